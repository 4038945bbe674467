"""The Content-Security-Policy of the ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) pages: same origin only.

The viewers' scripts and styles are the process's own (fastapi-offline, under ``horde_core.app.DOCS_ASSETS_URL``),
but ReDoc's bundle still asks for one file off the machine: its side menu's "API docs by Redocly" logo,
``https://cdn.redoc.ly/redoc/logo-mini.svg``, hard-coded (no option turns it off; the image hides itself when it
does not load). The policy makes the browser refuse that request before it leaves the machine, so a docs page
never contacts a third party (a reader's address is not leaked, an air-gapped cluster has no hanging request), and
it keeps any later asset of the bundles from reaching out the same way. What the viewers need stays allowed: their
inline bootstrap script and the styles they inject, ``data:`` images (Swagger UI's icons), ReDoc's ``blob:``
worker, and same-origin fetches (the OpenAPI document, Swagger UI's "Try it out"). No other site may frame
the pages (``frame-ancestors 'none'``: no clickjacking of "Try it out") and a form on them may only post to the
origin (``form-action 'self'``).

The policy covers every HTML page at or under a viewer's path: ``/docs``, ``/redoc`` and Swagger UI's OAuth2
redirect page, ``/docs/oauth2-redirect`` (the assets under ``/docs/assets`` are scripts and styles, not pages).

tests/test_offline_docs.py checks the header; tests/clients/test_docs_render.py renders the pages in Chromium
with every off-machine request blocked and recorded.
"""

from __future__ import annotations

from typing import Final

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DOCS_CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "worker-src 'self' blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    )
)


class DocsPolicy:
    """ASGI middleware: :data:`DOCS_CONTENT_SECURITY_POLICY` on the HTML responses to ``paths`` (the viewer
    pages) and to the paths under them (``/docs/oauth2-redirect``); every other request passes untouched
    (streams included)."""

    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app = app
        self.paths = paths
        self.prefixes = tuple(path.rstrip("/") + "/" for path in paths)

    def covers(self, path: str) -> bool:
        """Whether ``path`` is a viewer's or under one."""
        return path in self.paths or path.startswith(self.prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.covers(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if headers.get("content-type", "").lower().startswith("text/html"):
                    headers["Content-Security-Policy"] = DOCS_CONTENT_SECURITY_POLICY
            await send(message)

        await self.app(scope, receive, send_with_policy)
