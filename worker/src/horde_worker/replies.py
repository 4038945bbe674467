"""Turning backend output into submit bodies: reasoning split, tool checks, strict schemas, finish reasons.

See docs/native-api.md#submit, #reasoning, #reply-verification (the checks the Horde makes,
which the worker makes first so that a declared guarantee holds), #worker-fault-reasons; worker/README.md#what-the-worker-declares.
Every function here is pure.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from horde_contract import (
    MAX_CHAT_NATIVE_FINISH_REASON_LENGTH,
    MAX_CHAT_REPORTED_TOKENS,
    MAX_CHAT_TOOL_CALL_COUNT,
    ChatFaultReason,
    ChatGuarantee,
)
from horde_contract.reply_schema import (
    SchemaBoundExceeded,
    SchemaUncompilable,
    compile_reply_schema,
    reply_schema_error,
)

from horde_worker.jobs import BackendFault, ChatJob, ChatOutput, TextJob

log = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def split_reasoning(text: str | None) -> tuple[str | None, str | None]:
    """Split ``<think>…</think>`` blocks out of generated text (docs/native-api.md#reasoning).

    Returns ``(content, reasoning)``: ``content`` is the text outside every block (leading whitespace after a
    block removed), ``reasoning`` the blocks' text joined by blank lines, or ``None`` when there was no block.
    Handled shapes:

    - ``<think>r</think>answer``: a closed block (several blocks are joined);
    - ``r</think>answer``: a close tag with no opening tag before it, as templates that put ``<think>`` in the
      generation prompt produce (Qwen3, DeepSeek-R1);
    - ``<think>r`` with no close: an unclosed block cut off at ``max_length``; everything after the tag is
      reasoning and the content is what came before it.

    ``None`` content stays ``None``.
    """
    if text is None:
        return None, None
    parts: list[str] = []
    rest = text
    open_at = rest.find(THINK_OPEN)
    close_at = rest.find(THINK_CLOSE)
    if close_at != -1 and (open_at == -1 or close_at < open_at):
        parts.append(rest[:close_at])
        rest = rest[close_at + len(THINK_CLOSE) :]
    content: list[str] = []
    while True:
        start = rest.find(THINK_OPEN)
        if start == -1:
            content.append(rest)
            break
        content.append(rest[:start])
        end = rest.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end == -1:
            parts.append(rest[start + len(THINK_OPEN) :])
            break
        parts.append(rest[start + len(THINK_OPEN) : end])
        rest = rest[end + len(THINK_CLOSE) :]
    if not parts:
        return text, None
    reasoning = "\n\n".join(p.strip() for p in parts if p.strip())
    return "".join(content).lstrip(), reasoning


def _partial_tag_length(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags`` (a tag that may be
    completed by the next delta)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class ThinkSplitter:
    """:func:`split_reasoning` applied incrementally, for streamed deltas.

    :meth:`feed` takes the next piece of generated text and returns the ``(reasoning, content)`` text it
    releases; :meth:`flush` releases what is held at the end. A tag cut across pieces is held until it is
    complete, as is whitespace whose fate depends on what follows (a block's trailing whitespace, and leading
    content whitespace that a later block strips). The released pieces concatenated equal what
    :func:`split_reasoning` returns for the whole text (``reasoning`` ``None`` as ``""``), except in two cases
    that cannot be known in advance: a close tag with no opening tag before it (the text before it, already
    released as content, is reasoning for :func:`split_reasoning`), and content that starts with whitespace
    and is followed by a block later (:func:`split_reasoning` strips that whitespace).
    """

    def __init__(self) -> None:
        self._buf = ""  # text not released yet: at most a partial tag
        self._in_block = False
        self._tag_seen = False  # a block (or an orphan close tag) was found: content is left-stripped
        self._content_started = False  # non-whitespace content was released
        self._held_space = ""  # leading content whitespace, released once content starts (no block yet)
        self._block_text = False  # the current block released text
        self._any_reasoning = False  # some block released text (the next one is joined by a blank line)
        self._block_space = ""  # whitespace inside a block, released once more block text follows

    def feed(self, text: str) -> tuple[str, str]:
        """Take ``text``; return the ``(reasoning, content)`` it releases (either may be empty)."""
        reasoning: list[str] = []
        content: list[str] = []
        self._buf += text
        self._scan(reasoning, content, final=False)
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """Release what is held at the end of the text (a partial tag is plain text then)."""
        reasoning: list[str] = []
        content: list[str] = []
        self._scan(reasoning, content, final=True)
        if not self._content_started and not self._tag_seen and self._held_space:
            content.append(self._held_space)  # whitespace-only content without a block is kept as is
        self._held_space = ""
        return "".join(reasoning), "".join(content)

    def _scan(self, reasoning: list[str], content: list[str], final: bool) -> None:
        while self._buf:
            if self._in_block:
                end = self._buf.find(THINK_CLOSE)
                if end == -1:
                    keep = 0 if final else _partial_tag_length(self._buf, (THINK_CLOSE,))
                    self._reason(self._buf[: len(self._buf) - keep], reasoning)
                    self._buf = self._buf[len(self._buf) - keep :]
                    return
                self._reason(self._buf[:end], reasoning)
                self._buf = self._buf[end + len(THINK_CLOSE) :]
                self._end_block()
                continue
            start = self._buf.find(THINK_OPEN)
            # only the first tag of the text may be a close tag without an opening one (split_reasoning)
            close = -1 if self._tag_seen else self._buf.find(THINK_CLOSE)
            if close != -1 and (start == -1 or close < start):
                before = self._buf[:close]
                self._buf = self._buf[close + len(THINK_CLOSE) :]
                if not self._content_started:  # nothing released as content yet: it is reasoning
                    self._held_space = ""
                    self._reason(before, reasoning)
                    self._end_block()
                else:  # already released as content: keep it so (the stream diverges from the submit)
                    content.append(before)
                self._tag_seen = True
                continue
            if start == -1:
                tags = (THINK_OPEN,) if self._tag_seen else (THINK_OPEN, THINK_CLOSE)
                keep = 0 if final else _partial_tag_length(self._buf, tags)
                self._content(self._buf[: len(self._buf) - keep], content)
                self._buf = self._buf[len(self._buf) - keep :]
                return
            self._content(self._buf[:start], content)
            self._buf = self._buf[start + len(THINK_OPEN) :]
            self._tag_seen = True
            # split_reasoning strips the content's leading whitespace once a block exists
            self._held_space = ""
            self._in_block = True

    def _content(self, text: str, out: list[str]) -> None:
        if not text:
            return
        if self._content_started:
            out.append(text)
            return
        stripped = text.lstrip()
        if not stripped:
            if not self._tag_seen:
                self._held_space += text
            return
        if not self._tag_seen:
            out.append(self._held_space + text)
        else:
            out.append(stripped)
        self._held_space = ""
        self._content_started = True

    def _reason(self, text: str, out: list[str]) -> None:
        if not text:
            return
        if not self._block_text:
            text = text.lstrip()
            if not text:
                return
            if self._any_reasoning:
                out.append("\n\n")
            self._block_text = True
            self._any_reasoning = True
        text = self._block_space + text
        body = text.rstrip()
        self._block_space = text[len(body) :]
        if body:
            out.append(body)

    def _end_block(self) -> None:
        self._in_block = False
        self._block_text = False
        self._block_space = ""


def map_finish_reason(native: str | None, has_tool_calls: bool) -> str:
    """Map a backend's finish reason to the submit's ``stop``/``length``/``content_filter``/``tool_calls``.

    ``tool_calls`` is returned only when the reply carries calls (the submit refuses it otherwise), and a
    reply with calls that stopped normally finishes ``tool_calls`` as OpenAI's do; the Horde itself stores a
    forced function's finish as ``stop``. Unknown or missing reasons count as ``stop``.
    """
    reason = (native or "").strip().lower()
    if reason in ("length", "max_tokens", "max_length", "limit"):
        return "length"
    if reason in ("content_filter", "safety", "recitation"):
        return "content_filter"
    if has_tool_calls:
        return "tool_calls"
    return "stop"


def _arguments_text(arguments: Any) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def normalize_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shape each call as ``{id, type: "function", function: {name, arguments: str}}``.

    A missing or repeated id is replaced by ``call_<n>`` (the worker mints ids; backends such as koboldcpp mint
    ``call_<5 digits>`` that can collide), so two calls never share an id. Raises
    :class:`BackendFault` ``tool_violation`` on a call without a function name.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, call in enumerate(calls, start=1):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            fn = {}
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise BackendFault(ChatFaultReason.tool_violation.value, "tool call without a function name")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in seen:
            call_id = f"call_{n}"
            while call_id in seen:
                call_id += "_"
        seen.add(call_id)
        out.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": _arguments_text(fn.get("arguments"))},
            }
        )
    return out


def check_tool_calls(
    job: ChatJob, calls: list[dict[str, Any]], declared: frozenset[str]
) -> list[dict[str, Any]]:
    """Apply the request's tool controls to normalized calls; return the calls to submit.

    - ``parallel_tool_calls`` false keeps the first call (``single_tool_call_enforced``);
    - every call names a function in the job's ``tools``, and a job without tools gets no call (the Horde
      refuses both under either conformance, docs/native-api.md#reply-verification);
    - at most 128 calls;
    - with ``tool_choice_enforced`` declared, a required or function choice gets at least one call, and a
      forced function is the one called.

    Raises :class:`BackendFault` ``tool_violation`` when a check fails: such a reply is not submitted.
    """
    if calls and job.parallel_tool_calls is False:
        calls = calls[:1]
    names = set(job.tool_names)
    for call in calls:
        name = call["function"]["name"]
        if name not in names:
            raise BackendFault(ChatFaultReason.tool_violation.value, f"call to {name!r}, not among the tools")
    if len(calls) > MAX_CHAT_TOOL_CALL_COUNT:
        raise BackendFault(ChatFaultReason.tool_violation.value, f"{len(calls)} tool calls")
    if ChatGuarantee.tool_choice_enforced.value in declared and job.requires_tool_call:
        if not calls:
            raise BackendFault(
                ChatFaultReason.tool_violation.value, "no tool call under a forcing tool_choice"
            )
        forced = job.forced_function
        if forced is not None and any(c["function"]["name"] != forced for c in calls):
            raise BackendFault(
                ChatFaultReason.tool_violation.value, f"a call to another function than {forced}"
            )
    return calls


def _refuse_constant(value: str) -> Any:
    raise ValueError(f"{value} is not JSON")


def parse_json_strict(text: str) -> Any:
    """Parse JSON as the Horde does: Python's ``json`` with ``NaN`` and ``Infinity`` refused.

    Raises ``ValueError`` on anything that is not strict JSON.
    """
    return json.loads(text, parse_constant=_refuse_constant)


def schema_validator(schema: dict[str, Any]) -> Any:
    """A bounded validator for a strict response schema, the Horde's own (``horde_contract.reply_schema``): by
    the draft its ``$schema`` names (Draft 2020-12 otherwise), patterns matched with RE2, references resolved in
    an empty registry (inside the schema only: no ``file://``, no URL is ever fetched), checking bounded in
    steps and CPU time. Raises :class:`BackendFault` ``unbuildable_grammar`` when the schema does not compile,
    since the worker cannot enforce a schema it cannot check (docs/native-api.md#reply-verification); returns None when
    checking the schema alone exceeds the bounds (the Horde judges the reply then).
    """
    try:
        return compile_reply_schema(schema)
    except SchemaUncompilable as exc:
        raise BackendFault(
            ChatFaultReason.unbuildable_grammar.value, f"schema does not compile: {exc}"
        ) from None
    except SchemaBoundExceeded as exc:
        log.warning("strict schema not checked: checking it exceeded %s", exc)
        return None


def check_strict_schema(job: ChatJob, content: str | None, has_tool_calls: bool) -> None:
    """Validate ``content`` against the job's strict ``json_schema`` (``structured_output_enforced``).

    A reply with tool calls and empty content is exempt, as at the Horde. Raises :class:`BackendFault`
    ``generation_error`` when the content is not JSON or does not match (the model failed the contract; the
    spec has no closer reason), ``unbuildable_grammar`` when the schema cannot be compiled or a reference does
    not resolve inside it. A check past the bounds of ``horde_contract.reply_schema`` (a pathological schema or
    reply) leaves the reply unchecked: it is submitted, and the Horde, under the same bounds, refuses it as
    nonconformant rather than counting a dropped job.
    """
    schema = job.strict_schema
    if schema is None or (has_tool_calls and not content):
        return
    validator = schema_validator(schema)
    try:
        value = parse_json_strict(content or "")
    except ValueError as exc:
        raise BackendFault(ChatFaultReason.generation_error.value, f"reply is not JSON: {exc}") from None
    if validator is None:
        return
    try:
        error = reply_schema_error(validator, value)
    except SchemaUncompilable as exc:  # a $ref that does not resolve inside the schema
        raise BackendFault(ChatFaultReason.unbuildable_grammar.value, f"schema: {exc}") from None
    except SchemaBoundExceeded as exc:
        log.warning("reply not checked against its strict schema: checking it exceeded %s", exc)
        return
    if error is not None:
        raise BackendFault(
            ChatFaultReason.generation_error.value, f"reply does not match the schema: {error.message}"
        )


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    limit: int = MAX_CHAT_REPORTED_TOKENS
    return max(0, min(value, limit))


def build_chat_submit(
    job: ChatJob, output: ChatOutput, model_id: str, declared: frozenset[str]
) -> dict[str, Any]:
    """The structured submit body for a chat reply (docs/native-api.md#submit).

    Returns ``{id, message: {role: "assistant", content, tool_calls?, reasoning_content?}, finish_reason,
    native_finish_reason?, prompt_tokens?, completion_tokens?, reasoning_tokens?, model_id}``; counts appear
    only when the backend reported them. Applies :func:`split_reasoning`, :func:`normalize_tool_calls`,
    :func:`check_tool_calls` and, when ``structured_output_enforced`` is declared, :func:`check_strict_schema`.
    Raises :class:`BackendFault` when the reply must not be submitted.
    """
    content, think = split_reasoning(output.content)
    reasoning_parts = [r for r in (output.reasoning, think) if r]
    reasoning = "\n\n".join(reasoning_parts) if reasoning_parts else None
    calls = check_tool_calls(job, normalize_tool_calls(output.tool_calls), declared)
    if calls and content is not None and not content.strip():
        content = None  # OpenAI's shape for a reply that only calls tools
    if not calls and content is None:
        content = ""
    if ChatGuarantee.structured_output_enforced.value in declared:
        check_strict_schema(job, content, bool(calls))
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = reasoning
    body: dict[str, Any] = {
        "id": job.id,
        "message": message,
        "finish_reason": map_finish_reason(output.native_finish_reason, bool(calls)),
        "model_id": model_id,
    }
    if output.native_finish_reason:
        body["native_finish_reason"] = str(output.native_finish_reason)[:MAX_CHAT_NATIVE_FINISH_REASON_LENGTH]
    for key in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
        value = _count(getattr(output, key))
        if value is not None:
            body[key] = value
    return body


def build_chat_fault(job_id: str, model_id: str, reason: str | None) -> dict[str, Any]:
    """A faulted chat submit ``{id, state: "faulted", model_id, fault_reason?}`` (docs/native-api.md#submit)."""
    body: dict[str, Any] = {"id": job_id, "state": "faulted", "model_id": model_id}
    if reason:
        body["fault_reason"] = reason
    return body


def build_text_submit(job: TextJob, generation: str) -> dict[str, Any]:
    """A legacy text submit ``{id, generation, state: "ok", seed}`` (docs/native-api.md#submit)."""
    return {"id": job.id, "generation": generation, "state": "ok", "seed": job.seed}


def build_text_fault(job_id: str) -> dict[str, Any]:
    """A faulted text submit; upstream requires ``generation`` even then (docs/native-api.md#submit)."""
    return {"id": job_id, "state": "faulted", "generation": "faulted", "seed": -1}


def trim_stop(text: str, stops: list[str]) -> str:
    """Cut ``text`` at the first occurrence of any stop string (backends that do not trim them)."""
    cut = len(text)
    for stop in stops:
        at = text.find(stop)
        if stop and at != -1:
            cut = min(cut, at)
    return text[:cut]
