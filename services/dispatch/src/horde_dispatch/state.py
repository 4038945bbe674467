"""What the dispatch routes and the gRPC servicer share: settings and store clients, opened by the lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
from fastapi import Request

from .payload import ObjectStore
from .settings import DispatchSettings


@dataclass
class DispatchState:
    """``pool`` (PostgreSQL), ``signals`` (Redis on the chat signal db, for stream leases; None when Redis is
    not configured) and ``objects`` (S3 for chat images and offloaded messages)."""

    settings: DispatchSettings
    pool: asyncpg.Pool
    signals: Any | None
    objects: ObjectStore | None


def get_state(request: Request) -> DispatchState:
    """The app's :class:`DispatchState` (a FastAPI dependency)."""
    state: DispatchState = request.app.state.dispatch
    return state
