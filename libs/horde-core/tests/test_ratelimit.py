"""Upstream's limits on the read and worker routes (horde_core.ratelimit.ROUTE_LIMITS) on a real Redis, the
limiter failing open on a hung store, and the trusted-proxy settings that decide whose address is counted."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import httpx
import pytest
from fastapi import APIRouter
from horde_core.app import create_app, include_native
from horde_core.ratelimit import RATE_LIMIT_STORE_ERRORS, Limiter, client_address, parse_limits, route_limit
from horde_core.runner import uvicorn_options
from horde_core.settings import HordeSettings
from pydantic import ValidationError
from starlette.requests import Request


def build_app(settings: HordeSettings | None) -> Any:
    app = create_app("test")
    router = APIRouter()

    @router.get("/v2/generate/chat/status/{request_id}")
    async def status(request_id: str) -> dict[str, str]:
        return {"id": request_id}

    @router.delete("/v2/generate/text/status/{request_id}")
    async def cancel(request_id: str) -> dict[str, str]:
        return {"id": request_id}

    @router.post("/v2/generate/text/pop")
    async def pop() -> dict[str, Any]:
        return {"id": None}

    @router.post("/v2/generate/text/submit")
    async def submit() -> dict[str, int]:
        return {"reward": 0}

    @router.post("/v2/generate/text/progress")
    async def progress() -> dict[str, int]:
        return {"accepted_seq": 1}

    @router.get("/v2/workers")
    async def workers() -> list[Any]:
        return []

    @router.post("/v2/generate/chat/async")
    async def chat_async() -> dict[str, str]:
        return {"id": "x"}

    include_native(app, router)
    app.state.settings = settings
    return app


def client(app: Any, address: str = "203.0.113.10") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 1234))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def settings(redis_url: str, **overrides: Any) -> HordeSettings:
    return HordeSettings(redis_url=redis_url, **overrides)


def assert_limited(r: httpx.Response, limit: str) -> None:
    assert r.status_code == 429, r.text
    assert r.json() == {"message": f"Rate limit exceeded: {limit}", "rc": "RateLimitExceeded"}
    assert 1 <= int(r.headers["Retry-After"]) <= 60


async def test_status_is_limited_per_address_method_and_path(redis_url: str) -> None:
    """Upstream: 60/minute per IP@method@path on the status routes (here 2/minute): a third read of one request
    is refused; another request's status, the cancel, and another address each have their own budget; /api and
    /v2 are one route."""
    app = build_app(settings(redis_url, status_request_limit_per_ip="2/minute"))
    rid, other = uuid.uuid4(), uuid.uuid4()
    async with client(app) as c, client(app, "203.0.113.11") as c2:
        assert (await c.get(f"/api/v2/generate/chat/status/{rid}")).status_code == 200
        assert (await c.get(f"/v2/generate/chat/status/{rid}")).status_code == 200
        assert_limited(await c.get(f"/api/v2/generate/chat/status/{rid}"), "2 per 1 minute")
        assert (await c.get(f"/api/v2/generate/chat/status/{other}")).status_code == 200
        assert (await c.delete(f"/api/v2/generate/text/status/{rid}")).status_code == 200
        assert (await c2.get(f"/api/v2/generate/chat/status/{rid}")).status_code == 200


async def test_upstream_numbers_are_the_defaults() -> None:
    s = HordeSettings()
    assert s.status_request_limit_per_ip == "60/minute"
    assert (s.pop_request_limit_per_ip, s.submit_request_limit_per_ip) == ("60/second", "60/second")
    assert s.read_request_limit_per_ip == "90/minute"
    assert s.forwarded_allow_ips == ""
    found = route_limit("POST", "/api/v2/generate/text/pop")
    assert found is not None and found[0].name == "pop"
    assert route_limit("POST", "/api/v2/generate/chat/async") is None  # the route counts its own limits
    assert route_limit("GET", "/healthz") is None
    assert s.modify_request_limit_per_ip == "30/minute"


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("PUT", "/api/v2/workers/8ea50d45-d428-430f-8a2f-2658c897d8dd", "modify_worker"),
        ("GET", "/api/v2/workers/8ea50d45-d428-430f-8a2f-2658c897d8dd", "workers"),
        ("GET", "/api/v2/find_user", "horde_info"),
        ("GET", "/api/v2/users/12", "horde_info"),
        ("GET", "/api/v2/status/heartbeat", "horde_info"),
        ("GET", "/api/v2/status/performance", "horde_info"),
        ("GET", "/api/v2/status/modes", "horde_info"),
        ("GET", "/api/v2/status/news", "horde_info"),
        ("GET", "/api/v2/stats/text/models", "horde_info"),
        ("GET", "/v2/stats/text/totals", "horde_info"),
        ("GET", "/api/v2/stats/text/totals", "horde_info"),
        ("PUT", "/api/v2/workers", None),
        ("GET", "/api/v2/users", None),
        ("GET", "/api/v2/status/models", None),
        ("GET", "/api/v2/status/models/koboldcpp/some-model", None),  # as the list: served from its cache
    ],
)
def test_the_horde_read_routes_and_worker_changes_are_limited(
    method: str, path: str, name: str | None
) -> None:
    found = route_limit(method, path)
    assert (found[0].name if found else None) == name


async def test_pop_submit_progress_and_worker_reads_are_limited_per_address(redis_url: str) -> None:
    app = build_app(
        settings(
            redis_url,
            pop_request_limit_per_ip="3/minute",
            submit_request_limit_per_ip="2/minute",
            read_request_limit_per_ip="1/minute",
        )
    )
    async with client(app, "198.51.100.1") as c, client(app, "198.51.100.2") as c2:
        for _ in range(3):
            assert (await c.post("/api/v2/generate/text/pop", json={})).status_code == 200
        assert_limited(await c.post("/api/v2/generate/text/pop", json={}), "3 per 1 minute")
        assert (await c2.post("/api/v2/generate/text/pop", json={})).status_code == 200
        # submit and progress: each its own bucket of the submit limit
        for _ in range(2):
            assert (await c.post("/api/v2/generate/text/submit", json={})).status_code == 200
            assert (await c.post("/api/v2/generate/text/progress", json={})).status_code == 200
        assert_limited(await c.post("/api/v2/generate/text/submit", json={}), "2 per 1 minute")
        assert_limited(await c.post("/api/v2/generate/text/progress", json={}), "2 per 1 minute")
        assert (await c.get("/api/v2/workers")).status_code == 200
        assert_limited(await c.get("/api/v2/workers"), "1 per 1 minute")
        # the generate route is not the middleware's
        for _ in range(5):
            assert (await c.post("/api/v2/generate/chat/async", json={})).status_code == 200


async def test_limits_off_or_settings_absent_count_nothing(redis_url: str) -> None:
    for s in (settings(redis_url, pop_request_limit_per_ip="1/minute", rate_limits_enabled=False), None):
        async with client(build_app(s), "198.51.100.3") as c:
            for _ in range(3):
                assert (await c.post("/api/v2/generate/text/pop", json={})).status_code == 200


def store_errors(route: str) -> float:
    """Checks of ``route`` that failed open so far in this process."""
    return sum(
        sample.value
        for family in RATE_LIMIT_STORE_ERRORS.collect()
        for sample in family.samples
        if sample.name.endswith("_total") and list(sample.labels.values()) == [route]
    )


async def test_a_hung_store_fails_open_within_the_timeout(hung_redis: str) -> None:
    """The store accepts and never answers: each limited route still answers, within the limiter's deadline
    (0.3 s here) rather than after redis-py's default of waiting forever. Answering at all proves the deadline,
    and each answer is a counted store error (the ``wait_for`` is only a hang guard)."""
    app = build_app(
        settings(hung_redis, rate_limit_timeout_seconds=0.3, status_request_limit_per_ip="1/minute")
    )
    status, pop = store_errors("status"), store_errors("pop")
    async with client(app) as c:
        for path in ("/api/v2/generate/chat/status/abc", "/api/v2/generate/chat/status/abc"):
            r = await asyncio.wait_for(c.get(path), 30)
            assert r.status_code == 200
        assert (await asyncio.wait_for(c.post("/api/v2/generate/text/pop", json={}), 30)).status_code == 200
        metrics = (await c.get("/metrics")).text
    assert 'horde_rate_limit_store_errors_total{route="status"}' in metrics
    assert (store_errors("status"), store_errors("pop")) == (status + 2, pop + 1)


async def test_an_unreachable_store_fails_open() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens
    limiter = Limiter(f"redis://127.0.0.1:{port}/0", timeout=0.5)
    before = store_errors("status")
    await asyncio.wait_for(limiter.check("status", [(parse_limits("1/minute"), ["x"])]), 30)
    await asyncio.wait_for(limiter.check("status", [(parse_limits("1/minute"), ["x"])]), 30)
    assert store_errors("status") == before + 2  # both allowed (1/minute), as failures of the store


async def test_limiter_deadline_bounds_a_slow_check(hung_redis: str) -> None:
    limiter = Limiter(hung_redis, timeout=0.2)
    before = store_errors("pop")
    # The store never answers: returning at all is the deadline (the wait_for is only a hang guard).
    await asyncio.wait_for(limiter.check("pop", [(parse_limits("1/second"), ["y"])]), 30)
    assert store_errors("pop") == before + 1


def _request(headers: dict[str, str], peer: str = "10.1.2.3") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "headers": raw, "client": (peer, 1), "method": "GET", "path": "/"})


def test_client_address_takes_proxied_for_only_with_a_known_passkey() -> None:
    proxied = {"Proxy-Authorization": "pk", "Proxied-For": "203.0.113.5, 10.0.0.1"}
    assert client_address(_request(proxied), ["pk"]) == "203.0.113.5"
    assert client_address(_request(proxied), ["other"]) == "10.1.2.3"
    assert client_address(_request(proxied), []) == "10.1.2.3"
    assert client_address(_request({**proxied, "Proxied-For": "x" * 100}), ["pk"]) == "10.1.2.3"
    # X-Forwarded-For is uvicorn's to read, and only from a trusted proxy: never here
    assert client_address(_request({"X-Forwarded-For": "203.0.113.9"}), ["pk"]) == "10.1.2.3"


def test_trusted_proxies_default_to_nobody_and_are_validated() -> None:
    options = uvicorn_options(HordeSettings())
    assert options["proxy_headers"] is False
    # never None: uvicorn would fall back to 127.0.0.1 (or $FORWARDED_ALLOW_IPS)
    assert options["forwarded_allow_ips"] == ""
    trusted = uvicorn_options(HordeSettings(forwarded_allow_ips=" 10.244.0.0/16 , 192.0.2.7"))
    assert trusted["proxy_headers"] is True
    assert trusted["forwarded_allow_ips"] == "10.244.0.0/16,192.0.2.7"
    with pytest.raises(ValidationError, match="not an IP address or network"):
        HordeSettings(forwarded_allow_ips="ingress.local")


def test_a_malformed_limit_stops_the_process_at_start() -> None:
    with pytest.raises(ValidationError, match="is not a rate limit"):
        HordeSettings(status_request_limit_per_ip="sixty a minute")
