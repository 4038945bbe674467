"""The pool's timeouts on a real PostgreSQL: a pool whose every connection is taken answers a further acquire
within the acquire timeout, a statement past the command timeout is cancelled, and an app built on the pool
answers such a request 503 ServiceUnavailable instead of holding it."""

from __future__ import annotations

import httpx
import pytest
from fastapi import APIRouter, Request
from horde_core.app import create_app, include_native
from horde_store.db import (
    ACQUIRE_TIMEOUT_SECONDS,
    COMMAND_TIMEOUT_SECONDS,
    CONNECT_TIMEOUT_SECONDS,
    create_pool,
)


def test_the_defaults_are_bounded() -> None:
    assert (CONNECT_TIMEOUT_SECONDS, ACQUIRE_TIMEOUT_SECONDS, COMMAND_TIMEOUT_SECONDS) == (5.0, 10.0, 30.0)


# Unbounded, an acquire from an exhausted pool waits forever: the TimeoutError is the bound (the test's
# timeout is only a hang guard).
@pytest.mark.timeout(60)
async def test_an_exhausted_pool_answers_within_the_acquire_timeout(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=1, acquire_timeout=0.3)
    try:
        async with pool.acquire():
            with pytest.raises(TimeoutError):
                async with pool.acquire():
                    pass
            with pytest.raises(TimeoutError):
                await pool.fetchval("SELECT 1")  # the pool's own helpers acquire with the same bound
        assert await pool.fetchval("SELECT 1") == 1
        # an explicit timeout still wins
        async with pool.acquire(timeout=5) as conn:
            assert await conn.fetchval("SELECT 2") == 2
    finally:
        await pool.close()


async def test_a_statement_past_the_command_timeout_is_cancelled(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=1, command_timeout=0.3)
    try:
        # Unbounded, the statement would end after 5 s without an error: the TimeoutError is the bound.
        with pytest.raises(TimeoutError):
            await pool.execute("SELECT pg_sleep(5)")
        assert await pool.fetchval("SELECT 3") == 3  # the connection is usable again
    finally:
        await pool.close()


async def test_an_app_answers_503_when_the_pool_is_exhausted(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=1, acquire_timeout=0.3)
    app = create_app("test")
    router = APIRouter()

    @router.get("/v2/one")
    async def one(request: Request) -> dict[str, int]:
        async with request.app.state.pool.acquire() as conn:
            return {"one": await conn.fetchval("SELECT 1")}

    include_native(app, router)
    app.state.pool = pool
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            assert (await client.get("/api/v2/one")).json() == {"one": 1}
            async with pool.acquire():
                r = await client.get("/api/v2/one")
            assert r.status_code == 503
            assert r.json()["rc"] == "ServiceUnavailable"
            assert r.headers["Retry-After"] == "5"
    finally:
        await pool.close()
