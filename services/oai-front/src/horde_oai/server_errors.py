"""An unhandled exception as OpenAI's 500, inside CORS (docs/openai-front.md#routes).

Starlette answers an unhandled exception in its outermost ``ServerErrorMiddleware``, outside every middleware an
app adds, so that 500 would go out without the CORS headers a browser client needs to read it. The front adds
:class:`UnhandledErrorMiddleware` just inside ``CORSMiddleware``: an exception that escapes the routes and
the inner middleware becomes the OpenAI envelope (500 ``InternalServerError``) while the response has not
started, and passes through CORS like any other answer. Once the response has started (a stream), nothing can
be sent in its place: the exception propagates and the server closes the connection.
"""

from __future__ import annotations

import logging

from horde_contract.errors import RC
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from horde_oai.errors import OpenAIError

log = logging.getLogger(__name__)

INTERNAL_ERROR_MESSAGE = "The server had an error while processing your request."


def internal_server_error() -> OpenAIError:
    """500 api_error InternalServerError, OpenAI's message for a server error."""
    return OpenAIError(500, INTERNAL_ERROR_MESSAGE, RC.InternalServerError)


class UnhandledErrorMiddleware:
    """Answers an unhandled exception of an HTTP request with :func:`internal_server_error`, before any header
    has gone out (pure ASGI, so a streamed response is passed through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error", exc_info=exc)
            await internal_server_error().response()(scope, receive, send)
