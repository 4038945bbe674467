"""Native status → ``chat.completion``: the completion (:func:`build_completion`) and its parts (the assistant
message, :func:`build_usage`, :func:`build_system_fingerprint`, :func:`effective_completion_limit`). No I/O.
See docs/openai-front.md#responses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from horde_contract import (
    DEFAULT_CHAT_MAX_TOKENS,
    ChatContextAdjustmentReason,
    estimate_chat_prompt_tokens,
    estimate_text_tokens,
)

from horde_oai.native_request import include_reasoning, requested_models


def worker_max_length_adjustments(context_adjustments: Sequence[Any] | None) -> list[Mapping[str, Any]]:
    """The ``context_adjustments`` entries in which the Horde lowered the completion limit to what the
    serving workers accept."""
    reason = ChatContextAdjustmentReason.worker_max_length
    return [a for a in context_adjustments or () if isinstance(a, Mapping) and a.get("reason") == reason]


def effective_completion_limit(
    body: Mapping[str, Any], context_adjustments: Sequence[Mapping[str, Any]] | None = None
) -> int:
    """The completion limit estimates are capped at (docs/openai-front.md#responses).

    In order: the lowered value of a ``worker_max_length`` adjustment, max_completion_tokens, max_tokens,
    the native default 512.
    """
    for adjustment in worker_max_length_adjustments(context_adjustments):
        to = adjustment.get("to")
        if isinstance(to, int) and not isinstance(to, bool):
            return to
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return DEFAULT_CHAT_MAX_TOKENS


def completion_limit_source(
    body: Mapping[str, Any], context_adjustments: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """``client``, ``default`` or ``lowered`` (docs/openai-front.md#responses)."""
    if worker_max_length_adjustments(context_adjustments):
        return "lowered"
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None:
        return "client"
    return "default"


def estimate_prompt_tokens(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> int:
    """The prompt estimate of ``messages`` (and tool definitions): the flattened text / 4 plus 512 per image.

    horde_contract's estimate, the one the Horde sizes the context with, so the front and the Horde agree.
    """
    return int(estimate_chat_prompt_tokens(list(messages), tools or None))


def _tool_call_chars(tool_calls: Any) -> int:
    total = 0
    for call in tool_calls or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            total += len(str(function.get("name") or "")) + len(str(function.get("arguments") or ""))
    return total


def _reported(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def build_usage(
    generation: Mapping[str, Any], prompt_estimate: int, limit: int
) -> tuple[dict[str, Any], bool]:
    """``usage`` for one generation and whether any count is an estimate.

    Reported counts are used unchanged. Estimates: prompt from the request's messages; completion from the
    reasoning, reply text and tool calls; reasoning from the reasoning characters; both capped at ``limit``.
    ``completion_tokens_details.reasoning_tokens`` is present when reported or when the reply has reasoning.
    """
    raw = generation.get("message")
    message: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    reasoning = message.get("reasoning_content")
    reasoning = reasoning if isinstance(reasoning, str) else ""
    estimated = False
    prompt = _reported(generation.get("prompt_tokens"))
    if prompt is None:
        prompt, estimated = prompt_estimate, True
    completion = _reported(generation.get("completion_tokens"))
    if completion is None:
        chars = len(content) + len(reasoning) + _tool_call_chars(message.get("tool_calls"))
        completion, estimated = min(estimate_text_tokens(chars), limit), True
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    reasoning_tokens = _reported(generation.get("reasoning_tokens"))
    if reasoning_tokens is None and reasoning:
        reasoning_tokens, estimated = min(estimate_text_tokens(reasoning), limit), True
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage, estimated


def build_system_fingerprint(worker_id: Any, model: Any) -> str | None:
    """``fp_`` + the first 10 hex of SHA-256 over ``"<worker id>:<model>"``; None without a worker id."""
    if not worker_id:
        return None
    digest = hashlib.sha256(f"{worker_id}:{model or ''}".encode()).hexdigest()
    return f"fp_{digest[:10]}"


def completion_id(request_id: str) -> str:
    """The completion id: ``chatcmpl-<native request id>``, so a client can find the request again."""
    return f"chatcmpl-{request_id}"


def finished_generations(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The generations with a stored reply (state ok/censored/csam and a message or text)."""
    out = []
    for generation in status.get("generations") or ():
        if not isinstance(generation, Mapping):
            continue
        if generation.get("state") == "faulted":
            continue
        if generation.get("message") is not None or generation.get("text") is not None:
            out.append(generation)
    return out


def served_model(generation: Mapping[str, Any] | None, body: Mapping[str, Any]) -> str:
    """The response's model: the generation's model, else the request's model or first listed model."""
    if generation and generation.get("model"):
        return str(generation["model"])
    models = requested_models(body)
    return models[0] if models else ""


def _visible(text: Any) -> bool:
    return isinstance(text, str) and bool(text.strip())


def content_category(message: Mapping[str, Any]) -> str:
    """``text``, ``tool_calls``, ``reasoning_only`` or ``empty`` (the horde.oai.completions content)."""
    if _visible(message.get("content")):
        return "text"
    if message.get("tool_calls"):
        return "tool_calls"
    if _visible(message.get("reasoning_content")):
        return "reasoning_only"
    return "empty"


def reply_notice(message: Mapping[str, Any], finish_reason: str) -> str | None:
    """``x_horde.notice`` for a reply without visible text or tool calls, else None."""
    category = content_category(message)
    if category == "reasoning_only":
        if finish_reason == "length":
            return (
                "The model used the whole completion limit on reasoning and returned no visible text; "
                "raise max_tokens or lower reasoning_effort."
            )
        return "The model returned reasoning but no visible text."
    if category == "empty":
        return "The worker returned an empty reply."
    return None


def build_assistant_message(native_message: Mapping[str, Any], with_reasoning: bool) -> dict[str, Any]:
    """``choices[0].message``: role, content (null only with tool calls and no text), tool_calls when the
    worker returned calls, reasoning_content when submitted and not hidden."""
    content = native_message.get("content")
    tool_calls = native_message.get("tool_calls") or None
    if tool_calls and not content:
        content = None  # tool calls without text: null, as OpenAI sends it
    elif content is None:
        content = ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments"),
                },
            }
            for call in tool_calls
            if isinstance(call, Mapping)
        ]
    reasoning = native_message.get("reasoning_content")
    if with_reasoning and isinstance(reasoning, str) and reasoning:
        message["reasoning_content"] = reasoning
    return message


def native_message_of(generation: Mapping[str, Any]) -> dict[str, Any]:
    """The structured reply of a generation; a text-only generation becomes ``{role, content: text}``."""
    message = generation.get("message")
    if isinstance(message, Mapping):
        return dict(message)
    return {"role": "assistant", "content": generation.get("text") or ""}


def build_completion(
    *,
    request_id: str,
    created: int,
    body: Mapping[str, Any],
    status: Mapping[str, Any],
    prompt_estimate: int,
) -> dict[str, Any]:
    """The ``chat.completion`` for a done native status with at least one finished generation."""
    generations = finished_generations(status)
    if not generations:
        raise ValueError("status has no finished generation")
    first = generations[0]
    adjustments = status.get("context_adjustments") or None
    limit = effective_completion_limit(body, adjustments)
    with_reasoning = include_reasoning(body)
    choices = []
    usage_total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    any_estimated = False
    notice = None
    reasoning_sum: int | None = None
    for index, generation in enumerate(generations[:1]):  # n is 1 on the Horde
        native_message = native_message_of(generation)
        finish_reason = generation.get("finish_reason") or "stop"
        choice: dict[str, Any] = {
            "index": index,
            "message": build_assistant_message(native_message, with_reasoning),
            "logprobs": None,
            "finish_reason": finish_reason,
            # Always present: null when the worker gave none (docs/openai-front.md#responses).
            "native_finish_reason": generation.get("native_finish_reason") or None,
        }
        choices.append(choice)
        usage, estimated = build_usage({**generation, "message": native_message}, prompt_estimate, limit)
        any_estimated = any_estimated or estimated
        usage_total["prompt_tokens"] = usage["prompt_tokens"]
        usage_total["completion_tokens"] += usage["completion_tokens"]
        details = usage.get("completion_tokens_details")
        if details is not None:
            reasoning_sum = (reasoning_sum or 0) + details["reasoning_tokens"]
        notice = notice or reply_notice(native_message, finish_reason)
    usage_total["total_tokens"] = usage_total["prompt_tokens"] + usage_total["completion_tokens"]
    usage_out: dict[str, Any] = dict(usage_total)
    if reasoning_sum is not None:
        usage_out["completion_tokens_details"] = {"reasoning_tokens": reasoning_sum}
    x_horde: dict[str, Any] = {
        "request_id": request_id,
        "kudos": status.get("kudos"),
        "worker_id": first.get("worker_id"),
        "worker_name": first.get("worker_name"),
    }
    if adjustments:
        x_horde["context_adjustments"] = adjustments
    if notice:
        x_horde["notice"] = notice
    if any_estimated:
        x_horde["estimated_usage"] = True
    return {
        "id": completion_id(request_id),
        "object": "chat.completion",
        "created": created,
        "model": served_model(first, body),
        "system_fingerprint": build_system_fingerprint(first.get("worker_id"), first.get("model")),
        "choices": choices,
        "usage": usage_out,
        "x_horde": x_horde,
    }
