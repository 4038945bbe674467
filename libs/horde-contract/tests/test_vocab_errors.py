"""Constants, vocabularies, rc codes and the error type (docs/native-api.md, values as the spec names them)."""

from __future__ import annotations

import horde_contract as hc


def test_limits() -> None:
    assert hc.MAX_CHAT_MODEL_COUNT == 5
    assert hc.MAX_CHAT_MESSAGE_COUNT == 1024
    assert hc.MAX_CHAT_TEXT_BYTES == 1024 * 1024
    assert hc.MAX_CHAT_TOOL_COUNT == 128
    assert hc.MAX_CHAT_TOOL_SPEC_BYTES == 256 * 1024
    assert hc.MAX_CHAT_SCHEMA_NESTING == 10
    assert hc.MAX_CHAT_TOOL_CALL_COUNT == 128
    assert hc.MAX_CHAT_TOOL_CALL_ID_LENGTH == 256
    assert hc.MAX_CHAT_IMAGE_COUNT == 20
    assert hc.MAX_CHAT_IMAGE_BYTES == 5 * 1024 * 1024
    assert hc.MAX_CHAT_IMAGE_TOTAL_BYTES == 25 * 1024 * 1024
    assert hc.MAX_CHAT_IMAGE_TOTAL_BYTES_UNTRUSTED == 5 * 1024 * 1024
    assert hc.MAX_CHAT_IMAGE_PIXELS == 3072 * 3072
    assert hc.MAX_CHAT_BODY_BYTES == 36 * 1024 * 1024
    assert hc.CHAT_IMAGE_PROMPT_TOKENS == 512
    assert (
        hc.MIN_CHAT_MAX_TOKENS == 16 and hc.DEFAULT_CHAT_MAX_TOKENS == 512 and hc.MAX_CHAT_MAX_TOKENS == 16384
    )
    assert hc.MAX_CHAT_FAULT_REASON_LENGTH == 1000
    assert hc.FAULTED_GENERATIONS_LIMIT == 2
    assert hc.TEXT_JOB_LEASE_SECONDS == 150
    assert dict(hc.OPENAI_SAMPLING_RANGES) == {
        "temperature": (0.0, 2.0),
        "top_p": (0.0, 1.0),
        "frequency_penalty": (-2.0, 2.0),
        "presence_penalty": (-2.0, 2.0),
    }
    assert dict(hc.CHAT_SAMPLING_DEFAULTS) == {
        "temperature": 1.0,
        "top_p": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "rep_pen": 1.0,
        "top_k": 0,
        "min_p": 0.0,
    }
    assert hc.OPERATION_FINGERPRINT_EXCLUDED_HORDE_KEYS == {
        "availability_mode",
        "dry_run",
        "include_reasoning",
        "max_kudos",
        "operation_key",
    }


def test_vocabularies() -> None:
    assert [f.value for f in hc.ChatFeature] == [
        "seed",
        "reasoning_effort",
        "presence_penalty",
        "frequency_penalty",
        "vision",
        "tools",
        "json_object",
        "json_schema",
        "tools_with_response_format",
    ]
    assert [g.value for g in hc.ChatGuarantee] == [
        "tool_choice_enforced",
        "single_tool_call_enforced",
        "structured_output_enforced",
        "prompt_overflow_refused",
    ]
    assert [e.value for e in hc.ChatReasoningEffort] == ["none", "minimal", "low", "medium", "high", "xhigh"]
    assert [e.value for e in hc.ChatFinishReason] == ["stop", "length", "content_filter", "tool_calls"]
    assert [e.value for e in hc.ChatImageTransport] == ["url", "base64", "messages_url"]
    assert [e.value for e in hc.ChatContextAdjustmentReason] == [
        "grow",
        "truncate_oldest",
        "worker_max_length",
    ]
    assert [e.value for e in hc.ChatContextFit] == ["grow", "reject", "truncate_oldest"]
    assert [e.value for e in hc.ChatConformance] == ["strict", "best_effort"]


def test_fault_messages() -> None:
    assert dict(hc.CHAT_WORKER_FAULT_MESSAGES) == {
        "prompt_overflow": "The worker could not fit the prompt into its context.",
        "unbuildable_grammar": "The worker could not build the grammar the request's tool choice or response format needs.",
        "tool_violation": "The model's reply broke the request's tool controls.",
        "reply_refused": "The AI Horde refused the worker's reply.",
        "generation_error": "The worker's backend failed while generating.",
    }
    assert hc.chat_worker_fault_message("reply_refused") == "The AI Horde refused the worker's reply."
    assert hc.chat_worker_fault_message("nope") is None
    assert hc.chat_worker_fault_message(None) is None
    assert hc.chat_worker_fault_label(None) == "none"
    assert hc.chat_worker_fault_label("nope") == "unknown"
    assert hc.chat_worker_fault_label(5) == "unknown"
    assert hc.chat_worker_fault_label("tool_violation") == "tool_violation"


def test_rc_values() -> None:
    assert hc.RC.InvalidExtraSourceImages == "InvalidExtraSourceImages."
    names = {rc.name for rc in hc.RC}
    for rc in hc.RC:
        if rc.name != "InvalidExtraSourceImages":
            assert rc.value == rc.name
    for needed in (
        "BadRequest UnsupportedChatParameter ChatRequestConflict UnknownChatModel NoEligibleWorker "
        "ChatAdmissionDisabled RequestTooLarge OperationKeyConflict ChatKudosCapExceeded PromptExceedsContext "
        "ChatDeclarationInvalid ChatSubmitInvalid ChatSubmitNonconformant ChatModelMismatch ChatWorkerFault "
        "AbortedGen DuplicateGen InvalidJobID RequestNotFound InvalidAPIKey WrongCredentials TooManyPrompts "
        "KudosUpfront ChatJobAborted ChatProgressNotStreaming ChatProgressOutOfSequence ChatProgressCapReached "
        "ChatProgressUnavailable TooManyExtraSourceImages SourceImageSizeExceeded SourceImageResolutionExceeded "
        "SourceImageUnreadable SourceImageUrlRefused SourceImageUrlInvalid ChatImageStorageUnavailable"
    ).split():
        assert needed in names


def test_error_body_and_repr() -> None:
    err = hc.HordeError(409, hc.RC.ChatProgressOutOfSequence, "seq 5 is not next", "seq", {"expected_seq": 3})
    assert err.to_body() == {
        "message": "seq 5 is not next",
        "rc": "ChatProgressOutOfSequence",
        "expected_seq": 3,
    }
    assert err.openai_message == err.message == str(err)
    assert "ChatProgressOutOfSequence" in repr(err)
    prefixed = hc.path_error(400, hc.RC.BadRequest, "models[1]", "bad")
    match = hc.NATIVE_REQUEST_PATH_PATTERN.match(prefixed.message)
    assert match is not None and match.group("path") == "models[1]"
    assert prefixed.openai_message == "bad"
    assert (
        hc.unsupported_value("n", 2).openai_message
        == "Unsupported value: 'n' does not support 2 on the Horde."
    )


def test_model_and_worker_errors(refusal) -> None:  # type: ignore[no-untyped-def]
    refusal(
        hc.unknown_chat_model_error("x", "models[1]"),
        404,
        "UnknownChatModel",
        "models[1]",
        "'models[1]': the model 'x' is not known to this horde.",
    )
    refusal(
        hc.no_serving_worker_error(["a"]),
        403,
        "NoEligibleWorker",
        "model",
        "No worker is currently serving the model 'a'.",
    )
    refusal(
        hc.no_serving_worker_error(["a", "b"]),
        403,
        "NoEligibleWorker",
        "models",
        "No worker is currently serving any of the models 'a', 'b'.",
    )
    gap = {"kind": "declaration_gap", "missing_declarations": ["vision"], "exceeded_limits": []}
    err = hc.no_eligible_worker_error(gap)
    assert err.to_body() == {
        "message": "No online worker can serve this request: no online worker serving the model declares vision.",
        "rc": "NoEligibleWorker",
        "impossible_reason": gap,
    }
    assert hc.no_eligible_worker_error(None).to_body() == {
        "message": "No online worker can serve this request.",
        "rc": "NoEligibleWorker",
    }
    limits = {"kind": "declaration_gap", "missing_declarations": [], "exceeded_limits": ["max_length"]}
    assert hc.no_eligible_worker_message(limits) == (
        "No online worker can serve this request: the request exceeds the max_length limit of every online worker "
        "serving the model."
    )
    both = {
        "kind": "declaration_gap",
        "missing_declarations": ["seed", "tools", "vision"],
        "exceeded_limits": ["max_context_length", "max_length"],
    }
    assert hc.no_eligible_worker_message(both) == (
        "No online worker can serve this request: no online worker serving the model declares seed, tools or "
        "vision; the request exceeds the max_context_length and max_length limits of every online worker serving "
        "the model."
    )
    refusal(
        hc.source_image_total_error(10, 5, encoded=True),
        400,
        "SourceImageSizeExceeded",
        "messages",
        "The request's images encode to 10 bytes, above the cap of 5 bytes.",
    )
    refusal(
        hc.prompt_exceeds_context_error(900, 800),
        400,
        "PromptExceedsContext",
        "messages",
        "The messages are estimated at 900 prompt tokens, above the 800 tokens the context leaves beside max_tokens.",
    )


def test_load_json_body(refusal) -> None:  # type: ignore[no-untyped-def]
    assert hc.load_json_body(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    assert hc.load_json_body('"x"') == "x"
    for raw in (
        b"{",
        b'{"a": NaN}',
        b"[Infinity]",
        b"-Infinity",
        b"[" * 100_000,
        b'{"t": 1e400}',
        b"[-1e999]",
    ):
        try:
            hc.load_json_body(raw)
        except hc.HordeError as exc:
            refusal(exc, 400, "BadRequest", None, "The request body is not valid JSON.")
        else:  # pragma: no cover
            raise AssertionError(raw)
    try:
        hc.load_json_body(b"\xff")
    except hc.HordeError as exc:
        refusal(exc, 400, "BadRequest", None, "The request body is not UTF-8 JSON.")
    for nul_body in (b'{"a": "x\\u0000"}', '{"a": "x\x00"}'):
        try:
            hc.load_json_body(nul_body)
        except hc.HordeError as exc:
            refusal(exc, 400, "NulByteInPayload", None, "The request body contains a NUL character.")
    assert hc.load_json_body(b'{"a": "x\\u0000"}', refuse_nul=False) == {"a": "x\x00"}
    # an escaped backslash before u0000 is no NUL
    assert hc.load_json_body(b'{"k": ["C:\\\\u0000", 1]}') == {"k": ["C:\\u0000", 1]}
    for raw in (b'{"a": "\\ud800"}', b'{"a": ["x\\uDFFF"]}', b'{"\\udc00": 1}'):
        try:
            hc.load_json_body(raw)
        except hc.HordeError as exc:
            refusal(
                exc,
                400,
                "BadRequest",
                None,
                "The request body holds a lone UTF-16 surrogate, which is not valid Unicode.",
            )
        else:  # pragma: no cover
            raise AssertionError(raw)
    # a surrogate pair is one character; an escaped backslash before ud800 is no surrogate
    assert hc.load_json_body(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    assert hc.load_json_body(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}
    try:
        hc.load_json_body(b'{"k\\u0000": [1]}')
    except hc.HordeError as exc:
        assert exc.rc == "NulByteInPayload"
    else:  # pragma: no cover
        raise AssertionError("NUL in a key")
