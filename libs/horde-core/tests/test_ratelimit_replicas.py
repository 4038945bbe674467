"""The read and worker routes' limits (horde_core.ratelimit.ROUTE_LIMITS) count across replicas: two app
instances, each with its own middleware, limiter and Redis connection as two processes of one service would have,
share one budget per address (issue 13; docs/operator-guide.md#correct-with-n-replicas)."""

from __future__ import annotations

import uuid

from horde_core.settings import HordeSettings

from .test_ratelimit import assert_limited, build_app, client


async def test_two_replicas_share_each_routes_budget(redis_url: str) -> None:
    a = build_app(
        HordeSettings(
            redis_url=redis_url, status_request_limit_per_ip="3/minute", pop_request_limit_per_ip="2/minute"
        )
    )
    b = build_app(
        HordeSettings(
            redis_url=redis_url, status_request_limit_per_ip="3/minute", pop_request_limit_per_ip="2/minute"
        )
    )
    address = "192.0.2.77"  # no other test counts this address
    status = f"/api/v2/generate/chat/status/{uuid.uuid4()}"
    async with client(a, address) as on_a, client(b, address) as on_b:
        assert [(await c.get(status)).status_code for c in (on_a, on_b, on_a)] == [200, 200, 200]
        assert_limited(await on_b.get(status), "3 per 1 minute")
        assert_limited(await on_a.get(status), "3 per 1 minute")
        assert (await on_a.post("/api/v2/generate/text/pop", json={})).status_code == 200
        assert (await on_b.post("/api/v2/generate/text/pop", json={})).status_code == 200
        assert_limited(await on_a.post("/api/v2/generate/text/pop", json={}), "2 per 1 minute")
