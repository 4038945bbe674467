"""Server-sent events of a streamed request (docs/openai-front.md#streaming).

A buffered stream sends the whole reply once the request is done: the role chunk, a reasoning chunk, a
content chunk, a tool-call chunk (each only when present), the finish chunk with ``finish_reason``,
``native_finish_reason`` and ``x_horde``, the usage chunk when ``stream_options.include_usage``, then
``data: [DONE]``. An error after the headers is ``data: {"error": {...}}`` followed by ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from horde_oai.errors import OpenAIError

# Legal inside a JSON string and an SSE line, but line breaks to readers that split like str.splitlines()
# (httpx's iter_lines among them), which would cut the event's JSON in two.
_LINE_SEPARATORS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})


def sse_json(data: Mapping[str, Any]) -> str:
    """The JSON of one ``data:`` line: compact, UTF-8 as is, but U+2028, U+2029 and U+0085 escaped."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).translate(_LINE_SEPARATORS)


def sse(data: Mapping[str, Any]) -> str:
    """One ``data:`` event."""
    return f"data: {sse_json(data)}\n\n"


def sse_error(error: OpenAIError) -> str:
    """The error event; ``metadata.retry_after`` carries the interval a Retry-After header would."""
    body = error.body()
    retry_after = error.headers.get("Retry-After")
    if retry_after is not None:
        body["error"].setdefault("metadata", {})["retry_after"] = int(retry_after)
    return sse(body)


def _chunk(
    completion: Mapping[str, Any], delta: dict[str, Any], finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    choice.update(extra)
    return {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
        "system_fingerprint": completion.get("system_fingerprint"),
        "choices": [choice],
        "usage": None,
    }


def buffered_stream_events(completion: Mapping[str, Any], *, include_usage: bool) -> Iterator[str]:
    """The events of a completed reply, in the spec's order."""
    choice = completion["choices"][0]
    message = choice["message"]
    yield sse(_chunk(completion, {"role": "assistant"}))
    if message.get("reasoning_content"):
        yield sse(_chunk(completion, {"reasoning_content": message["reasoning_content"]}))
    if message.get("content"):
        yield sse(_chunk(completion, {"content": message["content"]}))
    if message.get("tool_calls"):
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        yield sse(_chunk(completion, {"tool_calls": calls}))
    finish = _chunk(completion, {}, choice["finish_reason"])
    finish["choices"][0]["native_finish_reason"] = choice.get("native_finish_reason")
    finish["x_horde"] = completion.get("x_horde")
    yield sse(finish)
    if include_usage:
        usage_chunk = {
            "id": completion["id"],
            "object": "chat.completion.chunk",
            "created": completion["created"],
            "model": completion["model"],
            "system_fingerprint": completion.get("system_fingerprint"),
            "choices": [],
            "usage": completion.get("usage"),
        }
        yield sse(usage_chunk)
    yield "data: [DONE]\n\n"
