"""Two replicas of every service behind the one URL (``make run REPLICAS=2``, issue 13's proofs).

One :class:`horde_testing.local_stack.LocalStack` for the module: supervisord runs two processes of admission,
dispatch, submit, janitor and the OpenAI front, Caddy balances the one URL over them, gRPC callers balance
over both dispatch and submit replicas (round_robin), and the stack's reference worker (scripted backend,
``scripted/echo``) pops and submits through the one URL.

1. Fifty completions through the one URL with the official OpenAI SDK (plain, relayed streams, buffered
   streams), clients that leave relayed streams (cancelled) and jobs the worker faults all end as they should;
   both replicas of dispatch and of submit served gRPC calls (their ``horde_grpc_server_handled_total``); in
   PostgreSQL no request got more generations than its jobs and each is charged once.
2. Failover: while traffic runs, one replica of each service in turn is killed with SIGKILL and waited back
   (supervisord restarts it): every request ends done or faulted with a reason within a bounded deadline,
   none is charged twice, the clients' errors say whether a retry helps; a relayed stream cut by its front
   replica's death resumes on the other replica through the one URL with ``Last-Event-ID`` and the client
   gets the whole reply once.

The stack runs an 8 s job lease and a 1 s janitor pass, so a lease lost with a killed replica lapses in
seconds (docs/native-api.md#job-lease), and the front's 3 s resume grace (docs/openai-front.md#resumable-streams).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import openai
import pytest
from horde_testing.local_stack import LocalStack

from .conftest import E2E_LIMITS

# Whole stacks with two replicas of everything: make test-replicas (CI runs it after make test).
pytestmark = pytest.mark.replicas

ROOT = Path(__file__).resolve().parents[2]
MODEL = "scripted/echo"
ADMIN = (sys.executable, "-m", "horde_store.admin")
LEASE_SECONDS = 8
RESUME_GRACE_SECONDS = 3
#: How long any request may take to end once traffic stopped: a lapsed lease (8 s) is faulted by the next
#: janitor pass and restarted at most three times, each attempt a few seconds on a loaded two-core machine.
SETTLE_SECONDS = 120
#: Clients that leave a relayed stream in test 1: each cancel settles the running generation through submit's
#: gRPC (SettleCancelledGeneration), enough calls for round_robin to reach both submit replicas.
LEAVERS = 10
#: Requests the worker faults in test 1: each is restarted until its third fault (FAULTED_GENERATIONS_LIMIT), and
#: every faulted job counts towards the stack's one worker's dropped jobs (maintenance past 20 an hour:
#: docs/native-api.md#refusal-record), which the failover test's lapsed leases add to.
FAULTED = 2
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    },
}


@pytest.fixture(scope="module")
def local_stack(
    horde_settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    env = {
        **horde_settings_env,
        "HORDE_TEXT_JOB_LEASE_SECONDS": str(LEASE_SECONDS),
        "HORDE_JANITOR_INTERVAL_SECONDS": "1",
        "HORDE_OAI_STREAM_RESUME_GRACE_SECONDS": str(RESUME_GRACE_SECONDS),
        "HORDE_OAI_RETRY_GRACE_SECONDS": str(RESUME_GRACE_SECONDS),
        "HORDE_WORKER_THREADS": "8",
        **E2E_LIMITS,
        "HORDE_LOG_JSON": "false",
    }
    stack = LocalStack(2, directory=tmp_path_factory.mktemp("replicas"), env=env, root=ROOT)
    with stack:
        wait_for(lambda: MODEL in models(stack), 120, "the worker's model listed at /v1/models")
        yield stack


# -- helpers ---------------------------------------------------------------------------------------------


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def models(stack: LocalStack) -> list[str]:
    got = httpx.get(f"{stack.urls.front}/models", timeout=10, trust_env=False)
    return [m["id"] for m in got.json().get("data", [])] if got.status_code == 200 else []


def query(stack: LocalStack, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(stack.env["HORDE_DATABASE_URL"])
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


@dataclass
class User:
    """A fresh client user: its key, id and starting balance."""

    key: str
    id: int
    start_kudos: float


def new_user(stack: LocalStack, prefix: str) -> User:
    out = subprocess.run(
        [*ADMIN, "user", "create", "--username", f"{prefix}-{uuid.uuid4().hex[:8]}", "--kudos", "100000"],
        env=stack.env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    made = json.loads(out.stdout)
    user_id = int(made["id"])
    (row,) = query(stack, "SELECT kudos FROM users WHERE id = $1", user_id)
    return User(key=str(made["api_key"]), id=user_id, start_kudos=float(row["kudos"]))


def sdk(stack: LocalStack, user: User, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.urls.front,
        api_key=user.key,
        **{"timeout": 120.0, **options},
    )


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 200, **extra}


def request_id_of(completion_id: str) -> str:
    assert completion_id.startswith("chatcmpl-"), completion_id
    return completion_id.removeprefix("chatcmpl-")


def native_status(stack: LocalStack, request_id: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.urls.horde}/api/v2/generate/chat/status/{request_id}", timeout=15, trust_env=False)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def final_content(stack: LocalStack, request_id: str) -> str:
    status = native_status(stack, request_id)
    assert status["done"] and not status["faulted"], status
    (generation,) = status["generations"]
    return str(generation["message"]["content"])


def sse_events(response: httpx.Response) -> Iterator[tuple[str | None, Any]]:
    """``(event id, data)`` of each SSE event of a raw streamed response (comments skipped)."""
    event_id: str | None = None
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            raw = line[6:]
            yield event_id, raw if raw == "[DONE]" else json.loads(raw)
            event_id = None


def grpc_served(url: str) -> float:
    """The gRPC calls a replica's server answered (``horde_grpc_server_handled_total``, every method and code)."""
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^horde_grpc_server_handled_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    )


def janitors_expired(stack: LocalStack) -> float:
    """Requests expired by every janitor replica (``horde_janitor_expired_requests_total``, all labels)."""
    total = 0.0
    for url in stack.urls.replicas["janitor"]:
        text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
        total += sum(
            float(m.group(1))
            for m in re.finditer(r"^horde_janitor_expired_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
        )
    return total


def front_resumed(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    found = re.search(
        r'^horde_oai_stream_relays_total\{[^}]*outcome="resumed"[^}]*\} ([0-9.e+]+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


@dataclass
class Streamed:
    """What a raw SSE reader got: the request, the content it read, whether ``[DONE]`` came, error events,
    the last event id and the connections it took (1 + resumes/retries)."""

    request_id: str | None = None
    content: str = ""
    done: bool = False
    errors: list[dict[str, Any]] = field(default_factory=list)
    last_id: str | None = None
    idempotency_key: str | None = None
    connections: int = 0
    refused: tuple[int, str, dict[str, Any]] | None = None


def read_stream(
    url: str, key: str, body: dict[str, Any], got: Streamed, *, stop_after: int | None = None
) -> None:
    """One connection of a relayed stream (``Last-Event-ID`` = ``got.last_id`` when set), appending to
    ``got``; stops after ``stop_after`` content events (the client leaves). Raises httpx.TransportError when
    the connection is cut."""
    headers = {"Authorization": f"Bearer {key}"}
    if got.idempotency_key is not None:
        headers["Idempotency-Key"] = got.idempotency_key
    if got.last_id is not None:
        headers["Last-Event-ID"] = got.last_id
    got.connections += 1
    seen = 0
    with httpx.stream(
        "POST",
        f"{url}/chat/completions",
        json={**body, "stream": True},
        headers=headers,
        timeout=60,
        trust_env=False,
    ) as r:
        if r.status_code != 200:
            r.read()
            got.refused = (r.status_code, r.headers.get("x-should-retry", ""), r.json())
            return
        for event_id, data in sse_events(r):
            if data == "[DONE]":
                got.done = True
                return
            if "error" in data:
                got.errors.append(data["error"])
                continue
            got.request_id = request_id_of(data["id"])
            if event_id is not None:
                got.last_id = event_id
            if data["choices"]:
                piece = data["choices"][0]["delta"].get("content") or ""
                got.content += piece
                seen += 1 if piece else 0
                if stop_after is not None and seen >= stop_after:
                    return


def stream_to_end(url: str, key: str, body: dict[str, Any], attempts: int = 6) -> Streamed:
    """A relayed stream read to its end as a careful client does: a cut connection is resumed with
    ``Last-Event-ID`` (or, before any event id, the call is sent again under its ``Idempotency-Key``: the
    front joins the first attempt's request, docs/openai-front.md#retries-and-idempotency), a refusal marked
    ``x-should-retry: true`` is retried after a pause."""
    got = Streamed(idempotency_key=str(uuid.uuid4()))
    for _ in range(attempts):
        got.refused = None
        try:
            read_stream(url, key, body, got)
        except httpx.TransportError:
            pass
        else:
            if got.done or (got.refused is not None and got.refused[1] != "true"):
                return got
        if got.last_id is None:
            got.content = ""  # sent again from its start
        time.sleep(1)
    return got


def assert_requests_end_and_are_charged_once(
    stack: LocalStack, user: User, expected: int | None = None
) -> list[dict[str, Any]]:
    """Every request of ``user`` ends (native status ``done``) within SETTLE_SECONDS; a faulted one has a
    reason; none has more submitted generations than its jobs; the balance fell by exactly what the requests
    consumed (one charge each). Returns the request rows."""
    rows = query(stack, "SELECT id FROM waiting_prompts WHERE user_id = $1", user.id)
    if expected is not None:
        assert len(rows) == expected, rows
    pending = {str(r["id"]) for r in rows}
    deadline = time.monotonic() + SETTLE_SECONDS
    while pending and time.monotonic() < deadline:
        pending = {rid for rid in pending if not native_status(stack, rid)["done"]}
        time.sleep(0.5)
    assert not pending, {rid: native_status(stack, rid) for rid in pending}
    requests = query(
        stack,
        """
        SELECT wp.id, wp.jobs, wp.faulted, wp.cancelled, wp.chat_fault_reason, wp.consumed_kudos,
               count(pg.id) FILTER (WHERE pg.generation IS NOT NULL AND NOT pg.faulted) AS submitted,
               count(pg.id) FILTER (WHERE NOT pg.faulted) AS live
        FROM waiting_prompts wp LEFT JOIN processing_gens pg ON pg.wp_id = wp.id
        WHERE wp.user_id = $1 GROUP BY wp.id
        """,
        user.id,
    )
    for row in requests:
        assert row["submitted"] <= row["jobs"] and row["live"] <= row["jobs"], row
        if row["faulted"]:
            assert row["chat_fault_reason"], row
    # The generations are settled by submit after the status reads done: wait for the balance to match.
    consumed = 0.0

    def charged_once() -> bool:
        nonlocal consumed
        consumed = sum(
            float(r["consumed_kudos"])
            for r in query(stack, "SELECT consumed_kudos FROM waiting_prompts WHERE user_id = $1", user.id)
        )
        (balance,) = query(stack, "SELECT kudos FROM users WHERE id = $1", user.id)
        return abs(user.start_kudos - float(balance["kudos"]) - consumed) < 0.01

    wait_for(charged_once, 20, "the user's balance to fall by what its requests consumed")
    assert consumed > 0
    return requests


# -- 1. fifty completions, cancels and faults ------------------------------------------------------------


def test_fifty_completions_cancels_and_faults_through_the_one_url(local_stack: LocalStack) -> None:
    user = new_user(local_stack, "replicas")
    with sdk(local_stack, user, max_retries=2) as client:
        run_fifty(local_stack, user, client)


def run_fifty(local_stack: LocalStack, user: User, client: openai.OpenAI) -> None:
    served_before = {
        s: [grpc_served(u) for u in local_stack.urls.replicas[s]] for s in ("dispatch", "submit")
    }

    def plain(i: int) -> tuple[str, str]:
        completion = client.chat.completions.create(**ask(f"plain {i}"))
        assert completion.choices[0].finish_reason == "stop"
        content = completion.choices[0].message.content or ""
        assert content == f"Hello from the scripted backend: plain {i}", content
        return completion.id, content

    def relayed(i: int) -> tuple[str, str]:
        chunks = list(
            client.chat.completions.create(**ask(f"[[pace:1]] [[words:20]] relayed {i}"), stream=True)
        )
        assert len({c.id for c in chunks}) == 1
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert content.startswith(f"Hello from the scripted backend: relayed {i}"), content
        return chunks[0].id, content

    def buffered(i: int) -> tuple[str, str]:
        chunks = list(
            client.chat.completions.create(**ask(f"buffered {i}", response_format=SCHEMA), stream=True)
        )
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "answer" in json.loads(content), content
        return chunks[0].id, content

    def faulted(i: int) -> str:
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(**ask(f"[[fault:generation_error]] faulted {i}"))
        error = refused.value
        assert error.status_code == 502, error
        assert error.response.headers.get("x-should-retry") == "false"
        body = error.body if isinstance(error.body, dict) else {}
        body = body.get("error", body)
        assert body.get("code") == "ChatRequestFaulted", error.body
        metadata = body.get("metadata", {})
        assert metadata.get("fault_reason") and metadata.get("request_id"), error.body
        return str(metadata["request_id"])

    def leaves(i: int) -> str:
        got = Streamed()
        read_stream(
            local_stack.urls.front, user.key, ask(f"[[pace:30]] [[words:300]] leaves {i}"), got, stop_after=1
        )
        assert got.request_id is not None and got.content
        return got.request_id

    kinds = [plain] * 20 + [relayed] * 18 + [buffered] * 12
    with ThreadPoolExecutor(8) as pool:
        left = [pool.submit(leaves, i) for i in range(LEAVERS)]
        faults = [pool.submit(faulted, i) for i in range(FAULTED)]
        completed = [pool.submit(kind, i) for i, kind in enumerate(kinds)]
        results = [f.result() for f in completed]
        cancelled = [f.result() for f in left]
        faulted_ids = [f.result() for f in faults]
    # Each completion is its own request, and the client read the whole reply once.
    ids = [request_id_of(cid) for cid, _ in results]
    assert len(set(ids)) == 50
    for request_id, (_, content) in zip(ids, results, strict=True):
        assert content == final_content(local_stack, request_id)
    # The clients that left: cancelled after the resume grace, the worker stopped, no reply.
    for request_id in cancelled:
        wait_for(lambda rid=request_id: native_status(local_stack, rid)["done"], 60, "a left stream's end")
        (wp,) = query(
            local_stack, "SELECT cancelled FROM waiting_prompts WHERE id = $1", uuid.UUID(request_id)
        )
        assert wp["cancelled"] is True
        assert not [g for g in native_status(local_stack, request_id)["generations"] if g.get("message")]

    requests = assert_requests_end_and_are_charged_once(local_stack, user, expected=50 + LEAVERS + FAULTED)
    # The faults: each request faulted with its reason once the worker failed it FAULTED_GENERATIONS_LIMIT times.
    assert sorted(str(r["id"]) for r in requests if r["faulted"]) == sorted(faulted_ids)
    assert sorted(str(r["id"]) for r in requests if r["cancelled"]) == sorted(cancelled)
    # gRPC callers balance per call over both replicas (admission's availability reads go to dispatch, its
    # settlements of the cancelled generations above to submit): each replica served calls.
    for service, before in served_before.items():
        after = [grpc_served(u) for u in local_stack.urls.replicas[service]]
        assert all(a > b for a, b in zip(after, before, strict=True)), (service, before, after)

    # Expiry across the two janitor replicas: every request of this test expires at once; each is deleted,
    # and deleted once: the two janitors' expired counters add up to exactly the number of rows.
    expired_before = janitors_expired(local_stack)
    ids = [r["id"] for r in requests]
    query(
        local_stack,
        "UPDATE waiting_prompts SET expiry = now() - interval '1 second' WHERE id = ANY($1::uuid[])",
        ids,
    )
    wait_for(
        lambda: not query(local_stack, "SELECT 1 FROM waiting_prompts WHERE id = ANY($1::uuid[])", ids),
        60,
        "the expiry of every request",
    )
    wait_for(lambda: janitors_expired(local_stack) - expired_before >= len(ids), 30, "the expiry counters")
    assert janitors_expired(local_stack) - expired_before == len(ids)


# -- 2. failover ------------------------------------------------------------------------------------------


@dataclass
class Traffic:
    """A loop of completions (plain through the SDK, relayed streams through a resuming reader) on
    ``threads`` threads until stopped; what each call ended with. No scripted faults: the stack's one worker
    would reach its dropped-jobs maintenance (FAULTED); the faults here are those the kills cause."""

    stack: LocalStack
    user: User
    threads: int = 3
    stop: threading.Event = field(default_factory=threading.Event)
    completions: list[tuple[str, str]] = field(default_factory=list)
    streams: list[Streamed] = field(default_factory=list)
    errors: list[openai.APIStatusError] = field(default_factory=list)
    unexpected: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, n: int) -> None:
        with sdk(self.stack, self.user, max_retries=5) as client:
            self.loop(n, client)

    def loop(self, n: int, client: openai.OpenAI) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            text = f"loop {n}-{i}"
            try:
                if i % 2:
                    got = stream_to_end(
                        self.stack.urls.front, self.user.key, ask(f"[[pace:2]] [[words:20]] {text}")
                    )
                    with self.lock:
                        self.streams.append(got)
                else:
                    self.call(client, f"[[pace:1]] {text}")
            except BaseException as exc:  # every failure is reported by the test
                with self.lock:
                    self.unexpected.append(exc)

    def call(self, client: openai.OpenAI, text: str) -> None:
        try:
            completion = client.chat.completions.create(**ask(text))
        except openai.APIStatusError as exc:
            with self.lock:
                self.errors.append(exc)
            return
        with self.lock:
            self.completions.append((completion.id, completion.choices[0].message.content or ""))

    def __enter__(self) -> Traffic:
        self.pool = ThreadPoolExecutor(self.threads)
        self.futures = [self.pool.submit(self.run, n) for n in range(self.threads)]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for future in self.futures:
            future.result(timeout=300)
        self.pool.shutdown()


def resume_after_front_dies(stack: LocalStack, user: User) -> None:
    """A relayed stream served by front replica 1 (its own port, so the test knows which replica holds it)
    is cut by replica 1's SIGKILL; the client resumes through the one URL with ``Last-Event-ID``, the proxy
    sends it to replica 0, and the client has the whole reply once."""
    body = ask("[[pace:8]] [[words:80]] cut by its front")
    resumed_before = front_resumed(stack.urls.replicas["oai"][0])
    got = Streamed()
    read_stream(f"{stack.urls.replicas['oai'][1]}/v1", user.key, body, got, stop_after=3)
    assert got.request_id is not None and got.last_id is not None and not got.done
    old = stack.kill("oai", 1)
    got.refused = None
    read_stream(stack.urls.front, user.key, body, got)  # the one URL: replica 1 is dead, so replica 0
    assert got.refused is None and got.done and not got.errors, got
    assert got.connections == 2
    assert got.content == final_content(stack, got.request_id)
    # Replica 0 re-attached it (the traffic's streams cut by the same kill may have resumed there too).
    assert front_resumed(stack.urls.replicas["oai"][0]) >= resumed_before + 1
    stack.wait_replica("oai", 1, not_pid=old, timeout=120)


def test_failover_kill_one_replica_of_each_service_in_turn(local_stack: LocalStack) -> None:
    user = new_user(local_stack, "failover")
    with Traffic(local_stack, user) as traffic:
        wait_for(lambda: len(traffic.completions) + len(traffic.streams) >= 3, 60, "traffic under way")
        for service in ("admission", "dispatch", "submit", "janitor"):
            old = local_stack.kill(service, 1)
            local_stack.wait_replica(service, 1, not_pid=old, timeout=120)
            # Traffic goes on through the restarted replica before the next kill.
            done = len(traffic.completions) + len(traffic.streams)
            wait_for(
                lambda d=done: len(traffic.completions) + len(traffic.streams) > d,
                60,
                f"traffic after {service}",
            )
        resume_after_front_dies(local_stack, user)
    print(  # the run's shape, shown with -s
        f"failover traffic: {len(traffic.completions)} completions, {len(traffic.streams)} streams "
        f"({sum(s.connections > 1 for s in traffic.streams)} reconnected), {len(traffic.errors)} errors"
    )
    assert not traffic.unexpected, traffic.unexpected
    assert traffic.completions and traffic.streams
    # Clients' errors are honest: a request the horde faulted (a lapsed lease restarted past its limit),
    # marked final with its reason; a retryable error would have been retried by the SDK (max_retries) and
    # must not surface here.
    for error in traffic.errors:
        body = error.body if isinstance(error.body, dict) else {}
        assert error.response.headers.get("x-should-retry") == "false", (error.status_code, error.body)
        assert error.status_code == 502 and body.get("code") == "ChatRequestFaulted", error.body
        assert body.get("metadata", {}).get("fault_reason"), error.body
    for completion_id, content in traffic.completions:
        assert content == final_content(local_stack, request_id_of(completion_id))
    for streamed in traffic.streams:
        assert streamed.done and not streamed.errors and streamed.refused is None, streamed
        assert streamed.request_id is not None
        assert streamed.content == final_content(local_stack, streamed.request_id)
    requests = assert_requests_end_and_are_charged_once(local_stack, user)
    # One request per call: no retry, resume or failover queued (and charged) a second one.
    known = (
        {request_id_of(cid) for cid, _ in traffic.completions}
        | {s.request_id for s in traffic.streams}
        | {
            str((e.body if isinstance(e.body, dict) else {}).get("metadata", {}).get("request_id"))
            for e in traffic.errors
        }
    )
    extra = [r for r in requests if str(r["id"]) not in known]
    total = len(traffic.completions) + len(traffic.streams) + len(traffic.errors)
    assert len(requests) == total + 1, (len(requests), total, extra)  # + the stream resumed above
