"""Screening and validation of the request body (docs/openai-front.md#requests)."""

from __future__ import annotations

import pytest
from horde_oai.errors import OpenAIError
from horde_oai.schema import parameter_label, validate_request

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refuse(body: dict) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        validate_request(body)
    return info.value


def test_valid_body_passes_and_drops_default_no_ops():
    _, screened = validate_request(
        {
            **BASE,
            "n": 1,
            "logprobs": False,
            "store": False,
            "logit_bias": {},
            "service_tier": "auto",
            "user": "u",
        }
    )
    assert "n" not in screened and "logprobs" not in screened and "store" not in screened
    assert screened["user"] == "u"


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"top_k": 40}, "top_k", "UnsupportedChatParameter"),
        ({"logprobs": True}, "logprobs", "UnsupportedChatParameter"),
        ({"n": 2}, "n", "UnsupportedChatParameter"),
        ({"temperature": 2.5}, "temperature", "UnsupportedChatParameter"),
        ({"top_p": -0.1}, "top_p", "UnsupportedChatParameter"),
        ({"presence_penalty": 3}, "presence_penalty", "UnsupportedChatParameter"),
        ({"max_tokens": 0}, "max_tokens", "UnsupportedChatParameter"),
        ({"max_tokens": 15}, "max_tokens", "UnsupportedChatParameter"),
        ({"max_completion_tokens": 3}, "max_completion_tokens", "UnsupportedChatParameter"),
        ({"n": 0}, "n", "UnsupportedChatParameter"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "UnsupportedChatParameter"),
        (
            {"stream_options": {"include_usage": True, "foo": 1}},
            "stream_options.foo",
            "UnsupportedChatParameter",
        ),
        (
            {"response_format": {"type": "json_object", "extra": 1}},
            "response_format.extra",
            "UnsupportedChatParameter",
        ),
        ({"horde": {"models": ["x"]}}, "horde.models", "UnsupportedChatParameter"),
        ({"temperature": "hot"}, "temperature", "BadRequest"),
    ],
)
def test_refusals_carry_param_and_code(extra, param, code):
    error = refuse({**BASE, **extra})
    assert (error.status, error.param, error.code) == (400, param, code)


def test_openai_messages():
    assert refuse({**BASE, "temperature": 3}).message == (
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 instead."
    )
    assert refuse({**BASE, "stop": ["a"] * 5}).message == (
        "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length 5 "
        "instead."
    )
    empty = refuse({"model": "m", "messages": []})
    assert (empty.code, empty.param) == ("BadRequest", "messages")
    assert empty.message.startswith("Invalid 'messages': empty array.")
    assert refuse({**BASE, "top_k": 1}).message == "Unrecognized request argument supplied: top_k"


def test_roles_and_parts():
    role = refuse({"model": "m", "messages": [{"role": "function", "content": "x"}]})
    assert (role.param, role.code) == ("messages[0].role", "UnsupportedChatParameter")
    part = refuse(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}],
                }
            ],
        }
    )
    assert part.param == "messages[0].content[1].type=input_audio"
    image_on_assistant = refuse(
        {
            "model": "m",
            "messages": [
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        }
    )
    assert image_on_assistant.param == "messages[0].content[0].type=image_url"
    calls_on_user = refuse({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]})
    assert calls_on_user.param == "messages[0].tool_calls"


def test_unknown_nested_keys_are_dropped():
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}], "x": 1},
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "audio": None,
                "annotations": [],
                "function_call": None,
                "parsed": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "index": 0,
                        "function": {"name": "f", "arguments": "{}", "parsed_arguments": {}},
                    }
                ],
            },
            {"role": "tool", "content": "r", "tool_call_id": "c1", "name": "f"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "x": 1}, "y": 2}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f", "z": 1}, "w": 1},
    }
    _, screened = validate_request(body)
    assert screened["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
    ]
    assert screened["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert screened["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_model_selection():
    both = refuse({**BASE, "models": ["m"]})
    assert both.code == "ChatRequestConflict"
    neither = refuse({"messages": BASE["messages"]})
    assert (neither.code, neither.param) == ("BadRequest", "model")
    twice = refuse({"models": ["a", "a"], "messages": BASE["messages"]})
    assert twice.param == "models[1]"
    too_many = refuse({"models": list("abcdef"), "messages": BASE["messages"]})
    assert too_many.param == "models"
    _, ok = validate_request({"models": ["a", "b"], "messages": BASE["messages"]})
    assert ok["models"] == ["a", "b"]


def test_json_schema_requires_schema():
    error = refuse({**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})
    assert error.param == "response_format.json_schema.schema"


def test_parameter_labels():
    assert parameter_label("top_k") == "top_k"
    assert parameter_label("messages[0].role") == "messages"
    assert parameter_label("horde.models") == "horde"
    assert parameter_label("some_random_key") == "other"
    assert parameter_label("logit_bias") == "logit_bias"
