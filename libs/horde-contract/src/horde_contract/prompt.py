"""The flattened prompt, its token estimate, and truncate_oldest.

See docs/native-api.md#flattened-prompt, #context-adjustments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ._json_values import compact_json
from .errors import RC, HordeError
from .limits import CHARS_PER_TOKEN, CHAT_IMAGE_PLACEHOLDER, CHAT_IMAGE_PROMPT_TOKENS
from .vocab import ChatContextAdjustmentReason


def _message_line(message: Mapping[str, Any]) -> tuple[str, int]:
    """One message as ``role: text`` and its image count."""
    pieces: list[str] = []
    images = 0
    content = message.get("content")
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):
        for part in content:
            if part.get("type") == "image_url":
                pieces.append(CHAT_IMAGE_PLACEHOLDER)
                images += 1
            else:
                pieces.append(part.get("text", ""))
    calls = message.get("tool_calls")
    if calls:
        pieces.append(compact_json(calls))
    return f"{message.get('role')}: " + "\n".join(pieces), images


def flatten_messages(messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt column: each message as ``role: text`` (parts joined by newlines, an image part as
    ``[image]``, an assistant's tool_calls as compact JSON after its text, a tool message as ``tool: text``),
    messages joined by newlines, then the compact JSON of ``tools`` when there are any. The response format
    schema is not part of it. See docs/native-api.md#flattened-prompt.
    """
    lines = [_message_line(message)[0] for message in messages]
    if tools:
        lines.append(compact_json(tools))
    return "\n".join(lines)


def estimate_text_tokens(text_or_length: str | int) -> int:
    """The character-based token estimate: ceil(characters / 4)."""
    length = text_or_length if isinstance(text_or_length, int) else len(text_or_length)
    return math.ceil(length / CHARS_PER_TOKEN)


def count_image_parts(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many image parts the messages carry."""
    return sum(_message_line(m)[1] for m in messages)


def estimate_chat_prompt_tokens(
    messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None
) -> int:
    """Prompt tokens of a chat request: the estimate of the flattened text plus CHAT_IMAGE_PROMPT_TOKENS (512)
    per image part. See docs/native-api.md#flattened-prompt.
    """
    lines = [_message_line(message) for message in messages]
    chars = sum(len(line) for line, _ in lines) + max(len(lines) - 1, 0)
    if tools:
        chars += len(compact_json(tools)) + (1 if lines else 0)
    return estimate_text_tokens(chars) + CHAT_IMAGE_PROMPT_TOKENS * sum(images for _, images in lines)


def chat_turns(messages: Sequence[Mapping[str, Any]]) -> tuple[list[list[int]], set[int]]:
    """Split message indexes into droppable turns (oldest first) and the kept set.

    Kept: every system and developer message, and the latest user message with everything after it. A turn
    is a user message with the assistant message right after it, or an assistant message carrying tool_calls
    with the tool messages answering it (an assistant following a user takes its tool messages along, so a
    turn never leaves a tool message without its call); any other message is a turn by itself.
    See docs/native-api.md#context-adjustments.
    """
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
    kept = {i for i, m in enumerate(messages) if m.get("role") in ("system", "developer") or i >= last_user}
    turns: list[list[int]] = []
    index = 0
    while index < last_user:
        if index in kept:
            index += 1
            continue
        turn = [index]
        role = messages[index].get("role")
        nxt = index + 1
        assistant = index if role == "assistant" else None
        if role == "user" and nxt < last_user and messages[nxt].get("role") == "assistant":
            turn.append(nxt)
            assistant = nxt
            nxt += 1
        if assistant is not None and messages[assistant].get("tool_calls"):
            while nxt < last_user and messages[nxt].get("role") == "tool":
                turn.append(nxt)
                nxt += 1
        turns.append(turn)
        index = nxt
    return turns, kept


def prompt_exceeds_context_error(estimate: int, max_prompt_tokens: int) -> HordeError:
    """400 PromptExceedsContext: the messages' estimate does not fit the prompt budget (tokens)."""
    return HordeError(
        400,
        RC.PromptExceedsContext,
        f"The messages are estimated at {estimate} prompt tokens, above the {max_prompt_tokens} tokens the "
        "context leaves beside max_tokens.",
        "messages",
        {"estimated_prompt_tokens": estimate, "max_prompt_tokens": max_prompt_tokens},
    )


def truncate_oldest(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    max_prompt_tokens: int,
    *,
    refuse: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Drop whole turns, oldest first, until :func:`estimate_chat_prompt_tokens` of the rest fits
    ``max_prompt_tokens`` (the context minus max_length, in tokens).

    Returns ``(kept messages, adjustment)``: the messages unchanged and None when they already fit, else the
    kept ones in order and ``{"from": estimate before, "to": estimate after, "reason": "truncate_oldest",
    "dropped_messages": n}``. System/developer messages, the latest user message and everything after it are
    never dropped. When even dropping every turn does not fit: raises 400 PromptExceedsContext (``refuse``)
    or returns the fewest messages it can keep. See docs/native-api.md#context-adjustments.
    """
    lines = [_message_line(message) for message in messages]
    # Size of the flattened prompt: lines joined by newlines, then the tools JSON on its own line.
    chars = sum(len(line) for line, _ in lines) + len(lines) - 1
    if tools:
        chars += len(compact_json(tools)) + 1
    images = sum(count for _, count in lines)
    before = estimate_text_tokens(max(chars, 0)) + CHAT_IMAGE_PROMPT_TOKENS * images
    if before <= max_prompt_tokens:
        return messages, None
    turns, _ = chat_turns(messages)
    dropped: set[int] = set()
    after = before
    for turn in turns:
        for i in turn:
            dropped.add(i)
            chars -= len(lines[i][0]) + 1
            images -= lines[i][1]
        after = estimate_text_tokens(max(chars, 0)) + CHAT_IMAGE_PROMPT_TOKENS * images
        if after <= max_prompt_tokens:
            break
    if after > max_prompt_tokens and refuse:
        raise prompt_exceeds_context_error(after, max_prompt_tokens)
    if not dropped:
        return list(messages), None
    kept = [message for i, message in enumerate(messages) if i not in dropped]
    return kept, {
        "from": before,
        "to": after,
        "reason": ChatContextAdjustmentReason.truncate_oldest.value,
        "dropped_messages": len(dropped),
    }
