"""The stores of one service process, opened and closed the same way by every service's lifespan.

:func:`open_stores` opens the PostgreSQL pool (:func:`horde_store.db.create_pool`, sized by
``HORDE_DB_POOL_MIN_SIZE``/``HORDE_DB_POOL_MAX_SIZE``, its statement cache by
``HORDE_DATABASE_STATEMENT_CACHE_SIZE``), a Redis client on the chat signal database
(:func:`horde_core.redis_keys.signal_client`: completion signals, stream leases, queue announcements) and, when
asked, a Redis client on the URL's own database (caches, rate limits, the image delete retry set) and an S3
client (:func:`horde_store.objects.make_s3_client`). It registers the ``database`` and ``redis`` readiness
checks of ``/readyz`` and, with S3, its ``s3`` probe (:func:`s3_probe`: ``horde_store_up`` only, never
readiness; :func:`horde_core.app.add_store_readiness`) and closes every client it opened when the
block ends, after whatever the service stopped inside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as redis
from fastapi import FastAPI
from horde_core.app import add_store_readiness
from horde_core.redis_keys import redis_client, signal_client
from horde_core.settings import HordeSettings

from horde_store.db import create_pool
from horde_store.objects import make_s3_client

#: The S3 probe's timeouts (seconds) and one attempt: a hung object store must not pile up probe threads.
S3_PROBE_TIMEOUT_SECONDS = 1.5


def s3_probe(client: Any, bucket: str) -> Callable[[], Awaitable[object]]:
    """The ``s3`` store probe of ``/readyz`` (``horde_store_up{store="s3"}``): HeadBucket on ``bucket`` in a
    thread, one at a time (a probe still running answers the next call as down). Any answer of the store is up,
    403 included (a role may lack s3:ListBucket); no answer, or another error answer, is down."""
    from botocore.exceptions import ClientError

    running: list[bool] = [False]

    def head() -> None:
        try:
            client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) not in {"403", "AccessDenied", "Forbidden"}:
                raise

    async def ping() -> object:
        if running[0]:
            raise TimeoutError("the previous S3 probe is still running")
        running[0] = True
        try:
            return await asyncio.to_thread(head)
        finally:
            running[0] = False

    return ping


@dataclass(frozen=True, slots=True)
class Stores:
    """The store clients of one process: ``pool`` (PostgreSQL), ``signals`` (Redis, chat signal database 7),
    ``cache`` (Redis, the URL's database; None unless asked for) and ``s3`` (a boto3 S3 client; None unless
    asked for)."""

    pool: asyncpg.Pool
    signals: redis.Redis
    cache: redis.Redis | None = None
    s3: Any | None = None


@asynccontextmanager
async def open_stores(
    app: FastAPI, settings: HordeSettings, *, cache: bool = False, s3: bool = False
) -> AsyncIterator[Stores]:
    """Open the stores of ``settings`` (see the module docstring), register their readiness checks on ``app``
    and yield them; closes the Redis clients and the pool on the way out. Raises what
    :func:`horde_store.db.create_pool` raises when PostgreSQL is unreachable (the process then does not
    start)."""
    pool = await create_pool(
        settings.database_url,
        min_size=settings.db_pool_min_size,
        max_size=settings.db_pool_max_size,
        statement_cache_size=settings.database_statement_cache_size,
    )
    signals = signal_client(settings.redis_url)
    cache_client = redis_client(settings.redis_url) if cache else None
    stores = Stores(
        pool=pool, signals=signals, cache=cache_client, s3=make_s3_client(settings) if s3 else None
    )
    probe_client = (
        make_s3_client(
            settings,
            connect_timeout=S3_PROBE_TIMEOUT_SECONDS,
            read_timeout=S3_PROBE_TIMEOUT_SECONDS,
            max_attempts=1,
        )
        if s3
        else None
    )
    add_store_readiness(
        app,
        pool=pool,
        redis_ping=signals.ping,
        s3_ping=s3_probe(probe_client, settings.s3_image_bucket) if probe_client is not None else None,
    )
    try:
        yield stores
    finally:
        for client in (stores.s3, probe_client):
            if client is not None:
                # Its kept-alive connections would otherwise linger until the client is collected.
                client.close()
        if cache_client is not None:
            await cache_client.aclose()
        await signals.aclose()
        await pool.close()
