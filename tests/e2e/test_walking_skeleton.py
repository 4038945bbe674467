"""The walking skeleton: an OpenAI client gets a chat.completion whose content the reference worker
produced, through admission → dispatch → worker → submit → signal → front, every hop its own process.

Also: killing and restarting any service process loses nothing (a queued request is still served).
"""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from .conftest import MODEL, Stack

GREETING = "Hello from the scripted backend:"


def wait_done(stack: Stack, request_id: str, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    status: dict[str, object] = {}
    while time.monotonic() < deadline:
        r = httpx.get(f"{stack.native}/generate/chat/status/{request_id}", timeout=10)
        assert r.status_code == 200, r.text
        status = r.json()
        if status["done"]:
            return status
        time.sleep(0.2)
    raise AssertionError(f"request {request_id} not done in {timeout}s: {status}")


def test_openai_sdk_gets_the_workers_reply(stack: Stack) -> None:
    stack.start_worker("skeleton-worker")
    client = openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=60)
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi to the horde"}]
    )
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == f"{GREETING} Say hi to the horde"
    assert completion.system_fingerprint is not None and completion.system_fingerprint.startswith("fp_")

    models = client.models.list()
    assert MODEL in [m.id for m in models.data]


def test_unknown_model_is_refused_by_admission_through_the_front(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="nobody/serves-this", messages=[{"role": "user", "content": "x"}]
        )
    r = httpx.post(
        f"{stack.native}/generate/chat/async",
        headers={"apikey": stack.client_key},
        json={"model": "nobody/serves-this", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 404
    assert r.json()["rc"] == "UnknownChatModel"


def test_native_round_trip_stores_the_structured_reply(stack: Stack) -> None:
    if not stack.workers:
        stack.start_worker("native-worker")
    r = httpx.post(
        f"{stack.native}/generate/chat/async",
        headers={"apikey": stack.client_key},
        json={"model": MODEL, "messages": [{"role": "user", "content": "native hello"}], "max_tokens": 64},
    )
    assert r.status_code == 202, r.text
    body = r.json()
    assert set(body) >= {"id", "kudos", "warnings"}
    status = wait_done(stack, body["id"])
    assert status["faulted"] is False
    assert status["finished"] == 1
    generation = status["generations"][0]  # type: ignore[index]
    assert generation["model"] == MODEL
    assert generation["finish_reason"] == "stop"
    assert generation["message"]["content"] == f"{GREETING} native hello"


@pytest.mark.parametrize("victim", ["admission", "dispatch", "submit", "janitor", "oai"])
def test_killing_and_restarting_a_service_loses_nothing(stack: Stack, victim: str) -> None:
    # A worker that checked in recently keeps the model served while it is stopped, so the request queues
    # and waits through the kill and restart.
    stack.stop_workers()
    worker = stack.start_worker(f"restart-{victim}-{uuid.uuid4().hex[:6]}")
    worker.stop()
    r = httpx.post(
        f"{stack.native}/generate/chat/async",
        headers={"apikey": stack.client_key},
        json={"model": MODEL, "messages": [{"role": "user", "content": f"survive {victim}"}]},
    )
    assert r.status_code == 202, r.text
    request_id = r.json()["id"]

    stack.processes[victim].kill()
    stack.processes[victim].restart()
    stack.processes[victim].wait_healthy(60)

    stack.workers.remove(worker)
    worker.restart()
    worker.wait_healthy(60)
    stack.workers.append(worker)
    status = wait_done(stack, request_id)
    assert status["generations"][0]["message"]["content"] == f"{GREETING} survive {victim}"  # type: ignore[index]
    worker.stop()
    stack.workers.remove(worker)

    # The restarted process serves new work too (the front through the SDK).
    if victim == "oai":
        stack.start_worker(f"after-{victim}")
        client = openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=60)
        completion = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "after restart"}]
        )
        assert completion.choices[0].message.content == f"{GREETING} after restart"
