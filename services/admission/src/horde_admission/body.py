"""The request body of admission's routes: horde_core's one body reader under the chat bounds (413
RequestTooLarge before parsing, docs/native-api.md#routes, step 1; read_chat_request_body), refusals in the Horde envelope."""

from __future__ import annotations

from typing import Any

import horde_contract as contract
from fastapi import Request
from horde_contract.errors import RC, HordeError
from horde_core import body


def request_too_large(limit: int) -> Exception:
    """413 RequestTooLarge (the contract's message for the chat bound)."""
    error: Exception = (
        contract.request_too_large_error()
        if limit == contract.MAX_CHAT_BODY_BYTES
        else HordeError(413, RC.RequestTooLarge, f"The request body is larger than {limit} bytes.")
    )
    return error


async def read_bounded_body(request: Request, limit: int, read_timeout: float = 60.0) -> bytes:
    """The raw body (horde_core's bounded reader), refused with 413 RequestTooLarge above ``limit`` bytes, 408
    RequestBodyTimeout when it takes longer than ``read_timeout`` seconds, 400 for a malformed Content-Length."""
    try:
        return await body.read_bounded_body(request, limit, read_timeout)
    except body.BodyTooLarge:
        raise request_too_large(limit) from None
    except body.BodyReadTimeout as exc:
        raise HordeError(408, RC.RequestBodyTimeout, str(exc)) from None
    except body.InvalidContentLength as exc:
        raise HordeError(400, RC.BadRequest, str(exc)) from None


def parse_json_object(raw: bytes, limits: body.BodyLimits = body.CHAT_BODY_LIMITS) -> dict[str, Any]:
    """The body as a JSON object: its structure checked against ``limits`` (400 BadRequest "The JSON body
    nests deeper than 64 levels." or "... has more than N elements ...") before the contract's
    ``load_json_body`` reads it (the front reads it the same way).

    400 BadRequest when it is not JSON, holds NaN, Infinity or a lone surrogate, or is not an object; 400
    NulByteInPayload for a NUL character.
    """
    try:
        value = body.parse_json_body(raw, limits, allow_empty=True)
    except body.JsonStructureError as exc:
        raise HordeError(400, RC.BadRequest, exc.message) from None
    if not isinstance(value, dict):
        raise HordeError(
            400, RC.BadRequest, "Input payload validation failed: the body has to be a JSON object."
        )
    return value


async def read_json_object(
    request: Request, read_timeout: float, limits: body.BodyLimits = body.CHAT_BODY_LIMITS
) -> dict[str, Any]:
    """The body as a JSON object within ``limits`` (the chat route's by default: MAX_CHAT_BODY_BYTES, then
    the elements and depth the contract allows): :func:`read_bounded_body`, then :func:`parse_json_object`."""
    return parse_json_object(await read_bounded_body(request, limits.max_bytes, read_timeout), limits)
