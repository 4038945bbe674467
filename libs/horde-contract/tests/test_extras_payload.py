"""Stored extras, the worker's narrowed copy and the chat job payload (docs/native-api.md#tools,
#progress, #chat-job-payload)."""

from __future__ import annotations

import horde_contract as hc

F = {"type": "function", "function": {"name": "f"}}
G = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}
FORCE_G = {"type": "function", "function": {"name": "g"}}
FMT = {"type": "json_object"}
MESSAGES = [{"role": "user", "content": "hi"}]


def test_build_chat_extras() -> None:
    assert hc.build_chat_extras(tools=None) is None
    assert hc.build_chat_extras(tools=[], tool_choice="auto") is None
    assert hc.build_chat_extras(tools=None, response_format={"type": "text"}) is None
    assert hc.build_chat_extras(tools=None, response_format=FMT) == {"response_format": FMT}
    assert hc.build_chat_extras(
        tools=[F], tool_choice="none", parallel_tool_calls=True, response_format=FMT
    ) == {
        "tools": [F],
        "tool_choice": "none",
        "parallel_tool_calls": True,
        "response_format": FMT,
    }


def test_stored_extras_and_hint() -> None:
    assert hc.build_stored_chat_extras(None, stream=False) is None
    assert hc.build_stored_chat_extras(None, stream=True) == {"stream_progress": True}
    stored = hc.build_stored_chat_extras({"tools": [F]}, stream=True)
    assert stored == {"tools": [F], "stream_progress": True}
    assert (
        hc.streams_progress(stored)
        and not hc.streams_progress({"tools": [F]})
        and not hc.streams_progress(None)
    )
    assert hc.answer_chat_extras(stored) == {"tools": [F]}
    assert hc.answer_chat_extras({"stream_progress": True}) is None
    assert hc.answer_chat_extras(None) is None


def test_worker_narrowing() -> None:
    assert hc.build_worker_chat_extras(None) == {}
    assert hc.build_worker_chat_extras(
        {"tools": [F, G], "tool_choice": "none", "parallel_tool_calls": False, "response_format": FMT}
    ) == {"response_format": FMT}
    assert hc.build_worker_chat_extras(
        {"tools": [F, G], "tool_choice": FORCE_G, "parallel_tool_calls": True}
    ) == {
        "tools": [G],
        "tool_choice": "required",
        "parallel_tool_calls": True,
    }
    for choice in ("auto", "required"):
        assert hc.build_worker_chat_extras({"tools": [F, G], "tool_choice": choice}) == {
            "tools": [F, G],
            "tool_choice": choice,
        }
    assert hc.build_worker_chat_extras({"tools": [F], "stream_progress": True}) == {"tools": [F]}
    assert hc.forced_function_name(FORCE_G) == "g"
    assert hc.forced_function_name({"type": "function", "function": "g"}) is None
    assert hc.forced_function_name("auto") is None
    assert hc.forwards_tools({"tools": [F]}) and not hc.forwards_tools({"tools": [F], "tool_choice": "none"})
    assert not hc.forwards_tools(None) and not hc.forwards_tools({"tools": []})


def test_payload_defaults() -> None:
    payload = hc.build_chat_job_payload(
        messages=MESSAGES,
        text_params={"max_length": 512},
        chat_extras=None,
        max_length=512,
        max_context_length=2048,
    )
    assert payload == {
        "messages": MESSAGES,
        "temperature": 1.0,
        "top_p": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "rep_pen": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "max_length": 512,
        "max_context_length": 2048,
        "n": 1,
    }
    assert "prompt" not in payload


def test_payload_from_request() -> None:
    request = hc.parse_chat_request(
        {
            "model": "m",
            "messages": MESSAGES,
            "temperature": 0.2,
            "top_p": 0.9,
            "presence_penalty": 0.1,
            "seed": 4,
            "stop": "END",
            "reasoning_effort": "low",
            "tools": [F, G],
            "tool_choice": FORCE_G,
            "response_format": FMT,
            "stream": True,
        }
    )
    payload = hc.build_chat_job_payload(
        messages=request.messages,
        text_params=request.text_params,
        chat_extras=request.chat_extras,
        max_length=300,
        max_context_length=4096,
    )
    assert payload == {
        "messages": MESSAGES,
        "tools": [G],
        "tool_choice": "required",
        "response_format": FMT,
        "temperature": 0.2,
        "top_p": 0.9,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.1,
        "rep_pen": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "stop_sequence": ["END"],
        "seed": 4,
        "reasoning_effort": "low",
        "max_length": 300,
        "max_context_length": 4096,
        "n": 1,
        "stream_progress": True,
    }
    by_url = hc.build_chat_job_payload(
        messages=None,
        text_params=request.text_params,
        chat_extras=None,
        max_length=300,
        max_context_length=4096,
        messages_url="https://r2/x",
    )
    assert by_url["messages_url"] == "https://r2/x" and "messages" not in by_url
