"""What the dispatch routes and the gRPC servicer share: settings and store clients, opened by the lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg
from fastapi import Request
from horde_contract import TextModelReference
from redis.asyncio import Redis

from .longpoll import AnnouncementSubscriber, LongPoll
from .payload import ObjectStore
from .queue import HeadPool
from .settings import DispatchSettings


@dataclass
class DispatchState:
    """``pool`` (PostgreSQL), ``signals`` (Redis on the chat signal db, for stream leases; None when Redis is
    not configured), ``objects`` (S3 for chat images and offloaded messages), ``longpoll`` (the waiting
    pops and their wake-ups; None: every pop answers at once, as with ``wait_seconds`` 0),
    ``announcements`` (the subscriber feeding it), ``head`` (the pop statement's head variant connections;
    None: every pop runs the full statement) and ``model_reference`` (HORDE_TEXT_MODEL_REFERENCE, read at
    start: the uptime reward's model size)."""

    settings: DispatchSettings
    pool: asyncpg.Pool
    signals: Redis | None
    objects: ObjectStore | None
    longpoll: LongPoll | None = None
    announcements: AnnouncementSubscriber | None = None
    head: HeadPool | None = None
    model_reference: TextModelReference = field(default_factory=TextModelReference)


async def get_state(request: Request) -> DispatchState:
    """The app's :class:`DispatchState` (a FastAPI dependency; async, since FastAPI runs a plain ``def``
    dependency in its thread pool, a thread hop on every pop)."""
    state: DispatchState = request.app.state.dispatch
    return state
