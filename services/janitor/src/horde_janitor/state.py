"""What the janitor process holds while it runs: the settings, the stores and the pass runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg
    from redis.asyncio import Redis

    from horde_janitor.settings import JanitorSettings
    from horde_janitor.sweeper import Janitor


@dataclass
class JanitorState:
    """``pool`` (PostgreSQL), ``signals`` (Redis on the chat signal database: completion signals, stream
    leases) and ``janitor`` (the passes the lifespan's loop runs)."""

    settings: JanitorSettings
    pool: asyncpg.Pool
    signals: Redis
    janitor: Janitor
