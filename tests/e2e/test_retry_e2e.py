"""A retried call is one request, every service its own process, the official OpenAI SDK
at its default retry settings (two retries).

- The first attempt meets a 502 from a briefly stopped admission (its submits wait in admission's socket
  backlog and are served when it resumes); the SDK's retry joins the same operation: one request row, one
  charge, and the client gets that request's completion.
- The first attempt's connection drops while the request runs; the SDK's retry takes the request over within
  the front's retry grace, so it is neither cancelled nor queued twice.
- An ``Idempotency-Key`` sent by hand: a dropped attempt, then two more with the same key, are one request;
  a request that ended in a settled error (408, ``x-should-retry: false``) answers the same error again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
import uuid
from typing import Any

import asyncpg
import httpx
import openai
import pytest

from .conftest import MODEL, Stack

NONSTREAM_BUDGET_SECONDS = 6
RETRY_GRACE_SECONDS = 2


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    return {
        # A stopped admission answers nothing: the front gives up on a submit after 1.5 s, retries it once.
        "HORDE_OAI_NATIVE_TIMEOUT_SECONDS": "1.5",
        "HORDE_OAI_SUBMIT_RETRIES": "1",
        "HORDE_OAI_NONSTREAM_TIMEOUT_SECONDS": str(NONSTREAM_BUDGET_SECONDS),
        "HORDE_OAI_SIGNAL_RECHECK_SECONDS": "1",
        "HORDE_OAI_RETRY_GRACE_SECONDS": str(RETRY_GRACE_SECONDS),
    }


@pytest.fixture(scope="module")
def retry_stack(stack: Stack) -> Stack:
    stack.stop_workers()
    stack.start_worker("e2e-retried", ("HORDE_WORKER_THREADS", "2"))
    return stack


def query(stack: Stack, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(stack.env["HORDE_DATABASE_URL"])
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


class Client:
    """A fresh user: its key, id and starting balance."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        made = stack.admin("user", "create", "--username", f"retry-{uuid.uuid4().hex[:8]}", "--kudos", "1000")
        self.key = str(made["api_key"])
        self.user_id = int(str(made["id"]))
        self.start_kudos = self.kudos()

    def kudos(self) -> float:
        return float(query(self.stack, "SELECT kudos FROM users WHERE id = $1", self.user_id)[0]["kudos"])

    def requests(self) -> list[dict[str, Any]]:
        return query(
            self.stack,
            "SELECT id, consumed_kudos FROM waiting_prompts WHERE user_id = $1 ORDER BY created",
            self.user_id,
        )

    def requests_cancelled(self) -> int:
        rows = query(
            self.stack,
            "SELECT count(*) AS n FROM waiting_prompts WHERE user_id = $1 AND cancelled",
            self.user_id,
        )
        return int(rows[0]["n"])

    def assert_one_request_charged_once(self, completion_id: str) -> None:
        """Exactly one request row, the completion's, and the balance down by its charge only (its settled
        kudos, once the worker's submit has settled them)."""
        rows = self.requests()
        assert len(rows) == 1, rows
        assert completion_id == f"chatcmpl-{rows[0]['id']}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.requests()[0]["consumed_kudos"] <= 0:
            time.sleep(0.2)
        consumed = float(self.requests()[0]["consumed_kudos"])
        assert consumed > 0
        assert self.kudos() == pytest.approx(self.start_kudos - consumed, abs=0.01)


def ask(text: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 64}


def front_lines(stack: Stack, needle: str) -> int:
    return stack.processes["oai"].log_text().count(needle)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_sdk_retry_after_a_502_from_a_stopped_admission_is_one_request(retry_stack: Stack) -> None:
    client = Client(retry_stack)
    pid = retry_stack.processes["admission"].pid
    assert pid is not None
    failed_before = front_lines(retry_stack, "code=HordeUnavailable")
    os.kill(pid, signal.SIGSTOP)

    def resume_after_the_first_502() -> None:
        try:
            wait_for(lambda: front_lines(retry_stack, "code=HordeUnavailable") > failed_before, 30, "a 502")
        finally:
            os.kill(pid, signal.SIGCONT)

    resumer = threading.Thread(target=resume_after_the_first_502)
    resumer.start()
    try:
        sdk = openai.OpenAI(base_url=retry_stack.front, api_key=client.key, timeout=60)  # default retries
        completion = sdk.chat.completions.create(**ask(f"[[pace:1]] stopped admission {uuid.uuid4().hex}"))
    finally:
        resumer.join()
        os.kill(pid, signal.SIGCONT)
    assert completion.choices[0].message.content
    # The first attempt's submits did reach admission (they waited in its backlog): without the shared
    # operation key each would have queued its own request.
    assert front_lines(retry_stack, "code=HordeUnavailable") == failed_before + 1
    client.assert_one_request_charged_once(completion.id)


class DropFirstAttempt(httpx.BaseTransport):
    """Sends the first chat completion for real, then drops its connection after ``after`` seconds, as a
    network fault or a client timeout would; later requests go through unchanged."""

    def __init__(self, after: float, *, after_headers: bool = False) -> None:
        self.inner = httpx.HTTPTransport()
        self.after = after
        self.after_headers = after_headers
        self.dropped = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.dropped == 0 and request.url.path.endswith("/chat/completions"):
            self.dropped += 1
            if self.after_headers:  # a stream whose connection breaks once its headers arrived
                with httpx.Client() as once:
                    once.send(request, stream=True).close()
                raise httpx.ReadError("connection dropped", request=request)
            # The request carries the SDK's own timeout, which would win over the client's.
            request.extensions["timeout"] = httpx.Timeout(self.after).as_dict()
            with httpx.Client() as once:
                try:
                    once.send(request)
                except httpx.ReadTimeout:
                    pass
                else:
                    raise AssertionError("the first attempt ended before its connection dropped")
            raise httpx.ReadError("connection dropped", request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_sdk_retry_after_a_dropped_connection_takes_the_request_over(retry_stack: Stack) -> None:
    client = Client(retry_stack)
    transport = DropFirstAttempt(after=1.0)
    dropped_before = front_lines(retry_stack, "code=client_disconnected")
    sdk = openai.OpenAI(
        base_url=retry_stack.front,
        api_key=client.key,
        timeout=60,
        # The SDK types its client as its own httpx build; an httpx.Client is what it uses at run time.
        http_client=httpx.Client(transport=transport),  # type: ignore[arg-type]
    )
    completion = sdk.chat.completions.create(**ask(f"[[pace:3]] dropped {uuid.uuid4().hex}"))
    assert transport.dropped == 1
    assert completion.choices[0].message.content
    assert front_lines(retry_stack, "code=client_disconnected") == dropped_before + 1
    client.assert_one_request_charged_once(completion.id)


def test_sdk_retry_of_a_relayed_stream_replays_the_same_completion(retry_stack: Stack) -> None:
    client = Client(retry_stack)
    transport = DropFirstAttempt(after=1.0, after_headers=True)
    sdk = openai.OpenAI(
        base_url=retry_stack.front,
        api_key=client.key,
        timeout=60,
        # The SDK types its client as its own httpx build; an httpx.Client is what it uses at run time.
        http_client=httpx.Client(transport=transport),  # type: ignore[arg-type]
    )
    stream = sdk.chat.completions.create(
        **ask(f"[[pace:2]] [[words:12]] streamed {uuid.uuid4().hex}"), stream=True
    )
    chunks = list(stream)
    assert transport.dropped == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "streamed" in text and chunks[-1].choices[0].finish_reason == "stop"
    client.assert_one_request_charged_once(chunks[0].id)


def test_a_call_retried_after_the_grace_gets_the_reply_its_cancelled_job_still_produced(
    retry_stack: Stack,
) -> None:
    """The cancel after the grace stops only what is queued: a job already running finishes and is charged,
    so the call stays open and a later retry gets that reply instead of paying for a second one."""
    client = Client(retry_stack)
    body = ask(f"[[pace:{RETRY_GRACE_SECONDS + 4}]] late retry {uuid.uuid4().hex}")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{retry_stack.front}/chat/completions",
            headers={"Authorization": f"Bearer {client.key}"},
            json=body,
            timeout=1.0,
        )
    wait_for(lambda: client.requests_cancelled() == 1, RETRY_GRACE_SECONDS + 10, "the cancel after the grace")
    again = httpx.post(
        f"{retry_stack.front}/chat/completions",
        headers={"Authorization": f"Bearer {client.key}"},
        json=body,
        timeout=60,
    )
    assert again.status_code == 200, again.text
    assert "late retry" in again.json()["choices"][0]["message"]["content"]
    client.assert_one_request_charged_once(again.json()["id"])


def post(stack: Stack, key: str, body: dict[str, Any], idem: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{stack.front}/chat/completions",
        headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem},
        json=body,
        timeout=timeout,
    )


def test_an_idempotency_key_sent_again_by_hand_is_one_request(retry_stack: Stack) -> None:
    client = Client(retry_stack)
    idem = str(uuid.uuid4())
    body = ask(f"[[pace:3]] idempotent {uuid.uuid4().hex}")
    with pytest.raises(httpx.ReadTimeout):
        post(retry_stack, client.key, body, idem, timeout=1.0)
    first = post(retry_stack, client.key, body, idem)
    assert first.status_code == 200, first.text
    again = post(retry_stack, client.key, body, idem)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["choices"] == first.json()["choices"]
    conflict = post(retry_stack, client.key, ask("another request"), idem)
    assert conflict.status_code == 400, conflict.text
    assert conflict.json()["error"]["code"] == "OperationKeyConflict"
    assert conflict.headers["x-should-retry"] == "false"
    client.assert_one_request_charged_once(first.json()["id"])
    # The conflict did not take the key away from its request.
    assert post(retry_stack, client.key, body, idem).json()["id"] == first.json()["id"]


def test_an_idempotency_key_replays_its_settled_error(retry_stack: Stack) -> None:
    client = Client(retry_stack)
    idem = str(uuid.uuid4())
    body = ask(f"[[pace:{NONSTREAM_BUDGET_SECONDS + 4}]] too slow {uuid.uuid4().hex}")
    first = post(retry_stack, client.key, body, idem)
    assert first.status_code == 408, first.text
    assert first.headers["x-should-retry"] == "false"
    error = first.json()["error"]
    assert error["code"] == "ChatRequestTimeout"
    request_id = error["metadata"]["request_id"]
    again = post(retry_stack, client.key, body, idem)
    assert again.status_code == 408
    assert again.json() == first.json()
    assert again.headers["x-should-retry"] == "false"
    rows = client.requests()
    assert [str(r["id"]) for r in rows] == [request_id]
    # A new key is a new call.
    other = post(retry_stack, client.key, ask(f"fresh {uuid.uuid4().hex}"), str(uuid.uuid4()))
    assert other.status_code == 200, other.text
    assert len(client.requests()) == 2


def test_the_sdk_does_not_retry_a_settled_timeout(retry_stack: Stack) -> None:
    client = Client(retry_stack)
    sdk = openai.OpenAI(base_url=retry_stack.front, api_key=client.key, timeout=60)  # default retries
    with pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(**ask(f"[[pace:{NONSTREAM_BUDGET_SECONDS + 4}]] slow {uuid.uuid4().hex}"))
    assert info.value.status_code == 408
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(client.requests()) == 1


def send_and_close(stack: Stack, key: str, body: dict[str, Any]) -> None:
    """Send a whole request on a raw socket and close it at once, before any answer."""
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", stack.ports["oai"])) as sock:
        sock.sendall(head + raw)


def test_a_client_that_closes_right_after_sending_has_its_request_cancelled(retry_stack: Stack) -> None:
    """The front notices the close at once; the cancel of its wait must take even when it lands as a Redis
    command completes (Python 3.11's wait_for once swallowed it, and such requests ran on and were charged)."""
    client = Client(retry_stack)
    for n in range(5):
        send_and_close(retry_stack, client.key, ask(f"[[pace:8]] closed at once {n} {uuid.uuid4().hex}"))
    wait_for(lambda: len(client.requests()) == 5, 10, "the five requests")
    wait_for(lambda: client.requests_cancelled() == 5, RETRY_GRACE_SECONDS + 10, "five cancels")


def test_anonymous_calls_never_join_each_other(retry_stack: Stack) -> None:
    """Anyone may send the anonymous key: the same Idempotency-Key and body from it are two requests."""
    idem = str(uuid.uuid4())
    body = ask(f"anonymous {uuid.uuid4().hex}")
    ids = []
    for _ in range(2):
        answer = post(retry_stack, "0000000000", body, idem).json()
        # A completion, or (the workers busy) the 408 of its own cancelled request: either names the request.
        ids.append(answer.get("id") or f"chatcmpl-{answer['error']['metadata']['request_id']}")
    assert ids[0] != ids[1]


def test_a_retry_beyond_the_streams_connection_limit_is_409_and_lets_go(retry_stack: Stack) -> None:
    client = Client(retry_stack)
    idem = str(uuid.uuid4())
    body = {**ask(f"[[pace:4]] [[words:20]] busy {uuid.uuid4().hex}"), "stream": True}
    headers = {"Authorization": f"Bearer {client.key}", "Idempotency-Key": idem}
    with httpx.Client(timeout=60) as http:
        opened = []
        try:
            for _ in range(4):  # MAX_STREAM_CONNECTIONS
                response = http.send(
                    http.build_request(
                        "POST", f"{retry_stack.front}/chat/completions", json=body, headers=headers
                    ),
                    stream=True,
                )
                assert response.status_code == 200
                opened.append(response)
            busy = http.post(f"{retry_stack.front}/chat/completions", json=body, headers=headers)
            assert busy.status_code == 409, busy.text
            assert busy.json()["error"]["code"] == "stream_busy"
            assert busy.headers["x-should-retry"] == "true"
            for response in opened:
                assert any(line == "data: [DONE]" for line in response.iter_lines())
        finally:
            for response in opened:
                response.close()
    assert len(client.requests()) == 1
