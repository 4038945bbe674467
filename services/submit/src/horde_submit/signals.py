"""Completion signals a settlement publishes after its commit (spec: **Completion signal**).

Only chat requests publish. Publishing is best effort: :func:`horde_core.redis_keys.publish_chat_event` logs a
Redis failure and returns False, so a submit or fault never fails because of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as redis
from horde_core.redis_keys import publish_chat_event


@dataclass(frozen=True, slots=True)
class ChatSignal:
    """One message to publish on ``horde:chat:<request_id>``."""

    request_id: str
    event: str
    generations: int
    fault_reason: str | None = None
    fault_rc: str | None = None


async def publish(client: redis.Redis | None, signals: list[ChatSignal]) -> None:
    """Publish ``signals`` in order (``generation`` before ``done``); never raises."""
    if client is None:
        return
    for s in signals:
        await publish_chat_event(client, s.request_id, s.event, s.generations, s.fault_reason, s.fault_rc)
