"""Reading a request body within a size bound and a time bound, for every route that takes a large body.

Admission and the OpenAI front share this reader and map its exceptions to their own error envelopes
(413 RequestTooLarge, 408 RequestBodyTimeout, 400 for a malformed Content-Length).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request


class BodyReadError(Exception):
    """A body the reader refused."""


class BodyTooLarge(BodyReadError):
    """The body is larger than ``limit`` bytes (declared or read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than {limit} bytes.")
        self.limit = limit


class BodyReadTimeout(BodyReadError):
    """The body did not arrive within ``read_timeout`` seconds."""

    def __init__(self, read_timeout: float) -> None:
        super().__init__(f"The request body did not arrive within {read_timeout:g} seconds.")
        self.read_timeout = read_timeout


class InvalidContentLength(BodyReadError):
    """The Content-Length header is not a number."""

    def __init__(self) -> None:
        super().__init__("Invalid Content-Length header.")


async def read_bounded_body(
    request: Request, limit: int, read_timeout: float, *, strict_content_length: bool = True
) -> bytes:
    """The raw body of at most ``limit`` bytes, read within ``read_timeout`` seconds.

    A declared Content-Length above the limit is refused without reading; a body without one (chunked) is read
    only up to one byte past the limit. Raises :class:`BodyTooLarge`, :class:`BodyReadTimeout`, or, with
    ``strict_content_length``, :class:`InvalidContentLength` for a non-numeric header (otherwise the header is
    ignored and the body is bounded as it is read).
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if declared.strip().isdigit():
            if int(declared) > limit:
                raise BodyTooLarge(limit)
        elif strict_content_length:
            raise InvalidContentLength()
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(read_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyReadTimeout(read_timeout) from None
    return b"".join(chunks)
