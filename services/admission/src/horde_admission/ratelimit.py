"""Per-address and per-key rate limits of the generate routes (docs/native-api.md#rate-limits).

Fixed windows in Redis through horde_core's :class:`~horde_core.ratelimit.Limiter` (the ``limits`` library),
so every admission replica shares one budget, and a store that errs or hangs lets the request through within
``HORDE_RATE_LIMIT_TIMEOUT_SECONDS``. Each route counts separately (the key holds the route name), so chat
submits do not spend the text budget. The read routes' limits (status) are horde_core's ROUTE_LIMITS.
"""

from __future__ import annotations

import hashlib

from fastapi import Request
from horde_core.ratelimit import Limiter, parse_limits
from horde_core.ratelimit import client_address as core_client_address

from horde_admission.settings import AdmissionSettings

ANONYMOUS_API_KEY = "0000000000"


def client_address(request: Request, settings: AdmissionSettings) -> str:
    """The address a request is counted by: ``Proxied-For`` when it carries a known proxy passkey, else the
    peer (the ``X-Forwarded-For`` client when the peer is a trusted proxy)."""
    return core_client_address(request, settings.proxy_passkeys)


class RateLimiter:
    """Checks the per-address and per-key limits of one generate route.

    A refusal raises 429 with rc ``RateLimitExceeded`` in the Horde envelope. A Redis failure or timeout lets
    the request through (logged): rate limiting never takes the route down.
    """

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.enabled = settings.rate_limits_enabled
        self._limiter = Limiter(settings.redis_url, settings.rate_limit_timeout_seconds)
        self._per_ip = {
            "chat_async": parse_limits(settings.chat_limits_per_ip()),
            "text_async": parse_limits(settings.text_limits_per_ip()),
        }
        self._whitelisted = parse_limits(settings.whitelisted_request_limits)
        self._per_key = parse_limits(settings.apikey_request_limit)
        self._per_key_whitelisted = parse_limits(settings.apikey_whitelisted_request_limit)

    async def check(self, request: Request, route: str) -> None:
        """Count one request of ``route`` by its address and API key; 429 when a limit is exceeded."""
        if not self.enabled:
            return
        address = client_address(request, self.settings)
        whitelisted = address in self.settings.whitelisted_service_ips
        apikey = request.headers.get("apikey") or ANONYMOUS_API_KEY
        key_hash = hashlib.sha256(apikey.encode()).hexdigest()
        per_key = self._per_key_whitelisted if whitelisted or apikey == ANONYMOUS_API_KEY else self._per_key
        per_ip = self._whitelisted if whitelisted else self._per_ip[route]
        await self._limiter.check(
            route, [(per_ip, [route, "ip", address]), (per_key, [route, "key", key_hash])]
        )

    async def reset(self) -> None:
        """Clear every counter (tests)."""
        await self._limiter.reset()
