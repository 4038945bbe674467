"""The HTTP request counter and duration histogram of every app (horde_core.http_metrics)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from horde_contract.errors import HordeError
from horde_core.app import create_app, include_native
from horde_core.http_metrics import UNMATCHED_ROUTE
from horde_core.settings import HordeSettings
from prometheus_client import REGISTRY

REQUESTS = "horde_http_server_requests_total"
DURATION = "horde_http_server_request_duration_seconds"
STREAM_SECONDS = 0.05


def build_app():
    app = create_app("metrics-test")
    router = APIRouter()

    @router.get("/v2/metrics-test/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    @router.post("/v2/metrics-test/refuse")
    async def refuse() -> None:
        raise HordeError(403, "KudosUpfront", "Not enough kudos.")

    @router.post("/v2/metrics-test/odd-rc")
    async def odd_rc() -> None:
        raise HordeError(400, "NotAnRc", "An rc outside the enum.")

    @router.get("/v2/metrics-test/boom")
    async def boom() -> None:
        raise RuntimeError("kaput")

    @router.get("/v2/metrics-test/slow")
    async def slow() -> dict[str, bool]:
        await asyncio.sleep(STREAM_SECONDS)
        return {"ok": True}

    @router.get("/v2/metrics-test/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"a"
            await asyncio.sleep(STREAM_SECONDS)
            yield b"b"

        return StreamingResponse(chunks(), media_type="text/plain")

    include_native(app, router)
    return app


def count(route: str, method: str, status: str, rc: str = "") -> float:
    labels = {"route": route, "method": method, "status": status, "rc": rc}
    return REGISTRY.get_sample_value(REQUESTS, labels) or 0.0


def timed(route: str, method: str) -> tuple[float, float]:
    labels = {"route": route, "method": method}
    return (
        REGISTRY.get_sample_value(DURATION + "_count", labels) or 0.0,
        REGISTRY.get_sample_value(DURATION + "_sum", labels) or 0.0,
    )


def series_with_path(fragment: str) -> list[str]:
    """Every route label of the counter that holds ``fragment``."""
    return [route for route in route_labels() if fragment in route]


def route_labels() -> list[str]:
    """Every route label of the counter."""
    return [
        sample.labels["route"]
        for metric in REGISTRY.collect()
        if metric.name == "horde_http_server_requests"
        for sample in metric.samples
        if "route" in sample.labels
    ]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def test_a_matched_route_counts_its_template_not_its_path(client: httpx.AsyncClient) -> None:
    route = "/v2/metrics-test/items/{item_id}"
    before, before_timed = count(route, "GET", "200"), timed(route, "GET")
    for item in ("a", "b", "c"):
        assert (await client.get(f"/api/v2/metrics-test/items/{item}")).status_code == 200
    # The native route's own template, called at /api/v2/... or /v2/...; no raw path becomes a label.
    await client.get("/v2/metrics-test/items/zzz")
    assert count(route, "GET", "200") - before == 4
    assert timed(route, "GET")[0] - before_timed[0] == 4
    assert not [r for r in series_with_path("metrics-test/items/") if "{item_id}" not in r]


async def test_an_unmatched_path_is_one_fixed_route(client: httpx.AsyncClient) -> None:
    before = count(UNMATCHED_ROUTE, "GET", "404", "NotFound")
    for path in ("/nope", "/v2/metrics-test/nope/1", "/wp-login.php"):
        assert (await client.get(path)).status_code == 404
    assert count(UNMATCHED_ROUTE, "GET", "404", "NotFound") - before == 3
    assert not series_with_path("nope")
    assert not series_with_path("wp-login")


async def test_a_refusal_counts_its_rc(client: httpx.AsyncClient) -> None:
    route = "/v2/metrics-test/refuse"
    before = count(route, "POST", "403", "KudosUpfront")
    r = await client.post("/api" + route)
    assert (r.status_code, r.json()["rc"]) == (403, "KudosUpfront")
    assert count(route, "POST", "403", "KudosUpfront") - before == 1
    # An rc outside the enum is "other": the label set stays bounded.
    odd = "/v2/metrics-test/odd-rc"
    before_odd = count(odd, "POST", "400", "other")
    assert (await client.post(odd)).status_code == 400
    assert count(odd, "POST", "400", "other") - before_odd == 1


async def test_validation_method_and_unhandled_errors_count_their_rc(client: httpx.AsyncClient) -> None:
    route = "/v2/metrics-test/boom"
    before_boom = count(route, "GET", "500", "InternalServerError")
    assert (await client.get("/api" + route)).status_code == 500
    assert count(route, "GET", "500", "InternalServerError") - before_boom == 1
    # A method the route does not serve: the route's template, 405 MethodNotAllowed.
    before_405 = count(route, "DELETE", "405", "MethodNotAllowed")
    assert (await client.delete(route)).status_code == 405
    assert count(route, "DELETE", "405", "MethodNotAllowed") - before_405 == 1
    # A method outside the known set is "other".
    before_other = count(route, "other", "405", "MethodNotAllowed")
    assert (await client.request("BREW", route)).status_code == 405
    assert count(route, "other", "405", "MethodNotAllowed") - before_other == 1


async def test_a_stream_is_timed_until_its_last_chunk(client: httpx.AsyncClient) -> None:
    route = "/v2/metrics-test/stream"
    before_count, before_sum = timed(route, "GET")
    before = count(route, "GET", "200")
    r = await client.get(route)
    assert r.text == "ab"
    assert count(route, "GET", "200") - before == 1
    after_count, after_sum = timed(route, "GET")
    assert after_count - before_count == 1
    assert after_sum - before_sum >= STREAM_SECONDS


async def test_probes_and_the_scrape_are_not_counted(client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        await client.get(path)
    assert not {"/healthz", "/readyz", "/metrics"} & set(route_labels())


async def test_a_refusal_before_routing_gets_the_route_template() -> None:
    """The in-flight cap answers before the router: the counter still names the route it would have reached."""
    app = build_app()
    app.state.settings = HordeSettings(max_in_flight_requests=1, rate_limits_enabled=False)
    route = "/v2/metrics-test/slow"
    before = count(route, "GET", "503", "ServiceAtCapacity")
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        first = asyncio.create_task(c.get("/api" + route))
        await asyncio.sleep(STREAM_SECONDS / 5)
        refused = await c.get("/api" + route)
        await first
    assert refused.status_code == 503
    assert count(route, "GET", "503", "ServiceAtCapacity") - before == 1
