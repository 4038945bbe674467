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
from horde_store.model_reference import load_text_model_reference
from horde_store.stores import open_stores

from horde_submit.grpc_server import SERVICE_NAME, SettlementServicer, registrar
from horde_submit.openapi import install_openapi
from horde_submit.progress import ProgressHandler
from horde_submit.progress import router as progress_router
from horde_submit.settings import SubmitSettings
from horde_submit.state import SubmitState
from horde_submit.submit import Submitter
from horde_submit.submit import router as submit_router

SERVICE = "submit"

log = logging.getLogger(__name__)


def create_app(settings: SubmitSettings | None = None) -> FastAPI:
    """Build the submit app (``settings`` None: read from the environment). Its lifespan opens the stores
    (pool, Redis signal client), puts the :class:`SubmitState` on ``app.state.submit`` and starts the
    Settlement gRPC server on ``settings.submit_grpc_port`` (unless ``submit_grpc_enabled`` is false).

    The text model reference (HORDE_TEXT_MODEL_REFERENCE) is read here, so a missing or unreadable file stops
    the process at start (TextModelReferenceError); generations are priced at their served model's size.
    """
    settings = settings or SubmitSettings()
    models = load_text_model_reference(settings.text_model_reference)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_stores(app, settings) as stores:
            pool, signal = stores.pool, stores.signals
            app.state.submit = SubmitState(
                settings=settings,
                pool=pool,
                signals=signal,
                submitter=Submitter(
                    pool=pool,
                    signal=signal,
                    salt=settings.secret_key,
                    models=models,
                    read_timeout=settings.body_read_timeout_seconds,
                ),
                progress=ProgressHandler(
                    pool=pool,
                    signal=signal,
                    salt=settings.secret_key,
                    lease_seconds=settings.text_job_lease_seconds,
                    read_timeout=settings.body_read_timeout_seconds,
                ),
            )
            server = None
            if settings.submit_grpc_enabled:
                server = await start_grpc_server(
                    settings.bind_host,
                    settings.submit_grpc_port,
                    registrar(SettlementServicer(pool, signal, models)),
                    [SERVICE_NAME],
                    settings,
                )
            try:
                yield
            finally:
                if server is not None:
                    await server.stop(settings.shutdown_grace_seconds)

    app = create_base_app(SERVICE, lifespan=lifespan, settings=settings)
    include_native(app, submit_router)
    include_native(app, progress_router)
    install_openapi(app)
    return app
