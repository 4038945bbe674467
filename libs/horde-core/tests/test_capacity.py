"""The in-flight cap of the native services (horde_core.capacity)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import APIRouter, Request
from horde_core.app import create_app, include_native
from horde_core.capacity import IN_FLIGHT, REFUSED, leave_in_flight
from horde_core.settings import HordeSettings


def build(limit: int) -> tuple[object, asyncio.Event, list[str]]:
    app = create_app("test")
    app.state.settings = HordeSettings(max_in_flight_requests=limit, rate_limits_enabled=False)
    release = asyncio.Event()
    served: list[str] = []
    router = APIRouter()

    @router.get("/v2/work")
    async def work() -> dict[str, str]:
        await release.wait()
        served.append("work")
        return {"ok": "work"}

    @router.get("/v2/wait")
    async def wait(request: Request) -> dict[str, str]:
        leave_in_flight(request.scope)  # a long poll: waits without working
        leave_in_flight(request.scope)  # idempotent
        await release.wait()
        served.append("wait")
        return {"ok": "wait"}

    include_native(app, router)
    return app, release, served


def client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")  # type: ignore[arg-type]


async def until_in_flight(count: float) -> None:
    for _ in range(200):
        if IN_FLIGHT._value.get() == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"in flight {IN_FLIGHT._value.get()}, expected {count}")


@pytest.mark.asyncio
async def test_past_the_cap_a_request_gets_503_with_retry_after_and_nothing_runs() -> None:
    app, release, served = build(limit=2)
    before = REFUSED._value.get()
    async with client(app) as c:
        held = [asyncio.create_task(c.get("/api/v2/work")) for _ in range(2)]
        await until_in_flight(2)
        refused = await c.get("/api/v2/work")
        assert refused.status_code == 503
        assert refused.json() == {
            "message": "This service has too many requests in flight right now; retry shortly.",
            "rc": "ServiceAtCapacity",
        }
        assert refused.headers["retry-after"] == "1" and refused.headers["x-should-retry"] == "true"
        assert REFUSED._value.get() == before + 1
        # Health, readiness and metrics are never refused.
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        await until_in_flight(0)
        assert served == ["work", "work"]
        assert (await c.get("/api/v2/work")).status_code == 200


@pytest.mark.asyncio
async def test_a_waiting_request_gives_its_place_back() -> None:
    app, release, served = build(limit=1)
    async with client(app) as c:
        waiting = [asyncio.create_task(c.get("/api/v2/wait")) for _ in range(3)]
        await asyncio.sleep(0.05)
        await until_in_flight(0)
        working = asyncio.create_task(c.get("/api/v2/work"))
        await until_in_flight(1)
        release.set()
        assert (await working).status_code == 200
        assert [r.json() for r in await asyncio.gather(*waiting)] == [{"ok": "wait"}] * 3
    assert sorted(served) == ["wait", "wait", "wait", "work"]


@pytest.mark.asyncio
async def test_zero_means_no_cap() -> None:
    app, release, _ = build(limit=0)
    async with client(app) as c:
        held = [asyncio.create_task(c.get("/api/v2/work")) for _ in range(20)]
        await until_in_flight(20)
        release.set()
        assert {r.status_code for r in await asyncio.gather(*held)} == {200}


@pytest.mark.asyncio
async def test_a_client_trickling_its_body_holds_no_place() -> None:
    app = create_app("test")
    app.state.settings = HordeSettings(max_in_flight_requests=1, rate_limits_enabled=False)
    router = APIRouter()

    @router.post("/v2/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    include_native(app, router)
    more = asyncio.Event()

    async def trickle():  # type: ignore[no-untyped-def]
        yield b"x" * 10
        await more.wait()
        yield b"y" * 5

    async with client(app) as c:
        slow = asyncio.create_task(c.post("/api/v2/echo", content=trickle()))
        await asyncio.sleep(0.05)
        await until_in_flight(0)
        fast = await c.post("/api/v2/echo", content=b"abc")
        assert fast.status_code == 200 and fast.json() == {"bytes": 3}
        more.set()
        done = await slow
        assert done.status_code == 200 and done.json() == {"bytes": 15}
        await until_in_flight(0)
