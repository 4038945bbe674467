"""The wait's refusals (pure builders) and the metrics helpers."""

from __future__ import annotations

from horde_oai.metrics import max_tokens_bucket, outcome_class_for
from horde_oai.waiter import faulted_error, no_generation_error, queue_unavailable_error, timeout_error


def test_faulted_uses_the_status_reason_then_the_signal():
    error = faulted_error(
        "r", {"fault_reason": "The worker's backend failed.", "fault_rc": "ChatWorkerFault"}, {}
    )
    assert (error.status, error.code) == (502, "ChatRequestFaulted")
    assert error.message == "The AI Horde faulted the request: The worker's backend failed."
    assert error.metadata == {"request_id": "r", "rc": "ChatWorkerFault"}
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
    assert none.headers == {"Retry-After": "30"}
    assert none.reason == "no_eligible_threads"
    assert "0 eligible worker threads" in none.message and "590 s of budget left" in none.message
    slow = queue_unavailable_error("r", "wait_exceeds_budget", 2, 5000, 100)
    assert slow.headers == {"Retry-After": "60"}  # capped
    assert "estimated wait 5000 s" in slow.message


def test_outcome_classes_and_buckets():
    assert outcome_class_for("ok") == "served"
    assert outcome_class_for("no_eligible_worker", "grace") == "capacity"
    assert outcome_class_for("no_eligible_worker", "submit") == "unservable"
    assert outcome_class_for("SomethingNew") == "unclassified"
    assert max_tokens_bucket(600) == "768"
    assert max_tokens_bucket(16) == "16"
    assert max_tokens_bucket(20000) == "over"
