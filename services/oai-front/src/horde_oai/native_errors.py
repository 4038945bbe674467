"""Native refusals → OpenAI errors: :func:`map_native_error` for a refused submit or status read, and
:func:`declaration_gap_error` for a request no online worker can serve. No I/O. See docs/openai-front.md
#no-eligible-worker, #kudos-cap, #requests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from horde_contract import (
    CHAT_GUARANTEE_VALUES,
    KUDOS_CAP_EXCESS_PATTERN,
    NATIVE_REQUEST_PATH_PATTERN,
    declaration_gap_sentence,
)
from horde_contract.errors import RC
from horde_contract.operator_controls import MAINTENANCE_MODE_MESSAGE, MAINTENANCE_RETRY_AFTER_SECONDS

from horde_oai.errors import OpenAIError, bad_request, no_eligible_worker

# Native text-param keys that differ from the OpenAI key the client sent.
NATIVE_FIELD_PARAMETERS = {"max_length": "max_tokens", "stop_sequence": "stop"}

NATIVE_VALIDATION_PATTERN = re.compile(r"^Input payload validation failed: (?P<loc>[^:]+):")

# The size limits of a declaration gap, in the order their sentences are written.
SIZE_LIMITS = ("max_length", "max_context_length")
LIMIT_NOUNS = {"max_length": "a completion limit", "max_context_length": "a context length"}


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


def largest_declared(
    limit: str, models: Sequence[str], chat_entries: Mapping[str, Mapping[str, Any]] | None
) -> int | None:
    """The largest chat ``max_length``/``max_context_length`` declared for the requested models, or None."""
    values = []
    for model in models:
        entry = (chat_entries or {}).get(model)
        if entry:
            value = entry.get(limit)
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


def declaration_gap_of(body: Any) -> Mapping[str, Any] | None:
    """The ``impossible_reason`` of a native body (a refusal or a status) when it is a declaration gap, else
    None."""
    gap = body.get("impossible_reason") if isinstance(body, Mapping) else None
    return gap if isinstance(gap, Mapping) and gap.get("kind") == "declaration_gap" else None


def declaration_gap_error(
    gap: Mapping[str, Any],
    models: Sequence[str],
    *,
    request_id: str | None,
    chat_entries: Mapping[str, Mapping[str, Any]] | None = None,
) -> OpenAIError:
    """404 no_worker_supports_features, or 400 no_worker_supports_limit for a size-only gap.

    ``request_id`` is the cancelled native request (None when the Horde refused at submit, which created
    nothing). Neither sets Retry-After or x-should-retry (docs/openai-front.md#no-eligible-worker).
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
    sentence = declaration_gap_sentence(gap, models=whom, missing_conjunction="and")
    message = f"No worker can serve this request: {sentence}."
    if any(m in CHAT_GUARANTEE_VALUES for m in missing):
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


def maintenance_error(message: str, headers: Mapping[str, str] | None) -> OpenAIError:
    """503 MaintenanceMode for the native 400 (docs/openai-front.md#errors): an OpenAI client reads a
    service that is down for maintenance as 503, with the native ``Retry-After`` (else
    MAINTENANCE_RETRY_AFTER_SECONDS) and ``x-should-retry: false``, since maintenance outlasts an SDK's
    automatic retries."""
    retry_after = native_retry_after(headers) or {"Retry-After": str(MAINTENANCE_RETRY_AFTER_SECONDS)}
    return OpenAIError(
        503,
        message or MAINTENANCE_MODE_MESSAGE,
        RC.MaintenanceMode,
        headers={**retry_after, "x-should-retry": "false"},
    )


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

    ``code`` is the native rc, passed through (docs/openai-front.md#metrics-and-logs), with the front's own
    mappings: 403 NoEligibleWorker → 503 no_eligible_worker (Retry-After 30, x-should-retry false), or the
    gap's 404/400 when the body has impossible_reason; ChatKudosCapExceeded → max_kudos_exceeded; a 400 without rc (payload
    validation) → BadRequest with the first failing field as param; a 429 without rc → rate_limit_exceeded; a
    5xx → 502 HordeUnavailable (503 statuses with an rc keep it). 404 UnknownChatModel keeps OpenAI's type for an
    unknown model (invalid_request_error) and the entry's path as param; 400 MaintenanceMode → 503
    (:func:`maintenance_error`). The native ``Retry-After`` of a 429 or a 503 (with or without rc) reaches the
    client.
    """
    data = body if isinstance(body, Mapping) else {}
    message = str(data.get("message") or "")
    rc = data.get("rc")
    rc = str(rc) if rc else None
    path, text = split_native_path(message)
    if status == 404 and rc == RC.UnknownChatModel:
        return OpenAIError(
            404,
            text if path else message,
            rc,
            type="invalid_request_error",
            param=path or "model",
        )
    if status == 403 and rc == RC.NoEligibleWorker:
        gap = declaration_gap_of(data)
        if gap is not None:
            return declaration_gap_error(gap, models, request_id=None, chat_entries=chat_entries)
        return no_eligible_worker(_retry_later(message), stage="submit")
    if rc == RC.ChatKudosCapExceeded:
        return kudos_cap_error(message, rc)
    if rc == RC.MaintenanceMode:
        return maintenance_error(message, headers)
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
            RC.HordeUnavailable,
            headers=retry_after,
        )
    return OpenAIError(status, text if path else message, rc, param=_native_param(path), headers=retry_after)
