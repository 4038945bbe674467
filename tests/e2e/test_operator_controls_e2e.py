"""Operator controls end to end (docs/operator-guide.md#operator-controls), every service its own process and
``horde-admin`` run as an operator runs it:

- ``modes maintenance on`` refuses new requests on both native routes and the front (503 there, with
  Retry-After), and aborts a queued request: the waiting OpenAI client ends on the ``cancelled`` signal
  (the front's periodic status re-read is pushed past the test, so only the signal can end it); ``off``
  serves again.
- ``ip-timeout`` refuses that address (native, and through the front, which forwards its client's address).
- a flagged user's prompt reaches the worker through the replacement filter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from .conftest import MODEL, Stack

GREETING = "Hello from the scripted backend:"
PASSKEY = "e2e-operator-passkey"


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    return {
        # Admission reads the modes row on every submission: no assertion waits on the cache.
        "HORDE_MODES_CACHE_SECONDS": "0",
        # The front forwards each client's address with the passkey, as `make run` configures it.
        "HORDE_PROXY_PASSKEYS": f'["{PASSKEY}"]',
        "HORDE_OAI_PROXY_PASSKEY": PASSKEY,
        # A waiting client re-reads its status only after 10 minutes: within the test only a signal wakes it.
        "HORDE_OAI_SIGNAL_RECHECK_SECONDS": "600",
    }


@pytest.fixture
def maintenance_off(stack: Stack) -> Iterator[None]:
    """Leave the stack out of maintenance whatever the test did."""
    yield
    stack.admin("modes", "maintenance", "off")


def _complete(stack: Stack, content: str, key: str | None = None) -> ChatCompletion:
    """One chat completion through the front (no SDK retries); the client is closed after it."""
    with openai.OpenAI(
        base_url=stack.front, api_key=key or stack.client_key, max_retries=0, timeout=120
    ) as client:
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}])


def _queued_ids(stack: Stack) -> list[str]:
    """The e2e client's requests that are neither cancelled nor finished (newest first)."""
    shown = stack.admin("user", "show", "--username", "e2e-client")
    requests: list[dict[str, Any]] = shown["requests"]  # type: ignore[assignment]
    return [r["id"] for r in requests if not r["cancelled"] and not r["finished"]]


def test_maintenance_refuses_new_requests_and_aborts_a_queued_one(
    stack: Stack, maintenance_off: None
) -> None:
    # A worker that checked in and left: the model stays served (online for 300 s), nothing pops.
    stack.start_worker("maint-gone")
    stack.stop_workers()
    before = set(_queued_ids(stack))

    outcome: dict[str, Any] = {}

    def wait_for_reply() -> None:
        try:
            outcome["reply"] = _complete(stack, "queued before maintenance")
        except openai.APIStatusError as exc:
            outcome["error"] = exc

    waiter = threading.Thread(target=wait_for_reply)
    waiter.start()
    deadline = time.monotonic() + 60
    queued: list[str] = []
    while not queued and time.monotonic() < deadline:
        queued = [rid for rid in _queued_ids(stack) if rid not in before]
        time.sleep(0.2)
    assert len(queued) == 1, "the client's request was not queued"
    (request_id,) = queued

    switched = stack.admin("modes", "maintenance", "on")
    assert switched["maintenance"] is True
    assert request_id in switched["aborted_ids"]  # type: ignore[operator]
    assert switched["signalled"] == switched["aborted"]

    waiter.join(90)
    assert not waiter.is_alive(), "the waiting client did not end on the cancelled signal"
    error = outcome.get("error")
    assert isinstance(error, openai.APIStatusError), outcome
    assert error.status_code == 502 and error.code == "ChatRequestNoGeneration"
    status = httpx.get(f"{stack.native}/generate/chat/status/{request_id}", timeout=10).json()
    assert status["done"] is True and status["finished"] == 0 and status["waiting"] == 0

    # New requests: refused on both native routes, and by the front as a 503 an SDK does not retry.
    for path, body in (
        ("text/async", {"prompt": "hello"}),
        ("chat/async", {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}),
    ):
        r = httpx.post(f"{stack.native}/generate/{path}", headers={"apikey": stack.client_key}, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["rc"] == "MaintenanceMode"
        assert r.headers["Retry-After"] == "300" and r.headers["x-should-retry"] == "false"
    calls = 0

    def count(request: httpx.Request) -> None:
        nonlocal calls
        calls += 1

    with (
        openai.OpenAI(
            base_url=stack.front,
            api_key=stack.client_key,
            max_retries=2,  # x-should-retry: false keeps the SDK from retrying
            timeout=60,
            http_client=httpx.Client(event_hooks={"request": [count]}),  # type: ignore[arg-type]
        ) as sdk,
        pytest.raises(openai.InternalServerError) as refused,
    ):
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])
    assert refused.value.status_code == 503 and refused.value.code == "MaintenanceMode"
    assert refused.value.response.headers["Retry-After"] == "300"
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert calls == 1

    # Off: served again.
    assert stack.admin("modes", "maintenance", "off") == {
        "maintenance": False,
        "aborted": 0,
        "aborted_ids": [],
        "signalled": 0,
    }
    stack.start_worker("maint-back")
    reply = _complete(stack, "after maintenance")
    assert reply.choices[0].message.content == f"{GREETING} after maintenance"


def test_ip_timeout_refuses_that_address(stack: Stack) -> None:
    if not stack.workers:
        stack.start_worker("ipt-worker")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "from afar"}], "max_tokens": 16}

    def native(address: str) -> httpx.Response:
        headers = {"apikey": stack.client_key, "Proxy-Authorization": PASSKEY, "Proxied-For": address}
        return httpx.post(f"{stack.native}/generate/chat/async", headers=headers, json=body, timeout=30)

    timed_out = stack.admin("ip-timeout", "198.51.100.23", "--minutes", "10")
    assert timed_out == {"address": "198.51.100.23", "seconds": 600}
    try:
        r = native("198.51.100.23")
        assert r.status_code == 403, r.text
        assert r.json()["rc"] == "TimeoutIP"
        assert 0 < int(r.headers["Retry-After"]) <= 600
        assert native("198.51.100.24").status_code == 202
    finally:
        assert stack.admin("ip-timeout", "198.51.100.23", "--clear") == {
            "address": "198.51.100.23",
            "cleared": True,
        }
    assert native("198.51.100.23").status_code == 202

    # Through the front: it forwards its client's address (this test's, 127.0.0.1) with the passkey.
    stack.admin("ip-timeout", "127.0.0.1", "--minutes", "10")
    try:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            _complete(stack, "from afar")
        assert refused.value.code == "TimeoutIP"
    finally:
        stack.admin("ip-timeout", "127.0.0.1", "--clear")
    assert _complete(stack, "from afar").choices[0].message.content == f"{GREETING} from afar"


def test_a_flagged_users_prompt_reaches_the_worker_filtered(stack: Stack) -> None:
    if not stack.workers:
        stack.start_worker("flag-worker")
    key = str(stack.admin("user", "create", "--username", "e2e-flagged", "--kudos", "500")["api_key"])
    assert stack.admin("user", "set", "--username", "e2e-flagged", "--flagged")["flagged"] is True
    prompt = "Tell a story about a 12 year old kid"
    reply = _complete(stack, prompt, key)
    # The scripted worker echoes the last user message it received.
    assert reply.choices[0].message.content == f"{GREETING} Tell a story about a adult adult"

    with pytest.raises(openai.BadRequestError) as refused:
        _complete(stack, "loli", key)
    assert refused.value.code == "CorruptPrompt"

    # The same prompt from an unflagged user is not rewritten.
    assert _complete(stack, prompt).choices[0].message.content == f"{GREETING} {prompt}"
