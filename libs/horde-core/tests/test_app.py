"""The app factory's health, readiness, metrics routes and the Horde error envelope."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import httpx
import pytest
from fastapi import APIRouter
from horde_contract.errors import HordeError
from horde_core.app import create_app, include_native
from horde_core.body import read_bounded_body
from horde_core.metrics import counter
from pydantic import BaseModel
from starlette.requests import Request


class Body(BaseModel):
    max_tokens: int


def build_app():
    app = create_app("test")
    router = APIRouter()

    @router.post("/v2/echo")
    async def echo(body: Body) -> dict[str, int]:
        return {"max_tokens": body.max_tokens}

    @router.get("/v2/refuse")
    async def refuse() -> None:
        raise HordeError(
            403, "NoEligibleWorker", "No worker is currently serving the model 'x'.", extra={"extra_key": 1}
        )

    @router.get("/v2/boom")
    async def boom() -> None:
        raise RuntimeError("kaput")

    include_native(app, router)
    return app


@pytest.fixture
async def client():
    transport = httpx.ASGITransport(app=build_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def test_healthz(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "service": "test"}


async def test_readyz_reports_each_check() -> None:
    app = build_app()

    async def ok() -> None:
        return None

    async def down() -> None:
        raise ConnectionError("refused")

    app.state.readiness_checks = {"postgres": ok}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/readyz")
        assert r.status_code == 200
        assert r.json()["checks"] == {"postgres": "ok"}
        app.state.readiness_checks = {"postgres": ok, "redis": down}
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["redis"] == "ConnectionError: refused"


async def test_metrics_exposes_spec_named_counter(client: httpx.AsyncClient) -> None:
    faults = counter("horde.test.core_faults", "test counter", ["horde.reason"])
    faults.labels(reason="none").inc()
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert 'horde_test_core_faults_total{reason="none"} 1.0' in r.text
    assert counter("horde.test.core_faults", "again", ["horde.reason"]) is faults


@pytest.mark.parametrize("prefix", ["/api", ""])
async def test_native_router_at_both_prefixes(client: httpx.AsyncClient, prefix: str) -> None:
    r = await client.post(f"{prefix}/v2/echo", json={"max_tokens": 5})
    assert r.status_code == 200
    assert r.json() == {"max_tokens": 5}


async def test_validation_error_is_bad_request_naming_the_field(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v2/echo", json={"max_tokens": "many"})
    assert r.status_code == 400
    body = r.json()
    assert body["rc"] == "BadRequest"
    assert body["message"].startswith("Input payload validation failed: max_tokens:")


async def test_horde_error_envelope(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/refuse")
    assert r.status_code == 403
    assert r.json() == {
        "message": "No worker is currently serving the model 'x'.",
        "rc": "NoEligibleWorker",
        "extra_key": 1,
    }


async def test_unknown_route_and_unhandled_error(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/nowhere")
    assert r.status_code == 404
    assert r.json() == {"message": "Not Found", "rc": "NotFound"}
    r = await client.get("/v2/boom")
    assert r.status_code == 500
    assert r.json() == {"message": "Internal Server Error", "rc": "InternalServerError"}


async def test_store_outage_is_503_with_retry_after() -> None:
    import asyncpg
    import redis.exceptions

    app = build_app()
    router = APIRouter()
    raised: list[Exception] = [
        ConnectionRefusedError(111, "Connection refused"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
        redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379."),
    ]

    @router.get("/v2/outage/{n}")
    async def outage(n: int) -> None:
        raise raised[n]

    include_native(app, router)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t"
    ) as c:
        for n in range(len(raised)):
            r = await c.get(f"/v2/outage/{n}")
            assert r.status_code == 503, raised[n]
            assert r.headers["retry-after"] == "5"
            assert r.json() == {
                "message": "A store this service needs is unreachable; retry shortly.",
                "rc": "ServiceUnavailable",
            }


async def test_horde_error_headers_are_sent() -> None:
    app = build_app()
    router = APIRouter()

    @router.get("/v2/limited")
    async def limited() -> None:
        raise HordeError(
            429, "RateLimitExceeded", "Rate limit exceeded: 2 per 1 second", headers={"Retry-After": "1"}
        )

    include_native(app, router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/v2/limited")
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.json() == {"message": "Rate limit exceeded: 2 per 1 second", "rc": "RateLimitExceeded"}


@pytest.mark.parametrize("horde_errors", [True, False])
async def test_a_client_gone_mid_body_is_499_without_an_error_log(horde_errors: bool, caplog) -> None:
    app = create_app("test", horde_errors=horde_errors)

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        return {"bytes": len(await read_bounded_body(request, 1000, 5.0))}

    messages: Iterator[dict[str, object]] = iter(
        [
            {"type": "http.request", "body": b"12345", "more_body": True},
            {"type": "http.disconnect"},
        ]
    )
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, object]:
        return next(messages)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": "/upload",
        "raw_path": b"/upload",
        "query_string": b"",
        "headers": [(b"content-length", b"1000")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "scheme": "http",
        "root_path": "",
    }
    caplog.set_level("ERROR")
    await app(scope, receive, send)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499, sent
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
