"""Completion signals (docs/native-api.md#completion-signal): the message a settlement publishes on a chat request's channel,
its publishers, and the front's one subscriber per process.

Message: ``{"id": <request id>, "event": <generation | done | cancelled | faulted>, "generations": <finished
generations>}``, plus ``"fault_reason"`` and ``"fault_rc"`` on a ``faulted`` event that has them, as compact
JSON on ``horde:chat:<request id>`` (:func:`horde_core.redis_keys.chat_signal_channel`). Publishing is best
effort: a Redis failure is logged, never raised, so a settlement never fails because of it.

Subscribing (:class:`SignalHub`): a request registers its channel before its first status read (subscribe,
then check the status once). Each message wakes the request's waiter with the parsed event. Pub/sub reaches
subscribers on any logical database, so the hub only needs the host. When Redis fails the hub reconnects,
resubscribes every channel and wakes every waiter, which re-read their status; waiters re-read the status every
``signal_recheck_seconds`` anyway, so a lost message only delays them.

The hub's connection stays subscribed to its own channel (:attr:`SignalHub.hub_channel`, on which nobody
publishes) for the life of the process, so the reader always blocks on the socket and hands a message over the
moment it arrives, whether or not a request waits; a request's SUBSCRIBE goes out on a live connection after
any quiet spell. (A reader that stopped reading while no channel was subscribed, polling for the next
subscription, woke a request that subscribed while the previous one's UNSUBSCRIBE was in flight up to a poll
period late.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis

from horde_core.redis_keys import chat_signal_channel, redis_client, signal_hub_channel
from horde_core.tasks import stop_task

log = logging.getLogger(__name__)


async def publish_chat_event(
    client: redis.Redis,
    request_id: str,
    event: str,
    generations: int,
    fault_reason: str | None = None,
    fault_rc: str | None = None,
) -> bool:
    """Publish ``{"id", "event", "generations"[, "fault_reason", "fault_rc"]}`` on the request's channel.

    ``event`` is generation, done, cancelled or faulted. Best effort: a Redis failure is logged and
    returns False, never raises.
    """
    message: dict[str, Any] = {"id": request_id, "event": event, "generations": generations}
    if event == "faulted" and (fault_reason is not None or fault_rc is not None):
        message["fault_reason"] = fault_reason
        message["fault_rc"] = fault_rc
    try:
        await client.publish(chat_signal_channel(request_id), json.dumps(message, separators=(",", ":")))
    except Exception:
        log.warning(
            "chat signal publish failed", extra={"request_id": request_id, "event": event}, exc_info=True
        )
        return False
    return True


@dataclass(frozen=True, slots=True)
class ChatSignal:
    """One message to publish on ``horde:chat:<request_id>`` (a settlement collects them until its commit)."""

    request_id: str
    event: str
    generations: int
    fault_reason: str | None = None
    fault_rc: str | None = None


async def publish_chat_signals(client: redis.Redis | None, signals: Iterable[ChatSignal]) -> None:
    """Publish ``signals`` in order (``generation`` before ``done``); nothing without a client; never raises."""
    if client is None:
        return
    for s in signals:
        await publish_chat_event(client, s.request_id, s.event, s.generations, s.fault_reason, s.fault_rc)


# --- the subscriber ------------------------------------------------------------------------------------------

RECONNECT_SECONDS = 1.0
# The longest one read of the pub/sub connection blocks; a message ends it at once.
READ_TIMEOUT_SECONDS = 5.0
# CLIENT SETNAME of the hub's connections (with ``:<token>`` of the hub), so CLIENT LIST tells them apart.
CLIENT_NAME = "horde-oai-signals"
# How long start() waits for the first connection (the reader keeps trying after it).
START_WAIT_SECONDS = 2.0


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
        token = uuid.uuid4().hex
        # Keeps the connection subscribed while no request waits (nobody publishes on it).
        self.hub_channel = signal_hub_channel(token)
        self.client_name = f"{CLIENT_NAME}:{token[:12]}"
        # Pub/sub reads pass their own timeout (READ_TIMEOUT_SECONDS), which wins over the client's.
        self._client: redis.Redis | None = redis_client(url, client_name=self.client_name) if url else None
        self._pubsub: Any = None
        self._subs: dict[str, set[Subscription]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.connects = 0  # pub/sub connections opened (the first one included)
        self._connected = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return self._client is not None

    async def start(self, wait_seconds: float = START_WAIT_SECONDS) -> None:
        """Start the reader, which opens the connection and subscribes, retrying every
        :data:`RECONNECT_SECONDS` while Redis is down. Returns once connected, or after ``wait_seconds``."""
        if self._client is not None and self._task is None:
            self._task = asyncio.create_task(self._reader(), name="horde-oai-signal-reader")
            await self.wait_connected(wait_seconds)

    async def wait_connected(self, seconds: float) -> bool:
        """True once the pub/sub connection is up and subscribed; False after ``seconds`` without."""
        try:
            await asyncio.wait_for(self._connected.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
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
            if first and self._pubsub is not None:
                # Without a connection the reader is reconnecting and subscribes every registered channel.
                try:
                    await self._pubsub.subscribe(sub.channel)
                except Exception:
                    log.warning("signal subscribe failed; relying on status rechecks", exc_info=True)
                    self._reset_pubsub()
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

    def _reset_pubsub(self) -> None:
        """Drop the connection (under the lock); the reader's read then fails, and it reconnects."""
        old, self._pubsub = self._pubsub, None
        self._connected.clear()
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
        """A new connection, subscribed to the hub's channel and every registered channel in one command."""
        async with self._lock:
            if self._pubsub is not None:
                return
            assert self._client is not None
            pubsub: Any = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.hub_channel, *self._subs)
            except BaseException:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                raise
            self._pubsub = pubsub

    async def _reader(self) -> None:
        failing = False
        while True:
            pubsub = self._pubsub
            try:
                if pubsub is None:
                    await self._resubscribe()
                    self.connects += 1
                    # A message published while there was no connection is lost: every waiter re-reads.
                    self._wake_all()
                    pubsub = self._pubsub
                    if pubsub is None:
                        continue  # dropped at once by a failed subscribe: connect again
                    self._connected.set()
                    if failing:
                        log.warning("signal reader reconnected")
                    failing = False
                # Blocks on the socket until a message arrives. The timeout only bounds how long the reader
                # sits on a connection another task dropped (``_reset_pubsub``) should its read not fail.
                message = await pubsub.get_message(timeout=READ_TIMEOUT_SECONDS)
                if message and message.get("type") == "message":
                    self._dispatch(message.get("channel", ""), message.get("data"))
            except asyncio.CancelledError:
                raise
            except Exception:
                if pubsub is not None and self._pubsub is not pubsub:
                    continue  # another task dropped this connection (a failed SUBSCRIBE): connect again now
                if not failing:
                    log.warning("signal reader failed; reconnecting", exc_info=True)
                failing = True
                async with self._lock:
                    self._reset_pubsub()
                await asyncio.sleep(RECONNECT_SECONDS)
