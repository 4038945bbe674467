"""Pure mapping functions of the openai backend (worker/README.md)."""

from __future__ import annotations

from typing import Any

import pytest
from horde_worker.backends.openai import (
    GENERIC,
    KOBOLDCPP,
    LLAMA_CPP_PYTHON,
    LLAMA_SERVER,
    OLLAMA,
    VLLM,
    build_chat_request,
    build_text_request,
    fault_for_error,
    flatten_for_count,
    friendly_model_name,
    parse_chat_response,
    root_url,
)
from horde_worker.jobs import BackendFault, ChatJob, TextJob

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def job(**kw: object) -> ChatJob:
    pop = {
        "id": "j",
        "chat": True,
        "payload": {
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5,
            "top_p": 0.9,
            "frequency_penalty": 0.1,
            "presence_penalty": 0.2,
            "rep_pen": 1.1,
            "top_k": 0,
            "min_p": 0.05,
            "max_length": 100,
            "max_context_length": 2048,
            "n": 1,
            **kw,
        },
    }
    return ChatJob.from_pop(pop)


def test_root_url_accepts_v1_or_not() -> None:
    assert root_url("http://h:8080/v1/") == "http://h:8080"
    assert root_url("http://h:8080") == "http://h:8080"


def test_friendly_model_name() -> None:
    assert friendly_model_name("/models/qwen3-8b.Q4_K_M.gguf") == "qwen3-8b.Q4_K_M"
    assert friendly_model_name("koboldcpp/Qwen3-8B") == "koboldcpp/Qwen3-8B"
    assert friendly_model_name("llama3.2:3b") == "llama3.2:3b"
    assert friendly_model_name(None) is None


def test_common_fields() -> None:
    body = build_chat_request(GENERIC, job(seed=7, stop_sequence=["END"], reasoning_effort="low"), "m")
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
        "temperature": 0.5,
        "top_p": 0.9,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.1,
        "stream": False,
        "seed": 7,
        "stop": ["END"],
        "reasoning_effort": "low",
    }


def test_koboldcpp_quirks() -> None:
    body = build_chat_request(KOBOLDCPP, job(response_format={"type": "json_object"}), "koboldcpp/x")
    assert "frequency_penalty" not in body  # only a fallback for presence_penalty there
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "object", "schema": {"type": "object"}},
    }
    assert (body["top_k"], body["min_p"], body["rep_pen"]) == (0, 0.05, 1.1)


def test_llama_server_parallel_tool_calls() -> None:
    on = build_chat_request(LLAMA_SERVER, job(tools=[WEATHER], tool_choice="auto"), None)
    assert on["parallel_tool_calls"] is True and on["tool_choice"] == "auto"
    off = build_chat_request(
        LLAMA_SERVER, job(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), None
    )
    assert off["parallel_tool_calls"] is False and off["tool_choice"] == "required"
    assert off["repeat_penalty"] == 1.1


def test_vllm_samplers() -> None:
    body = build_chat_request(VLLM, job(), "m")
    assert (body["top_k"], body["repetition_penalty"]) == (-1, 1.1)


def test_ollama_sends_only_standard_fields() -> None:
    body = build_chat_request(OLLAMA, job(tools=[WEATHER], tool_choice="auto"), "llama3.2")
    assert not {"top_k", "min_p", "repeat_penalty", "parallel_tool_calls"} & set(body)
    assert body["tools"] == [WEATHER]


def test_llama_cpp_python_quirks() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}}
    body = build_chat_request(LLAMA_CPP_PYTHON, job(response_format=rf), None)
    assert body["response_format"] == {"type": "json_object", "schema": schema}
    forced = build_chat_request(LLAMA_CPP_PYTHON, job(tools=[WEATHER], tool_choice="required"), None)
    assert forced["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_response_format_passes_through_elsewhere() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {"type": "object"}}}
    assert build_chat_request(LLAMA_SERVER, job(response_format=rf), None)["response_format"] == rf


def test_parse_response_with_reasoning_fields_and_usage() -> None:
    data: dict[str, Any] = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "4", "reasoning": "2+2"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "completion_tokens_details": {"reasoning_tokens": 3},
        },
    }
    out = parse_chat_response(data)
    assert (out.content, out.reasoning, out.native_finish_reason) == ("4", "2+2", "stop")
    assert (out.prompt_tokens, out.completion_tokens, out.reasoning_tokens) == (10, 5, 3)
    data["choices"][0]["message"] = {"content": "4", "reasoning_content": "llama-server"}
    del data["usage"]
    out = parse_chat_response(data)
    assert out.reasoning == "llama-server"
    assert (out.prompt_tokens, out.completion_tokens, out.reasoning_tokens) == (None, None, None)


def test_parse_tool_calls() -> None:
    call = {"id": "call_12345", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    out = parse_chat_response(
        {"choices": [{"message": {"content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}]}
    )
    assert out.tool_calls == [call] and out.content is None


def test_parse_without_choices_is_a_generation_error() -> None:
    with pytest.raises(BackendFault) as err:
        parse_chat_response({"error": "x"})
    assert err.value.reason == "generation_error"


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (
            400,
            '{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}',
            "prompt_overflow",
        ),
        (
            400,
            '{"object":"error","message":"This model\'s maximum context length is 4096 tokens. However, you requested 5000 tokens","type":"BadRequestError"}',
            "prompt_overflow",
        ),
        (400, '{"error":{"code":"context_length_exceeded","message":"..."}}', "prompt_overflow"),
        (
            400,
            '{"error":{"code":400,"message":"failed to parse grammar","type":"invalid_request_error"}}',
            "unbuildable_grammar",
        ),
        (500, '{"error":{"message":"boom"}}', "generation_error"),
        (404, "not found", "generation_error"),
    ],
)
def test_fault_for_error(status: int, body: str, reason: str) -> None:
    assert fault_for_error(status, body).reason == reason


def test_text_request_maps_kobold_fields() -> None:
    tj = TextJob.from_pop(
        {
            "id": "t",
            "payload": {
                "prompt": "Once",
                "temperature": 0.3,
                "top_k": 40,
                "rep_pen": 1.2,
                "stop_sequence": ["\n"],
                "sampler_seed": 5,
            },
        }
    )
    body = build_text_request(LLAMA_SERVER, tj, "m", 50)
    assert body["prompt"] == "Once" and body["max_tokens"] == 50 and body["seed"] == 5
    assert (body["top_k"], body["repeat_penalty"], body["stop"]) == (40, 1.2, ["\n"])


def test_flatten_for_count() -> None:
    text = flatten_for_count(job(tools=[WEATHER], tool_choice="auto"))
    assert text.startswith("user: hi\n") and "get_weather" in text
