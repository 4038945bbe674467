"""The dispatch app factory: the pool, Redis (stream leases, queue announcements), the object store, the
long-poll registry and its subscriber, the WorkerPool gRPC server and the native routes (README.md#architecture:
dispatch)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from horde_core.app import create_app as create_base_app
from horde_core.app import include_native
from horde_core.tasks import stop_task
from horde_store.model_reference import load_text_model_reference
from horde_store.stores import open_stores

from . import openapi, pop, worker_routes
from .grpc_server import start_worker_pool_server
from .longpoll import AnnouncementSubscriber, LongPoll, on_shutdown_signal
from .payload import ObjectStore
from .queue import HeadPool
from .queue_depth import refresh_queue_depth
from .settings import DispatchSettings
from .state import DispatchState

SERVICE = "dispatch"

log = logging.getLogger(__name__)


def create_app(settings: DispatchSettings | None = None) -> FastAPI:
    """Build the dispatch app (``settings`` None: read from the environment).

    The lifespan opens the stores (pool, a Redis client on the chat signal database, S3) and the pop
    statement's head variant connections (HORDE_POP_HEAD_POOL_SIZE), puts the
    :class:`DispatchState` on ``app.state.dispatch``, starts the queue announcement subscriber of the long-poll
    pop, the queue depth reader (horde_dispatch.queue_depth) and the WorkerPool gRPC server on
    ``settings.dispatch_grpc_port`` unless ``dispatch_grpc_enabled`` is false. Waiting pops are released
    (answered empty) at SIGTERM/SIGINT, before uvicorn drains connections, and at the latest when the lifespan
    ends. The text model reference (the uptime reward's model size) is read here, so a missing or unreadable
    HORDE_TEXT_MODEL_REFERENCE stops the process at start.
    """
    settings = settings or DispatchSettings()
    model_reference = load_text_model_reference(settings.text_model_reference)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_stores(app, settings, s3=True) as stores:
            objects = ObjectStore(stores.s3, settings.s3_image_bucket, settings.messages_bucket)
            longpoll = LongPoll(settings.pop_wait_recheck_seconds)
            subscriber = AnnouncementSubscriber(stores.signals, longpoll)
            head = (
                await HeadPool.open(
                    settings.database_url, settings.pop_head_pool_size, settings.database_statement_cache_size
                )
                if settings.pop_head_pool_size > 0 and settings.database_statement_cache_size > 0
                else None
            )
            state = DispatchState(
                settings=settings,
                pool=stores.pool,
                signals=stores.signals,
                objects=objects,
                longpoll=longpoll,
                announcements=subscriber,
                head=head,
                model_reference=model_reference,
            )
            app.state.dispatch = state
            subscriber.start()
            remove_signal_hook = on_shutdown_signal(longpoll.close)
            depth_task = (
                asyncio.create_task(refresh_queue_depth(stores.pool, settings.queue_depth_refresh_seconds))
                if settings.queue_depth_refresh_seconds > 0
                else None
            )
            grpc_server = None
            try:
                if settings.dispatch_grpc_enabled:
                    grpc_server = await start_worker_pool_server(
                        state, settings.bind_host, settings.dispatch_grpc_port
                    )
                yield
            finally:
                remove_signal_hook()
                longpoll.close()
                await subscriber.stop()
                await stop_task(depth_task)
                if grpc_server is not None:
                    await grpc_server.stop(settings.shutdown_grace_seconds)
                if head is not None:
                    await head.close()

    app = create_base_app(SERVICE, lifespan=lifespan, settings=settings)
    include_native(app, pop.router)
    include_native(app, worker_routes.router)
    openapi.install_openapi(app)
    return app
