"""Pure mapping between the OpenAI contract and the native chat routes.

Request → native body (:func:`build_native_body`); native status → ``chat.completion``
(:func:`build_completion`) and its parts (:func:`build_system_fingerprint`, :func:`build_usage`,
:func:`effective_completion_limit`); native refusals → OpenAI errors (:func:`map_native_error`,
:func:`declaration_gap_error`). No I/O. Spec: chat-front.md *Response shape*, *No eligible worker*,
*Kudos cap*, *Value and contract validation*.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from horde_contract import (
    KUDOS_CAP_EXCESS_PATTERN,
    NATIVE_REQUEST_PATH_PATTERN,
    estimate_chat_prompt_tokens,
)

from horde_oai.errors import OpenAIError, bad_request, no_eligible_worker

DEFAULT_CHAT_MAX_TOKENS = 512
CHARS_PER_TOKEN = 4

# Native text-param keys that differ from the OpenAI key the client sent.
NATIVE_FIELD_PARAMETERS = {"max_length": "max_tokens", "stop_sequence": "stop"}

# The keys forwarded to the native route; user, metadata, stream_options and the like are not applied.
FORWARDED_KEYS = (
    "model",
    "models",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "reasoning_effort",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
)

NATIVE_VALIDATION_PATTERN = re.compile(r"^Input payload validation failed: (?P<loc>[^:]+):")


SIZE_LIMITS = ("max_length", "max_context_length")
LIMIT_NOUNS = {"max_length": "a completion limit", "max_context_length": "a context length"}
LIMIT_ENTRY_KEYS = {"max_length": "max_length", "max_context_length": "max_context_length"}


# --- request ----------------------------------------------------------------------------------------------------


def new_operation_key() -> str:
    """A fresh ``horde.operation_key``: one per client call, so a retried native POST is idempotent."""
    return str(uuid.uuid4())


def requested_models(body: Mapping[str, Any]) -> list[str]:
    """The request's models: ``[model]`` or ``models``."""
    if isinstance(body.get("models"), list):
        return [str(m) for m in body["models"]]
    model = body.get("model")
    return [str(model)] if model is not None else []


def include_reasoning(body: Mapping[str, Any]) -> bool:
    """``horde.include_reasoning`` (default true)."""
    horde = body.get("horde")
    return not (isinstance(horde, dict) and horde.get("include_reasoning") is False)


def build_native_body(
    screened: Mapping[str, Any], operation_key: str, *, stream_hint: bool = False
) -> dict[str, Any]:
    """The ``POST /v2/generate/chat/async`` body for a screened request.

    Forwards the keys the native route applies, unchanged (``models`` included), with
    ``horde.operation_key`` set. ``stream`` is forwarded only when the front relays deltas.
    """
    native: dict[str, Any] = {k: screened[k] for k in FORWARDED_KEYS if screened.get(k) is not None}
    horde = {k: v for k, v in (screened.get("horde") or {}).items() if v is not None}
    horde["operation_key"] = horde.get("operation_key") or operation_key
    native["horde"] = horde
    if stream_hint:
        native["stream"] = True
    return native


def relays_deltas(body: Mapping[str, Any]) -> bool:
    """True for a request whose progress the front relays (spec: Relayed deltas): ``stream: true``, no tools,
    and no response_format other than text. Tool calls and structured output are verified only once the reply
    is complete, so they are never relayed before verification."""
    if body.get("stream") is not True or body.get("tools"):
        return False
    response_format = body.get("response_format")
    return response_format is None or (
        isinstance(response_format, Mapping) and response_format.get("type") == "text"
    )


def request_digest(native_body: Mapping[str, Any]) -> str:
    """SHA-256 of a native body without its ``horde.operation_key``: a resumed stream must carry the request
    it resumes."""
    horde = {k: v for k, v in (native_body.get("horde") or {}).items() if k != "operation_key"}
    canonical = {**native_body, "horde": horde}
    canonical.pop("stream", None)
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def key_digest(apikey: str) -> str:
    """SHA-256 of an API key, as the front stores it (never the key itself)."""
    return hashlib.sha256(apikey.encode("utf-8", "surrogatepass")).hexdigest()


def effective_completion_limit(
    body: Mapping[str, Any], context_adjustments: Sequence[Mapping[str, Any]] | None = None
) -> int:
    """The completion limit estimates are capped at (spec: Reasoning and usage).

    In order: the lowered value of a ``worker_max_length`` adjustment, max_completion_tokens, max_tokens,
    the native default 512.
    """
    for adjustment in context_adjustments or ():
        if isinstance(adjustment, Mapping) and adjustment.get("reason") == "worker_max_length":
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
    """``client``, ``default`` or ``lowered`` (spec: Completion limit source)."""
    for adjustment in context_adjustments or ():
        if isinstance(adjustment, Mapping) and adjustment.get("reason") == "worker_max_length":
            return "lowered"
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None:
        return "client"
    return "default"


# --- usage ------------------------------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """The character-based estimate: characters / 4, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


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
        completion, estimated = min(math.ceil(chars / CHARS_PER_TOKEN), limit), True
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    reasoning_tokens = _reported(generation.get("reasoning_tokens"))
    if reasoning_tokens is None and reasoning:
        reasoning_tokens, estimated = min(estimate_tokens(reasoning), limit), True
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage, estimated


# --- completion ---------------------------------------------------------------------------------------------------


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
            # Always present: null when the worker gave none (spec: Response shape).
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


def now() -> int:
    """Unix seconds."""
    return int(time.time())


# --- native refusals ----------------------------------------------------------------------------------------------


def split_native_path(message: str) -> tuple[str | None, str]:
    """``("models[1]", "the model ... ")`` from ``"'models[1]': the model ..."``; ``(None, message)`` else."""
    match = NATIVE_REQUEST_PATH_PATTERN.match(message or "")
    if not match:
        return None, message
    rest = message[match.end() :]
    return match.group("path"), rest.removeprefix(":").strip() or message


def _native_param(path: str | None) -> str | None:
    if path is None:
        return None
    return NATIVE_FIELD_PARAMETERS.get(path, path)


def _validation_param(body: Mapping[str, Any]) -> str | None:
    errors = body.get("errors")
    if isinstance(errors, Mapping) and errors:
        field = str(next(iter(errors)))
    else:
        match = NATIVE_VALIDATION_PATTERN.match(str(body.get("message") or ""))
        if not match:
            return None
        field = match.group("loc").strip()
    field = field.removeprefix("body.").removeprefix("params.")
    top = re.split(r"[.\[]", field, maxsplit=1)[0]
    if top in NATIVE_FIELD_PARAMETERS:
        field = NATIVE_FIELD_PARAMETERS[top] + field[len(top) :]
    return field


def kudos_cap_error(message: str, rc: str) -> OpenAIError:
    """400 max_kudos_exceeded with metadata rc, kudos_estimate and max_kudos read from the message."""
    metadata: dict[str, Any] = {"rc": rc}
    match = KUDOS_CAP_EXCESS_PATTERN.search(message)
    if match:
        metadata["kudos_estimate"] = int(match.group("kudos_estimate"))
        metadata["max_kudos"] = int(match.group("max_kudos"))
    return OpenAIError(400, message, "max_kudos_exceeded", param="horde.max_kudos", metadata=metadata)


def _join(values: Sequence[str]) -> str:
    if len(values) <= 1:
        return "".join(values)
    return ", ".join(values[:-1]) + " and " + values[-1]


def largest_declared(
    limit: str, models: Sequence[str], chat_entries: Mapping[str, Mapping[str, Any]] | None
) -> int | None:
    """The largest chat ``max_length``/``max_context_length`` declared for the requested models, or None."""
    values = []
    for model in models:
        entry = (chat_entries or {}).get(model)
        if entry:
            value = entry.get(LIMIT_ENTRY_KEYS[limit])
            if isinstance(value, int) and not isinstance(value, bool):
                values.append(value)
    return max(values) if values else None


def size_limit_message(
    exceeded: Sequence[str], models: Sequence[str], chat_entries: Mapping[str, Mapping[str, Any]] | None
) -> str:
    """The no_worker_supports_limit message: one sentence pair per exceeded size limit."""
    whom = "for the listed models" if len(models) > 1 else "for the model"
    sentences = []
    for limit in SIZE_LIMITS:
        if limit not in exceeded:
            continue
        noun = LIMIT_NOUNS[limit]
        largest = largest_declared(limit, models, chat_entries)
        sentence = f"No worker eligible for this request currently declares {noun} that high."
        if largest is not None:
            sentence += f" The largest any online worker {whom} declares now is {largest} tokens."
        else:
            sentence = f"No worker eligible for this request currently declares {noun} that high ({limit})."
        sentences.append(sentence)
    return " ".join(sentences)


def is_size_only_gap(gap: Mapping[str, Any]) -> bool:
    """True for a gap of only max_length and/or max_context_length (the 400 case)."""
    missing = list(gap.get("missing_declarations") or [])
    exceeded = list(gap.get("exceeded_limits") or [])
    return not missing and bool(exceeded) and set(exceeded) <= set(SIZE_LIMITS)


GUARANTEES = frozenset(
    {
        "tool_choice_enforced",
        "single_tool_call_enforced",
        "structured_output_enforced",
        "prompt_overflow_refused",
    }
)


def declaration_gap_error(
    gap: Mapping[str, Any],
    models: Sequence[str],
    *,
    request_id: str | None,
    chat_entries: Mapping[str, Mapping[str, Any]] | None = None,
) -> OpenAIError:
    """404 no_worker_supports_features, or 400 no_worker_supports_limit for a size-only gap.

    ``request_id`` is the cancelled native request (None when the Horde refused at submit, which created
    nothing). Neither sets Retry-After or x-should-retry (spec: Declaration gaps, Size limit gaps).
    """
    exceeded = list(gap.get("exceeded_limits") or [])
    if is_size_only_gap(gap):
        message = size_limit_message(exceeded, models, chat_entries)
        param = "max_tokens" if "max_length" in exceeded else "horde.max_context_length"
        return OpenAIError(
            400,
            message,
            "no_worker_supports_limit",
            param=param,
            metadata={"request_id": request_id} if request_id else None,
        )
    missing = list(gap.get("missing_declarations") or [])
    whom = "the listed models" if len(models) > 1 else "the model"
    parts = []
    if missing:
        parts.append(f"no online worker serving {whom} declares {_join(missing)}")
    if exceeded:
        noun = "limit" if len(exceeded) == 1 else "limits"
        parts.append(
            f"the request exceeds the {_join(exceeded)} {noun} of every online worker serving {whom}"
        )
    message = "No worker can serve this request: " + "; ".join(parts) + "."
    if any(m in GUARANTEES for m in missing):
        message += " Guarantees are not required under horde.conformance best_effort."
    if request_id:
        message += " The request was cancelled."
    return OpenAIError(
        404,
        message,
        "no_worker_supports_features",
        type="not_found_error",
        metadata={"request_id": request_id} if request_id else None,
    )


def _retry_later(message: str) -> str:
    message = (message or "No worker is currently serving the model.").strip()
    return message if message.endswith("Retry later.") else f"{message} Retry later."


def native_retry_after(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``{"Retry-After": value}`` when the native answer carried one (any header case), else ``{}``."""
    for name, value in (headers or {}).items():
        if name.lower() == "retry-after" and value:
            return {"Retry-After": value}
    return {}


def map_native_error(
    status: int,
    body: Any,
    *,
    models: Sequence[str] = (),
    headers: Mapping[str, str] | None = None,
    chat_entries: Mapping[str, Mapping[str, Any]] | None = None,
) -> OpenAIError:
    """The OpenAI error for a native refusal of the submit (or a status read).

    ``code`` is the native rc, passed through (spec: Outcome class), with the spec's own mappings: 403
    NoEligibleWorker → 503 no_eligible_worker (Retry-After 30, x-should-retry false), or the gap's 404/400 when
    the body has impossible_reason; ChatKudosCapExceeded → max_kudos_exceeded; a 400 without rc (payload
    validation) → BadRequest with the first failing field as param; a 429 without rc → rate_limit_exceeded; a
    5xx → 502 HordeUnavailable (503 statuses with an rc keep it). 404 UnknownChatModel keeps OpenAI's type for an
    unknown model (invalid_request_error) and the entry's path as param. The native ``Retry-After`` of a 429 or
    a 503 (with or without rc) reaches the client.
    """
    data = body if isinstance(body, Mapping) else {}
    message = str(data.get("message") or "")
    rc = data.get("rc")
    rc = str(rc) if rc else None
    path, text = split_native_path(message)
    if status == 404 and rc == "UnknownChatModel":
        return OpenAIError(
            404,
            text if path else message,
            rc,
            type="invalid_request_error",
            param=path or "model",
        )
    if status == 403 and rc == "NoEligibleWorker":
        gap = data.get("impossible_reason")
        if isinstance(gap, Mapping) and gap.get("kind") == "declaration_gap":
            return declaration_gap_error(gap, models, request_id=None, chat_entries=chat_entries)
        return no_eligible_worker(_retry_later(message), stage="submit")
    if rc == "ChatKudosCapExceeded":
        return kudos_cap_error(message, rc)
    if status == 400 and rc is None:
        return bad_request(message or "Input payload validation failed", _validation_param(data))
    retry_after = native_retry_after(headers) if status in (429, 503) else {}
    if status == 429:
        return OpenAIError(
            429,
            message or "Too many requests: the Horde's rate limit was exceeded.",
            rc or "rate_limit_exceeded",
            headers=retry_after,
        )
    if status >= 500 and not (status == 503 and rc):
        return OpenAIError(
            502,
            f"The Horde did not answer the request (HTTP {status}).",
            "HordeUnavailable",
            headers=retry_after,
        )
    return OpenAIError(status, text if path else message, rc, param=_native_param(path), headers=retry_after)
