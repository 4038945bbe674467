"""Stored and dispatched chat extras, and the chat job payload.

See docs/native-api.md#tools (build_chat_extras), #progress (the stream hint),
#chat-job-payload (build_worker_chat_extras narrowing, sampling defaults, build_chat_job_payload).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .limits import CHAT_SAMPLING_DEFAULTS, CHAT_STREAM_PROGRESS_KEY

# The answer-changing keys, in the order the spec lists them.
CHAT_EXTRAS_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
# Keys of the payload taken from the text params only when the client sent them.
_SENT_ONLY_PARAMS = ("stop_sequence", "seed", "reasoning_effort")


def build_chat_extras(
    *,
    tools: list[dict[str, Any]] | None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    response_format: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The values a request applies, in the client's shape, only when they change the answer; None when none.

    ``tools`` is stored when non-empty; ``tool_choice`` (``none`` included) and ``parallel_tool_calls`` when
    sent beside tools; ``response_format`` when its type is ``json_object`` or ``json_schema``.
    Inputs are the validated values (``parse_chat_request`` refuses a tool choice without tools).
    See docs/native-api.md#tools.
    """
    extras: dict[str, Any] = {}
    if tools:
        extras["tools"] = tools
        if tool_choice is not None:
            extras["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            extras["parallel_tool_calls"] = parallel_tool_calls
    if response_format is not None and response_format.get("type") in ("json_object", "json_schema"):
        extras["response_format"] = response_format
    return extras or None


def build_stored_chat_extras(chat_extras: Mapping[str, Any] | None, *, stream: bool) -> dict[str, Any] | None:
    """The ``waiting_prompts.chat_extras`` column: the extras plus ``stream_progress: true`` for a streamed
    request; None when neither applies. See docs/native-api.md#progress.
    """
    stored = dict(chat_extras) if chat_extras else {}
    if stream:
        stored[CHAT_STREAM_PROGRESS_KEY] = True
    return stored or None


def streams_progress(chat_extras: Mapping[str, Any] | None) -> bool:
    """Whether stored extras carry the stream hint."""
    return bool(chat_extras) and chat_extras.get(CHAT_STREAM_PROGRESS_KEY) is True  # type: ignore[union-attr]


def answer_chat_extras(chat_extras: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Stored extras without the stream hint (what verification and the fingerprint read); None when empty."""
    if not chat_extras:
        return None
    out = {key: chat_extras[key] for key in CHAT_EXTRAS_KEYS if key in chat_extras}
    return out or None


def forced_function_name(tool_choice: Any) -> str | None:
    """The function name a ``{type: function, function: {name}}`` tool choice forces, else None."""
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            return name
    return None


def forwards_tools(chat_extras: Mapping[str, Any] | None) -> bool:
    """Whether the worker receives tool definitions: tools are stored with a tool_choice other than none."""
    return bool(chat_extras) and bool(chat_extras.get("tools")) and chat_extras.get("tool_choice") != "none"  # type: ignore[union-attr]


def build_worker_chat_extras(chat_extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """The worker's narrowed copy of the stored extras (tool keys and response_format only).

    Under ``tool_choice`` none the tools, tool_choice and parallel_tool_calls are not sent; under a function
    choice only that function is sent in ``tools``, with ``tool_choice`` ``"required"``; auto and required
    (and an absent choice) are sent as stored. The stream hint is left out (see ``build_chat_job_payload``).
    See docs/native-api.md#chat-job-payload.
    """
    out: dict[str, Any] = {}
    if not chat_extras:
        return out
    tools = chat_extras.get("tools")
    choice = chat_extras.get("tool_choice")
    if tools and choice != "none":
        forced = forced_function_name(choice)
        if forced is not None:
            out["tools"] = [tool for tool in tools if tool.get("function", {}).get("name") == forced][:1]
            out["tool_choice"] = "required"
        else:
            out["tools"] = tools
            if choice is not None:
                out["tool_choice"] = choice
        if "parallel_tool_calls" in chat_extras:
            out["parallel_tool_calls"] = chat_extras["parallel_tool_calls"]
    if "response_format" in chat_extras:
        out["response_format"] = chat_extras["response_format"]
    return out


def build_chat_job_payload(
    *,
    messages: list[dict[str, Any]] | None,
    text_params: Mapping[str, Any],
    chat_extras: Mapping[str, Any] | None,
    max_length: int,
    max_context_length: int,
    messages_url: str | None = None,
) -> dict[str, Any]:
    """The ``payload`` of a chat job's pop response.

    ``messages`` is the array the worker receives (image references already replaced), or ``messages_url``
    replaces it for the messages_url transport. Every sampling field is present (the client's value or
    CHAT_SAMPLING_DEFAULTS: temperature 1.0, top_p 1.0, penalties 0, rep_pen 1.0, top_k 0, min_p 0);
    stop_sequence, seed and reasoning_effort only when sent; max_length and max_context_length the validated
    budgets (tokens); ``n`` 1; the narrowed tool keys; ``stream_progress: true`` when the stored extras carry
    the hint. No prompt. See docs/native-api.md#chat-job-payload, #progress.
    """
    payload: dict[str, Any] = {}
    if messages_url is not None:
        payload["messages_url"] = messages_url
    else:
        payload["messages"] = messages
    payload.update(build_worker_chat_extras(chat_extras))
    for key, default in CHAT_SAMPLING_DEFAULTS.items():
        payload[key] = text_params.get(key, default)
    for key in _SENT_ONLY_PARAMS:
        if key in text_params:
            payload[key] = text_params[key]
    payload["max_length"] = max_length
    payload["max_context_length"] = max_context_length
    payload["n"] = 1
    if streams_progress(chat_extras):
        payload[CHAT_STREAM_PROGRESS_KEY] = True
    return payload
