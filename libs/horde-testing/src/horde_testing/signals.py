"""Listen on the completion signals a service publishes to Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import redis.asyncio as redis
from horde_core.redis_keys import chat_signal_channel


class Subscriber:
    """A real Redis subscriber on one request's completion channel (or on ``channel`` when given).

    Use as ``async with Subscriber(client, request_id) as sub: ... await sub.messages(1)``.
    """

    def __init__(self, client: redis.Redis, request_id: uuid.UUID, *, channel: str | None = None) -> None:
        self.pubsub = client.pubsub()
        self.channel = channel if channel is not None else chat_signal_channel(str(request_id))

    async def __aenter__(self) -> Subscriber:
        await self.pubsub.subscribe(self.channel)
        # Wait for the subscribe confirmation so nothing published afterwards is missed.
        while True:
            msg = await self.pubsub.get_message(timeout=1.0)
            if msg and msg["type"] == "subscribe":
                return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.unsubscribe(self.channel)
        await self.pubsub.aclose()  # type: ignore[no-untyped-call]

    async def messages(self, count: int, wait: float = 3.0) -> list[dict[str, Any]]:
        """Up to ``count`` messages (JSON-decoded) received within ``wait`` seconds."""
        out: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while len(out) < count and loop.time() < deadline:
            msg = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if msg and msg["type"] == "message":
                out.append(json.loads(msg["data"]))
        return out
