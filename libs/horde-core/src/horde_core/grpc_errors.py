"""Store outages inside a gRPC servicer answered ``UNAVAILABLE``, in one server interceptor.

A servicer method that raises one of :func:`horde_core.app.store_outage_errors` (the stdlib's connection and
timeout errors, asyncpg's connection errors, redis-py's connection and timeout errors) or any ``OSError`` (an
unreachable or unresolvable host) is answered ``grpc.StatusCode.UNAVAILABLE`` with the detail
``"store unreachable: <exception class>"``, and a warning is logged: the caller may retry, as an HTTP client
retries a 503. Other exceptions keep gRPC's default (``UNKNOWN``), and a method's own ``context.abort`` is
unchanged. Only unary-unary methods are wrapped (every horde RPC is one); streaming handlers pass through.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from horde_core.app import store_outage_errors
from horde_core.grpc_handlers import rewrap_unary

log = logging.getLogger(__name__)

# An aio unary-unary method: (request, context) -> awaitable response (grpc's stubs type handlers as sync).
_UnaryBehavior = Callable[..., Any]


def store_outage_detail(exc: BaseException) -> str:
    """The ``UNAVAILABLE`` detail for a store outage, e.g. ``"store unreachable: ConnectionRefusedError"``."""
    return f"store unreachable: {type(exc).__name__}"


class StoreOutageInterceptor(grpc.aio.ServerInterceptor):
    """Maps store outages raised by unary-unary servicer methods to ``UNAVAILABLE`` (see the module)."""

    def __init__(self) -> None:
        self.outages: tuple[type[BaseException], ...] = (*store_outage_errors(), OSError)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        return rewrap_unary(handler, self._guard(handler.unary_unary, handler_call_details.method))

    def _guard(self, behavior: _UnaryBehavior, method: str) -> _UnaryBehavior:
        outages = self.outages

        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                return await behavior(request, context)
            except outages as exc:
                log.warning("%s: store unreachable: %s: %s", method, type(exc).__name__, exc)
                await context.abort(grpc.StatusCode.UNAVAILABLE, store_outage_detail(exc))

        return guarded
