"""Upstream's per-address limits on the worker routes of submit (docs/native-api.md#rate-limits: 60/second per address;
here 2/minute): submit and progress each count on their own, per client address, before the body is read. The
real submit app on the real stores."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from horde_submit.app import create_app
from horde_submit.settings import SubmitSettings
from horde_testing._proc import free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY


@pytest.fixture(scope="module")
async def limited_app(horde_settings_env: dict[str, str]) -> AsyncIterator[object]:
    settings = SubmitSettings(
        database_url=horde_settings_env["HORDE_DATABASE_URL"],
        redis_url=horde_settings_env["HORDE_REDIS_URL"],
        secret_key=TEST_SECRET_KEY,
        submit_grpc_port=free_port(),
        submit_request_limit_per_ip="2/minute",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


def client(app: object, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 5555))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://submit")


async def test_submit_and_progress_are_limited_per_address(limited_app: object) -> None:
    body = {"id": str(uuid.uuid4()), "generation": "x"}
    async with client(limited_app, "203.0.113.61") as c, client(limited_app, "203.0.113.62") as c2:
        for route in ("submit", "progress"):
            path = f"/api/v2/generate/text/{route}"
            for _ in range(2):
                r = await c.post(path, json=body, headers={"apikey": "not-a-key"})
                assert r.status_code != 429, r.text
            r = await c.post(path, json=body, headers={"apikey": "not-a-key"})
            assert r.status_code == 429
            assert r.json() == {"message": "Rate limit exceeded: 2 per 1 minute", "rc": "RateLimitExceeded"}
            assert 1 <= int(r.headers["Retry-After"]) <= 60
            # another address has its own budget
            assert (await c2.post(path, json=body, headers={"apikey": "not-a-key"})).status_code != 429
