"""x-should-retry on every error the front returns (docs/openai-front.md#retries-and-idempotency): true only where a retry
of the same call is safe (it joins the same operation) and may help."""

from __future__ import annotations

import pytest
from horde_oai.completions import stream_busy, stream_not_resumable
from horde_oai.errors import OpenAIError, bad_request, no_eligible_worker
from horde_oai.native_errors import map_native_error
from horde_oai.waiter import faulted_error, no_generation_error, queue_unavailable_error, timeout_error


@pytest.mark.parametrize(
    ("error", "should_retry"),
    [
        (bad_request("x"), "false"),
        (OpenAIError(401, "no key", "invalid_api_key"), "false"),
        (OpenAIError(413, "too big", "RequestTooLarge"), "false"),
        (OpenAIError(408, "slow body", "RequestBodyTimeout"), "true"),
        (OpenAIError(500, "bug", "InternalServerError"), "true"),
        (OpenAIError(502, "down", "HordeUnavailable"), "true"),
        (OpenAIError(503, "full", "FrontAtCapacity", headers={"Retry-After": "1"}), "true"),
        (stream_busy(), "true"),
        (stream_not_resumable(), "false"),
        (no_eligible_worker("none", stage="submit"), "false"),
        (timeout_error("r", 540), "false"),
        (faulted_error("r", {"fault_reason": "boom"}, {}), "false"),
        (no_generation_error("r"), "false"),
        (queue_unavailable_error("r", "wait_exceeds_budget", 1, 90, 30), "false"),
        (map_native_error(429, {"message": "slow down", "rc": "TooManyPrompts"}), "true"),
        (map_native_error(503, {"message": "off", "rc": "ChatAdmissionDisabled"}), "true"),
        (map_native_error(403, {"message": "pay", "rc": "KudosUpfront"}), "false"),
        (map_native_error(400, {"message": "dup", "rc": "OperationKeyConflict"}), "false"),
        (map_native_error(500, {}), "true"),
    ],
)
def test_every_error_says_whether_to_retry(error: OpenAIError, should_retry: str) -> None:
    assert error.response().headers["x-should-retry"] == should_retry


def test_an_error_of_a_created_request_is_settled() -> None:
    error = OpenAIError(502, "The Horde could not be reached: ReadTimeout", "HordeUnavailable")
    assert error.should_retry
    assert error.settled() is error and not error.should_retry
    assert error.response().headers["x-should-retry"] == "false"


def test_a_recorded_error_comes_back_the_same() -> None:
    import json

    error = faulted_error("r-1", {"fault_reason": "boom", "fault_rc": "WorkerFault"}, {})
    again = OpenAIError.from_record(json.dumps(error.to_record()))
    assert again is not None
    assert (again.status, again.body(), again.headers) == (error.status, error.body(), error.headers)
    assert OpenAIError.from_record("not json") is None
    assert OpenAIError.from_record('{"status": 400}') is None
