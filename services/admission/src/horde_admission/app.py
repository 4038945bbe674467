"""The admission app factory: stores, gRPC clients and the native routes (ARCHITECTURE.md: admission)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from fastapi import FastAPI
from horde.dispatch.v1 import worker_pool_pb2_grpc
from horde.submit.v1 import settlement_pb2_grpc
from horde_core.app import create_app as create_base_app
from horde_core.app import include_native
from horde_core.grpc import insecure_channel
from horde_core.redis_keys import redis_client, signal_client
from horde_store.db import create_pool
from horde_store.model_reference import load_text_model_reference
from horde_store.objects import make_s3_client

from horde_admission import chat, models, openapi, text
from horde_admission.availability import AvailabilityMemo
from horde_admission.images import ImageFetcher, ImageStore
from horde_admission.ratelimit import RateLimiter
from horde_admission.settings import AdmissionSettings
from horde_admission.state import AdmissionState
from horde_admission.status import QueueAheadMemo

SERVICE = "admission"


async def _create_pool(settings: AdmissionSettings) -> asyncpg.Pool:
    pool: asyncpg.Pool = await create_pool(
        settings.database_url, min_size=settings.db_pool_min_size, max_size=settings.db_pool_max_size
    )
    return pool


def create_app(settings: AdmissionSettings | None = None) -> FastAPI:
    """Build the admission app. The lifespan opens the pool, Redis, the WorkerPool and Settlement channels.

    The text model reference is read here, so a missing or unreadable HORDE_TEXT_MODEL_REFERENCE stops the
    process at start (TextModelReferenceError).
    """
    settings = settings or AdmissionSettings()
    model_reference = load_text_model_reference(settings.text_model_reference)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await _create_pool(settings)
        cache = redis_client(settings.redis_url)
        signals = signal_client(settings.redis_url)
        dispatch_channel = insecure_channel(settings.dispatch_target())
        submit_channel = insecure_channel(settings.submit_target())
        fetcher = ImageFetcher(allow_private=settings.image_fetch_allow_private)
        app.state.admission = AdmissionState(
            settings=settings,
            pool=pool,
            redis=cache,
            signals=signals,
            dispatch_channel=dispatch_channel,
            worker_pool=worker_pool_pb2_grpc.WorkerPoolServiceStub(dispatch_channel),
            submit_channel=submit_channel,
            settlement=settlement_pb2_grpc.SettlementServiceStub(submit_channel),
            limiter=RateLimiter(settings),
            fetcher=fetcher,
            images=ImageStore(make_s3_client(settings), settings.s3_image_bucket, cache),
            model_reference=model_reference,
            availability_memo=AvailabilityMemo(settings.text_availability_memo_seconds),
            queue_ahead_memo=QueueAheadMemo(pool, settings.status_queue_memo_seconds),
        )

        async def database() -> object:
            return await pool.fetchval("SELECT 1")

        async def redis_ping() -> object:
            return await cache.ping()

        app.state.readiness_checks.update({"database": database, "redis": redis_ping})
        try:
            yield
        finally:
            await fetcher.aclose()
            await dispatch_channel.close()
            await submit_channel.close()
            await cache.aclose()
            await signals.aclose()
            await pool.close()

    app: FastAPI = create_base_app(SERVICE, lifespan=lifespan)
    app.state.settings = settings
    include_native(app, chat.router)
    include_native(app, text.router)
    include_native(app, models.router)
    openapi.install_openapi(app)
    return app
