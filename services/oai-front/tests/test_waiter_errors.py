"""The wait's refusals (pure builders) and the metrics helpers."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from horde_core.signals import SignalHub
from horde_oai.cancels import CancelManager
from horde_oai.errors import OpenAIError
from horde_oai.horde_client import HordeClient
from horde_oai.metrics import max_tokens_bucket, outcome_class_for
from horde_oai.waiter import (
    ChatWait,
    faulted_error,
    no_generation_error,
    queue_unavailable_error,
    timeout_error,
)


def test_faulted_uses_the_status_reason_then_the_signal():
    error = faulted_error(
        "r", {"fault_reason": "The worker's backend failed.", "fault_rc": "ChatWorkerFault"}, {}
    )
    assert (error.status, error.code) == (502, "ChatRequestFaulted")
    assert error.message == "The AI Horde faulted the request: The worker's backend failed."
    assert error.metadata == {
        "request_id": "r",
        "rc": "ChatWorkerFault",
        "fault_reason": "The worker's backend failed.",
    }
    assert error.headers == {"x-should-retry": "false"}
    from_signal = faulted_error("r", None, {"fault_reason": "gone", "fault_rc": None})
    assert from_signal.message.endswith("gone")
    assert faulted_error("r", None, {}).metadata == {"request_id": "r"}


def test_no_generation_and_timeout():
    assert no_generation_error("r").body()["error"]["code"] == "ChatRequestNoGeneration"
    timeout = timeout_error("r", 600)
    assert (timeout.status, timeout.code, timeout.metadata) == (
        408,
        "ChatRequestTimeout",
        {"request_id": "r"},
    )
    assert "600 seconds" in timeout.message


def test_queue_unavailable():
    none = queue_unavailable_error("r", "no_eligible_threads", 0, 0, 590)
    assert (none.status, none.code, none.param) == (503, "queue_unavailable", "horde.availability_mode")
    assert none.headers == {"Retry-After": "30", "x-should-retry": "false"}
    assert none.reason == "no_eligible_threads"
    assert "0 eligible worker threads" in none.message and "590 s of budget left" in none.message
    slow = queue_unavailable_error("r", "wait_exceeds_budget", 2, 5000, 100)
    assert slow.headers == {"Retry-After": "60", "x-should-retry": "false"}  # capped
    assert "estimated wait 5000 s" in slow.message


def test_outcome_classes_and_buckets():
    assert outcome_class_for("ok") == "served"
    assert outcome_class_for("no_eligible_worker", "grace") == "capacity"
    assert outcome_class_for("no_eligible_worker", "submit") == "unservable"
    assert outcome_class_for("SomethingNew") == "unclassified"
    assert max_tokens_bucket(600) == "768"
    assert max_tokens_bucket(16) == "16"
    assert max_tokens_bucket(20000) == "over"


# --- unanswered status reads (docs/openai-front.md#streaming) -------------------------------------------------------------

DONE = {
    "done": True,
    "faulted": False,
    "waiting": 0,
    "processing": 0,
    "is_possible": True,
    "generations": [{"state": "ok", "message": {"role": "assistant", "content": "hi"}, "worker_id": "w"}],
}


class NativeScript:
    """Answers the native status route from a list of steps (an int status, an exception, or "done") and
    records every call; a stand-in for the horde's HTTP peer, not for a store."""

    def __init__(self, *steps: object) -> None:
        self.steps = list(steps)
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request.method)
        if request.method == "DELETE":
            return httpx.Response(200, json=DONE)
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, Exception):
            raise step
        if step == "done":
            return httpx.Response(200, json=DONE)
        return httpx.Response(int(step), json={"message": "busy"})  # type: ignore[call-overload]


async def wait_with(script: NativeScript) -> dict[str, object]:
    client = HordeClient("http://horde.test/api", transport=httpx.MockTransport(script))
    cancels = CancelManager(client, 30)
    wait = ChatWait(
        request_id="r",
        submitted_at=time.time(),
        budget=30,
        client=client,
        hub=SignalHub(None),
        cancels=cancels,
        recheck_seconds=0.01,
        grace_seconds=30,
        models=["m"],
    )
    try:
        return await wait.run()
    finally:
        await client.aclose()


async def test_two_unanswered_reads_are_tolerated():
    script = NativeScript(503, 502, "done")
    status = await wait_with(script)
    assert status["done"] is True
    assert "DELETE" not in script.calls


async def test_a_third_unanswered_read_cancels_the_request():
    script = NativeScript(503)
    with pytest.raises(OpenAIError) as failed:
        await wait_with(script)
    assert failed.value.status >= 500
    assert script.calls.count("GET") == 3 and script.calls[-1] == "DELETE"
    # The request was cancelled: a retry of the call would only meet it again.
    assert failed.value.headers["x-should-retry"] == "false"


async def test_a_stale_keepalive_connection_is_read_again_at_once():
    script = NativeScript(httpx.RemoteProtocolError("closed"), "done")
    status = await wait_with(script)
    assert status["done"] is True and script.calls == ["GET", "GET"]


async def test_transport_failures_count_as_unanswered_and_then_cancel():
    script = NativeScript(httpx.ConnectError("refused"))
    with pytest.raises(OpenAIError) as failed:
        await wait_with(script)
    assert failed.value.code == "HordeUnavailable"
    assert script.calls.count("GET") == 6 and script.calls[-1] == "DELETE"  # 3 reads, each tried twice


async def test_progress_spares_the_periodic_status_reads():
    running = {
        "done": False,
        "faulted": False,
        "waiting": 0,
        "processing": 1,
        "is_possible": True,
        "generations": [],
    }
    reads: list[float] = []

    def native(request: httpx.Request) -> httpx.Response:
        reads.append(time.time())
        return httpx.Response(200, json=DONE if time.time() > finish_at else running)

    client = HordeClient("http://horde.test/api", transport=httpx.MockTransport(native))
    wait = ChatWait(
        request_id="r",
        submitted_at=time.time(),
        budget=30,
        client=client,
        hub=SignalHub(None),
        cancels=CancelManager(client, 30),
        recheck_seconds=0.4,
        grace_seconds=30,
        models=["m"],
    )
    finish_at = time.time() + 2.5
    task = asyncio.create_task(wait.run())
    try:
        while time.time() < finish_at - 0.5:  # a worker posting every 50 ms
            wait.progress_seen()
            await asyncio.sleep(0.05)
        during_progress = len(reads)
        status = await asyncio.wait_for(task, 5)
    finally:
        await client.aclose()
    assert status["done"] is True
    # Without progress a 0.4 s recheck reads about 5 times in those 2 s; with it, only the first read.
    assert during_progress <= 2
    assert len(reads) > during_progress  # reads resume once the posts stop


def test_the_nonstream_budget_ends_before_the_sdks_own_timeout():
    import openai
    from horde_oai.settings import OaiSettings

    budget = OaiSettings.model_fields["oai_nonstream_timeout_seconds"].default
    assert openai.DEFAULT_TIMEOUT.read is not None and budget < openai.DEFAULT_TIMEOUT.read
