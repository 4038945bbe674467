"""Pure mapping: completion building, fingerprint, usage estimate, native error mapping."""

from __future__ import annotations

import hashlib

from horde_oai.completion import (
    build_completion,
    build_system_fingerprint,
    build_usage,
    completion_limit_source,
    effective_completion_limit,
    estimate_prompt_tokens,
)
from horde_oai.native_errors import declaration_gap_error, map_native_error, split_native_path
from horde_oai.native_request import build_native_body

REQUEST_ID = "7b3f8e9a-1111-4222-8333-944455556666"


def status_with(message: dict, **generation: object) -> dict:
    gen = {
        "id": "g1",
        "worker_id": "w-1",
        "worker_name": "worker one",
        "model": "org/model-a",
        "state": "ok",
        "text": message.get("content") or "",
        "message": message,
        "finish_reason": "stop",
        **generation,
    }
    return {
        "done": True,
        "faulted": False,
        "finished": 1,
        "processing": 0,
        "waiting": 0,
        "kudos": 12,
        "generations": [gen],
    }


def test_fingerprint_is_fp_and_ten_hex_of_worker_and_model():
    expected = "fp_" + hashlib.sha256(b"w-1:org/model-a").hexdigest()[:10]
    assert build_system_fingerprint("w-1", "org/model-a") == expected
    assert build_system_fingerprint(None, "org/model-a") is None
    assert build_system_fingerprint("w-1", "m") != build_system_fingerprint("w-2", "m")


def test_effective_limit_order():
    lowered = [{"from": 4096, "to": 2048, "reason": "worker_max_length"}]
    assert effective_completion_limit({"max_tokens": 4096}, lowered) == 2048
    assert effective_completion_limit({"max_tokens": 100, "max_completion_tokens": 200}) == 200
    assert effective_completion_limit({"max_tokens": 100}) == 100
    assert effective_completion_limit({}) == 512
    assert completion_limit_source({}, None) == "default"
    assert completion_limit_source({"max_tokens": 9}, None) == "client"
    assert completion_limit_source({"max_tokens": 9}, lowered) == "lowered"


def test_usage_uses_reported_counts_unchanged():
    gen = {
        "message": {"content": "hello"},
        "prompt_tokens": 7,
        "completion_tokens": 900,
        "reasoning_tokens": 3,
    }
    usage, estimated = build_usage(gen, prompt_estimate=50, limit=16)
    assert usage == {
        "prompt_tokens": 7,
        "completion_tokens": 900,
        "total_tokens": 907,
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    assert estimated is False


def test_usage_estimates_are_capped_and_flagged():
    reasoning = "r" * 400  # 100 tokens
    gen = {
        "message": {
            "content": "a" * 40,
            "reasoning_content": reasoning,
            "tool_calls": [{"function": {"name": "f", "arguments": "x" * 39}}],
        }
    }
    usage, estimated = build_usage(gen, prompt_estimate=33, limit=1000)
    # (40 + 400 + 1 + 39) / 4 = 120
    assert usage["completion_tokens"] == 120
    assert usage["prompt_tokens"] == 33
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 100}
    assert estimated is True
    capped, _ = build_usage(gen, prompt_estimate=33, limit=50)
    assert capped["completion_tokens"] == 50
    assert capped["completion_tokens_details"] == {"reasoning_tokens": 50}


def test_usage_omits_reasoning_details_without_reasoning():
    usage, _ = build_usage({"message": {"content": "hi"}}, prompt_estimate=1, limit=10)
    assert "completion_tokens_details" not in usage


def test_prompt_estimate_counts_images():
    text_only = estimate_prompt_tokens([{"role": "user", "content": "hello"}])
    with_image = estimate_prompt_tokens(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hello"},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                ],
            }
        ]
    )
    assert text_only >= 1
    assert with_image >= text_only + 512


def test_completion_shape():
    status = status_with(
        {"role": "assistant", "content": "Hello there", "reasoning_content": "thinking"},
        prompt_tokens=5,
        completion_tokens=3,
        native_finish_reason="eos",
    )
    status["context_adjustments"] = [{"from": 2048, "to": 4096, "reason": "grow"}]
    body = {"model": "org/model-a", "messages": [{"role": "user", "content": "hi"}]}
    completion = build_completion(
        request_id=REQUEST_ID, created=1700000000, body=body, status=status, prompt_estimate=2
    )
    assert completion["id"] == f"chatcmpl-{REQUEST_ID}"
    assert completion["object"] == "chat.completion"
    assert completion["created"] == 1700000000
    assert completion["model"] == "org/model-a"
    assert completion["system_fingerprint"] == build_system_fingerprint("w-1", "org/model-a")
    choice = completion["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hello there",
        "reasoning_content": "thinking",
    }
    assert choice["finish_reason"] == "stop"
    assert choice["native_finish_reason"] == "eos"
    # Reported prompt and completion counts; the reasoning count is estimated (no reported count).
    assert completion["usage"]["prompt_tokens"] == 5
    assert completion["usage"]["completion_tokens"] == 3
    assert completion["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
    assert completion["x_horde"]["context_adjustments"] == status["context_adjustments"]
    assert completion["x_horde"]["estimated_usage"] is True
    assert "notice" not in completion["x_horde"]


def test_completion_hides_reasoning_when_asked_and_models_request_uses_served_model():
    status = status_with({"role": "assistant", "content": "x", "reasoning_content": "why"}, model="org/b")
    body = {"models": ["org/a", "org/b"], "messages": [], "horde": {"include_reasoning": False}}
    completion = build_completion(
        request_id=REQUEST_ID, created=1, body=body, status=status, prompt_estimate=1
    )
    assert "reasoning_content" not in completion["choices"][0]["message"]
    # The count is returned even when the text is hidden.
    assert completion["usage"]["completion_tokens_details"]["reasoning_tokens"] == 1
    assert completion["model"] == "org/b"


def test_completion_tool_calls_content_null_and_notice():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]
    status = status_with(
        {"role": "assistant", "content": None, "tool_calls": calls}, finish_reason="tool_calls"
    )
    completion = build_completion(
        request_id=REQUEST_ID, created=1, body={"model": "m"}, status=status, prompt_estimate=1
    )
    message = completion["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == calls
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert "notice" not in completion["x_horde"]
    empty = build_completion(
        request_id=REQUEST_ID,
        created=1,
        body={"model": "m"},
        status=status_with({"role": "assistant", "content": "  "}),
        prompt_estimate=1,
    )
    assert empty["x_horde"]["notice"]
    reasoning_only = build_completion(
        request_id=REQUEST_ID,
        created=1,
        body={"model": "m"},
        status=status_with(
            {"role": "assistant", "content": "", "reasoning_content": "hmm"}, finish_reason="length"
        ),
        prompt_estimate=1,
    )
    assert "max_tokens" in reasoning_only["x_horde"]["notice"]


def test_completion_without_worker_id_has_null_fingerprint_and_falls_back_to_request_model():
    status = status_with({"role": "assistant", "content": "x"}, worker_id=None, model=None)
    completion = build_completion(
        request_id=REQUEST_ID, created=1, body={"models": ["a", "b"]}, status=status, prompt_estimate=1
    )
    assert completion["system_fingerprint"] is None
    assert completion["model"] == "a"


def test_native_body_forwards_applied_keys_with_operation_key():
    screened = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "user": "u",
        "metadata": {"a": "b"},
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": None,
        "horde": {"conformance": "best_effort"},
    }
    native = build_native_body(screened, "11111111-2222-4333-8444-555555555555")
    assert native == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "horde": {"conformance": "best_effort", "operation_key": "11111111-2222-4333-8444-555555555555"},
    }


def test_split_native_path():
    assert split_native_path("'models[1]': the model 'x' is not known.") == (
        "models[1]",
        "the model 'x' is not known.",
    )
    assert split_native_path("no path here") == (None, "no path here")


def test_unknown_model_maps_to_404_with_the_rc_as_code_and_path():
    error = map_native_error(
        404, {"message": "'models[1]': the model 'x' is not known to this horde.", "rc": "UnknownChatModel"}
    )
    assert error.status == 404
    assert error.code == "UnknownChatModel"
    assert error.type == "invalid_request_error"
    assert error.param == "models[1]"
    assert error.message == "the model 'x' is not known to this horde."
    assert error.metadata == {}


def test_no_eligible_worker_without_gap_is_503_with_retry_headers():
    error = map_native_error(
        403, {"message": "No worker is currently serving the model 'm'.", "rc": "NoEligibleWorker"}
    )
    assert error.status == 503
    assert error.code == "no_eligible_worker"
    assert error.message == "No worker is currently serving the model 'm'. Retry later."
    assert error.headers == {"Retry-After": "30", "x-should-retry": "false"}
    assert error.stage == "submit"
    assert "metadata" not in error.body()["error"]


def test_no_eligible_worker_with_feature_gap_is_404_without_retry():
    gap = {"kind": "declaration_gap", "missing_declarations": ["vision"], "exceeded_limits": []}
    error = map_native_error(
        403,
        {
            "message": "No online worker can serve this request: ...",
            "rc": "NoEligibleWorker",
            "impossible_reason": gap,
        },
        models=["m"],
    )
    assert error.status == 404
    assert error.code == "no_worker_supports_features"
    assert error.type == "not_found_error"
    assert error.param is None
    assert error.headers == {"x-should-retry": "false"}  # no Retry-After; a settled refusal
    assert (
        error.message
        == "No worker can serve this request: no online worker serving the model declares vision."
    )


def test_gap_error_after_submit_states_cancel_and_request_id():
    gap = {"kind": "declaration_gap", "missing_declarations": ["reasoning_effort"], "exceeded_limits": []}
    error = declaration_gap_error(gap, ["m"], request_id="rid")
    assert error.body() == {
        "error": {
            "message": "No worker can serve this request: no online worker serving the model declares "
            "reasoning_effort. The request was cancelled.",
            "type": "not_found_error",
            "param": None,
            "code": "no_worker_supports_features",
            "metadata": {"request_id": "rid"},
        }
    }
    guarantee = declaration_gap_error(
        {"kind": "declaration_gap", "missing_declarations": ["tool_choice_enforced"], "exceeded_limits": []},
        ["m"],
        request_id=None,
    )
    assert "best_effort" in guarantee.message


def test_size_only_gap_is_400_no_worker_supports_limit():
    gap = {"kind": "declaration_gap", "missing_declarations": [], "exceeded_limits": ["max_length"]}
    error = declaration_gap_error(gap, ["m"], request_id=None, chat_entries={"m": {"max_length": 1024}})
    assert error.status == 400
    assert error.code == "no_worker_supports_limit"
    assert error.param == "max_tokens"
    assert error.headers == {"x-should-retry": "false"}  # no Retry-After; a settled refusal
    assert error.message == (
        "No worker eligible for this request currently declares a completion limit that high. "
        "The largest any online worker for the model declares now is 1024 tokens."
    )
    ctx = declaration_gap_error(
        {"kind": "declaration_gap", "missing_declarations": [], "exceeded_limits": ["max_context_length"]},
        ["a", "b"],
        request_id=None,
        chat_entries={"a": {"max_context_length": 4096}, "b": {"max_context_length": 8192}},
    )
    assert ctx.param == "horde.max_context_length"
    assert "for the listed models declares now is 8192 tokens" in ctx.message
    mixed = declaration_gap_error(
        {"kind": "declaration_gap", "missing_declarations": ["seed"], "exceeded_limits": ["max_length"]},
        ["m"],
        request_id=None,
    )
    assert mixed.status == 404


def test_kudos_cap_maps_with_metadata():
    message = (
        "The request's kudos estimate at current pricing is 215, above its horde.max_kudos of 1. "
        "The estimate assumes the full max_tokens is generated."
    )
    error = map_native_error(400, {"message": message, "rc": "ChatKudosCapExceeded"})
    assert error.body() == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "horde.max_kudos",
            "code": "max_kudos_exceeded",
            "metadata": {"rc": "ChatKudosCapExceeded", "kudos_estimate": 215, "max_kudos": 1},
        }
    }
    odd = map_native_error(400, {"message": "capped", "rc": "ChatKudosCapExceeded"})
    assert odd.metadata == {"rc": "ChatKudosCapExceeded"}


def test_native_validation_failure_names_the_openai_field():
    error = map_native_error(
        400,
        {
            "message": "Input payload validation failed",
            "errors": {"max_length": "20000 is greater than the maximum of 16384"},
        },
    )
    assert (error.status, error.code, error.param) == (400, "BadRequest", "max_tokens")
    core = map_native_error(
        400, {"message": "Input payload validation failed: stop_sequence: too long", "rc": None}
    )
    assert core.param == "stop"


def test_other_native_errors_pass_rc_through():
    assert (
        map_native_error(401, {"message": "bad key", "rc": "InvalidAPIKey"}).body()["error"]["code"]
        == "InvalidAPIKey"
    )
    limited = map_native_error(429, {"message": "slow down"}, headers={"retry-after": "2"})
    assert (limited.status, limited.code, limited.headers) == (
        429,
        "rate_limit_exceeded",
        {"Retry-After": "2", "x-should-retry": "true"},
    )
    conflict = map_native_error(400, {"message": "'tool_choice': not defined", "rc": "ChatRequestConflict"})
    assert (conflict.param, conflict.message, conflict.code) == (
        "tool_choice",
        "not defined",
        "ChatRequestConflict",
    )
    assert map_native_error(500, {}).code == "HordeUnavailable"
    disabled = map_native_error(503, {"message": "off", "rc": "ChatAdmissionDisabled"})
    assert (disabled.status, disabled.code) == (503, "ChatAdmissionDisabled")
