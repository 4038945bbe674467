"""The one body reader of every route that takes a body: a byte bound, a time bound and a bound on the JSON
structure (elements and depth) checked on the raw bytes before json builds any object.

Every service reads its bodies with :func:`read_json_body` (or :func:`read_bounded_body` then
:func:`parse_json_body`, to look at the raw bytes in between) under its route's :class:`BodyLimits`, and maps
the exceptions to its own error envelope: :class:`BodyTooLarge` to 413, :class:`BodyReadTimeout` to 408
RequestBodyTimeout, :class:`InvalidContentLength` and :class:`JsonStructureError` to 400, and the contract's
``HordeError`` of ``load_json_body`` (invalid JSON, NaN, Infinity, a lone surrogate, a NUL) as it is.

Why the structure bound: json builds about 70 bytes of Python objects for each ``{}`` of ``[{},{},…]``, so a
12 MB body would take 300 MiB while it is parsed. The scan counts elements (each ``[``, ``{`` and ``,``
outside strings) and measures the nesting with a few C-speed passes over the bytes (``bytes.replace``,
``bytes.translate``, ``bytes.count``, ``bytes.split`` over 64 KiB slices), so the memory it takes stays within
about the body's size and a body past a bound is refused before any object is built.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from horde_contract import load_json_body
from horde_contract.limits import (
    MAX_CHAT_BODY_BYTES,
    MAX_CHAT_BODY_ELEMENTS,
    MAX_JSON_BODY_DEPTH,
    MAX_POP_BODY_BYTES,
    MAX_POP_BODY_ELEMENTS,
    MAX_PROGRESS_BODY_BYTES,
    MAX_PROGRESS_BODY_ELEMENTS,
    MAX_SUBMIT_BODY_BYTES,
    MAX_SUBMIT_BODY_ELEMENTS,
)
from starlette.requests import Request


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """A route's bounds: ``max_bytes`` of body, ``max_elements`` JSON elements (each ``[``, ``{`` and ``,``
    outside strings) and ``max_depth`` levels of nested arrays and objects (the root is level 1)."""

    max_bytes: int
    max_elements: int
    max_depth: int = MAX_JSON_BODY_DEPTH


#: The chat and text request routes: the front's chat completions, admission's chat/async and text/async.
CHAT_BODY_LIMITS = BodyLimits(MAX_CHAT_BODY_BYTES, MAX_CHAT_BODY_ELEMENTS)
#: Submit's ``text/submit``: the largest legal reply.
SUBMIT_BODY_LIMITS = BodyLimits(MAX_SUBMIT_BODY_BYTES, MAX_SUBMIT_BODY_ELEMENTS)
#: Submit's ``text/progress``: one delta within any generation's byte cap.
PROGRESS_BODY_LIMITS = BodyLimits(MAX_PROGRESS_BODY_BYTES, MAX_PROGRESS_BODY_ELEMENTS)
#: Dispatch's ``text/pop``: the text pop fields and the chat declaration.
POP_BODY_LIMITS = BodyLimits(MAX_POP_BODY_BYTES, MAX_POP_BODY_ELEMENTS)


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


class JsonStructureError(BodyReadError):
    """The body's JSON has more elements or deeper nesting than its route allows (``kind`` is ``"elements"``
    or ``"depth"``, ``limit`` the bound); ``message`` says which bound, e.g. "The JSON body nests deeper than
    64 levels." Services answer it with their 400 BadRequest."""

    def __init__(self, kind: str, limit: int) -> None:
        if kind == "depth":
            message = f"The JSON body nests deeper than {limit} levels."
        else:
            message = f"The JSON body has more than {limit} elements (arrays, objects and their items)."
        super().__init__(message)
        self.kind = kind
        self.limit = limit
        self.message = message


# Every byte but the structural ones `"[]{},`, for bytes.translate's delete argument.
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'"[]{},')
# The slice of the body scanned at a time: it bounds the scan's memory (a copy of the slice, and one piece a
# string when it is split at its quotes) whatever the body holds.
_SCAN_SLICE = 64 * 1024
_SQUARE = bytes.maketrans(b"{}", b"[]")


def check_json_structure(raw: bytes, max_elements: int, max_depth: int) -> tuple[int, int]:
    """``(elements, depth)`` of the JSON in ``raw``: elements are the ``[``, ``{`` and ``,`` outside strings,
    depth the levels of nested arrays and objects. Raises :class:`JsonStructureError` past ``max_elements`` or
    ``max_depth`` (counting stops there).

    Works on the bytes alone and never builds the value. Slice by slice of 64 KiB: escaped backslashes and
    quotes are dropped (``bytes.replace``, only in a slice with a backslash; an escape cut by the slice's end
    is carried over), then every byte but ``"[]{},`` (``bytes.translate``), then what lies between quotes
    (``split`` at the quotes, carrying whether the slice ends inside a string); the elements are counted
    (``bytes.count``). The depth is the number of passes that remove every innermost ``[]`` pair
    (``bytes.replace``, braces squared first) from the brackets left. Linear in the body, a few milliseconds
    a MiB, and memory within the slice plus the brackets (bounded by the elements) whatever the body holds.
    A body that is not JSON may pass (the parser refuses it next) or be refused by either bound, such as a
    balanced bracket sequence that does not nest, or too many quotes for its elements.
    """
    elements = 0
    quotes = 0
    # A string of valid JSON follows one of `[{,`, or is a value whose key does: at most two strings an
    # element. Past that the body has too many elements; this bounds the work of the splits.
    max_quotes = 4 * max_elements + 2
    nests: list[bytes] = []
    inside = False
    escaped = False
    for start in range(0, len(raw), _SCAN_SLICE):
        piece = raw[start : start + _SCAN_SLICE]
        if escaped:  # the previous slice ended on the backslash of an escape: this byte is escaped
            piece = piece[1:]
            escaped = False
        if b"\\" in piece:
            # A pair of backslashes is one escaped backslash; a backslash left at the end escapes the next
            # slice's first byte; a backslash before a quote escapes it. Other escapes are letters and digits,
            # dropped below with their backslash.
            piece = piece.replace(b"\\\\", b"")
            if piece.endswith(b"\\"):
                piece = piece[:-1]
                escaped = True
            piece = piece.replace(b'\\"', b"")
        piece = piece.translate(None, _NOT_STRUCTURAL)
        if b'"' in piece:
            quotes += piece.count(b'"')
            if quotes > max_quotes:
                raise JsonStructureError("elements", max_elements)
            between = piece.split(b'"')
            piece = b"".join(between[1::2] if inside else between[::2])
            if len(between) % 2 == 0:  # an odd number of quotes: the slice ends on the other side
                inside = not inside
        elif inside:
            continue
        elements += piece.count(b"[") + piece.count(b"{") + piece.count(b",")
        if elements > max_elements:
            raise JsonStructureError("elements", max_elements)
        nests.append(piece.translate(_SQUARE, b","))
    nest = b"".join(nests)
    del nests
    if nest.count(b"[") != nest.count(b"]"):
        return elements, 0  # unbalanced: not JSON, which the parser refuses (past its own depth limit too)
    depth = 0
    while nest:
        if depth == max_depth:
            raise JsonStructureError("depth", max_depth)
        nest = nest.replace(b"[]", b"")
        depth += 1
    return elements, depth


def parse_json_body(
    raw: bytes, limits: BodyLimits, *, refuse_nul: bool = True, allow_empty: bool = False
) -> object:
    """The body parsed by the contract's ``load_json_body`` once :func:`check_json_structure` has passed it.

    Raises :class:`JsonStructureError` past ``limits``' elements or depth, and the contract's
    ``HordeError`` (400 BadRequest for invalid JSON, NaN, Infinity and lone surrogates; 400
    NulByteInPayload for a NUL with ``refuse_nul``). With ``allow_empty`` an empty body is ``None``.
    """
    if allow_empty and not raw:
        return None
    check_json_structure(raw, limits.max_elements, limits.max_depth)
    return load_json_body(raw, refuse_nul=refuse_nul)


async def read_json_body(
    request: Request,
    limits: BodyLimits,
    read_timeout: float,
    *,
    strict_content_length: bool = True,
    refuse_nul: bool = True,
    allow_empty: bool = False,
) -> object:
    """Read the body within ``limits.max_bytes`` and ``read_timeout`` seconds (:func:`read_bounded_body`), then
    check its structure and parse it (:func:`parse_json_body`). Raises :class:`BodyTooLarge`,
    :class:`BodyReadTimeout`, :class:`InvalidContentLength`, :class:`JsonStructureError` or the contract's
    ``HordeError``."""
    raw = await read_bounded_body(
        request, limits.max_bytes, read_timeout, strict_content_length=strict_content_length
    )
    return parse_json_body(raw, limits, refuse_nul=refuse_nul, allow_empty=allow_empty)
