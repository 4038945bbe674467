"""Submit bodies, reply verification, the stored reply and its charge.

See docs/native-api.md#submit, #reasoning, #reply-verification, #worker-fault-reasons,
#pricing; docs/native-api.md#submit (the text submit body).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ._json_values import is_int, utf8_len
from .errors import RC, HordeError
from .extras import forced_function_name
from .limits import (
    CHAT_PROGRESS_BYTES_PER_TOKEN,
    MAX_CHAT_NATIVE_FINISH_REASON_LENGTH,
    MAX_CHAT_REPORTED_TOKENS,
    MAX_CHAT_TEXT_BYTES,
    MAX_CHAT_TOOL_CALL_COUNT,
    MIN_CHARGED_TOKENS,
)
from .reply_schema import (
    DEFAULT_SCHEMA_LIMITS,
    SchemaBoundExceeded,
    SchemaLimits,
    SchemaUncompilable,
    compile_reply_schema,
    reply_schema_error,
)
from .vocab import ChatConformance, ChatFinishReason, ChatSubmitState

_CHAT_SUBMIT_MARKERS = ("message", "model_id", "finish_reason", "fault_reason")
_MESSAGE_KEYS = frozenset({"role", "content", "tool_calls", "reasoning_content"})
_CALL_KEYS = frozenset({"id", "type", "function"})
_CALL_FUNCTION_KEYS = frozenset({"name", "arguments"})
_COUNT_KEYS = ("prompt_tokens", "completion_tokens", "reasoning_tokens")
_STATES = frozenset(ChatSubmitState.__members__)


def _invalid(param: str | None, text: str) -> HordeError:
    message = f"'{param}': {text}" if param else text
    return HordeError(400, RC.ChatSubmitInvalid, message, param, openai_message=text)


def submit_invalid(message: str, param: str | None = None) -> HordeError:
    """400 ChatSubmitInvalid with ``message`` as it is (no path prefix) and ``param`` beside it."""
    return HordeError(400, RC.ChatSubmitInvalid, message, param)


def _nonconformant(param: str | None, text: str) -> HordeError:
    message = f"'{param}': {text}" if param else text
    return HordeError(400, RC.ChatSubmitNonconformant, message, param, openai_message=text)


@dataclass(frozen=True, slots=True)
class TextSubmit:
    """A text job's submit: ``{id, generation, state, seed, gen_metadata}`` (docs/native-api.md#submit)."""

    id: str
    generation: str
    state: str = ChatSubmitState.ok
    seed: int = 0
    gen_metadata: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChatSubmit:
    """A chat job's structured submit (docs/native-api.md#submit).

    ``message`` is the validated reply (None on a faulted submit); ``finish_reason`` as submitted; the
    counts are None when not reported; ``fault_reason`` is the worker's raw value (map it with
    ``chat_worker_fault_message``), read only on a faulted submit.
    """

    id: str
    model_id: str
    state: str = ChatSubmitState.ok
    message: dict[str, Any] | None = None
    finish_reason: str | None = None
    native_finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    fault_reason: str | None = None
    seed: int = 0
    gen_metadata: list[dict[str, Any]] = field(default_factory=list)

    @property
    def faulted(self) -> bool:
        """Whether the worker faulted the job."""
        return self.state == ChatSubmitState.faulted


#: A parsed submit body: a chat reply or fault, or a text generation.
SubmitBody: TypeAlias = ChatSubmit | TextSubmit


def _parse_common(body: Mapping[str, Any], invalid: Any) -> tuple[str, str, int, list[dict[str, Any]]]:
    job_id = body.get("id")
    if not isinstance(job_id, str) or not job_id:
        raise invalid("id", "has to be the generation id (a string).")
    state = body.get("state", ChatSubmitState.ok)
    if state is None:
        state = ChatSubmitState.ok
    if not isinstance(state, str) or state not in _STATES:
        raise invalid("state", "has to be one of ok, censored, csam, faulted.")
    seed = body.get("seed", 0)
    if seed is None:
        seed = 0
    if not is_int(seed) or not -(2**63) <= seed < 2**63:
        raise invalid("seed", "has to be an integer of at most 64 bits.")
    metadata = body.get("gen_metadata") or []
    if not isinstance(metadata, list) or not all(isinstance(m, dict) for m in metadata):
        raise invalid("gen_metadata", "has to be an array of objects.")
    return job_id, str(state), seed, metadata


def _parse_reply_message(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _invalid(
            "message", "has to be an object {role: assistant, content, tool_calls?, reasoning_content?}."
        )
    for key in raw:
        if key not in _MESSAGE_KEYS:
            raise _invalid(f"message.{key}", "is not a key of a reply message.")
    if raw.get("role") != "assistant":
        raise _invalid("message.role", "has to be 'assistant'.")
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        raise _invalid("message.content", "has to be a string, or null with tool_calls.")
    out: dict[str, Any] = {"role": "assistant", "content": content}
    calls = raw.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or not 1 <= len(calls) <= MAX_CHAT_TOOL_CALL_COUNT:
            raise _invalid("message.tool_calls", f"has to hold 1 to {MAX_CHAT_TOOL_CALL_COUNT} tool calls.")
        parsed = []
        for index, call in enumerate(calls):
            path = f"message.tool_calls[{index}]"
            if not isinstance(call, dict) or any(key not in _CALL_KEYS for key in call):
                raise _invalid(path, "has to be {id, type: function, function: {name, arguments}}.")
            function = call.get("function")
            if (
                not isinstance(call.get("id"), str)
                or not call["id"]
                or call.get("type") != "function"
                or not isinstance(function, dict)
                or any(key not in _CALL_FUNCTION_KEYS for key in function)
                or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)
            ):
                raise _invalid(path, "has to be {id, type: function, function: {name, arguments}}.")
            parsed.append(
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": function["name"], "arguments": function["arguments"]},
                }
            )
        out["tool_calls"] = parsed
    elif content is None:
        raise _invalid("message.content", "may be null only with tool_calls.")
    reasoning = raw.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise _invalid("message.reasoning_content", "has to be a string.")
        size = utf8_len(reasoning)
        if size > MAX_CHAT_TEXT_BYTES:
            raise _invalid(
                "message.reasoning_content",
                f"takes {size} bytes of UTF-8; at most {MAX_CHAT_TEXT_BYTES} are allowed.",
            )
        out["reasoning_content"] = reasoning
    return out


def parse_submit_body(body: Any) -> SubmitBody:
    """Parse ``POST /v2/generate/text/submit``: a body carrying message, model_id, finish_reason or
    fault_reason is a :class:`ChatSubmit`, any other a :class:`TextSubmit`.

    A chat submit raises 400 ChatSubmitInvalid (param the field) for: generation beside message, a missing
    or invalid message or finish_reason (unless faulted), a tool_calls finish without calls, a missing
    model_id, native_finish_reason over 32 characters, counts outside 0–10,000,000, reasoning over
    MAX_CHAT_TEXT_BYTES. A text submit without a string generation raises 400 BadRequest. The service
    answers a text job's submit carrying message with ChatSubmitInvalid itself (it knows the job).
    See docs/native-api.md#submit, #reasoning.
    """
    if not isinstance(body, dict):
        raise HordeError(400, RC.BadRequest, "The submit body has to be a JSON object.", None)
    if not any(key in body for key in _CHAT_SUBMIT_MARKERS):
        job_id, state, seed, metadata = _parse_common(
            body, lambda p, t: HordeError(400, RC.BadRequest, f"'{p}': {t}", p, openai_message=t)
        )
        generation = body.get("generation")
        if not isinstance(generation, str):
            raise HordeError(
                400, RC.BadRequest, "'generation': Missing required parameter 'generation'.", "generation"
            )
        return TextSubmit(id=job_id, generation=generation, state=state, seed=seed, gen_metadata=metadata)

    job_id, state, seed, metadata = _parse_common(body, _invalid)
    if "message" in body and "generation" in body:
        raise _invalid("generation", "a chat submit sends message, not generation.")
    model_id = body.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise _invalid("model_id", "has to be the assigned model (a string).")
    fault_reason = body.get("fault_reason")
    if fault_reason is not None and not isinstance(fault_reason, str):
        raise _invalid("fault_reason", "has to be a string.")
    counts: dict[str, int | None] = {}
    for key in _COUNT_KEYS:
        value = body.get(key)
        if value is not None and (not is_int(value) or not 0 <= value <= MAX_CHAT_REPORTED_TOKENS):
            raise _invalid(key, f"has to be an integer from 0 to {MAX_CHAT_REPORTED_TOKENS}.")
        counts[key] = value
    native = body.get("native_finish_reason")
    if native is not None and (
        not isinstance(native, str) or len(native) > MAX_CHAT_NATIVE_FINISH_REASON_LENGTH
    ):
        raise _invalid(
            "native_finish_reason",
            f"has to be a string of at most {MAX_CHAT_NATIVE_FINISH_REASON_LENGTH} characters.",
        )
    if isinstance(native, str) and "\x00" in native:
        native = native.replace(
            "\x00", "\ufffd"
        )  # stored like every submitted string (PostgreSQL has no NUL)
    if state == ChatSubmitState.faulted:
        # The reply of a faulted job is discarded, so it is not checked.
        return ChatSubmit(
            id=job_id,
            model_id=model_id,
            state=state,
            fault_reason=fault_reason,
            seed=seed,
            gen_metadata=metadata,
        )
    if "message" not in body:
        raise _invalid("message", "a chat submit needs message.")
    message = _parse_reply_message(body["message"])
    finish_reason = body.get("finish_reason")
    if not isinstance(finish_reason, str) or finish_reason not in ChatFinishReason.__members__:
        raise _invalid("finish_reason", "has to be one of stop, length, content_filter, tool_calls.")
    if finish_reason == ChatFinishReason.tool_calls and not message.get("tool_calls"):
        raise _invalid("finish_reason", "tool_calls needs a non-empty message.tool_calls.")
    return ChatSubmit(
        id=job_id,
        model_id=model_id,
        state=state,
        message=message,
        finish_reason=finish_reason,
        native_finish_reason=native,
        prompt_tokens=counts["prompt_tokens"],
        completion_tokens=counts["completion_tokens"],
        reasoning_tokens=counts["reasoning_tokens"],
        fault_reason=fault_reason,
        seed=seed,
        gen_metadata=metadata,
    )


def max_reply_bytes(max_length: int) -> int:
    """The UTF-8 bytes a reply to a job of ``max_length`` tokens may take: CHAT_PROGRESS_BYTES_PER_TOKEN (16) per
    token, the same bound as the job's progress posts (a token decodes to a few characters of at most four
    bytes). See docs/native-api.md#progress."""
    return CHAT_PROGRESS_BYTES_PER_TOKEN * max(max_length, 0)


def chat_reply_output_bytes(message: Mapping[str, Any]) -> int:
    """UTF-8 bytes of a chat reply's output as stored twice (generation and message): the content, and each tool
    call's id, function name and arguments. reasoning_content has its own bound (MAX_CHAT_TEXT_BYTES)."""
    total = utf8_len(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        for part in (call.get("id"), function.get("name"), function.get("arguments")):
            if isinstance(part, str):
                total += utf8_len(part)
    return total


def check_chat_reply_size(message: Mapping[str, Any], max_length: int) -> None:
    """400 ChatSubmitInvalid (param message) when the reply's content and tool calls take more UTF-8 bytes than
    :func:`max_reply_bytes` allows for the request's ``max_length``: the reply is bounded by the job, not only by
    the body. The submit checks it before the model and the reply's contract."""
    size = chat_reply_output_bytes(message)
    cap = max_reply_bytes(max_length)
    if size > cap:
        raise _invalid(
            "message",
            f"the content and tool calls take {size} bytes of UTF-8; at most {cap} are allowed for a job of "
            f"max_length {max_length} ({CHAT_PROGRESS_BYTES_PER_TOKEN} per token).",
        )


def check_text_reply_size(generation: str, max_length: int) -> None:
    """400 ChatSubmitInvalid (param generation) when a text job's generation takes more UTF-8 bytes than
    :func:`max_reply_bytes` allows for the request's ``max_length`` (the same bound as a chat reply's)."""
    size = utf8_len(generation)
    cap = max_reply_bytes(max_length)
    if size > cap:
        raise _invalid(
            "generation",
            f"takes {size} bytes of UTF-8; at most {cap} are allowed for a job of max_length {max_length} "
            f"({CHAT_PROGRESS_BYTES_PER_TOKEN} per token).",
        )


@dataclass(frozen=True, slots=True)
class VerifiedReply:
    """A reply that passed :func:`verify_chat_reply`: ``message`` (tool calls after the single-call
    reduction), ``finish_reason`` as stored, ``dropped_tool_calls`` (how many calls the reduction dropped).
    """

    message: dict[str, Any]
    finish_reason: str
    dropped_tool_calls: int = 0


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_strict_json(text: str) -> Any:
    """Parse JSON with Python's json, refusing NaN, Infinity and -Infinity. Raises ValueError."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def chat_reply_finish_reason(
    finish_reason: str, message: Mapping[str, Any], chat_extras: Mapping[str, Any] | None
) -> str:
    """The stored finish reason: as submitted, except a tool_calls finish with calls under a function
    tool_choice is stored as stop (OpenAI finishes such a choice with stop). See docs/native-api.md#reply-verification.
    """
    if (
        finish_reason == ChatFinishReason.tool_calls
        and message.get("tool_calls")
        and forced_function_name((chat_extras or {}).get("tool_choice")) is not None
    ):
        return ChatFinishReason.stop.value
    return finish_reason


def _check_schema(content: str, schema: Any, limits: SchemaLimits) -> None:
    try:
        value = parse_strict_json(content)
    except ValueError:
        raise _nonconformant(
            "message.content", "The reply content is not JSON, which the response format requires."
        ) from None
    try:
        validator = compile_reply_schema(schema, limits)
    except SchemaBoundExceeded as exc:
        raise _nonconformant(
            "response_format",
            f"The request's response format schema cannot be checked within the Horde's bounds ({exc}), so the "
            "reply cannot be shown to match it.",
        ) from None
    except SchemaUncompilable as exc:
        raise _uncompilable(exc) from None
    try:
        error = reply_schema_error(validator, value, limits)
    except SchemaBoundExceeded as exc:
        raise _nonconformant(
            "message.content",
            f"The reply cannot be shown to match the response format schema: checking it exceeded {exc}.",
        ) from None
    except SchemaUncompilable as exc:
        # A reference that resolves only while validating.
        raise _uncompilable(exc) from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        location = f" at '/{_cut(where, 200)}'" if where else ""
        raise _nonconformant(
            "message.content",
            f"The reply content does not match the response format schema{location}: {error.message}",
        )


def _uncompilable(exc: SchemaUncompilable) -> HordeError:
    reason = f" ({exc})" if str(exc) else ""
    return _nonconformant(
        "response_format",
        f"The request's response format schema cannot be compiled{reason}, so the reply cannot be shown to "
        "match it.",
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reply_validates_schema(chat_extras: Mapping[str, Any] | None, conformance: str) -> bool:
    """Whether :func:`verify_chat_reply` validates the reply against a JSON schema (a strict json_schema under
    strict conformance): the only check that may take long, so the submit runs it off its event loop."""
    if conformance != ChatConformance.strict:
        return False
    response_format = (chat_extras or {}).get("response_format")
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        return False
    return bool((response_format.get("json_schema") or {}).get("strict"))


def _check_calls_defined(calls: list[Any], extras: Mapping[str, Any]) -> None:
    """400 ChatSubmitInvalid for a call to a function the request's tools do not define, or a repeated id."""
    defined = {tool["function"]["name"] for tool in extras.get("tools") or ()}
    seen_ids: set[str] = set()
    for index, call in enumerate(calls):
        name = call["function"]["name"]
        if name not in defined:
            raise _invalid(
                f"message.tool_calls[{index}].function.name",
                f"The reply calls the function '{name}', which the request does not define.",
            )
        if call["id"] in seen_ids:
            raise _invalid(
                f"message.tool_calls[{index}].id", f"The reply repeats the tool call id '{call['id']}'."
            )
        seen_ids.add(call["id"])


def _check_tool_choice(calls: list[Any], choice: Any) -> None:
    """400 ChatSubmitNonconformant for calls that break the request's ``tool_choice`` (strict only)."""
    forced = forced_function_name(choice)
    if choice == "none" and calls:
        raise _nonconformant("message.tool_calls", "The reply calls a tool under tool_choice none.")
    if choice == "required" and not calls:
        raise _nonconformant(
            "message.tool_calls", "The reply does not call a tool under tool_choice required."
        )
    if forced is not None:
        if not calls:
            raise _nonconformant(
                "message.tool_calls",
                f"The reply does not call the function '{forced}' the tool_choice forces.",
            )
        other = next((c["function"]["name"] for c in calls if c["function"]["name"] != forced), None)
        if other is not None:
            raise _nonconformant(
                "message.tool_calls",
                f"The reply calls '{other}' where the tool_choice forces '{forced}'.",
            )


def _check_response_format(content: Any, response_format: Any, schema_limits: SchemaLimits) -> None:
    """400 ChatSubmitNonconformant for content that breaks the request's ``response_format`` (strict only)."""
    if not isinstance(response_format, Mapping):
        return
    kind = response_format.get("type")
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if kind == "json_object" or (kind == "json_schema" and not (spec or {}).get("strict")):
        try:
            value = parse_strict_json(content or "")
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise _nonconformant(
                "message.content",
                "The reply content is not a JSON object, which the response format requires.",
            )
    elif kind == "json_schema":
        _check_schema(content or "", spec["schema"], schema_limits)  # type: ignore[index]


def verify_chat_reply(
    submit: ChatSubmit | Mapping[str, Any],
    chat_extras: Mapping[str, Any] | None,
    conformance: str = ChatConformance.strict,
    schema_limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS,
) -> VerifiedReply:
    """Check a reply against the request's stored ``chat_extras`` (the client's values) under its conformance.

    ``submit`` is a parsed :class:`ChatSubmit` (or its message dict with ``finish_reason`` read as stop).
    Order: the single-call reduction (strict, parallel_tool_calls false: keep the first call); then, in both
    modes, 400 ChatSubmitInvalid for a call to a function the request's tools do not define (or any call
    without tools) and for two calls with one id; then, under strict only, 400 ChatSubmitNonconformant for a
    call under tool_choice none, no call under required, no call or another function under a function
    choice, content that is not a JSON object under json_object or non-strict json_schema, and content not
    matching a strict json_schema (validated by its ``$schema`` draft, 2020-12 otherwise, references only
    inside the schema; an uncompilable schema refuses). A reply with empty or null content and tool calls is
    exempt from the response format. See docs/native-api.md#reply-verification.

    The schema check is bounded (:mod:`horde_contract.reply_schema`): patterns in RE2, references in an empty
    registry, and ``schema_limits`` on steps, reference expansions and CPU time; a check past them refuses the
    reply with ChatSubmitNonconformant, since it cannot be shown to match.
    """
    if isinstance(submit, ChatSubmit):
        if submit.message is None:
            raise _invalid("message", "a chat submit needs message.")
        message = dict(submit.message)
        finish_reason = submit.finish_reason or ChatFinishReason.stop.value
    else:
        message = dict(submit)
        finish_reason = ChatFinishReason.stop.value
    extras = chat_extras or {}
    strict = conformance == ChatConformance.strict
    calls = list(message.get("tool_calls") or [])
    dropped = 0
    if strict and extras.get("parallel_tool_calls") is False and len(calls) > 1:
        dropped = len(calls) - 1
        calls = calls[:1]
        message["tool_calls"] = calls
    _check_calls_defined(calls, extras)
    if strict:
        _check_tool_choice(calls, extras.get("tool_choice"))
        content = message.get("content")
        if not (not content and calls):  # a reply of tool calls without content is exempt from the format
            _check_response_format(content, extras.get("response_format"), schema_limits)
    return VerifiedReply(
        message=message,
        finish_reason=chat_reply_finish_reason(finish_reason, message, extras),
        dropped_tool_calls=dropped,
    )


def chat_reply_characters(message: Mapping[str, Any]) -> int:
    """The reply's characters (Python code points): content, reasoning, and each tool call's function name
    and arguments. See docs/native-api.md#pricing.
    """
    total = len(message.get("content") or "") + len(message.get("reasoning_content") or "")
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        total += len(function.get("name") or "") + len(function.get("arguments") or "")
    return total


def charged_tokens(characters: int, max_length: int) -> int:
    """The kudos formula's token count: ceil(characters / 4), at least 20, at most ``max_length``.

    See docs/native-api.md#pricing; docs/native-api.md#kudos.
    """
    return min(max(math.ceil(characters / 4), MIN_CHARGED_TOKENS), max_length)


def replace_nul(text: str) -> str:
    """``text`` with every NUL replaced by U+FFFD, as submitted text is stored (PostgreSQL text and JSONB cannot
    hold NUL)."""
    return text.replace("\x00", "\ufffd")


def _replace_nul(value: Any) -> Any:
    if isinstance(value, str):
        return replace_nul(value)
    if isinstance(value, list):
        return [_replace_nul(v) for v in value]
    if isinstance(value, dict):
        return {_replace_nul(k): _replace_nul(v) for k, v in value.items()}
    return value


def build_stored_reply(message: Mapping[str, Any]) -> dict[str, Any]:
    """``processing_gens.message``: role and content, tool_calls when present, reasoning_content only when
    submitted, with NUL replaced by U+FFFD in every string. See docs/native-api.md#submit.
    """
    stored: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        stored["tool_calls"] = message["tool_calls"]
    if message.get("reasoning_content") is not None:
        stored["reasoning_content"] = message["reasoning_content"]
    cleaned: dict[str, Any] = _replace_nul(stored)
    return cleaned


def stored_generation(message: Mapping[str, Any]) -> str:
    """``processing_gens.generation`` of a chat reply: the content with NUL replaced, or "" when null."""
    return replace_nul(message.get("content") or "")
