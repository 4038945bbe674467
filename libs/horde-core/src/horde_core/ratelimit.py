"""Rate limits for every service: fixed windows in Redis through the ``limits`` library (flask-limiter's
storage format and strategy, as upstream), so every replica of a service shares one budget.

- :class:`Limiter` counts hits and raises 429 ``RateLimitExceeded`` (with ``Retry-After``) when a limit is
  exceeded. A store that errs or does not answer within ``HORDE_RATE_LIMIT_TIMEOUT_SECONDS`` lets the request
  through (logged, counted on ``horde_rate_limit_store_errors_total``): rate limiting never takes a route down.
- :data:`ROUTE_LIMITS` is upstream's table for the read and worker routes (docs/native-api.md#rate-limits), which
  :class:`RouteLimitMiddleware` applies before a request is routed (so before its body is read), in every
  service built with :func:`horde_core.app.create_app`. The generate routes (``POST .../async``) count their
  limits in the route (admission's ``RateLimiter``: per address and per key, whitelists).
- :func:`client_address`: the address a request is counted by.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from horde_contract.errors import RC, HordeError
from limits import RateLimitItem, parse_many
from limits.aio.strategies import FixedWindowRateLimiter
from limits.storage import storage_from_string
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from horde_core.http_metrics import note_rc
from horde_core.metrics import counter
from horde_core.settings import HordeSettings

log = logging.getLogger(__name__)

RATE_LIMIT_REFUSALS = counter(
    "horde.rate_limit.refusals", "Requests refused with 429 by a rate limit", ["horde.route"]
)
RATE_LIMIT_STORE_ERRORS = counter(
    "horde.rate_limit.store_errors",
    "Rate-limit checks that failed open (store error or timeout)",
    ["horde.route"],
)

#: A forwarded address longer than this is not an address (it would only grow the counter keys).
MAX_ADDRESS_LENGTH = 64
#: At most one "failed open" warning per this many seconds per process (a hung store would log each request).
FAIL_OPEN_LOG_INTERVAL_SECONDS = 10.0


#: The header a horde proxy (the front) sends its passkey in.
PROXY_PASSKEY_HEADER = "Proxy-Authorization"


def known_proxy_passkey(passkey: str | None, passkeys: Iterable[str]) -> bool:
    """Whether ``passkey`` (a request's :data:`PROXY_PASSKEY_HEADER`) is one of ``passkeys`` (the service's
    ``proxy_passkeys``, admission's ``HORDE_PROXY_PASSKEYS``), compared in constant time: the one rule that
    marks a request as sent by a trusted horde process, for :func:`client_address` and for the trace context
    :mod:`horde_core.tracing` honours."""
    if not passkey:
        return False
    return any(hmac.compare_digest(passkey.encode(), known.encode()) for known in passkeys if known)


def client_address(request: Request, proxy_passkeys: Iterable[str] = ()) -> str:
    """The address a request is counted by.

    The peer address, which uvicorn has already replaced by the ``X-Forwarded-For`` client when the peer is a
    trusted proxy (``HORDE_FORWARDED_ALLOW_IPS``); or the first ``Proxied-For`` address when the request carries
    a known proxy passkey in ``Proxy-Authorization`` (the front forwarding its client, docs/native-api.md#rate-limits).
    """
    passkey = request.headers.get(PROXY_PASSKEY_HEADER)
    proxied_for = request.headers.get("Proxied-For")
    if proxied_for and known_proxy_passkey(passkey, proxy_passkeys):
        forwarded = proxied_for.split(",")[0].strip()
        if forwarded and len(forwarded) <= MAX_ADDRESS_LENGTH:
            return forwarded
    return request.client.host if request.client else "unknown"


def async_storage_uri(redis_url: str) -> str:
    """``redis://…`` as the ``limits`` async storage URI (``async+redis://…``)."""
    scheme, _, rest = redis_url.partition("://")
    return f"async+{scheme}://{rest}"


def parse_limits(text: str) -> list[RateLimitItem]:
    """Limits in flask-limiter notation, several joined by ``;`` (``"2/second;90/minute"``)."""
    return list(parse_many(text))


class Limiter:
    """Fixed-window counters in the Redis at ``redis_url``, checked with a deadline of ``timeout`` seconds.

    The storage's socket timeouts are the same deadline, so a hung store also frees its connection.
    """

    def __init__(self, redis_url: str, timeout: float) -> None:
        self.timeout = timeout
        self._storage = storage_from_string(
            async_storage_uri(redis_url),
            implementation="redispy",
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
        self._strategy = FixedWindowRateLimiter(self._storage)
        self._last_warning = 0.0

    async def _hit(self, items: Sequence[RateLimitItem], identifiers: Sequence[str]) -> None:
        for item in items:
            if not await self._strategy.hit(item, *identifiers):
                stats = await self._strategy.get_window_stats(item, *identifiers)
                # When the window resets: an SDK honours a short Retry-After and retries then.
                retry_after = max(1, math.ceil(stats.reset_time - time.time()))
                raise HordeError(
                    429,
                    RC.RateLimitExceeded,
                    f"Rate limit exceeded: {item}",
                    headers={"Retry-After": str(retry_after)},
                )

    async def check(
        self, route: str, counts: Sequence[tuple[Sequence[RateLimitItem], Sequence[str]]]
    ) -> None:
        """Count one hit of each ``(limits, identifiers)`` pair, in order; 429 ``RateLimitExceeded`` on the first
        limit exceeded. A store error or a store slower than the deadline lets the request through."""
        try:
            async with asyncio.timeout(self.timeout):
                for items, identifiers in counts:
                    await self._hit(items, identifiers)
        except HordeError:
            RATE_LIMIT_REFUSALS.labels(route).inc()
            raise
        except Exception as exc:  # the store: refused, reset, timed out, or anything else it raised
            RATE_LIMIT_STORE_ERRORS.labels(route).inc()
            now = time.monotonic()
            if now - self._last_warning >= FAIL_OPEN_LOG_INTERVAL_SECONDS:
                self._last_warning = now
                log.warning(
                    "rate limit storage unavailable; requests let through",
                    extra={"route": route, "error": f"{type(exc).__name__}: {exc}"[:200]},
                )

    async def reset(self) -> None:
        """Clear every counter (tests)."""
        await self._storage.reset()  # type: ignore[misc]


# --- the read and worker routes ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RouteLimit:
    """One upstream limit: requests of ``methods`` on paths matching ``pattern`` (without the ``/api``
    prefix), counted per client address under ``name``; ``per_path`` adds the method and path to the key
    (upstream's ``IP@method@path``). ``setting`` names the :class:`HordeSettings` field with the limits."""

    name: str
    methods: frozenset[str]
    pattern: re.Pattern[str]
    setting: str
    per_path: bool = False


ROUTE_LIMITS: tuple[RouteLimit, ...] = (
    RouteLimit(
        "status",
        frozenset({"GET", "DELETE"}),
        re.compile(r"/v2/generate/(?:chat|text)/status/[^/]+/?"),
        "status_request_limit_per_ip",
        per_path=True,
    ),
    RouteLimit(
        "pop", frozenset({"POST"}), re.compile(r"/v2/generate/text/pop/?"), "pop_request_limit_per_ip"
    ),
    RouteLimit(
        "submit",
        frozenset({"POST"}),
        re.compile(r"/v2/generate/text/submit/?"),
        "submit_request_limit_per_ip",
    ),
    RouteLimit(
        "progress",
        frozenset({"POST"}),
        re.compile(r"/v2/generate/text/progress/?"),
        "submit_request_limit_per_ip",
    ),
    RouteLimit(
        "workers", frozenset({"GET"}), re.compile(r"/v2/workers(?:/.*)?"), "read_request_limit_per_ip"
    ),
    RouteLimit(
        "modify_worker", frozenset({"PUT"}), re.compile(r"/v2/workers/[^/]+/?"), "modify_request_limit_per_ip"
    ),
    # The horde's own read routes (users, status, stats): upstream's application default.
    RouteLimit(
        "horde_info",
        frozenset({"GET"}),
        re.compile(
            r"/v2/(?:find_user|users/[^/]+|status/(?:heartbeat|performance|modes|news)|stats/text/(?:models|totals))/?"
        ),
        "read_request_limit_per_ip",
    ),
)


def route_limit(method: str, path: str) -> tuple[RouteLimit, str] | None:
    """The limit of a request and its path without ``/api`` (the native routes answer at both), or None."""
    native = path[4:] if path.startswith("/api/") else path
    for rule in ROUTE_LIMITS:
        if method in rule.methods and rule.pattern.fullmatch(native):
            return rule, native.rstrip("/")
    return None


class RouteLimiter:
    """:data:`ROUTE_LIMITS` with one service's settings."""

    def __init__(self, settings: HordeSettings) -> None:
        self.settings = settings
        self.limiter = Limiter(settings.redis_url, settings.rate_limit_timeout_seconds)
        self.limits = {rule.name: parse_limits(getattr(settings, rule.setting)) for rule in ROUTE_LIMITS}
        self.proxy_passkeys: list[str] = list(getattr(settings, "proxy_passkeys", None) or [])

    async def check(self, request: Request, rule: RouteLimit, path: str) -> None:
        """Count ``request`` against ``rule``; 429 RateLimitExceeded when over."""
        address = client_address(request, self.proxy_passkeys)
        identifiers = [rule.name, "ip", address]
        if rule.per_path:
            identifiers += [request.method, path]
        await self.limiter.check(rule.name, [(self.limits[rule.name], identifiers)])


class RouteLimitMiddleware:
    """Applies :data:`ROUTE_LIMITS` before routing, with the settings the service put on ``app.state.settings``
    (nothing is limited until it has, or when its ``rate_limits_enabled`` is false)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state
        self._limiter: RouteLimiter | None = None
        self._settings: HordeSettings | None = None

    def _route_limiter(self) -> RouteLimiter | None:
        settings = getattr(self.state, "settings", None)
        if not isinstance(settings, HordeSettings) or not settings.rate_limits_enabled:
            return None
        if self._limiter is None or self._settings is not settings:
            self._limiter, self._settings = RouteLimiter(settings), settings
        return self._limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = route_limit(scope["method"], scope["path"])
            limiter = self._route_limiter() if found is not None else None
            if found is not None and limiter is not None:
                try:
                    await limiter.check(Request(scope), *found)
                except HordeError as exc:
                    note_rc(scope, exc.rc)
                    response = JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
