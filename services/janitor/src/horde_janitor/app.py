"""The janitor's FastAPI app (health and metrics only) and its pass loop, run from the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from horde.submit.v1 import settlement_pb2_grpc
from horde_core.app import create_app as create_base_app
from horde_core.grpc import insecure_channel
from horde_core.redis_keys import redis_client, signal_client
from horde_store.db import create_pool
from horde_store.objects import make_s3_client

from horde_janitor.objects import ObjectCleaner
from horde_janitor.settings import JanitorSettings
from horde_janitor.sweeper import Janitor

log = logging.getLogger(__name__)


async def run_loop(janitor: Janitor, interval: float) -> None:
    """Run a pass every ``interval`` seconds until cancelled; a failed pass is logged and the loop goes on."""
    while True:
        try:
            result = await janitor.run_pass()
            if result.expired or result.stale_faulted or result.cancels_settled:
                log.info(
                    "janitor pass",
                    extra={
                        "expired": result.expired,
                        "stale_faulted": result.stale_faulted,
                        "requests_faulted": result.requests_faulted,
                        "cancels_settled": result.cancels_settled,
                        "leases_ended": result.leases_ended,
                    },
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("janitor pass failed")
        await asyncio.sleep(interval)


def create_app(settings: JanitorSettings) -> FastAPI:
    """Build the janitor app. Its lifespan opens the pool, the signal client and a channel to submit's
    Settlement service, registers the ``postgres`` and ``redis`` readiness checks and runs the pass loop."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(
            settings.database_url, min_size=settings.db_pool_min_size, max_size=settings.db_pool_max_size
        )
        signal = signal_client(settings.redis_url)
        channel = insecure_channel(settings.submit_target())
        cache = redis_client(settings.redis_url)
        objects = ObjectCleaner(
            make_s3_client(settings), settings.s3_image_bucket, settings.messages_bucket, cache
        )
        janitor = Janitor(
            pool,
            signal,
            settlement_pb2_grpc.SettlementServiceStub(channel),
            expiry_batch=settings.janitor_expiry_batch,
            stale_batch=settings.janitor_stale_batch,
            grpc_timeout=settings.janitor_grpc_timeout_seconds,
            objects=objects,
        )
        app.state.janitor = janitor

        async def check_postgres() -> None:
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT 1")

        async def check_redis() -> None:
            await signal.ping()

        app.state.readiness_checks.update({"postgres": check_postgres, "redis": check_redis})
        task = asyncio.create_task(run_loop(janitor, settings.janitor_interval_seconds), name="janitor-loop")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await channel.close()
            await cache.aclose()
            await signal.aclose()
            await pool.close()

    return create_base_app("janitor", lifespan=lifespan)
