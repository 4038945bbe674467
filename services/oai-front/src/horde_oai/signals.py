"""Completion signals: one Redis pub/sub connection per process, shared by every waiting request.

A request registers its channel ``horde:chat:<id>`` before its first status read (spec: Completion signal:
subscribe, then check the status once). Each message wakes the request's waiter with the parsed event.
Pub/sub reaches subscribers on any logical database, so the hub only needs the host. When Redis fails the
hub reconnects, resubscribes every channel and wakes every waiter, which re-read their status; waiters
re-read the status every ``signal_recheck_seconds`` anyway, so a lost message only delays them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import redis.asyncio as redis
from horde_core.redis_keys import chat_signal_channel

log = logging.getLogger(__name__)

RECONNECT_SECONDS = 1.0


class Subscription:
    """One request's registration: a queue of parsed events (``{"id", "event", "generations", ...}``)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.channel = chat_signal_channel(request_id)
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def wait(self, seconds: float) -> dict[str, Any] | None:
        """The next event, or None after ``seconds`` (a recheck tick)."""
        try:
            return await asyncio.wait_for(self.events.get(), max(seconds, 0.0))
        except TimeoutError:
            return None


class SignalHub:
    """Process-wide subscriber. ``url`` None runs without Redis: subscriptions only time out."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._client: redis.Redis | None = redis.from_url(url, decode_responses=True) if url else None
        self._pubsub: Any = None
        self._subs: dict[str, set[Subscription]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._have_channels = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return self._client is not None

    async def start(self) -> None:
        if self._client is not None and self._task is None:
            self._task = asyncio.create_task(self._reader(), name="horde-oai-signal-reader")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()

    async def ping(self) -> None:
        """Readiness: the Redis host answers."""
        if self._client is not None:
            await self._client.ping()

    async def subscribe(self, request_id: str) -> Subscription:
        """Register ``request_id``; returns once the SUBSCRIBE was sent (best effort when Redis is down)."""
        sub = Subscription(request_id)
        if self._client is None:
            return sub
        async with self._lock:
            subs = self._subs.setdefault(sub.channel, set())
            first = not subs
            subs.add(sub)
            if first:
                try:
                    await self._ensure_pubsub()
                    await self._pubsub.subscribe(sub.channel)
                except Exception:
                    log.warning("signal subscribe failed; relying on status rechecks", exc_info=True)
                    self._reset_pubsub()
            self._have_channels.set()
        return sub

    async def unsubscribe(self, sub: Subscription) -> None:
        if self._client is None:
            return
        async with self._lock:
            subs = self._subs.get(sub.channel)
            if not subs:
                return
            subs.discard(sub)
            if subs:
                return
            del self._subs[sub.channel]
            if self._pubsub is not None:
                try:
                    await self._pubsub.unsubscribe(sub.channel)
                except Exception:
                    self._reset_pubsub()
            if not self._subs:
                self._have_channels.clear()

    async def _ensure_pubsub(self) -> None:
        if self._pubsub is None:
            assert self._client is not None
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)

    def _reset_pubsub(self) -> None:
        old, self._pubsub = self._pubsub, None
        if old is not None:
            task = asyncio.get_running_loop().create_task(old.aclose())
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _dispatch(self, channel: str, data: Any) -> None:
        try:
            event = json.loads(data) if isinstance(data, str) else {}
        except ValueError:
            event = {}
        if not isinstance(event, dict):
            event = {}
        for sub in list(self._subs.get(channel, ())):
            sub.events.put_nowait(event)

    def _wake_all(self) -> None:
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub.events.put_nowait({"event": "reconnected"})

    async def _resubscribe(self) -> None:
        async with self._lock:
            await self._ensure_pubsub()
            if self._subs:
                await self._pubsub.subscribe(*self._subs)

    async def _reader(self) -> None:
        broken = False
        while True:
            try:
                await self._have_channels.wait()
                if broken or self._pubsub is None:
                    await self._resubscribe()
                    if broken:
                        self._wake_all()
                    broken = False
                pubsub = self._pubsub
                if pubsub is None or not pubsub.subscribed:
                    await asyncio.sleep(0.05)
                    continue
                message = await pubsub.get_message(timeout=1.0)
                if message and message.get("type") == "message":
                    self._dispatch(message.get("channel", ""), message.get("data"))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("signal reader failed; reconnecting", exc_info=True)
                async with self._lock:
                    self._reset_pubsub()
                broken = True
                await asyncio.sleep(RECONNECT_SECONDS)
