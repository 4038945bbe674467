"""The front's FastAPI factory: routes, OpenAI error envelope, CORS, docs, and the lifespan that opens the
native HTTP client, the signal hub and the cancel retry loop (README.md#architecture; see docs/openai-front.md)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import RedirectResponse
from horde_core.app import add_store_readiness
from horde_core.app import create_app as create_base_app
from horde_core.redis_keys import redis_client
from horde_core.signals import SignalHub

from horde_oai import completions, models
from horde_oai.cancels import CancelManager
from horde_oai.capacity import InFlightCap
from horde_oai.deltas import DeltaStreamReader, RelayRecords
from horde_oai.errors import install_openai_error_handlers
from horde_oai.horde_client import HordeClient
from horde_oai.models import chat_entries_by_model
from horde_oai.openapi import install_openapi
from horde_oai.operations import OperationRecords
from horde_oai.server_errors import UnhandledErrorMiddleware
from horde_oai.settings import OaiSettings
from horde_oai.state import FrontState

SERVICE = "horde-oai"
CHAT_ENTRIES_CACHE_SECONDS = 5.0


def create_app(settings: OaiSettings | None = None) -> FastAPI:
    """Build the front (``settings`` None: read from the environment). The lifespan opens the native client,
    the signal hub, the progress stream reader and the cancel retries and puts the :class:`FrontState` on
    ``app.state.front``."""
    settings = settings or OaiSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        horde = HordeClient(
            settings.oai_horde_url,
            timeout=settings.oai_native_timeout_seconds,
            proxy_passkey=settings.oai_proxy_passkey,
        )
        redis_url = settings.front_redis_url()
        signals = SignalHub(redis_url)
        cancels = CancelManager(horde, settings.oai_cancel_retry_seconds)
        # Progress streams: one client on the stream database, shared by the reader and the resume records.
        streams = redis_client(redis_url, db=settings.oai_stream_redis_db) if redis_url else None
        deltas = DeltaStreamReader(streams)
        cache: dict[str, Any] = {"at": 0.0, "entries": {}}

        async def chat_entries() -> Mapping[str, Mapping[str, Any]]:
            if time.monotonic() - cache["at"] > CHAT_ENTRIES_CACHE_SECONDS:
                response = await horde.chat_models()
                if response.ok:
                    cache["entries"] = chat_entries_by_model(response.body)
                    cache["at"] = time.monotonic()
            entries: Mapping[str, Mapping[str, Any]] = cache["entries"]
            return entries

        app.state.front = FrontState(
            settings=settings,
            horde=horde,
            signals=signals,
            cancels=cancels,
            deltas=deltas,
            relay_records=RelayRecords(streams),
            operations=OperationRecords(streams),
            chat_entries=chat_entries,
        )
        if signals.enabled:
            add_store_readiness(app, redis_ping=signals.ping)
        await signals.start()
        await deltas.start()
        await cancels.start()
        try:
            yield
        finally:
            await cancels.stop()
            await deltas.stop()
            await signals.stop()
            if streams is not None:
                await streams.aclose()
            await horde.aclose()

    app = create_base_app(
        SERVICE,
        title="AI Horde OpenAI-compatible chat API",
        lifespan=lifespan,
        horde_errors=False,
        settings=settings,
        docs_url="/docs",
        redoc_url="/redoc",
        openapi_url="/openapi.json",
    )
    install_openai_error_handlers(app)
    # Added first, so it sits inside CORS: a capacity refusal still carries the CORS headers.
    app.add_middleware(
        InFlightCap,
        total=settings.oai_max_in_flight,
        per_address=settings.oai_max_in_flight_per_address,
    )
    # Just inside CORS: an unhandled exception is answered with the OpenAI 500 there, so it carries the CORS
    # headers too (Starlette's own 500 is sent outside every added middleware).
    app.add_middleware(UnhandledErrorMiddleware)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"],
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["Retry-After", "x-should-retry", "X-Request-ID"],
    )
    app.include_router(completions.router)
    app.include_router(models.router)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/docs")

    install_openapi(app)
    return app
