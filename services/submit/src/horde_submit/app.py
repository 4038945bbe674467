"""The submit service's FastAPI app: the submit and progress routes, the Settlement gRPC server, health and
metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from horde_core.app import create_app as create_base_app
from horde_core.app import include_native
from horde_core.grpc import start_grpc_server
from horde_core.redis_keys import signal_client
from horde_store.db import create_pool
from horde_store.model_reference import load_text_model_reference

from horde_submit.grpc_server import SERVICE_NAME, SettlementServicer, registrar
from horde_submit.openapi import install_openapi
from horde_submit.progress import ProgressHandler
from horde_submit.progress import router as progress_router
from horde_submit.settings import SubmitSettings
from horde_submit.submit import Submitter
from horde_submit.submit import router as submit_router

log = logging.getLogger(__name__)


def create_app(settings: SubmitSettings) -> FastAPI:
    """Build the submit app. Its lifespan opens the PostgreSQL pool and the Redis signal client, starts the
    Settlement gRPC server on ``settings.submit_grpc_port`` (unless ``submit_grpc_enabled`` is false) and
    registers the ``postgres`` and ``redis`` readiness checks.

    The text model reference (HORDE_TEXT_MODEL_REFERENCE) is read here, so a missing or unreadable file stops
    the process at start (TextModelReferenceError); generations are priced at their served model's size.
    """
    models = load_text_model_reference(settings.text_model_reference)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(
            settings.database_url, min_size=settings.db_pool_min_size, max_size=settings.db_pool_max_size
        )
        signal = signal_client(settings.redis_url)
        app.state.submitter = Submitter(
            pool=pool,
            signal=signal,
            salt=settings.secret_key,
            models=models,
            read_timeout=settings.body_read_timeout_seconds,
        )
        app.state.progress = ProgressHandler(
            pool=pool,
            signal=signal,
            salt=settings.secret_key,
            lease_seconds=settings.text_job_lease_seconds,
            read_timeout=settings.body_read_timeout_seconds,
        )

        async def check_postgres() -> None:
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT 1")

        async def check_redis() -> None:
            await signal.ping()

        app.state.readiness_checks.update({"postgres": check_postgres, "redis": check_redis})
        server = None
        if settings.submit_grpc_enabled:
            server = await start_grpc_server(
                settings.bind_host,
                settings.submit_grpc_port,
                registrar(SettlementServicer(pool, signal, models)),
                [SERVICE_NAME],
            )
        try:
            yield
        finally:
            if server is not None:
                await server.stop(settings.shutdown_grace_seconds)
            await signal.aclose()
            await pool.close()

    app = create_base_app("submit", lifespan=lifespan)
    # The settings the app factory's rate limits (submit and progress per address) read.
    app.state.settings = settings
    include_native(app, submit_router)
    include_native(app, progress_router)
    install_openapi(app)
    return app
