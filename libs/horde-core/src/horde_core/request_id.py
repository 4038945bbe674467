"""One request id per HTTP request, on every log line it causes in every service (docs/operator-guide.md#logs).

- :class:`RequestIdMiddleware` (every app of :func:`horde_core.app.create_app`, outside every other middleware
  and Starlette's error handling) takes the id from the request's ``X-Request-ID`` header when it is sane
  (:func:`sane_request_id`: at most :data:`MAX_REQUEST_ID_LENGTH` characters of :data:`SAFE_CHARS`), else makes a
  new one (32 hex digits), keeps it in a context variable for the request's task and returns it as the
  response's ``X-Request-ID``. A hostile header (too long, control characters, quotes, spaces) is replaced, and
  never logged.
- :func:`current_request_id`: the id of the request being served (None outside one); the logging filter of
  :mod:`horde_core.logging` writes it as ``request_id`` on every JSON line.
- Onward: :func:`outgoing_headers` for an HTTP call (the front's calls to admission send ``X-Request-ID``),
  :class:`RequestIdClientInterceptor` for a gRPC call (metadata ``x-request-id``) and
  :class:`RequestIdServerInterceptor`, which reads it back into the context variable on the gRPC server
  (dispatch, submit), with the same sanity rule.

Each finished request and RPC is logged at DEBUG (``request`` / ``rpc``: method, path, status, milliseconds).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any

import grpc
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from horde_core.grpc_handlers import rewrap_unary

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
#: The gRPC metadata key (lower case, as gRPC requires).
GRPC_METADATA_KEY = "x-request-id"
MAX_REQUEST_ID_LENGTH = 128
#: What a caller's id may hold: letters, digits and ``-_.:+=/@`` (UUIDs, ULIDs, hex, base64, a proxy's
#: ``host/n-m`` ids); nothing a log reader, a terminal or a header could be fooled by.
SAFE_CHARS = "A-Za-z0-9_.:+=/@-"
_SAFE = re.compile(f"[{SAFE_CHARS}]{{1,{MAX_REQUEST_ID_LENGTH}}}")
_HEADER_KEY = REQUEST_ID_HEADER.lower().encode("latin-1")

_current: ContextVar[str | None] = ContextVar("horde_request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request this task serves, or None outside a request."""
    return _current.get()


def new_request_id() -> str:
    """A fresh id: 32 hex digits."""
    return uuid.uuid4().hex


def sane_request_id(value: str | bytes | None) -> str | None:
    """``value`` when it is a usable id (1 to :data:`MAX_REQUEST_ID_LENGTH` characters of :data:`SAFE_CHARS`),
    else None."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not value or _SAFE.fullmatch(value) is None:
        return None
    return value


def bind_request_id(value: str | bytes | None = None) -> str:
    """Make ``value`` (when sane, else a new id) the current request id of this task and return it."""
    request_id = sane_request_id(value) or new_request_id()
    _current.set(request_id)
    return request_id


def outgoing_headers() -> dict[str, str]:
    """``{"X-Request-ID": id}`` inside a request, ``{}`` outside: for an HTTP call made on its behalf."""
    request_id = _current.get()
    return {REQUEST_ID_HEADER: request_id} if request_id else {}


class RequestIdMiddleware:
    """The ASGI middleware of the module docstring, for ``http`` requests (others pass through).

    The context variable is reset once the response is sent, and left set when the app raised, so the server's
    own error line about that exception (uvicorn's ``Exception in ASGI application``, logged in the same task)
    carries the id too; uvicorn runs each request in a task of its own, so the value dies with it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((value for key, value in scope.get("headers") or () if key == _HEADER_KEY), None)
        request_id = sane_request_id(raw) or new_request_id()
        token = _current.set(request_id)
        encoded = request_id.encode("ascii")
        status = 0
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message.get("status", 0))
                headers = [(k, v) for k, v in message.get("headers") or () if k.lower() != _HEADER_KEY]
                message = {**message, "headers": [*headers, (_HEADER_KEY, encoded)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
        if log.isEnabledFor(logging.DEBUG):  # the hot routes pay nothing for the line they do not log
            log.debug(
                "request",
                extra={
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                },
            )
        _current.reset(token)


def install_request_id(app: Any) -> None:
    """Put :class:`RequestIdMiddleware` around ``app``'s whole middleware stack (Starlette's error middleware
    included, so its 500 answers carry the header and its error lines the id), whatever middleware is added
    to ``app`` later."""
    build: Callable[[], ASGIApp] = app.build_middleware_stack

    def build_with_request_id() -> ASGIApp:
        return RequestIdMiddleware(build())

    app.build_middleware_stack = build_with_request_id


def _metadata_request_id(metadata: Iterable[tuple[str, Any]] | None) -> str | bytes | None:
    for key, value in metadata or ():
        if key == GRPC_METADATA_KEY:
            return value  # type: ignore[no-any-return]
    return None


class RequestIdServerInterceptor(grpc.aio.ServerInterceptor):
    """Reads ``x-request-id`` from a unary RPC's metadata into the context variable (sane, else a new id) for
    the RPC's handler, and logs the finished RPC at DEBUG."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        behavior: Callable[..., Any] = handler.unary_unary
        method = handler_call_details.method
        raw = _metadata_request_id(handler_call_details.invocation_metadata)

        async def with_request_id(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            bind_request_id(raw)
            started = time.perf_counter()
            try:
                return await behavior(request, context)
            finally:
                log.debug(
                    "rpc",
                    extra={"method": method, "duration_ms": round((time.perf_counter() - started) * 1000, 1)},
                )

        return rewrap_unary(handler, with_request_id)


class RequestIdClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Sends the current request id as ``x-request-id`` metadata on every unary call made inside a request."""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        request_id = _current.get()
        if request_id is not None:
            metadata = grpc.aio.Metadata(*tuple(client_call_details.metadata or ()))
            metadata.add(GRPC_METADATA_KEY, request_id)
            client_call_details = client_call_details._replace(metadata=metadata)  # type: ignore[attr-defined]
        return await continuation(client_call_details, request)
