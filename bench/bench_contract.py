"""Benchmark of horde_contract: parse + validate + fingerprint of chat requests, on one core.

Run: ``uv run python bench/bench_contract.py`` (add ``--quick`` for a short run). Cases:

- typical: 20 messages (system, user/assistant turns, one tool round), two tools (one strict), a strict
  json_schema response format; parse_chat_request + build_operation_fingerprint, reported as requests per
  second on one core, with flatten + estimate and reply verification (strict schema) beside it;
- worst case at the caps: 1024 messages carrying 1 MiB of text and 128 tools within the 256 KiB spec cap; the
  same path, plus flatten/estimate and truncate_oldest to a small context.

Everything is pure Python in one process, so the numbers are per core.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import horde_contract as hc

STRICT_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
        "hourly": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"hour": {"type": "integer"}, "temp": {"type": "number"}},
                "required": ["hour", "temp"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["city", "days", "units", "hourly"],
    "additionalProperties": False,
}


def typical_body() -> dict[str, Any]:
    """20 messages, two tools, a strict json_schema: what a tool-using chat client sends mid-conversation."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful weather assistant. " * 8}
    ]
    for turn in range(8):
        messages.append(
            {"role": "user", "content": f"Question {turn}: what is the weather like in city {turn}? " * 3}
        )
        messages.append(
            {"role": "assistant", "content": f"Answer {turn}: it is sunny with a light breeze. " * 4}
        )
    messages.append({"role": "user", "content": "And in Paris tomorrow?"})
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18, "sky": "cloudy"}'})
    assert len(messages) == 20
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current and forecast weather for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city", "days"],
                    "additionalProperties": False,
                },
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Web search.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        },
    ]
    return {
        "model": "koboldcpp/Qwen3-8B",
        "messages": messages,
        "max_tokens": 1024,
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": ["</s>"],
        "tools": tools,
        "tool_choice": "auto",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": STRICT_SCHEMA, "strict": True},
        },
        "stream": True,
        "horde": {"operation_key": "0b4f4a5e-7d0c-4a7e-9c55-4c1c6f7b2f11", "conformance": "strict"},
    }


def worst_body() -> dict[str, Any]:
    """At the caps: 1024 messages, 1 MiB of UTF-8 text in them, 128 tools within the 256 KiB spec cap."""
    count = hc.MAX_CHAT_MESSAGE_COUNT
    per = hc.MAX_CHAT_TEXT_BYTES // count  # 1024 bytes each: exactly 1 MiB
    messages = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": ("é" if i % 7 == 0 else "a") * (per // (2 if i % 7 == 0 else 1)),
        }
        for i in range(count)
    ]
    messages[-1] = {"role": "user", "content": "a" * per}
    tool_budget = (hc.MAX_CHAT_TOOL_SPEC_BYTES - 4096) // hc.MAX_CHAT_TOOL_COUNT
    tools = []
    for i in range(hc.MAX_CHAT_TOOL_COUNT):
        tool = {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "",
                "parameters": {
                    "type": "object",
                    "properties": {f"p{j}": {"type": "string"} for j in range(8)},
                    "required": [f"p{j}" for j in range(8)],
                    "additionalProperties": False,
                },
                "strict": True,
            },
        }
        size = len(json.dumps(tool, separators=(",", ":")))
        tool["function"]["description"] = "d" * max(tool_budget - size, 0)
        tools.append(tool)
    return {"model": "m", "messages": messages, "tools": tools, "max_tokens": 512}


def timed(fn: Callable[[], Any], *, seconds: float, min_runs: int = 3) -> tuple[float, float, int]:
    """Run ``fn`` repeatedly for about ``seconds``; return (median seconds per call, best, runs)."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < min_runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), len(times)


def main() -> None:
    quick = "--quick" in sys.argv
    budget = 1.0 if quick else 5.0
    typical = typical_body()
    worst = worst_body()
    text_bytes = sum(len(m["content"].encode()) for m in worst["messages"])
    spec_bytes = len(json.dumps(worst["tools"], separators=(",", ":")))
    assert text_bytes == hc.MAX_CHAT_TEXT_BYTES, text_bytes
    assert spec_bytes <= hc.MAX_CHAT_TOOL_SPEC_BYTES, spec_bytes

    # Parsing never mutates the body (a test checks it), so every run reuses one parsed JSON body.
    def parse_and_fingerprint(body: dict[str, Any]) -> str:
        request = hc.parse_chat_request(body)
        return hc.build_operation_fingerprint(request)

    typical_request = hc.parse_chat_request(typical)
    reply = hc.ChatSubmit(
        id="g",
        model_id="m",
        message={
            "role": "assistant",
            "content": json.dumps(
                {
                    "city": "Paris",
                    "days": 1,
                    "units": "metric",
                    "hourly": [{"hour": h, "temp": 18.5} for h in range(24)],
                }
            ),
        },
        finish_reason="stop",
    )
    worst_request = hc.parse_chat_request(worst)

    rows: list[tuple[str, float, float, int]] = []

    def record(name: str, fn: Callable[[], Any], seconds: float) -> None:
        median, best, runs = timed(fn, seconds=seconds)
        rows.append((name, median, best, runs))

    record("typical: parse + validate + fingerprint", lambda: parse_and_fingerprint(typical), budget)
    record("typical: parse only", lambda: hc.parse_chat_request(typical), budget)
    record(
        "typical: fingerprint only",
        lambda: hc.build_operation_fingerprint(typical_request),
        budget,
    )
    record(
        "typical: flatten + estimate",
        lambda: hc.estimate_chat_prompt_tokens(typical_request.messages, typical_request.tools),
        budget,
    )
    record(
        "typical: verify strict-schema reply",
        lambda: hc.verify_chat_reply(reply, typical_request.chat_extras, typical_request.conformance),
        budget,
    )
    record(
        "worst: parse + validate + fingerprint",
        lambda: parse_and_fingerprint(worst),
        budget * 2,
    )
    record(
        "worst: flatten + estimate",
        lambda: hc.estimate_chat_prompt_tokens(worst_request.messages, worst_request.tools),
        budget,
    )
    record(
        "worst: truncate_oldest to 100,000 tokens",
        lambda: hc.truncate_oldest(worst_request.messages, worst_request.tools, 100_000),
        budget,
    )

    print(f"python {platform.python_version()} on {platform.machine()}, one process (one core)")
    print(
        f"typical body: {len(json.dumps(typical))} bytes of JSON; worst body: {len(json.dumps(worst, ensure_ascii=False).encode())} bytes"
    )
    print(f"{'case':45} {'median':>12} {'best':>12} {'per second':>12} {'runs':>6}")
    for name, median, best, runs in rows:
        print(f"{name:45} {median * 1e3:10.3f}ms {best * 1e3:10.3f}ms {1 / median:12.1f} {runs:6d}")


if __name__ == "__main__":
    main()
