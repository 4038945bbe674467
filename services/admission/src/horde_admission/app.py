"""The admission app factory: stores, gRPC clients and the native routes (README.md#architecture)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from horde.dispatch.v1 import worker_pool_pb2_grpc
from horde.submit.v1 import settlement_pb2_grpc
from horde_core.app import create_app as create_base_app
from horde_core.app import include_native
from horde_core.grpc import insecure_channel
from horde_store.model_reference import load_text_model_reference
from horde_store.stores import open_stores

from horde_admission import chat, horde_status, models, openapi, text, users
from horde_admission.availability import AvailabilityMemo
from horde_admission.creation import CompetingQueueMemo
from horde_admission.images import ImageFetcher, ImageStore
from horde_admission.ratelimit import RateLimiter
from horde_admission.settings import AdmissionSettings
from horde_admission.state import AdmissionState
from horde_admission.status import QueueAheadMemo

SERVICE = "admission"


def create_app(settings: AdmissionSettings | None = None) -> FastAPI:
    """Build the admission app (``settings`` None: read from the environment). The lifespan opens the stores
    (pool, Redis cache and signal clients, S3), the WorkerPool and Settlement channels and the image fetcher,
    and puts the :class:`AdmissionState` on ``app.state.admission``.

    The text model reference is read here, so a missing or unreadable HORDE_TEXT_MODEL_REFERENCE stops the
    process at start (TextModelReferenceError).
    """
    settings = settings or AdmissionSettings()
    model_reference = load_text_model_reference(settings.text_model_reference)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_stores(app, settings, cache=True, s3=True) as stores:
            assert stores.cache is not None
            dispatch_channel = insecure_channel(settings.dispatch_target())
            submit_channel = insecure_channel(settings.submit_target())
            fetcher = ImageFetcher(allow_private=settings.image_fetch_allow_private)
            app.state.admission = AdmissionState(
                settings=settings,
                pool=stores.pool,
                redis=stores.cache,
                signals=stores.signals,
                dispatch_channel=dispatch_channel,
                worker_pool=worker_pool_pb2_grpc.WorkerPoolServiceStub(dispatch_channel),
                submit_channel=submit_channel,
                settlement=settlement_pb2_grpc.SettlementServiceStub(submit_channel),
                limiter=RateLimiter(settings),
                fetcher=fetcher,
                images=ImageStore(stores.s3, settings.s3_image_bucket, stores.cache),
                model_reference=model_reference,
                availability_memo=AvailabilityMemo(settings.text_availability_memo_seconds),
                queue_ahead_memo=QueueAheadMemo(stores.pool, settings.status_queue_memo_seconds),
                competing_queue_memo=CompetingQueueMemo(stores.pool, settings.competing_queue_memo_seconds),
            )
            try:
                yield
            finally:
                await fetcher.aclose()
                await dispatch_channel.close()
                await submit_channel.close()

    app = create_base_app(SERVICE, lifespan=lifespan, settings=settings)
    include_native(app, chat.router)
    include_native(app, text.router)
    include_native(app, models.router)
    include_native(app, users.router)
    include_native(app, horde_status.router)
    openapi.install_openapi(app)
    return app
