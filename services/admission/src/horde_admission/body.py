"""The chat body bound: 413 RequestTooLarge before parsing (spec: Routes, step 1; read_chat_request_body)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from horde_contract import load_json_body
from horde_core.errors import HordeError

from horde_admission import contract


def request_too_large(limit: int) -> Exception:
    """413 RequestTooLarge (the contract's message for the chat bound)."""
    error: Exception = (
        contract.request_too_large_error()
        if limit == contract.MAX_CHAT_BODY_BYTES
        else HordeError(413, "RequestTooLarge", f"The request body is larger than {limit} bytes.")
    )
    return error


async def read_bounded_body(request: Request, limit: int, read_timeout: float = 60.0) -> bytes:
    """The raw body, refused with 413 when above ``limit`` bytes, or 408 RequestBodyTimeout when it takes
    longer than ``read_timeout`` seconds to arrive.

    A declared Content-Length above the limit is refused without reading; a body without one (chunked) is
    read only up to one byte past the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise request_too_large(limit)
        except ValueError:
            raise HordeError(400, "BadRequest", "Invalid Content-Length header.") from None
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(read_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise request_too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise HordeError(
            408, "RequestBodyTimeout", f"The request body did not arrive within {read_timeout:g} seconds."
        ) from None
    return b"".join(chunks)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, read by the contract's ``load_json_body`` (the front reads it the same way).

    400 BadRequest when it is not JSON, holds NaN, Infinity or a lone surrogate, or is not an object; 400
    NulByteInPayload for a NUL character.
    """
    body = load_json_body(raw or b"null")
    if not isinstance(body, dict):
        raise HordeError(
            400, "BadRequest", "Input payload validation failed: the body has to be a JSON object."
        )
    return body
