"""Admission tests against real stores (horde_testing fixtures) and the real dispatch process.

Admission runs in-process (its ASGI app with its lifespan, so the real pool, Redis and gRPC channels);
dispatch runs as its own process (``python -m horde_dispatch``) and answers WorkerPool.GetAvailability from
the workers table, where the tests insert online chat workers by SQL.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
from horde_admission.app import create_app
from horde_admission.settings import AdmissionSettings
from horde_store.db import connect

# The tests import their helpers by module name (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).parent))

from admission_helpers import TEST_SECRET_KEY


@dataclass
class Dispatch:
    """The launched dispatch process and its gRPC target."""

    target: str
    process: Any


@pytest.fixture(scope="session")
def admission_env(pg_dsn: str, redis_server: Any, s3_endpoint: Any) -> dict[str, str]:
    """``HORDE_*`` variables of the stores every admission test shares: one migrated database, the Redis and
    the S3 endpoint (tests keep apart by unique users and models, so one dispatch process serves them all)."""
    return {
        "HORDE_DATABASE_URL": pg_dsn,
        "HORDE_REDIS_URL": redis_server.url,
        **s3_endpoint.env(),
        "HORDE_SECRET_KEY": TEST_SECRET_KEY,
    }


@pytest.fixture(scope="session")
def dispatch(admission_env: dict[str, str]) -> Iterator[Dispatch]:
    """A real dispatch process on the shared stores."""
    from horde_testing.launcher import ServiceProcess, free_port

    http_port, grpc_port = free_port(), free_port()
    env = {
        **admission_env,
        "HORDE_DISPATCH_HTTP_PORT": str(http_port),
        "HORDE_DISPATCH_GRPC_PORT": str(grpc_port),
        "HORDE_LOG_JSON": "false",
    }
    process = ServiceProcess(
        "dispatch", [sys.executable, "-m", "horde_dispatch"], env, f"http://127.0.0.1:{http_port}/readyz"
    )
    process.start()
    try:
        process.wait_healthy()
        yield Dispatch(target=f"127.0.0.1:{grpc_port}", process=process)
    finally:
        process.stop()


def make_settings(env: dict[str, str], dispatch: Dispatch, **overrides: Any) -> AdmissionSettings:
    """Admission settings on the shared stores; rate limits off unless a test turns them on."""
    values: dict[str, Any] = {
        "database_url": env["HORDE_DATABASE_URL"],
        "redis_url": env["HORDE_REDIS_URL"],
        "secret_key": env["HORDE_SECRET_KEY"],
        "s3_endpoint_url": env["HORDE_S3_ENDPOINT_URL"],
        "s3_access_key_id": env["HORDE_S3_ACCESS_KEY_ID"],
        "s3_secret_access_key": env["HORDE_S3_SECRET_ACCESS_KEY"],
        "s3_image_bucket": env["HORDE_S3_IMAGE_BUCKET"],
        "dispatch_grpc_target": dispatch.target,
        # Nothing listens here: the cancel's SettleCancelledGeneration fails and is tolerated.
        "submit_grpc_target": "127.0.0.1:9",
        "rate_limits_enabled": False,
        "availability_cache_seconds": 0,
        "settlement_timeout_seconds": 1.0,
    }
    values.update(overrides)
    return AdmissionSettings(**values)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def make_client(admission_env: dict[str, str], dispatch: Dispatch) -> AsyncIterator[Any]:
    """Factory of admission clients: ``await make_client(**settings overrides)`` -> httpx.AsyncClient."""
    stack: list[tuple[Any, Any]] = []

    async def make(**overrides: Any) -> httpx.AsyncClient:
        app = create_app(make_settings(admission_env, dispatch, **overrides))
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admission")
        client.horde_app = app  # type: ignore[attr-defined]
        stack.append((lifespan, client))
        return client

    yield make
    for lifespan, client in reversed(stack):
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def client(make_client: Any) -> httpx.AsyncClient:
    """An admission client with the default test settings."""
    made: httpx.AsyncClient = await make_client()
    return made


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def db(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the shared database (json codecs on)."""
    conn = await connect(pg_dsn)
    try:
        yield conn
    finally:
        await conn.close()
