"""Two front replicas on one horde (issue 13: every stage correct with N replicas; docs/operator-guide.md#scaling).

Admission, dispatch, submit and two fronts each run as their own process on the same stores; the fronts re-read
a waiting request's status only every 300 s, so within the test's time a front learns that its request ended
from the completion signal alone. A relayed stream is opened on each front; once both have sent their headers
(their first status read is behind them, they wait), a worker pops both jobs, posts progress to each and
submits each. Each front wakes on its own request's signal (``woke_by`` a signal event in its finished line)
and each client gets its own request's deltas and reply, none of the other's: each front's delta reader reads
the streams of its own requests with a plain ``XREAD`` (no consumer group takes an entry from another reader).
The second test shows the same of the readers themselves, side by side on one Redis.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from horde_core.chat_stream import progress_stream_key
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client
from horde_oai.deltas import DeltaStreamReader
from horde_testing.launcher import ServiceProcess, free_port

from .conftest import start_front
from .test_e2e_native import _admin

MODEL = "e2e/two-fronts"
# A front re-reads the status this rarely: only a signal ends a wait within the test.
RECHECK_SECONDS = 300
BUDGET_SECONDS = 120
TEST_DEADLINE_SECONDS = 60


@dataclass
class Horde:
    dispatch: str
    submit: str
    fronts: list[ServiceProcess]
    user_key: str
    worker_key: str
    processes: list[ServiceProcess] = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(p.log_tail(40) for p in self.processes)


@pytest.fixture(scope="module")
def horde(horde_settings_env: dict[str, str]) -> Iterator[Horde]:
    tag = uuid.uuid4().hex[:6]
    user = _admin(horde_settings_env, "user", "create", "--username", f"two{tag}", "--kudos", "100000")
    owner = _admin(horde_settings_env, "user", "create", "--username", f"own{tag}", "--trusted")
    ports = {name: free_port() for name in ("adm", "dsp", "dspg", "sub", "subg")}
    common = {
        **horde_settings_env,
        "HORDE_LOG_JSON": "false",
        "HORDE_RATE_LIMITS_ENABLED": "false",
        "HORDE_ADMISSION_HTTP_PORT": str(ports["adm"]),
        "HORDE_DISPATCH_HTTP_PORT": str(ports["dsp"]),
        "HORDE_DISPATCH_GRPC_PORT": str(ports["dspg"]),
        "HORDE_SUBMIT_HTTP_PORT": str(ports["sub"]),
        "HORDE_SUBMIT_GRPC_PORT": str(ports["subg"]),
    }
    processes: list[ServiceProcess] = []
    try:
        for name, port in (
            ("horde_dispatch", ports["dsp"]),
            ("horde_submit", ports["sub"]),
            ("horde_admission", ports["adm"]),
        ):
            svc = ServiceProcess(
                name, [sys.executable, "-m", name], env=common, health_url=f"http://127.0.0.1:{port}/healthz"
            )
            processes.append(svc.start())
        fronts = [
            start_front(
                {
                    **common,
                    "HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{ports['adm']}/api",
                    "HORDE_OAI_SIGNAL_RECHECK_SECONDS": str(RECHECK_SECONDS),
                    "HORDE_OAI_NONSTREAM_TIMEOUT_SECONDS": str(BUDGET_SECONDS),
                    "HORDE_OAI_STREAM_TIMEOUT_SECONDS": str(BUDGET_SECONDS),
                    # Each delta goes out as it arrives.
                    "HORDE_OAI_DELTA_PACING_MAX_WINDOW_SECONDS": "0",
                },
                wait=False,
            )
            for _ in range(2)
        ]
        processes.extend(fronts)
        for svc in processes:
            svc.wait_healthy()
        yield Horde(
            dispatch=f"http://127.0.0.1:{ports['dsp']}/api",
            submit=f"http://127.0.0.1:{ports['sub']}/api",
            fronts=fronts,
            user_key=user["api_key"],
            worker_key=owner["api_key"],
            processes=processes,
        )
    finally:
        for svc in reversed(processes):
            svc.stop()


def pop_body(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "models": [MODEL],
        "max_length": 512,
        "max_context_length": 4096,
        "bridge_agent": "test-worker:1:none",
        "threads": 1,
        "chat_jobs": True,
        "model_id": MODEL,
        "chat_limits": {"max_context_length": 4096, "max_length": 512},
        "chat_features": ["prompt_overflow_refused"],
    }


@dataclass
class Stream:
    """One relayed stream read as it arrives: its status, content deltas and events."""

    label: str
    headers: asyncio.Event = field(default_factory=asyncio.Event)
    status: int | None = None
    content: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


async def read_stream(client: httpx.AsyncClient, front: ServiceProcess, key: str, stream: Stream) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": stream.label}],
        "max_tokens": 64,
        "stream": True,
    }
    async with client.stream(
        "POST", f"{front.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        stream.status = response.status_code
        stream.headers.set()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                stream.done = True
                return
            event = json.loads(data)
            stream.events.append(event)
            for choice in event.get("choices") or ():
                stream.content.append((choice.get("delta") or {}).get("content") or "")


async def until(test: Any, what: str, horde: Horde) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TEST_DEADLINE_SECONDS
    while not test():
        assert loop.time() < deadline, f"{what}\n{horde.logs()}"
        await asyncio.sleep(0.05)


def finished_line(front: ServiceProcess, request_id: str) -> str:
    marker = f"Chat request {request_id} finished:"
    log = front.wait_log(marker)
    lines = [line for line in log.splitlines() if marker in line]
    assert lines, log[-3000:]
    return lines[-1]


async def test_each_front_wakes_on_its_own_signal_and_relays_only_its_own_deltas(horde: Horde) -> None:
    streams = [Stream("front-A question"), Stream("front-B question")]
    workers = [f"two-fronts-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    async with httpx.AsyncClient(timeout=BUDGET_SECONDS + 30) as client:
        worker_headers = {"apikey": horde.worker_key}
        for name in workers:  # online, so the model is known and served
            r = await client.post(
                f"{horde.dispatch}/v2/generate/text/pop", json=pop_body(name), headers=worker_headers
            )
            assert r.status_code == 200 and r.json()["id"] is None, r.text
        readers = [
            asyncio.create_task(read_stream(client, front, horde.user_key, s))
            for front, s in zip(horde.fronts, streams, strict=True)
        ]
        try:
            # Both streams opened: each front's first status read passed and it waits on its signal.
            await until(lambda: all(s.headers.is_set() for s in streams), "a stream never opened", horde)
            assert [s.status for s in streams] == [200, 200]
            jobs: dict[str, dict[str, Any]] = {}
            for name in workers:
                r = await client.post(
                    f"{horde.dispatch}/v2/generate/text/pop", json=pop_body(name), headers=worker_headers
                )
                assert r.status_code == 200 and r.json()["id"], r.text
                job = r.json()
                assert job["payload"]["stream_progress"] is True, job["payload"]
                jobs[job["payload"]["messages"][0]["content"]] = job
            assert sorted(jobs) == sorted(s.label for s in streams)
            for s in streams:
                job = jobs[s.label]
                r = await client.post(
                    f"{horde.submit}/v2/generate/text/progress",
                    json={"id": job["id"], "seq": 1, "delta": {"content": f"Answer to {s.label}: "}},
                    headers=worker_headers,
                )
                assert r.status_code == 200, r.text
            # Each front relays its own delta before the request ends.
            await until(
                lambda: all("".join(s.content) == f"Answer to {s.label}: " for s in streams),
                f"a delta was not relayed: {[s.content for s in streams]}",
                horde,
            )
            for s in streams:
                job = jobs[s.label]
                r = await client.post(
                    f"{horde.submit}/v2/generate/text/submit",
                    json={
                        "id": job["id"],
                        "model_id": MODEL,
                        "message": {"role": "assistant", "content": f"Answer to {s.label}: done."},
                        "finish_reason": "stop",
                    },
                    headers=worker_headers,
                )
                assert r.status_code == 200, r.text
            await asyncio.wait_for(asyncio.gather(*readers), TEST_DEADLINE_SECONDS)
        finally:
            for task in readers:
                task.cancel()
    for front, s in zip(horde.fronts, streams, strict=True):
        assert s.done, s.events
        assert "".join(s.content) == f"Answer to {s.label}: done."
        assert not any("error" in e for e in s.events), s.events
        request_ids = {e["x_horde"]["request_id"] for e in s.events if e.get("x_horde")}
        assert len(request_ids) == 1, s.events
        (request_id,) = request_ids
        assert {e["id"] for e in s.events} == {f"chatcmpl-{request_id}"}
        assert s.events[-1]["choices"][0]["finish_reason"] == "stop"
        line = finished_line(front, request_id)
        assert "streamed=True" in line and "code=ok" in line, line
        # Woken by a signal (the status re-read is 300 s away), not by the budget.
        woke_by = line.split(" woke_by=", 1)[1].split(" ", 1)[0]
        assert woke_by in {"generation", "done"}, line
    # And neither front handled the other's request.
    for front, other in ((horde.fronts[0], streams[1]), (horde.fronts[1], streams[0])):
        other_id = next(e["x_horde"]["request_id"] for e in other.events if e.get("x_horde"))
        assert f"Chat request {other_id} " not in front.log_text()


async def test_two_delta_readers_each_get_every_entry_of_their_own_streams(
    redis_url: str, signal_redis: Any
) -> None:
    """Two fronts' readers on one Redis: each gets every entry of the streams its connections registered and none
    of another's; a stream registered on both (a resume beside the original) is read whole by both. XREAD takes
    nothing from a stream, and no consumer group exists on it."""
    mine, theirs, shared = (str(uuid.uuid4()) for _ in range(3))
    client_a, client_b = (
        redis_client(redis_url, db=CHAT_SIGNAL_DB),
        redis_client(redis_url, db=CHAT_SIGNAL_DB),
    )
    reader_a, reader_b = DeltaStreamReader(client_a), DeltaStreamReader(client_b)
    feed_mine, feed_shared_a = reader_a.register(mine), reader_a.register(shared)
    feed_theirs, feed_shared_b = reader_b.register(theirs), reader_b.register(shared)
    await reader_a.start()
    await reader_b.start()
    try:
        for i in range(5):
            for request_id in (mine, theirs, shared):
                await signal_redis.xadd(
                    progress_stream_key(request_id),
                    {"gen": "g", "seq": str(i + 1), "content": f"{request_id}:{i}"},
                )

        async def contents(feed: Any, count: int) -> list[str]:
            got: list[str] = []
            while len(got) < count:
                batch = await asyncio.wait_for(feed.batches.get(), TEST_DEADLINE_SECONDS)
                got.extend(e.content for e in batch)
            return got

        for feed, request_id in (
            (feed_mine, mine),
            (feed_theirs, theirs),
            (feed_shared_a, shared),
            (feed_shared_b, shared),
        ):
            assert await contents(feed, 5) == [f"{request_id}:{i}" for i in range(5)]
        assert (reader_a.registered, reader_b.registered) == (2, 2)
        for request_id in (mine, theirs, shared):
            key = progress_stream_key(request_id)
            assert await signal_redis.xlen(key) == 5  # nothing was taken from the stream
            assert await signal_redis.xinfo_groups(key) == []
    finally:
        await reader_a.stop()
        await reader_b.stop()
        await client_a.aclose()
        await client_b.aclose()
