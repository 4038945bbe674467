"""The janitor's FastAPI app (health and metrics only) and its pass loop, run from the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from horde.submit.v1 import settlement_pb2_grpc
from horde_core.app import create_app as create_base_app
from horde_core.grpc import insecure_channel
from horde_core.tasks import stop_task
from horde_store.stores import open_stores

from horde_janitor.objects import ObjectCleaner
from horde_janitor.settings import JanitorSettings
from horde_janitor.state import JanitorState
from horde_janitor.sweeper import Janitor

SERVICE = "janitor"

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


def create_app(settings: JanitorSettings | None = None) -> FastAPI:
    """Build the janitor app (``settings`` None: read from the environment). Its lifespan opens the stores
    (pool, Redis signal and cache clients, S3) and a channel to submit's Settlement service, puts the
    :class:`JanitorState` on ``app.state.janitor`` and runs the pass loop."""
    settings = settings or JanitorSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_stores(app, settings, cache=True, s3=True) as stores:
            assert stores.cache is not None
            channel = insecure_channel(settings.submit_target())
            objects = ObjectCleaner(
                stores.s3, settings.s3_image_bucket, settings.messages_bucket, stores.cache
            )
            janitor = Janitor(
                stores.pool,
                stores.signals,
                settlement_pb2_grpc.SettlementServiceStub(channel),
                expiry_batch=settings.janitor_expiry_batch,
                stale_batch=settings.janitor_stale_batch,
                grpc_timeout=settings.janitor_grpc_timeout_seconds,
                objects=objects,
            )
            app.state.janitor = JanitorState(
                settings=settings, pool=stores.pool, signals=stores.signals, janitor=janitor
            )
            task = asyncio.create_task(
                run_loop(janitor, settings.janitor_interval_seconds), name="janitor-loop"
            )
            try:
                yield
            finally:
                await stop_task(task)
                await channel.close()

    # No API: no OpenAPI document and no viewers (health, readiness and metrics only).
    return create_base_app(
        SERVICE, lifespan=lifespan, settings=settings, docs_url=None, redoc_url=None, openapi_url=None
    )
