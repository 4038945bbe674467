"""The dispatch app factory: the pool, Redis (stream leases, queue announcements), the object store, the
long-poll registry and its subscriber, the WorkerPool gRPC server and the native routes (ARCHITECTURE.md:
dispatch)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from horde_core.app import create_app as create_base_app
from horde_core.app import include_native
from horde_core.redis_keys import signal_client
from horde_store.db import create_pool
from horde_store.objects import make_s3_client

from . import openapi, pop, worker_routes
from .grpc_server import start_worker_pool_server
from .longpoll import AnnouncementSubscriber, LongPoll, on_shutdown_signal
from .payload import ObjectStore
from .settings import DispatchSettings
from .state import DispatchState

SERVICE = "dispatch"

log = logging.getLogger(__name__)


def create_app(settings: DispatchSettings | None = None) -> FastAPI:
    """Build the dispatch app.

    The lifespan opens the asyncpg pool, a Redis client on the chat signal database and an S3 client, starts
    the queue announcement subscriber of the long-poll pop and the WorkerPool gRPC server on
    ``settings.dispatch_grpc_port`` unless ``dispatch_grpc_enabled`` is false; readiness checks ping
    PostgreSQL and Redis. Waiting pops are released (answered empty) at SIGTERM/SIGINT, before uvicorn drains
    connections, and at the latest when the lifespan ends.
    """
    settings = settings or DispatchSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(
            settings.database_url, min_size=settings.db_pool_min_size, max_size=settings.db_pool_max_size
        )
        signals = signal_client(settings.redis_url)
        objects = ObjectStore(make_s3_client(settings), settings.s3_image_bucket, settings.messages_bucket)
        longpoll = LongPoll(settings.pop_wait_recheck_seconds)
        subscriber = AnnouncementSubscriber(signals, longpoll)
        state = DispatchState(
            settings=settings,
            pool=pool,
            signals=signals,
            objects=objects,
            longpoll=longpoll,
            announcements=subscriber,
        )
        app.state.dispatch = state
        subscriber.start()
        remove_signal_hook = on_shutdown_signal(longpoll.close)
        grpc_server = None
        try:
            if settings.dispatch_grpc_enabled:
                grpc_server = await start_worker_pool_server(
                    state, settings.bind_host, settings.dispatch_grpc_port
                )

            async def database() -> object:
                return await pool.fetchval("SELECT 1")

            async def redis_ping() -> object:
                return await signals.ping()

            app.state.readiness_checks.update({"database": database, "redis": redis_ping})
            yield
        finally:
            remove_signal_hook()
            longpoll.close()
            await subscriber.stop()
            if grpc_server is not None:
                await grpc_server.stop(settings.shutdown_grace_seconds)
            await signals.aclose()
            await pool.close()

    app = create_base_app(SERVICE, lifespan=lifespan)
    app.state.settings = settings
    include_native(app, pop.router)
    include_native(app, worker_routes.router)
    openapi.install_openapi(app)
    return app
