"""Buffered stream events and model cards (pure)."""

from __future__ import annotations

import json

from horde_oai.errors import no_eligible_worker
from horde_oai.models import build_model_list, supported_parameters
from horde_oai.streaming import buffered_stream_events, sse_error


def parse(events):
    out = []
    for event in events:
        assert event.endswith("\n\n")
        payload = event.removeprefix("data: ").strip()
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


COMPLETION = {
    "id": "chatcmpl-r",
    "object": "chat.completion",
    "created": 5,
    "model": "m",
    "system_fingerprint": "fp_0123456789",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "native_finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Let me check.",
                "reasoning_content": "think",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    "x_horde": {"request_id": "r"},
}


def test_buffered_stream_order():
    events = parse(buffered_stream_events(COMPLETION, include_usage=True))
    deltas = [e["choices"][0]["delta"] if e != "[DONE]" and e["choices"] else e for e in events]
    assert deltas[0] == {"role": "assistant"}
    assert deltas[1] == {"reasoning_content": "think"}
    assert deltas[2] == {"content": "Let me check."}
    assert deltas[3] == {
        "tool_calls": [
            {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]
    }
    finish = events[4]
    assert finish["choices"][0]["delta"] == {}
    assert finish["choices"][0]["finish_reason"] == "tool_calls"
    assert finish["choices"][0]["native_finish_reason"] == "tool_calls"
    assert finish["x_horde"] == {"request_id": "r"}
    assert events[5]["choices"] == [] and events[5]["usage"]["total_tokens"] == 3
    assert events[6] == "[DONE]"
    assert all(e["system_fingerprint"] == "fp_0123456789" for e in events[:6])
    assert all(e["object"] == "chat.completion.chunk" for e in events[:6])
    assert all(e["usage"] is None for e in events[:5])


def test_buffered_stream_without_usage_or_extras():
    completion = {
        **COMPLETION,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
    }
    events = parse(buffered_stream_events(completion, include_usage=False))
    assert len(events) == 4  # role, content, finish, [DONE]
    assert events[-1] == "[DONE]"


def test_error_event_carries_retry_after():
    event = parse([sse_error(no_eligible_worker("none", stage="grace", request_id="r"))])[0]
    assert event["error"]["code"] == "no_eligible_worker"
    assert event["error"]["metadata"] == {"request_id": "r", "retry_after": 30}


def test_supported_parameters():
    assert supported_parameters([]) == ["max_tokens", "temperature", "top_p", "stop"]
    assert supported_parameters(["reasoning_effort", "seed", "tools", "json_schema"]) == [
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "reasoning_effort",
        "tools",
        "parallel_tool_calls",
        "response_format",
    ]
    assert "tool_choice" in supported_parameters(["tools", "tool_choice_enforced"])


def test_model_cards():
    entries = [
        {
            "name": "org/vision",
            "count": 2,
            "queued": 100,
            "jobs": 1,
            "eta": 3,
            "type": "text",
            "chat": {
                "workers": 2,
                "max_context_length": 8192,
                "max_length": 1024,
                "features": ["vision", "seed"],
                "created": 1700000000,
            },
        },
        {"name": "org/plain", "count": 1, "queued": 0, "jobs": 0, "eta": 0, "type": "text"},
    ]
    listing = build_model_list(entries)
    assert listing["object"] == "list"
    assert [c["id"] for c in listing["data"]] == ["org/vision"]
    card = listing["data"][0]
    assert card["object"] == "model"
    assert card["created"] == 1700000000
    assert card["context_length"] == 8192
    assert card["top_provider"]["max_completion_tokens"] == 1024
    assert card["architecture"]["input_modalities"] == ["text", "image"]
    assert card["supported_parameters"] == ["max_tokens", "temperature", "top_p", "stop", "seed"]
    assert card["x_horde"]["workers"] == 2 and card["x_horde"]["queued"] == 100
