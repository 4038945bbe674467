"""The in-flight cap of a native service process (graceful behaviour past saturation).

A pure ASGI middleware counts the requests a process is working on. Past ``HORDE_MAX_IN_FLIGHT_REQUESTS``
a new request is refused at once with 503 ``ServiceAtCapacity`` and ``Retry-After``, before its body is read,
instead of queueing behind the PostgreSQL pool until its acquire timeout: latency stays bounded and the
client is told to come back (``x-should-retry: true``; another replica may take it). ``/healthz``,
``/readyz`` and ``/metrics`` are never counted or refused.

A request that waits without working (a long-polled pop) gives its place back with :func:`leave_in_flight`,
so idle workers waiting for a job never use up the cap; and no request counts while it waits on its client
(its body arriving, a disconnect watch), so clients that trickle their bodies cannot fill the cap.
"""

from __future__ import annotations

from typing import Any

from horde_contract import RC
from prometheus_client import Counter, Gauge
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from horde_core.http_metrics import note_rc

CAPACITY_RETRY_AFTER_SECONDS = 1
CAPACITY_MESSAGE = "This service has too many requests in flight right now; retry shortly."
UNCOUNTED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_LEAVE = "horde.in_flight.leave"

IN_FLIGHT = Gauge("horde_http_requests_in_flight", "Requests this process is working on (the in-flight cap)")
REFUSED = Counter(
    "horde_http_requests_refused_at_capacity_total", "Requests refused with 503 ServiceAtCapacity"
)


def leave_in_flight(scope: Scope) -> None:
    """Stop counting this request toward the cap (idempotent; a no-op outside :class:`InFlightLimit`)."""
    leave = scope.get(_LEAVE)
    if leave is not None:
        leave()


class InFlightLimit:
    """Caps the requests in flight at ``state.settings.max_in_flight_requests`` (0 or no settings: no cap)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state
        self.in_flight = 0

    def _limit(self) -> int:
        settings = getattr(self.state, "settings", None)
        return int(getattr(settings, "max_in_flight_requests", 0) or 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED_PATHS:
            await self.app(scope, receive, send)
            return
        limit = self._limit()
        if limit and self.in_flight >= limit:
            REFUSED.inc()
            note_rc(scope, RC.ServiceAtCapacity)
            response = JSONResponse(
                {"message": CAPACITY_MESSAGE, "rc": RC.ServiceAtCapacity.value},
                status_code=503,
                headers={"Retry-After": str(CAPACITY_RETRY_AFTER_SECONDS), "x-should-retry": "true"},
            )
            await response(scope, receive, send)
            return
        # One event loop per process: the counters need no lock.
        counted = False
        done = False

        def enter() -> None:
            nonlocal counted
            if not counted and not done:
                counted = True
                self.in_flight += 1
                IN_FLIGHT.inc()

        def pause() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.in_flight -= 1
                IN_FLIGHT.dec()

        def leave() -> None:
            nonlocal done
            pause()
            done = True

        async def counted_receive() -> Message:
            # Waiting on the client (a slow body, a disconnect watch) is not work: a client trickling its body
            # must not hold a place of the cap for the body read timeout.
            pause()
            try:
                return await receive()
            finally:
                enter()

        enter()
        scope[_LEAVE] = leave
        try:
            await self.app(scope, counted_receive, send)
        finally:
            leave()
