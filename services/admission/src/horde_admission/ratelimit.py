"""Per-address and per-key rate limits of the generate routes (spec: Rate limits; text path §9).

Fixed windows in Redis through the ``limits`` library, so every admission replica shares one budget. Each
route counts separately (the key holds the route name), so chat submits do not spend the text budget.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time

from fastapi import Request
from horde_core.errors import HordeError
from limits import RateLimitItem, parse_many
from limits.aio.strategies import FixedWindowRateLimiter
from limits.storage import storage_from_string

from horde_admission.settings import AdmissionSettings

log = logging.getLogger(__name__)

ANONYMOUS_API_KEY = "0000000000"


def client_address(request: Request, settings: AdmissionSettings) -> str:
    """The address a request is counted by: ``Proxied-For`` when it carries a known proxy passkey."""
    passkey = request.headers.get("Proxy-Authorization")
    proxied_for = request.headers.get("Proxied-For")
    if passkey and proxied_for and passkey in settings.proxy_passkeys:
        return proxied_for.split(",")[0].strip()
    return request.client.host if request.client else "unknown"


def _async_uri(redis_url: str) -> str:
    scheme, _, rest = redis_url.partition("://")
    return f"async+{scheme}://{rest}"


class RateLimiter:
    """Checks the per-address and per-key limits of one generate route.

    A refusal raises 429 with rc ``RateLimitExceeded`` in the Horde envelope. A Redis failure lets the request
    through (logged): rate limiting never takes the route down.
    """

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.enabled = settings.rate_limits_enabled
        self._storage = storage_from_string(_async_uri(settings.redis_url), implementation="redispy")
        self._limiter = FixedWindowRateLimiter(self._storage)
        self._per_ip = {
            "chat_async": parse_many(settings.chat_limits_per_ip()),
            "text_async": parse_many(settings.text_limits_per_ip()),
        }
        self._whitelisted = parse_many(settings.whitelisted_request_limits)
        self._per_key = parse_many(settings.apikey_request_limit)
        self._per_key_whitelisted = parse_many(settings.apikey_whitelisted_request_limit)

    async def _hit(self, items: list[RateLimitItem], *identifiers: str) -> None:
        for item in items:
            if not await self._limiter.hit(item, *identifiers):
                stats = await self._limiter.get_window_stats(item, *identifiers)
                # When the window resets: an SDK honours a short Retry-After and retries then.
                retry_after = max(1, math.ceil(stats.reset_time - time.time()))
                raise HordeError(
                    429,
                    "RateLimitExceeded",
                    f"Rate limit exceeded: {item}",
                    headers={"Retry-After": str(retry_after)},
                )

    async def check(self, request: Request, route: str) -> None:
        """Count one request of ``route`` by its address and API key; 429 when a limit is exceeded."""
        if not self.enabled:
            return
        address = client_address(request, self.settings)
        whitelisted = address in self.settings.whitelisted_service_ips
        apikey = request.headers.get("apikey") or ANONYMOUS_API_KEY
        key_hash = hashlib.sha256(apikey.encode()).hexdigest()
        per_key = self._per_key_whitelisted if whitelisted or apikey == ANONYMOUS_API_KEY else self._per_key
        try:
            await self._hit(self._whitelisted if whitelisted else self._per_ip[route], route, "ip", address)
            await self._hit(per_key, route, "key", key_hash)
        except HordeError:
            raise
        except Exception:
            log.warning("rate limit storage unavailable; request let through", exc_info=True)

    async def reset(self) -> None:
        """Clear every counter (tests)."""
        await self._storage.reset()  # type: ignore[misc]
