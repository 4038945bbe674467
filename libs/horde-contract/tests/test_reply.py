"""Submit bodies, reply verification, the stored reply and its charge (docs/native-api.md#submit,
#reasoning, #reply-verification, #pricing)."""

from __future__ import annotations

import copy
from typing import Any

import horde_contract as hc
import pytest

INV = "ChatSubmitInvalid"
N = "ChatSubmitNonconformant"
CALL_F = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CALL_G = {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}
MSG = {"role": "assistant", "content": "hello"}
SUBMIT = {"id": "gen-1", "model_id": "m", "message": MSG, "finish_reason": "stop"}


def submit(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(SUBMIT)
    for key, value in changes.items():
        if value is ...:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def msg(**changes: Any) -> dict[str, Any]:
    out = dict(MSG)
    out.update(changes)
    return {k: v for k, v in out.items() if v is not ...}


SUBMIT_REFUSALS = [
    ("not-object", [], 400, "BadRequest", None, "The submit body has to be a JSON object."),
    ("id-missing", submit(id=...), 400, INV, "id", "'id': has to be the generation id (a string)."),
    (
        "state",
        submit(state="done"),
        400,
        INV,
        "state",
        "'state': has to be one of ok, censored, csam, faulted.",
    ),
    ("seed", submit(seed="1"), 400, INV, "seed", "'seed': has to be an integer of at most 64 bits."),
    ("seed-range", submit(seed=2**63), 400, INV, "seed", "'seed': has to be an integer of at most 64 bits."),
    (
        "gen-metadata",
        submit(gen_metadata=[1]),
        400,
        INV,
        "gen_metadata",
        "'gen_metadata': has to be an array of objects.",
    ),
    (
        "generation-and-message",
        submit(generation="x"),
        400,
        INV,
        "generation",
        "'generation': a chat submit sends message, not generation.",
    ),
    (
        "model-id-missing",
        submit(model_id=...),
        400,
        INV,
        "model_id",
        "'model_id': has to be the assigned model (a string).",
    ),
    (
        "model-id-type",
        submit(model_id=5),
        400,
        INV,
        "model_id",
        "'model_id': has to be the assigned model (a string).",
    ),
    (
        "fault-reason-type",
        submit(fault_reason=5),
        400,
        INV,
        "fault_reason",
        "'fault_reason': has to be a string.",
    ),
    (
        "tokens-negative",
        submit(prompt_tokens=-1),
        400,
        INV,
        "prompt_tokens",
        "'prompt_tokens': has to be an integer from 0 to 10000000.",
    ),
    (
        "tokens-over",
        submit(completion_tokens=10_000_001),
        400,
        INV,
        "completion_tokens",
        "'completion_tokens': has to be an integer from 0 to 10000000.",
    ),
    (
        "tokens-bool",
        submit(reasoning_tokens=True),
        400,
        INV,
        "reasoning_tokens",
        "'reasoning_tokens': has to be an integer from 0 to 10000000.",
    ),
    (
        "native-long",
        submit(native_finish_reason="x" * 33),
        400,
        INV,
        "native_finish_reason",
        "'native_finish_reason': has to be a string of at most 32 characters.",
    ),
    (
        "native-type",
        submit(native_finish_reason=1),
        400,
        INV,
        "native_finish_reason",
        "'native_finish_reason': has to be a string of at most 32 characters.",
    ),
    ("message-missing", submit(message=...), 400, INV, "message", "'message': a chat submit needs message."),
    (
        "message-type",
        submit(message="hi"),
        400,
        INV,
        "message",
        "'message': has to be an object {role: assistant, content, tool_calls?, reasoning_content?}.",
    ),
    (
        "message-key",
        submit(message=msg(refusal=None)),
        400,
        INV,
        "message.refusal",
        "'message.refusal': is not a key of a reply message.",
    ),
    (
        "message-role",
        submit(message=msg(role="user")),
        400,
        INV,
        "message.role",
        "'message.role': has to be 'assistant'.",
    ),
    (
        "content-type",
        submit(message=msg(content=5)),
        400,
        INV,
        "message.content",
        "'message.content': has to be a string, or null with tool_calls.",
    ),
    (
        "content-null",
        submit(message=msg(content=None)),
        400,
        INV,
        "message.content",
        "'message.content': may be null only with tool_calls.",
    ),
    (
        "content-absent",
        submit(message=msg(content=...)),
        400,
        INV,
        "message.content",
        "'message.content': may be null only with tool_calls.",
    ),
    (
        "calls-empty",
        submit(message=msg(tool_calls=[])),
        400,
        INV,
        "message.tool_calls",
        "'message.tool_calls': has to hold 1 to 128 tool calls.",
    ),
    (
        "calls-over",
        submit(message=msg(tool_calls=[CALL_F] * 129)),
        400,
        INV,
        "message.tool_calls",
        "'message.tool_calls': has to hold 1 to 128 tool calls.",
    ),
    (
        "call-shape",
        submit(message=msg(tool_calls=[{**CALL_F, "type": "custom"}])),
        400,
        INV,
        "message.tool_calls[0]",
        "'message.tool_calls[0]': has to be {id, type: function, function: {name, arguments}}.",
    ),
    (
        "call-key",
        submit(message=msg(tool_calls=[{**CALL_F, "index": 0}])),
        400,
        INV,
        "message.tool_calls[0]",
        "'message.tool_calls[0]': has to be {id, type: function, function: {name, arguments}}.",
    ),
    (
        "call-args",
        submit(message=msg(tool_calls=[{**CALL_F, "function": {"name": "f", "arguments": {}}}])),
        400,
        INV,
        "message.tool_calls[0]",
        "'message.tool_calls[0]': has to be {id, type: function, function: {name, arguments}}.",
    ),
    (
        "call-id-empty",
        submit(message=msg(tool_calls=[{**CALL_F, "id": ""}])),
        400,
        INV,
        "message.tool_calls[0]",
        "'message.tool_calls[0]': has to be {id, type: function, function: {name, arguments}}.",
    ),
    (
        "reasoning-type",
        submit(message=msg(reasoning_content=1)),
        400,
        INV,
        "message.reasoning_content",
        "'message.reasoning_content': has to be a string.",
    ),
    (
        "reasoning-cap",
        submit(message=msg(reasoning_content="é" * (512 * 1024) + "x")),
        400,
        INV,
        "message.reasoning_content",
        "'message.reasoning_content': takes 1048577 bytes of UTF-8; at most 1048576 are allowed.",
    ),
    (
        "finish-missing",
        submit(finish_reason=...),
        400,
        INV,
        "finish_reason",
        "'finish_reason': has to be one of stop, length, content_filter, tool_calls.",
    ),
    (
        "finish-value",
        submit(finish_reason="eos"),
        400,
        INV,
        "finish_reason",
        "'finish_reason': has to be one of stop, length, content_filter, tool_calls.",
    ),
    (
        "finish-tool-calls-without-calls",
        submit(finish_reason="tool_calls"),
        400,
        INV,
        "finish_reason",
        "'finish_reason': tool_calls needs a non-empty message.tool_calls.",
    ),
    (
        "text-without-generation",
        {"id": "g", "state": "ok"},
        400,
        "BadRequest",
        "generation",
        "'generation': Missing required parameter 'generation'.",
    ),
    (
        "text-generation-type",
        {"id": "g", "generation": 5},
        400,
        "BadRequest",
        "generation",
        "'generation': Missing required parameter 'generation'.",
    ),
    (
        "text-id",
        {"generation": "x"},
        400,
        "BadRequest",
        "id",
        "'id': has to be the generation id (a string).",
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "status", "rc", "param", "message"), SUBMIT_REFUSALS, ids=[c[0] for c in SUBMIT_REFUSALS]
)
def test_submit_refusals(
    case: str, body: Any, status: int, rc: str, param: str | None, message: str, refusal: Any
) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_submit_body(body)
    refusal(info.value, status, rc, param, message)


def test_submit_accepted() -> None:
    text = hc.parse_submit_body(
        {
            "id": "g",
            "generation": "out",
            "state": "censored",
            "seed": 3,
            "gen_metadata": [{"type": "censorship"}],
        }
    )
    assert text == hc.TextSubmit(
        id="g", generation="out", state="censored", seed=3, gen_metadata=[{"type": "censorship"}]
    )
    assert hc.parse_submit_body({"id": "g", "generation": "", "seed": None, "state": None}) == hc.TextSubmit(
        id="g", generation=""
    )
    chat = hc.parse_submit_body(
        submit(
            message={
                "role": "assistant",
                "content": None,
                "tool_calls": [CALL_F],
                "reasoning_content": "think",
            },
            finish_reason="tool_calls",
            native_finish_reason="eos_token",
            prompt_tokens=0,
            completion_tokens=10_000_000,
        )
    )
    assert isinstance(chat, hc.ChatSubmit) and not chat.faulted
    assert chat.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL_F],
        "reasoning_content": "think",
    }
    assert (chat.prompt_tokens, chat.completion_tokens, chat.reasoning_tokens) == (0, 10_000_000, None)
    assert chat.native_finish_reason == "eos_token" and chat.finish_reason == "tool_calls"
    empty = hc.parse_submit_body(submit(message=msg(content="")))
    assert empty.message == {"role": "assistant", "content": ""}  # type: ignore[union-attr]
    # A forced choice may finish with stop and calls.
    assert hc.parse_submit_body(submit(message=msg(tool_calls=[CALL_F]))).finish_reason == "stop"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        {"id": "g", "state": "faulted", "model_id": "m"},
        {"id": "g", "state": "faulted", "model_id": "m", "fault_reason": "prompt_overflow"},
        {"id": "g", "state": "faulted", "model_id": "m", "fault_reason": "something new", "message": "junk"},
    ],
)
def test_faulted_chat_submit(body: dict[str, Any]) -> None:
    parsed = hc.parse_submit_body(body)
    assert isinstance(parsed, hc.ChatSubmit) and parsed.faulted and parsed.message is None
    assert parsed.fault_reason == body.get("fault_reason")
    with pytest.raises(hc.HordeError) as info:
        hc.verify_chat_reply(parsed, None)
    assert info.value.rc == INV


def test_fault_reason_marks_a_chat_submit() -> None:
    parsed = hc.parse_submit_body(
        {
            "id": "g",
            "state": "faulted",
            "model_id": "m",
            "fault_reason": "generation_error",
            "generation": "x",
        }
    )
    assert isinstance(parsed, hc.ChatSubmit)


# -- verification ------------------------------------------------------------------------------------------------

F_TOOL = {"type": "function", "function": {"name": "f"}}
G_TOOL = {"type": "function", "function": {"name": "g"}}
TOOLS = [F_TOOL, G_TOOL]
FORCE_F = {"type": "function", "function": {"name": "f"}}
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}},
    "required": ["n"],
    "additionalProperties": False,
}


def fmt(schema: Any = None, strict: bool | None = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "s", "schema": SCHEMA if schema is None else schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


def reply(
    content: str | None = "hello", calls: list[dict[str, Any]] | None = None, finish: str = "stop"
) -> hc.ChatSubmit:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return hc.ChatSubmit(id="g", model_id="m", message=message, finish_reason=finish)


# (id, reply, extras, strict outcome, best_effort outcome); an outcome is ("ok", finish) or (rc, param, message)
VERIFY_CASES: list[tuple[str, hc.ChatSubmit, dict[str, Any] | None, tuple[Any, ...], tuple[Any, ...]]] = [
    ("plain", reply(), None, ("ok", "stop"), ("ok", "stop")),
    (
        "call-without-tools",
        reply(calls=[CALL_F]),
        None,
        (
            INV,
            "message.tool_calls[0].function.name",
            "The reply calls the function 'f', which the request does not define.",
        ),
        (INV,),
    ),
    (
        "call-undefined",
        reply(calls=[{**CALL_F, "function": {"name": "h", "arguments": ""}}]),
        {"tools": TOOLS},
        (
            INV,
            "message.tool_calls[0].function.name",
            "The reply calls the function 'h', which the request does not define.",
        ),
        (INV,),
    ),
    (
        "duplicate-ids",
        reply(calls=[CALL_F, {**CALL_G, "id": "a"}]),
        {"tools": TOOLS},
        (INV, "message.tool_calls[1].id", "The reply repeats the tool call id 'a'."),
        (INV,),
    ),
    (
        "call-under-none",
        reply(calls=[CALL_F], finish="tool_calls"),
        {"tools": TOOLS, "tool_choice": "none"},
        (N, "message.tool_calls", "The reply calls a tool under tool_choice none."),
        ("ok", "tool_calls"),
    ),
    (
        "no-call-under-required",
        reply(),
        {"tools": TOOLS, "tool_choice": "required"},
        (N, "message.tool_calls", "The reply does not call a tool under tool_choice required."),
        ("ok", "stop"),
    ),
    (
        "call-under-required",
        reply(None, [CALL_G], "tool_calls"),
        {"tools": TOOLS, "tool_choice": "required"},
        ("ok", "tool_calls"),
        ("ok", "tool_calls"),
    ),
    (
        "no-call-under-forced",
        reply(),
        {"tools": TOOLS, "tool_choice": FORCE_F},
        (N, "message.tool_calls", "The reply does not call the function 'f' the tool_choice forces."),
        ("ok", "stop"),
    ),
    (
        "other-call-under-forced",
        reply(None, [CALL_G], "tool_calls"),
        {"tools": TOOLS, "tool_choice": FORCE_F},
        (N, "message.tool_calls", "The reply calls 'g' where the tool_choice forces 'f'."),
        ("ok", "stop"),
    ),
    (
        "forced-finish-stored-as-stop",
        reply(None, [CALL_F], "tool_calls"),
        {"tools": TOOLS, "tool_choice": FORCE_F},
        ("ok", "stop"),
        ("ok", "stop"),
    ),
    (
        "forced-finish-stop-kept",
        reply(None, [CALL_F], "stop"),
        {"tools": TOOLS, "tool_choice": FORCE_F},
        ("ok", "stop"),
        ("ok", "stop"),
    ),
    (
        "auto-calls",
        reply("x", [CALL_F, CALL_G], "tool_calls"),
        {"tools": TOOLS},
        ("ok", "tool_calls"),
        ("ok", "tool_calls"),
    ),
    (
        "json-object-bad",
        reply("not json"),
        {"response_format": {"type": "json_object"}},
        (N, "message.content", "The reply content is not a JSON object, which the response format requires."),
        ("ok", "stop"),
    ),
    (
        "json-object-array",
        reply("[1]"),
        {"response_format": {"type": "json_object"}},
        (N, "message.content", "The reply content is not a JSON object, which the response format requires."),
        ("ok", "stop"),
    ),
    (
        "json-object-nan",
        reply('{"a": NaN}'),
        {"response_format": {"type": "json_object"}},
        (N, "message.content", "The reply content is not a JSON object, which the response format requires."),
        ("ok", "stop"),
    ),
    (
        "json-object-infinity",
        reply('{"a": -Infinity}'),
        {"response_format": {"type": "json_object"}},
        (N, "message.content", "The reply content is not a JSON object, which the response format requires."),
        ("ok", "stop"),
    ),
    (
        "json-object-deep",
        reply("[" * 100_000 + "]" * 100_000),
        {"response_format": {"type": "json_object"}},
        (N, "message.content", "The reply content is not a JSON object, which the response format requires."),
        ("ok", "stop"),
    ),
    (
        "json-object-null-content",
        reply(None, [CALL_F], "tool_calls"),
        {"tools": TOOLS, "response_format": {"type": "json_object"}},
        ("ok", "tool_calls"),
        ("ok", "tool_calls"),
    ),
    (
        "json-object-empty-content-calls",
        reply("", [CALL_F], "tool_calls"),
        {"tools": TOOLS, "response_format": {"type": "json_object"}},
        ("ok", "tool_calls"),
        ("ok", "tool_calls"),
    ),
    (
        "json-object-empty-content",
        reply(""),
        {"response_format": {"type": "json_object"}},
        (N, "message.content", "The reply content is not a JSON object, which the response format requires."),
        ("ok", "stop"),
    ),
    (
        "json-object-ok",
        reply(' {"a": [1, 2]} '),
        {"response_format": {"type": "json_object"}},
        ("ok", "stop"),
        ("ok", "stop"),
    ),
    (
        "loose-schema-object-only",
        reply('{"n": -5, "x": 1}'),
        {"response_format": fmt(strict=False)},
        ("ok", "stop"),
        ("ok", "stop"),
    ),
    (
        "loose-schema-not-object",
        reply("5"),
        {"response_format": fmt(strict=None)},
        (N, "message.content", "The reply content is not a JSON object, which the response format requires."),
        ("ok", "stop"),
    ),
    ("strict-schema-ok", reply('{"n": 3}'), {"response_format": fmt()}, ("ok", "stop"), ("ok", "stop")),
    (
        "strict-schema-mismatch",
        reply('{"n": -1}'),
        {"response_format": fmt()},
        (
            N,
            "message.content",
            "The reply content does not match the response format schema at '/n': -1 is less than the minimum of 0",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-extra-key",
        reply('{"n": 1, "x": 2}'),
        {"response_format": fmt()},
        (
            N,
            "message.content",
            "The reply content does not match the response format schema: Additional properties are not allowed ('x' was unexpected)",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-not-json",
        reply("{n: 1}"),
        {"response_format": fmt()},
        (N, "message.content", "The reply content is not JSON, which the response format requires."),
        ("ok", "stop"),
    ),
    (
        "strict-schema-uncompilable",
        reply('{"n": 1}'),
        {"response_format": fmt({"type": 12})},
        (
            N,
            "response_format",
            "The request's response format schema cannot be compiled (it is not a valid schema: 12 is not valid under any of the given schemas), so the reply "
            "cannot be shown to match it.",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-external-ref",
        reply('{"n": 1}'),
        {"response_format": fmt({"$ref": "https://example.com/schema.json"})},
        (
            N,
            "response_format",
            "The request's response format schema cannot be compiled (the reference 'https://example.com/schema.json' does not resolve inside it), so the reply "
            "cannot be shown to match it.",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-dangling-ref",
        reply('{"n": 1}'),
        {"response_format": fmt({"$ref": "#/$defs/missing"})},
        (
            N,
            "response_format",
            "The request's response format schema cannot be compiled (the reference '#/$defs/missing' does not resolve inside it), so the reply "
            "cannot be shown to match it.",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-internal-ref",
        reply('{"a": {"n": 1}}'),
        {
            "response_format": fmt(
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/d"}}, "$defs": {"d": SCHEMA}}
            )
        },
        ("ok", "stop"),
        ("ok", "stop"),
    ),
    (
        "strict-schema-internal-ref-mismatch",
        reply('{"a": {"n": "x"}}'),
        {
            "response_format": fmt(
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/d"}}, "$defs": {"d": SCHEMA}}
            )
        },
        (
            N,
            "message.content",
            "The reply content does not match the response format schema at '/a/n': 'x' is not of type 'integer'",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-draft7",
        reply('{"n": 1}'),
        {
            "response_format": fmt(
                {
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "object",
                    "properties": {"n": {"type": "integer", "exclusiveMinimum": 1}},
                }
            )
        },
        (
            N,
            "message.content",
            "The reply content does not match the response format schema at '/n': 1 is less than or equal to the minimum of 1",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-draft4",
        reply('{"n": 1}'),
        {
            "response_format": fmt(
                {
                    "$schema": "http://json-schema.org/draft-04/schema#",
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 1, "exclusiveMinimum": True}},
                }
            )
        },
        (
            N,
            "message.content",
            "The reply content does not match the response format schema at '/n': 1 is less than or equal to the minimum of 1",
        ),
        ("ok", "stop"),
    ),
    (
        "strict-schema-exempt-with-calls",
        reply(None, [CALL_F], "tool_calls"),
        {"tools": TOOLS, "response_format": fmt()},
        ("ok", "tool_calls"),
        ("ok", "tool_calls"),
    ),
    (
        "parallel-false-reduces-first",
        reply(
            None, [CALL_F, {**CALL_F, "id": "z", "function": {"name": "h", "arguments": ""}}], "tool_calls"
        ),
        {"tools": TOOLS, "parallel_tool_calls": False},
        ("ok", "tool_calls"),
        (INV,),
    ),
]


def _check(outcome: tuple[Any, ...], run: Any, refusal: Any) -> hc.VerifiedReply | None:
    if outcome[0] == "ok":
        verified = run()
        assert verified.finish_reason == outcome[1]
        return verified  # type: ignore[no-any-return]
    with pytest.raises(hc.HordeError) as info:
        run()
    if len(outcome) == 1:
        assert info.value.rc == outcome[0]
    else:
        rc, param, text = outcome
        refusal(info.value, 400, rc, param, f"'{param}': {text}")
        assert info.value.openai_message == text
    return None


@pytest.mark.parametrize(
    ("case", "submitted", "extras", "strict", "best_effort"), VERIFY_CASES, ids=[c[0] for c in VERIFY_CASES]
)
def test_verify(
    case: str, submitted: hc.ChatSubmit, extras: Any, strict: Any, best_effort: Any, refusal: Any
) -> None:
    _check(strict, lambda: hc.verify_chat_reply(submitted, extras, "strict"), refusal)
    _check(
        best_effort, lambda: hc.verify_chat_reply(submitted, extras, hc.ChatConformance.best_effort), refusal
    )


def test_single_call_reduction() -> None:
    calls = [CALL_F, CALL_G, {**CALL_F, "id": "c"}]
    submitted = reply(None, calls, "tool_calls")
    strict = hc.verify_chat_reply(submitted, {"tools": TOOLS, "parallel_tool_calls": False})
    assert strict.message["tool_calls"] == [CALL_F] and strict.dropped_tool_calls == 2
    assert strict.finish_reason == "tool_calls"
    loose = hc.verify_chat_reply(submitted, {"tools": TOOLS, "parallel_tool_calls": False}, "best_effort")
    assert loose.message["tool_calls"] == calls and loose.dropped_tool_calls == 0
    # the submitted message is not modified
    assert submitted.message["tool_calls"] == calls  # type: ignore[index]
    assert (
        hc.verify_chat_reply(submitted, {"tools": TOOLS, "parallel_tool_calls": True}).dropped_tool_calls == 0
    )


def test_verify_message_dict_and_stream_hint() -> None:
    verified = hc.verify_chat_reply(
        {"role": "assistant", "content": "{}"},
        {"response_format": {"type": "json_object"}, "stream_progress": True},
    )
    assert verified == hc.VerifiedReply(message={"role": "assistant", "content": "{}"}, finish_reason="stop")
    assert hc.chat_reply_finish_reason("length", {"content": "x"}, None) == "length"


def test_parse_strict_json() -> None:
    assert hc.parse_strict_json('{"a": 1.5}') == {"a": 1.5}
    for text in ("NaN", "[Infinity]", "{"):
        with pytest.raises(ValueError):
            hc.parse_strict_json(text)


def test_characters_charge_and_storage() -> None:
    message = {
        "role": "assistant",
        "content": "héllo",
        "reasoning_content": "abc",
        "tool_calls": [CALL_F, {**CALL_G, "function": {"name": "gg", "arguments": '{"x":1}'}}],
    }
    assert hc.chat_reply_characters(message) == 5 + 3 + (1 + 2) + (2 + 7)
    assert hc.chat_reply_characters({"role": "assistant", "content": None}) == 0
    assert hc.charged_tokens(0, 512) == 20
    assert hc.charged_tokens(80, 512) == 20
    assert hc.charged_tokens(81, 512) == 21
    assert hc.charged_tokens(400, 512) == 100
    assert hc.charged_tokens(100_000, 512) == 512
    assert hc.charged_tokens(100, 16) == 16
    stored = hc.build_stored_reply(
        {
            "role": "assistant",
            "content": "a\x00b",
            "reasoning_content": "\x00",
            "tool_calls": [
                {"id": "i\x00", "type": "function", "function": {"name": "f", "arguments": '{"k\x00": 1}'}}
            ],
        }
    )
    assert stored == {
        "role": "assistant",
        "content": "a\ufffdb",
        "tool_calls": [
            {"id": "i\ufffd", "type": "function", "function": {"name": "f", "arguments": '{"k\ufffd": 1}'}}
        ],
        "reasoning_content": "\ufffd",
    }
    assert hc.build_stored_reply({"role": "assistant", "content": None}) == {
        "role": "assistant",
        "content": None,
    }
    assert (
        hc.build_stored_reply({"role": "assistant", "content": "", "reasoning_content": ""})[
            "reasoning_content"
        ]
        == ""
    )
    assert hc.stored_generation({"content": None}) == ""
    assert hc.stored_generation({"content": "x\x00"}) == "x\ufffd"


def test_verify_other_format_types_pass() -> None:
    text_format = {"response_format": {"type": "text"}}
    assert hc.verify_chat_reply(reply("plain words"), text_format).finish_reason == "stop"


def test_a_nul_in_native_finish_reason_is_replaced() -> None:
    parsed = hc.parse_submit_body(submit(native_finish_reason="eos\x00"))
    assert isinstance(parsed, hc.ChatSubmit) and parsed.native_finish_reason == "eos\ufffd"
