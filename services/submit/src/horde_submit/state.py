"""What the submit routes share: the settings, the stores and the two handlers, built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

if TYPE_CHECKING:
    import asyncpg
    from redis.asyncio import Redis

    from horde_submit.progress import ProgressHandler
    from horde_submit.settings import SubmitSettings
    from horde_submit.submit import Submitter


@dataclass
class SubmitState:
    """``pool`` (PostgreSQL), ``signals`` (Redis on the chat signal database: completion signals, stream
    leases), ``submitter`` (the submit route's handler) and ``progress`` (the progress route's)."""

    settings: SubmitSettings
    pool: asyncpg.Pool
    signals: Redis
    submitter: Submitter
    progress: ProgressHandler


async def get_state(request: Request) -> SubmitState:
    """The :class:`SubmitState` of the app serving ``request``."""
    state: SubmitState = request.app.state.submit
    return state
