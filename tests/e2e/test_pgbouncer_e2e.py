"""The whole stack behind a real PgBouncer in transaction mode (docs/operator-guide.md#pgbouncer).

Every service's database traffic (and ``horde-admin``'s) goes through a PgBouncer with ``pool_mode =
transaction`` and two server connections, with ``HORDE_DATABASE_STATEMENT_CACHE_SIZE=0``: many client
connections share two server connections, so consecutive transactions of one client land on different server
connections (what breaks named prepared statements and session state). Chat requests are answered end to end by a
worker, concurrently, and what they stored is checked directly in PostgreSQL.

The module's database was migrated directly against PostgreSQL (the fixtures' template), as an operator runs
``horde-admin migrate``: the migrator holds a session advisory lock, which transaction pooling does not keep.
PgBouncer comes from Debian's package, installed on first use (horde_testing.pgbouncer).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg
import httpx
import openai
import pytest
from horde_store.db import connect, create_pool
from horde_testing.pgbouncer import PgBouncer, PgBouncerUnavailable

from .conftest import MODEL, Stack
from .test_walking_skeleton import GREETING, wait_done

POOL_SIZE = 2


@pytest.fixture(scope="module")
def bouncer(database_url: str) -> Iterator[PgBouncer]:
    try:  # installed on first use (Debian's package); where it cannot be had, the test fails, never skips
        instance = PgBouncer(database_url, pool_mode="transaction", pool_size=POOL_SIZE)
    except PgBouncerUnavailable as exc:
        pytest.fail(str(exc))
    with instance:
        yield instance


@pytest.fixture(scope="module")
def stack_env_overrides(bouncer: PgBouncer) -> dict[str, str]:
    return {
        "HORDE_DATABASE_URL": bouncer.dsn,
        "HORDE_DATABASE_STATEMENT_CACHE_SIZE": "0",
        # More client connections per process than PgBouncer has server connections in all.
        "HORDE_DB_POOL_MIN_SIZE": "3",
        "HORDE_DB_POOL_MAX_SIZE": "6",
    }


def direct(database_url: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await connect(database_url)
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def test_chat_requests_complete_through_transaction_pooling(
    stack: Stack, bouncer: PgBouncer, database_url: str
) -> None:
    assert stack.env["HORDE_DATABASE_URL"] == bouncer.dsn
    stack.start_worker("pgbouncer-worker")
    client = openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=90)
    markers = [f"bounced {i} {uuid.uuid4().hex[:8]}" for i in range(8)]

    def complete(marker: str) -> str:
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": marker}])
        return str(reply.choices[0].message.content)

    with ThreadPoolExecutor(len(markers)) as pool:
        replies = list(pool.map(complete, markers))
    assert replies == [f"{GREETING} {marker}" for marker in markers]

    # A native request too, read back through admission's status route.
    r = httpx.post(
        f"{stack.native}/generate/chat/async",
        json={"model": MODEL, "messages": [{"role": "user", "content": "native through the bouncer"}]},
        headers={"apikey": stack.client_key},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    status = wait_done(stack, r.json()["id"])
    assert status["generations"][0]["message"]["content"] == f"{GREETING} native through the bouncer"  # type: ignore[index]

    # What was stored, read from PostgreSQL itself: every request answered by the worker and settled.
    rows = direct(
        database_url,
        """
        SELECT wp.prompt, wp.messages, wp.consumed_kudos, g.generation, g.faulted, g.completed_at, g.kudos
          FROM waiting_prompts wp JOIN processing_gens g ON g.wp_id = wp.id
          JOIN users u ON u.id = wp.user_id
         WHERE u.username = 'e2e-client'
        """,
    )
    by_content = {row["messages"][-1]["content"]: row for row in rows}
    for marker in [*markers, "native through the bouncer"]:
        row = by_content[marker]
        assert row["generation"] is not None and marker in row["generation"]
        assert not row["faulted"]
        assert row["completed_at"] is not None
        assert row["consumed_kudos"] > 0
    worker = direct(
        database_url,
        "SELECT kudos, fulfilments FROM workers WHERE name = 'pgbouncer-worker'",
    )
    assert worker and worker[0]["fulfilments"] == len(markers) + 1

    # The services' connections really went through PgBouncer: the database has at most its two server
    # connections (plus this check's own), while four services hold three or more client connections each.
    backends = direct(
        database_url,
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    assert backends[0]["n"] <= POOL_SIZE
    assert "login attempt" in bouncer.log_text()


async def _hammer(dsn: str, statement_cache_size: int) -> None:
    """Twelve client connections (fewer server connections) running a mix of statements at once."""
    pool = await create_pool(dsn, min_size=12, max_size=12, statement_cache_size=statement_cache_size)
    try:

        async def one(i: int) -> None:
            for j in range(15):
                assert await pool.fetchval("SELECT $1::int + $2::int", i, j) == i + j
                async with pool.acquire() as conn, conn.transaction():
                    row = await conn.fetchrow("SELECT $1::jsonb AS doc, $2::text AS t", {"i": i}, str(j))
                    assert row is not None and row["doc"] == {"i": i}

        await asyncio.gather(*(one(i) for i in range(12)))
    finally:
        await pool.close()


def test_the_statement_cache_setting_is_what_makes_transaction_pooling_work(bouncer: PgBouncer) -> None:
    """The library level: with the cache off, a busy pool through the bouncer works; with asyncpg's default
    cache, named prepared statements meet server connections that never prepared them."""
    asyncio.run(_hammer(bouncer.dsn, 0))
    with pytest.raises(asyncpg.PostgresError, match="prepared statement"):
        asyncio.run(_hammer(bouncer.dsn, 100))
