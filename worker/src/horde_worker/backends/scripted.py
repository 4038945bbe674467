"""The scripted backend: deterministic replies steered by markers in the last user message.

Used by the tests and by ``make run``. Without a marker the reply is
``"Hello from the scripted backend: <last user text>"``; a job with a ``response_format`` gets a JSON value
built from its schema instead. Markers (``[[name]]`` or ``[[name:arg]]``, removed from the echoed text):

=============================  =====================================================================
``[[tool]]``                   call the first tool (arguments built from its parameters schema)
``[[tool:NAME]]``              call NAME; repeat the marker for several calls (ids ``call_1``, …)
``[[tool:NAME:{json}]]``       call NAME with these arguments
``[[think]]``                  reply with ``<think>…</think>`` before the answer (reasoning split)
``[[think:unclosed]]``         an unclosed ``<think>`` block cut off at max_length, finish ``length``
``[[length]]``                 finish ``length`` (the echo is cut to max_length words anyway)
``[[finish:REASON]]``          report REASON as the backend's native finish reason
``[[reply:TEXT]]``             reply exactly TEXT
``[[json]]`` / ``[[json:bad]]``  JSON built from the response schema / text that is not JSON
``[[nousage]]``                report no token counts
``[[sleep:SECONDS]]``          wait before replying (lease and shutdown tests)
``[[pace:SECONDS]]``           spread the reply over SECONDS: streamed word by word at an even pace (the
                               ``<think>`` block first with ``[[think]]``), or returned after SECONDS
``[[words:N]]``                append N deterministic words to the reply (long streamed replies)
``[[random]]``                 start the reply with a random word (a restarted attempt replies differently)
``[[fault:REASON]]``           fail: ``prompt_overflow``, ``unbuildable_grammar``, ``generation_error`` raise
                               that fault; ``tool_violation`` calls an unknown tool, which the worker's
                               check faults; ``reply_refused`` sends reasoning over the 1 MiB cap, which the
                               Horde refuses with a 400; ``none`` faults without a reason; ``crash`` raises
                               an unexpected error (faulted ``generation_error``)
=============================  =====================================================================

Token counts are whitespace-separated words: prompt words over every message, completion words of the
reply. A prompt whose words exceed ``max_context_length - max_length`` is faulted ``prompt_overflow``, so the
backend "counts" before generating like a real one. Legacy text jobs read the same markers from the prompt.

Streaming (:meth:`ScriptedBackend.stream_chat`) yields the reply's text as it is submitted before the worker's
split, ``<think>`` tags included, in word-sized pieces (each word with the whitespace before it), then the
whole output; a tool call reply is not streamed. Cancelling the consumer interrupts the pace at once.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from horde_contract import MAX_CHAT_TEXT_BYTES, ChatFaultReason, ChatFeature
from horde_contract.vocab import CHAT_FEATURE_VALUES, CHAT_GUARANTEE_VALUES

from horde_worker.backends.base import Backend
from horde_worker.declaration import Capabilities
from horde_worker.jobs import BackendFault, ChatDelta, ChatJob, ChatOutput, TextJob, message_text
from horde_worker.schema_sample import sample_value

MARKER = re.compile(r"\[\[(\w+)(?::(.*?))?\]\]", re.DOTALL)
GREETING = "Hello from the scripted backend:"
#: The vocabulary ``[[words:N]]`` cycles through.
FILLER = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
PIECE = re.compile(r"\s*\S+")


@dataclass
class Marker:
    """One ``[[name:arg]]`` marker."""

    name: str
    arg: str | None


def parse_markers(text: str) -> tuple[list[Marker], str]:
    """Return the markers in ``text`` in order and the text with them removed (whitespace collapsed)."""
    markers = [Marker(m.group(1).lower(), m.group(2)) for m in MARKER.finditer(text)]
    rest = " ".join(MARKER.sub(" ", text).split())
    return markers, rest


def _words(text: str) -> int:
    return len(text.split())


def filler_words(count: int) -> str:
    """``count`` deterministic words: the NATO alphabet, cycled."""
    return " ".join(FILLER[i % len(FILLER)] for i in range(max(0, count)))


def stream_pieces(text: str) -> list[str]:
    """``text`` cut into word-sized pieces (each word with the whitespace before it; trailing whitespace is a
    last piece), which concatenate back to ``text``."""
    pieces = PIECE.findall(text)
    rest = text[sum(len(p) for p in pieces) :]
    if rest:
        pieces.append(rest)
    return pieces


def _seconds(value: str | None) -> float:
    try:
        return max(0.0, float(value or 0))
    except ValueError:
        return 0.0


def _fitting_prompt_words(job: ChatJob) -> int:
    """The prompt's words (tools included); faulted ``prompt_overflow`` when they leave no room for
    ``max_length``, as a real backend counts before generating."""
    prompt_words = sum(_words(message_text(m)) for m in job.messages)
    if job.tools:
        prompt_words += _words(json.dumps(job.tools))
    if prompt_words > job.max_context_length - job.max_length:
        raise BackendFault(
            ChatFaultReason.prompt_overflow.value,
            f"{prompt_words} prompt words do not fit {job.max_context_length} - {job.max_length}",
        )
    return prompt_words


def _echo_reply(job: ChatJob, names: dict[str, str | None], echo: str) -> tuple[str, str]:
    """The greeting and the echoed text (``[[words]]``, ``[[random]]`` applied), cut to ``max_length`` words;
    with the native finish reason."""
    content = f"{GREETING} {echo}".rstrip()
    if "words" in names:
        content = f"{content} {filler_words(int(_seconds(names['words'])))}".rstrip()
    if "random" in names:
        content = f"{secrets.token_hex(4)} {content}"
    words = content.split()
    if len(words) > job.max_length:
        return " ".join(words[: job.max_length]), "length"
    return content, "stop"


def _with_reasoning(
    content: str | None, native: str, names: dict[str, str | None], echo: str
) -> tuple[str | None, str, str | None]:
    """``content`` with the ``<think>`` block the markers ask for, the native finish reason, and the reasoning
    text (None without one)."""
    if names.get("fault") == ChatFaultReason.reply_refused.value:
        reasoning_text = "x" * (MAX_CHAT_TEXT_BYTES + 1)
        return f"<think>{reasoning_text}</think>{content or ''}", native, reasoning_text
    if "think" in names:
        thought = f"Scripted reasoning about: {echo}".rstrip()
        if names["think"] == "unclosed":
            return f"<think>{thought}", "length", thought
        return f"<think>{thought}</think>\n\n{content or ''}", native, thought
    return content, native, None


def _completion_words(content: str | None, tool_calls: list[dict[str, Any]]) -> int:
    """Completion "tokens": the reply's words (``<think>`` tags apart) and each call's argument words plus one."""
    visible = content or ""
    return _words(visible.replace("<think>", " ").replace("</think>", " ")) + sum(
        _words(c["function"]["arguments"]) + 1 for c in tool_calls
    )


class ScriptedBackend(Backend):
    """Deterministic backend; see the module docstring for the markers.

    ``features`` overrides the declared features and guarantees (default: every one but ``vision``);
    ``max_context_length``/``max_length`` are the limits it reports (``None``: the operator's settings).
    """

    kind = "scripted"

    def __init__(
        self,
        model_name: str | None = None,
        features: list[str] | None = None,
        max_context_length: int | None = None,
        max_length: int | None = None,
    ) -> None:
        self.model_name = model_name
        self.features = features
        self.max_context_length = max_context_length
        self.max_length = max_length

    async def start(self) -> Capabilities:
        """Report every feature but vision and every guarantee (or the configured ``features``)."""
        if self.features is not None:
            chosen = set(self.features)
            feats, guars = chosen & CHAT_FEATURE_VALUES, chosen & CHAT_GUARANTEE_VALUES
        else:
            feats, guars = set(CHAT_FEATURE_VALUES) - {ChatFeature.vision.value}, set(CHAT_GUARANTEE_VALUES)
        return Capabilities(
            features=frozenset(feats),
            guarantees=frozenset(guars),
            max_context_length=self.max_context_length,
            max_length=self.max_length,
            model_name=self.model_name,
        )

    async def generate_chat(self, job: ChatJob) -> ChatOutput:
        """Reply as the markers of the last user message say (module docstring)."""
        out, pace = await self._reply(job)
        if pace:
            await asyncio.sleep(pace)
        return out

    async def stream_chat(self, job: ChatJob) -> AsyncGenerator[ChatDelta | ChatOutput, None]:
        """Yield the reply's content (``<think>`` tags included) word by word, ``[[pace]]`` spreading the
        pieces evenly, then the output (module docstring)."""
        out, pace = await self._reply(job)
        pieces = stream_pieces(out.content or "")
        step = pace / len(pieces) if pieces else pace
        for piece in pieces:
            if step:
                await asyncio.sleep(step)
            yield ChatDelta(content=piece)
        if not pieces and pace:
            await asyncio.sleep(pace)
        yield out

    async def _reply(self, job: ChatJob) -> tuple[ChatOutput, float]:
        """The output for a chat job and the ``[[pace]]`` seconds (0 without the marker)."""
        markers, echo = parse_markers(job.last_user_text)
        names = {m.name: m.arg for m in markers}
        await self._common(markers, names)
        prompt_words = _fitting_prompt_words(job)
        content, native, tool_calls = self._answer(job, markers, names, echo)
        content, native, reasoning_text = _with_reasoning(content, native, names, echo)
        if "length" in names:
            native = "length"
        if names.get("finish"):
            native = names["finish"] or native

        out = ChatOutput(content=content, tool_calls=tool_calls, native_finish_reason=native)
        if "nousage" not in names:
            out.prompt_tokens = prompt_words
            out.completion_tokens = _completion_words(content, tool_calls)
            if reasoning_text is not None:
                out.reasoning_tokens = _words(reasoning_text)
        return out, _seconds(names.get("pace"))

    @classmethod
    def _answer(
        cls, job: ChatJob, markers: list[Marker], names: dict[str, str | None], echo: str
    ) -> tuple[str | None, str, list[dict[str, Any]]]:
        """The reply before any reasoning: content, native finish reason and tool calls."""
        if names.get("fault") == ChatFaultReason.tool_violation.value:
            violation: dict[str, Any] = {
                "id": "call_1",
                "type": "function",
                "function": {"name": "not_a_tool", "arguments": "{}"},
            }
            return None, "tool_calls", [violation]
        tool_markers = (m for m in markers if m.name == "tool")
        tool_calls = [cls._tool_call(job, m.arg, n) for n, m in enumerate(tool_markers, start=1)]
        if tool_calls:
            return None, "tool_calls", tool_calls
        if "reply" in names:
            return names["reply"] or "", "stop", []
        if "json" in names:
            return "this is not JSON" if names["json"] == "bad" else cls._json_reply(job), "stop", []
        if job.response_format:
            return cls._json_reply(job), "stop", []
        content, native = _echo_reply(job, names, echo)
        return content, native, []

    async def generate_text(self, job: TextJob, max_length: int) -> str:
        """Echo the prompt's last line after the greeting, cut to ``max_length`` words."""
        markers, _ = parse_markers(job.prompt)
        names = {m.name: m.arg for m in markers}
        await self._common(markers, names)
        if "pace" in names:
            await asyncio.sleep(_seconds(names["pace"]))
        if "reply" in names:
            return names["reply"] or ""
        lines = [parse_markers(ln)[1] for ln in job.prompt.splitlines()]
        lines = [ln for ln in lines if ln]
        echo = lines[-1] if lines else ""
        words = f"{GREETING} {echo}".split()
        return " ".join(words[:max_length])

    async def _common(self, markers: list[Marker], names: dict[str, str | None]) -> None:
        if "sleep" in names:
            await asyncio.sleep(_seconds(names["sleep"]))
        fault = names.get("fault")
        if fault in (
            ChatFaultReason.prompt_overflow.value,
            ChatFaultReason.unbuildable_grammar.value,
            ChatFaultReason.generation_error.value,
        ):
            raise BackendFault(fault, f"scripted fault {fault}")
        if fault == "none":
            raise BackendFault(None, "scripted fault without a reason")
        if fault == "crash":
            raise RuntimeError("scripted backend crash")

    @staticmethod
    def _tool_call(job: ChatJob, arg: str | None, n: int) -> dict[str, Any]:
        name, args = None, None
        if arg:
            name, _, raw = arg.partition(":")
            args = raw or None
        if not name:
            name = job.tool_names[0] if job.tool_names else "no_tool"
        if args is None:
            params = next(
                (
                    t["function"].get("parameters")
                    for t in job.tools or []
                    if t["function"].get("name") == name
                ),
                None,
            )
            args = json.dumps(sample_value(params) if params else {}, separators=(",", ":"))
        return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}}

    @staticmethod
    def _json_reply(job: ChatJob) -> str:
        rf = job.response_format or {}
        schema = (rf.get("json_schema") or {}).get("schema") if rf.get("type") == "json_schema" else None
        value = sample_value(schema) if schema else {"reply": "scripted"}
        if not isinstance(value, dict) and rf.get("type") == "json_object":
            value = {"reply": value}
        return json.dumps(value, separators=(",", ":"))
