"""HTTP request metrics of every process built by :func:`horde_core.app.create_app` (docs/operator-guide.md#metrics).

- ``horde_http_server_requests_total{route, method, status, rc}``: each finished request. ``route`` is the
  template of the route the router matched (``/v2/generate/text/pop``, ``/v2/generate/text/status/{id}``: the
  native routes' own template, whether called at ``/api/v2/...`` or ``/v2/...``), never the raw path; a path no route matches is :data:`UNMATCHED_ROUTE`. A request refused before routing (the
  in-flight cap, a rate limit) gets the template its path would have matched. ``method`` is the request's
  method, or ``other`` outside :data:`METHODS`. ``status`` is the HTTP status sent (500 when the app raised
  before answering). ``rc`` is the Horde envelope's ``rc`` of a refusal (empty for a success, and for an error
  answered without the envelope), read from where the answer is built (:func:`note_rc`) instead of from the
  body; an ``rc`` outside :class:`horde_contract.RC` is ``other``.
- ``horde_http_server_request_duration_seconds{route, method}``: seconds from the request's arrival to the end
  of its response (a streamed response's last chunk).

``/metrics``, ``/healthz`` and ``/readyz`` are not counted. :class:`HttpMetricsMiddleware` is pure ASGI and sits
outside Starlette's error middleware (so its 500 answers are counted), inside the request id's; every label
set's child instrument is looked up once and cached, so a request costs a few microseconds.
"""

from __future__ import annotations

import time
from typing import Any

from horde_contract import RC
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from horde_core.metrics import BUCKETS_SECONDS, counter, histogram

#: The route label of a request no route matched (404s of probing clients, a trailing-slash redirect).
UNMATCHED_ROUTE = "unmatched"
#: The method label of any method but these.
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
OTHER = "other"
#: Paths never counted: the probes and the scrape.
UNCOUNTED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Every rc a refusal may carry (the label's bounded set, with ``other`` and the empty success value).
RC_VALUES = frozenset(rc.value for rc in RC)
#: The statuses of the answers given before routing (429 rate limits, 503 at the in-flight cap).
PRE_ROUTING_STATUSES = frozenset({429, 503})
#: The scope key :func:`note_rc` writes and the middleware reads.
RC_SCOPE_KEY = "horde.http.rc"

REQUESTS = counter(
    "horde.http.server.requests",
    "Finished HTTP requests by route template, method, status and the refusal's rc (empty for a success)",
    ["horde.route", "horde.method", "horde.status", "horde.rc"],
)
DURATION = histogram(
    "horde.http.server.request_duration_seconds",
    "Seconds from an HTTP request's arrival to the end of its response (a stream's last chunk)",
    ["horde.route", "horde.method"],
    buckets=BUCKETS_SECONDS,
)


def note_rc(scope: Scope, rc: str) -> None:
    """Record the Horde envelope's ``rc`` of the answer being built for the request of ``scope``: every place
    that answers with ``{"message", "rc"}`` calls this (horde_core.app's error handlers, the in-flight cap, the
    rate limits), so the request counter reads it without parsing a body."""
    scope[RC_SCOPE_KEY] = str(rc)


class HttpMetricsMiddleware:
    """Counts and times every HTTP request but :data:`UNCOUNTED_PATHS` (see the module docstring).

    ``router`` is the app's router: a request answered before routing (no ``route`` in its scope) is matched
    against its routes to find the template, only then (refusals before routing, unmatched paths).
    """

    def __init__(self, app: ASGIApp, router: Any) -> None:
        self.app = app
        self.router = router
        self._requests: dict[tuple[str, str, str, str], Any] = {}
        self._durations: dict[tuple[str, str], Any] = {}
        self._flat: list[Any] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED_PATHS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self._record(scope, status, time.perf_counter() - started)

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        if route is not None:
            template = route.path
        elif status in PRE_ROUTING_STATUSES:
            # Answered before routing (the in-flight cap, a rate limit): the route the path would reach.
            template = self._match(scope) or UNMATCHED_ROUTE
        else:
            template = UNMATCHED_ROUTE
        method = scope["method"]
        if method not in METHODS:
            method = OTHER
        rc = scope.get(RC_SCOPE_KEY, "")
        if rc and rc not in RC_VALUES:
            rc = OTHER
        # No response started: the app raised past every handler (the server answers 500).
        key = (template, method, str(status or 500), rc)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = REQUESTS.labels(*key)
        child.inc()
        timer = self._durations.get((template, method))
        if timer is None:
            timer = self._durations[(template, method)] = DURATION.labels(template, method)
        timer.observe(seconds)

    def _match(self, scope: Scope) -> str | None:
        """The template of the route ``scope``'s path and method would be routed to (a full match first, else
        a partial one, as the router picks), or None. The native routes are included at ``/api`` and at the
        root, and labelled by their own template (``/v2/...``) either way, as the router labels them."""
        path = scope["path"]
        probe = {**scope, "path": path[4:] if path.startswith("/api/") else path, "root_path": ""}
        partial = None
        for route in self._routes():
            match, _ = route.matches(probe)
            if match is Match.FULL:
                return str(route.path)
            if match is Match.PARTIAL and partial is None:
                partial = route
        return str(partial.path) if partial is not None else None

    def _routes(self) -> list[Any]:
        """The app's routes with a template, those of its included routers (FastAPI keeps them apart) too."""
        if self._flat is None:
            flat: list[Any] = []
            for route in getattr(self.router, "routes", ()):
                included = getattr(route, "original_router", None)
                for inner in getattr(included, "routes", None) or (route,):
                    if isinstance(getattr(inner, "path", None), str):
                        flat.append(inner)
            self._flat = flat
        return self._flat


def install_http_metrics(app: Any) -> None:
    """Put :class:`HttpMetricsMiddleware` around ``app``'s whole middleware stack (Starlette's error middleware
    included), whatever middleware is added to ``app`` later. Call it before
    :func:`horde_core.request_id.install_request_id`, which then stays outermost."""
    build = app.build_middleware_stack

    def build_with_metrics() -> ASGIApp:
        return HttpMetricsMiddleware(build(), app.router)

    app.build_middleware_stack = build_with_metrics
