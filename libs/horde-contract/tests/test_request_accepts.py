"""Accepted edges of parse_chat_request: defaults, nulls that mean none, equivalences, mapping and caps at
their limit (docs/native-api.md#request-body, #images, #tools)."""

from __future__ import annotations

from typing import Any

import horde_contract as hc
import pytest

USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def parse(**overrides: Any) -> hc.ChatRequest:
    body: dict[str, Any] = {"model": "m", "messages": [dict(USER)]}
    body.update(overrides)
    return hc.parse_chat_request(body)


def test_defaults() -> None:
    request = parse()
    assert request.models == ["m"]
    assert request.model_key == "model"
    assert request.model_path(0) == "model"
    assert request.messages == [USER]
    assert request.max_length == hc.DEFAULT_CHAT_MAX_TOKENS == 512
    assert request.max_length_sent is False
    assert request.max_context_length is None
    assert request.text_params == {"max_length": 512}
    assert request.horde == hc.ChatHordeOptions()
    assert request.horde.context_fit == hc.ChatContextFit.truncate_oldest
    assert request.horde.conformance == request.conformance == hc.ChatConformance.strict
    assert request.horde.slow_workers is True and request.horde.include_reasoning is True
    assert request.horde.availability_mode == hc.ChatAvailabilityMode.wait
    assert request.chat_extras is None and request.answer_extras is None and request.tools is None
    assert request.stream is False
    assert request.image_count == 0 and not request.has_images
    assert request.required_features == ["prompt_overflow_refused"]
    assert request.tools_temperature is None
    assert request.text_bytes == 2


def test_models_list() -> None:
    request = hc.parse_chat_request({"models": ["b", "a"], "messages": [USER]})
    assert request.models == ["b", "a"] and request.model_key == "models"
    assert request.model_path(1) == "models[1]"


@pytest.mark.parametrize(
    "overrides",
    [
        {"tools": None},
        {"tools": []},
        {"tool_choice": None},
        {"parallel_tool_calls": None},
        {"response_format": None},
        {"response_format": {"type": "text"}},
        {"stop": None},
        {"stop": []},
        {"temperature": None},
        {"top_p": None},
        {"seed": None},
        {"reasoning_effort": None},
        {"frequency_penalty": None},
        {"n": None},
        {"n": 1},
        {"stream": None},
        {"stream": False},
        {"stream_options": None},
        {"stream_options": {"include_usage": True}},
        {"user": None},
        {"user": "u"},
        {"metadata": None},
        {"metadata": {"k": "v"}},
        {"horde": None},
        {"horde": {}},
        {"horde": {key: None for key in hc.HORDE_OPTION_DEFAULTS}},
        {"max_tokens": None},
        {"max_completion_tokens": None},
        {"max_tokens": 512},
        {"max_completion_tokens": 512, "max_tokens": 512},
        {"horde": {k: v for k, v in hc.HORDE_OPTION_DEFAULTS.items() if v is not None}},
    ],
)
def test_nulls_and_defaults_are_none(overrides: dict[str, Any]) -> None:
    request = parse(**overrides)
    base = parse()
    assert request.text_params == base.text_params
    assert request.chat_extras is None
    assert request.horde == base.horde
    assert hc.build_operation_fingerprint(request) == hc.build_operation_fingerprint(base)


def test_token_keys() -> None:
    assert parse(max_tokens=100).max_length == 100
    both = parse(max_tokens=100, max_completion_tokens=100)
    assert both.max_length == 100 and both.max_length_sent
    assert parse(max_completion_tokens=16).max_length == 16
    assert parse(max_completion_tokens=16384).max_length == 16384


def test_sampling_mapping() -> None:
    request = parse(
        temperature=0,
        top_p=1,
        frequency_penalty=-2,
        presence_penalty=2,
        seed=-5,
        reasoning_effort="none",
        stop="END",
    )
    assert request.text_params == {
        "max_length": 512,
        "temperature": 0.0,
        "top_p": 1.0,
        "frequency_penalty": -2.0,
        "presence_penalty": 2.0,
        "seed": -5,
        "reasoning_effort": "none",
        "stop_sequence": ["END"],
    }
    assert isinstance(request.text_params["temperature"], float)
    # The native route keeps the text ranges (temperature up to 5), not OpenAI's.
    assert parse(temperature=5).text_params["temperature"] == 5.0
    assert parse(stop=["a", "b"]).text_params["stop_sequence"] == ["a", "b"]


def test_message_mapping() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "dev", "name": "d"},
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {
            "role": "user",
            "name": "bob",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                {"type": "image_url", "image_url": {"url": "HTTPS://example.com/x.png"}},
            ],
        },
        {"role": "assistant", "tool_calls": [CALL], "name": "a"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]},
        {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": ""},
    ]
    request = hc.parse_chat_request({"model": "m", "messages": messages})
    stored = request.messages
    assert stored[0] == {"role": "system", "content": "dev", "name": "d"}
    assert stored[1]["role"] == "system"
    assert stored[2]["name"] == "bob" and stored[2]["content"][1]["image_url"]["detail"] == "low"
    assert stored[3] == {"role": "assistant", "content": None, "tool_calls": [CALL], "name": "a"}
    assert stored[4] == {"role": "tool", "content": [{"type": "text", "text": "r"}], "tool_call_id": "c1"}
    assert stored[5]["content"] is None
    assert stored[7]["content"] == ""
    assert request.image_count == 2 and request.has_images
    assert request.image_data_bytes == 3
    assert "vision" in request.required_features and "tools" in request.required_features
    # The body is not modified.
    assert messages[0]["role"] == "developer" and "content" not in messages[3]


def test_tool_history_accepts_any_order_and_recurring_ids() -> None:
    calls = [CALL, {**CALL, "id": "c2"}]
    messages: list[dict[str, Any]] = [
        USER,
        {"role": "assistant", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c2", "content": "b"},
        {"role": "tool", "tool_call_id": "c1", "content": "a"},
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "again"},
        USER,
    ]
    hc.check_tool_history(messages)
    assert len(hc.parse_chat_request({"model": "m", "messages": messages}).messages) == 7


def test_caps_at_their_limit() -> None:
    assert len(parse(messages=[USER] * 1024).messages) == 1024
    half = "x" * (hc.MAX_CHAT_TEXT_BYTES // 2)
    at_cap = parse(messages=[{"role": "user", "content": half}, {"role": "user", "content": half}])
    assert at_cap.text_bytes == hc.MAX_CHAT_TEXT_BYTES
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(128)]
    assert len(parse(tools=tools).chat_extras["tools"]) == 128  # type: ignore[index]
    images = [{"type": "image_url", "image_url": {"url": "https://a/b.png"}}] * 20
    assert parse(messages=[{"role": "user", "content": images}]).image_count == 20
    calls = [{**CALL, "id": f"c{i}"} for i in range(128)]
    replies = [{"role": "tool", "tool_call_id": f"c{i}", "content": ""} for i in range(128)]
    assert len(parse(messages=[USER, {"role": "assistant", "tool_calls": calls}, *replies]).messages) == 130
    assert len(parse(model=None, models=list("abcde")).models) == 5


def test_schema_nesting_at_limit_and_strict_ok() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(10):
        schema = {"type": "object", "properties": {"a": schema}}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    assert parse(response_format=fmt).chat_extras == {"response_format": fmt}
    ok = {
        "type": "object",
        "properties": {
            "a": {
                "type": "array",
                "items": {"type": "object", "properties": {}, "additionalProperties": False},
            }
        },
        "required": ["a"],
        "additionalProperties": False,
        "minProperties": 1,
    }
    strict_fmt = {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": ok, "strict": True, "description": "d"},
    }
    strict_tool = {
        "type": "function",
        "function": {"name": "f", "parameters": ok, "strict": True, "description": "d"},
    }
    request = parse(response_format=strict_fmt, tools=[strict_tool])
    assert "structured_output_enforced" in request.required_features
    # Without strict true a schema is not checked structurally.
    loose = {"type": "object", "properties": {"a": {}}}
    parse(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "n", "schema": loose, "strict": False},
        }
    )
    parse(tools=[{"type": "function", "function": {"name": "f", "parameters": loose, "strict": None}}])


def test_extras_and_stream_hint() -> None:
    request = parse(tools=[TOOL], tool_choice="none", parallel_tool_calls=False, stream=True)
    assert request.chat_extras == {
        "tools": [TOOL],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "stream_progress": True,
    }
    assert request.answer_extras == {"tools": [TOOL], "tool_choice": "none", "parallel_tool_calls": False}
    assert request.tools == [TOOL]
    assert request.tools_temperature is None  # tools are not forwarded under none
    assert parse(stream=True).chat_extras == {"stream_progress": True}
    assert parse(stream=True).answer_extras is None
    forced = parse(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}, temperature=0.2)
    assert forced.tools_temperature == 0.2
    assert parse(tools=[TOOL]).tools_temperature == 1.0


def test_horde_options() -> None:
    key = "0B4F4A5E-7D0C-4A7E-9C55-4C1C6F7B2F11"
    request = parse(
        horde={
            "only": ["w1", "w2"],
            "trusted_workers": True,
            "validated_backends": True,
            "slow_workers": False,
            "max_context_length": 4096,
            "context_fit": "grow",
            "conformance": "best_effort",
            "openai_guards": True,
            "include_reasoning": False,
            "availability_mode": "fail_fast",
            "max_kudos": 10,
            "dry_run": True,
            "operation_key": key,
        }
    )
    horde = request.horde
    assert horde.only == ["w1", "w2"] and horde.ignore is None
    assert horde.context_fit == "grow" and horde.conformance == "best_effort"
    assert horde.operation_key == key.lower()
    assert request.max_context_length == 4096 and request.text_params["max_context_length"] == 4096
    assert request.required_features == []  # best_effort needs no guarantee
    assert parse(horde={"ignore": ["w"]}).horde.ignore == ["w"]


def test_openai_guards_json_word() -> None:
    fmt = {"type": "json_object"}
    parse(response_format=fmt)  # guards off: accepted
    parse(
        response_format=fmt,
        horde={"openai_guards": True},
        messages=[{"role": "user", "content": "Reply in JSON"}],
    )
    parse(
        response_format=fmt,
        horde={"openai_guards": True},
        messages=[{"role": "user", "content": [{"type": "text", "text": "a Json reply"}]}],
    )
    assert hc.messages_mention_json([{"role": "assistant", "content": None, "tool_calls": [CALL]}]) is False


def test_defer_length_limits_and_final_validation(refusal: Any) -> None:
    # Deferred: the context range waits for sizing; max_tokens keeps its whole range, 16 to 16384.
    body = {"model": "m", "messages": [USER], "max_tokens": 16384, "horde": {"max_context_length": 100}}
    request = hc.parse_chat_request(body, defer_length_limits=True)
    assert request.max_length == 16384
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(dict(body, max_tokens=15), defer_length_limits=True)
    assert info.value.param == "max_tokens"
    lowered = dict(request.text_params, max_length=4096, max_context_length=8192)
    assert hc.validate_chat_text_params(lowered)["max_length"] == 4096
    with pytest.raises(hc.HordeError) as info:
        hc.validate_chat_text_params(dict(request.text_params, max_length=4096))
    refusal(
        info.value,
        400,
        "TokenOverflow",
        "horde.max_context_length",
        "max_context_length (100) has to be at least max_length (4096).",
    )
    with pytest.raises(hc.HordeError) as info:
        hc.validate_chat_text_params(
            dict(request.text_params, max_length=40000, max_context_length=65536),
            length_key="max_completion_tokens",
        )
    assert info.value.param == "max_completion_tokens"


def test_json_word_search_reads_every_text_part() -> None:
    parts = [
        {"type": "image_url", "image_url": {"url": "u"}},
        {"type": "text", "text": "no"},
        {"type": "text", "text": "yes JSON"},
    ]
    assert hc.messages_mention_json(
        [{"role": "user", "content": parts[:2]}, {"role": "user", "content": parts}]
    )
    assert not hc.messages_mention_json([{"role": "user", "content": parts[:2]}])


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("value", [16385, 20000, 40000])
@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_token_limit_above_16384_is_refused_not_lowered(
    refusal: Any, defer: bool, value: int, key: str
) -> None:
    """docs/native-api.md#request-body: max_length is 16 to 16384 and an out-of-range value is the text
    params' 400 validation error, never clamped, with or without the deferred (admission, front) parse."""
    body = {"model": "m", "messages": [USER], key: value}
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(body, defer_length_limits=defer)
    refusal(
        info.value,
        400,
        "BadRequest",
        key,
        f"'{key}': Input payload validation failed: max_length: Input should be less than or equal to 16384",
    )
    assert (
        info.value.openai_message == f"Invalid value for '{key}': Input should be less than or equal to 16384"
    )
    assert info.value.to_body()["errors"] == {"max_length": "Input should be less than or equal to 16384"}
    edge = hc.parse_chat_request(dict(body, **{key: 16384}), defer_length_limits=defer)
    assert edge.max_length == 16384
