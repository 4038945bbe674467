"""Jobs as the worker receives them and replies as backends produce them.

Shapes follow docs/native-api.md#chat-job-payload (chat jobs) and docs/native-api.md#pop (legacy text
jobs). Backends read a :class:`ChatJob` or :class:`TextJob` and return a :class:`ChatOutput` or a string; the
worker turns those into submit bodies (``horde_worker.replies``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from horde_contract import CHAT_STREAM_PROGRESS_KEY


class BackendFault(Exception):
    """A backend could not produce a reply for a job.

    ``reason`` is a worker fault reason (docs/native-api.md#worker-fault-reasons) such as ``prompt_overflow`` or
    ``unbuildable_grammar``, or ``None`` for a fault sent without a reason (a failed ``messages_url`` fetch).
    The message is for the worker's log only; the Horde never stores worker text.
    """

    def __init__(self, reason: str | None, message: str = "") -> None:
        super().__init__(message or (reason or "fault"))
        self.reason = reason


class JobCancelled(Exception):
    """The horde told the worker to stop a streamed job (progress answered ``cancelled: true`` or 404
    ``ChatJobAborted``): the generation is aborted and the job is not submitted (docs/native-api.md#progress).
    ``reason`` is ``cancelled`` or ``aborted``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _stop_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    return [str(v) for v in value if isinstance(v, str) and v]


@dataclass
class ChatJob:
    """A popped chat job (docs/native-api.md#chat-job-payload).

    ``messages`` is the OpenAI messages array; ``tools``/``tool_choice``/``parallel_tool_calls``/
    ``response_format`` are present only when the request applies them (already narrowed by dispatch: a forced
    function arrives as that one tool with ``tool_choice`` ``"required"``). Sampling fields are always present in
    a real payload; the defaults here are the spec's. ``max_length`` is in tokens, ``max_context_length`` is the
    request's context budget in tokens. ``stream_progress`` is the stream hint (``stream_progress: true`` in the
    payload): the worker may post progress for this job (docs/native-api.md#progress).
    """

    id: str
    messages: list[dict[str, Any]]
    max_length: int
    max_context_length: int
    model: str | None = None
    ttl: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    rep_pen: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    reasoning_effort: str | None = None
    messages_url: str | None = None
    stream_progress: bool = False
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_pop(cls, pop: dict[str, Any]) -> ChatJob:
        """Build a job from a chat pop response ``{id, payload, model, ttl, chat: true}``.

        Raises ``KeyError``/``TypeError``/``ValueError`` on a payload that is not a chat payload.
        """
        payload = dict(pop["payload"])
        messages = payload.get("messages")
        return cls(
            id=str(pop["id"]),
            messages=list(messages) if isinstance(messages, list) else [],
            messages_url=payload.get("messages_url"),
            max_length=int(payload.get("max_length") or 512),
            max_context_length=int(payload.get("max_context_length") or 2048),
            model=pop.get("model"),
            ttl=pop.get("ttl"),
            tools=payload.get("tools") or None,
            tool_choice=payload.get("tool_choice"),
            parallel_tool_calls=payload.get("parallel_tool_calls"),
            response_format=payload.get("response_format") or None,
            temperature=float(payload.get("temperature", 1.0)),
            top_p=float(payload.get("top_p", 1.0)),
            frequency_penalty=float(payload.get("frequency_penalty", 0.0)),
            presence_penalty=float(payload.get("presence_penalty", 0.0)),
            rep_pen=float(payload.get("rep_pen", 1.0)),
            top_k=int(payload.get("top_k", 0)),
            min_p=float(payload.get("min_p", 0.0)),
            stop=_stop_list(payload.get("stop_sequence")),
            seed=payload.get("seed") if isinstance(payload.get("seed"), int) else None,
            reasoning_effort=payload.get("reasoning_effort"),
            stream_progress=payload.get(CHAT_STREAM_PROGRESS_KEY) is True,
            payload=payload,
        )

    @property
    def tool_names(self) -> list[str]:
        """Names of the functions in ``tools``, in order."""
        names = []
        for tool in self.tools or []:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.append(fn["name"])
        return names

    @property
    def forced_function(self) -> str | None:
        """The one function the reply must call, when the choice forces one.

        Dispatch narrows ``{"type": "function", ...}`` to that tool plus ``"required"``, so a required choice
        with a single tool forces that tool; an object choice (from a horde that does not narrow) names it.
        """
        choice = self.tool_choice
        if isinstance(choice, dict):
            fn = choice.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                return str(fn["name"])
        if choice == "required" and len(self.tool_names) == 1:
            return self.tool_names[0]
        return None

    @property
    def requires_tool_call(self) -> bool:
        """True under ``tool_choice`` ``"required"`` or a function choice, with tools present."""
        return bool(self.tools) and (self.tool_choice == "required" or isinstance(self.tool_choice, dict))

    @property
    def strict_schema(self) -> dict[str, Any] | None:
        """The JSON schema of a ``json_schema`` response format with ``strict: true``, else ``None``."""
        rf = self.response_format
        if not rf or rf.get("type") != "json_schema":
            return None
        js = rf.get("json_schema") or {}
        if js.get("strict") is not True:
            return None
        schema = js.get("schema")
        return schema if isinstance(schema, dict) else {}

    @property
    def last_user_text(self) -> str:
        """The text of the last user message (text parts joined by newlines), or ``""``."""
        for msg in reversed(self.messages):
            if msg.get("role") == "user":
                return message_text(msg)
        return ""


def message_text(msg: dict[str, Any]) -> str:
    """The text of one message: a string content, or its ``text`` parts joined by newlines."""
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
    return "\n".join(parts)


@dataclass
class TextJob:
    """A popped legacy text job (docs/native-api.md#pop): a KoboldAI-style ``prompt`` with its params.

    ``max_length`` is in tokens; absent from the upstream payload when the client did not send it, so it
    falls back to the worker's own limit.
    """

    id: str
    prompt: str
    payload: dict[str, Any]
    model: str | None = None
    ttl: int | None = None

    @classmethod
    def from_pop(cls, pop: dict[str, Any]) -> TextJob:
        """Build a job from a text pop response ``{id, payload: {prompt, ...}, model, ttl}``."""
        payload = dict(pop["payload"])
        return cls(
            id=str(pop["id"]),
            prompt=str(payload.get("prompt", "")),
            payload=payload,
            model=pop.get("model"),
            ttl=pop.get("ttl"),
        )

    def param(self, name: str, default: Any) -> Any:
        """A sampler field of the payload, or ``default`` when absent or null."""
        value = self.payload.get(name)
        return default if value is None else value

    @property
    def seed(self) -> int:
        """The seed to report on submit: the payload's ``sampler_seed``/``seed`` when an int, else 0."""
        for key in ("sampler_seed", "seed"):
            value = self.payload.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return 0


@dataclass
class ChatOutput:
    """What a backend produced for a chat job, before the worker's checks.

    ``content`` may still hold ``<think>`` blocks (the worker splits them out); ``reasoning`` is reasoning the
    backend already separated (llama-server ``reasoning_content``, vLLM/Ollama ``reasoning``). ``tool_calls``
    are OpenAI-shaped ``{id?, type, function: {name, arguments}}``; ``arguments`` may be a string or an object.
    ``native_finish_reason`` is the backend's own reason, mapped by the worker. Token counts are ``None`` when
    the backend did not report them.
    """

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    native_finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None


@dataclass
class ChatDelta:
    """A piece of a chat reply as a streaming backend produces it: ``content`` (which may still hold
    ``<think>`` tags, split by the worker) and ``reasoning`` the backend already separated. Either may be
    empty."""

    content: str = ""
    reasoning: str = ""
