"""Queue announcements, "a job may have become available", for dispatch's long-poll pop
(docs/worker-guide.md#long-poll).

Admission publishes one after each newly created active request commits, and submit after each job restart (a
faulted submit, or a lapsed lease the janitor faults through submit's ``FaultGeneration``). Dispatch processes
subscribe and wake the waiting pops that could take the job (``horde_dispatch.longpoll``). The channel, the
message and both ends of the wire format are here, once.

Why Redis pub/sub and not PostgreSQL ``LISTEN``/``NOTIFY``: a transaction that has called ``NOTIFY`` takes a
cluster-wide lock at commit to append to the notification queue, so every request creation would commit one
after the other, which is exactly the hot path (several hundred creations a second) we are trying to widen;
notifications also need a dedicated listening connection per dispatch process outside the pool, and a queue
that a slow listener can fill (8 GB, then every ``NOTIFY`` fails its transaction). ``PUBLISH`` is one
fire-and-forget round trip after the commit, on a store every service already talks to, and cannot fail the
transaction. What pub/sub does not give, delivery to a subscriber that was disconnected, the subscriber makes
up for: it wakes every waiter when it (re)subscribes, and waiters retry the queue every few seconds anyway.

Channel: :data:`QUEUE_ANNOUNCE_CHANNEL` (``horde:queue:announce``; pub/sub ignores the logical database, so
any client of the Redis publishes and subscribes). Message: compact JSON ::

    {"id": "<request id>", "models": ["..."], "is_chat": true, "max_length": 512,
     "max_context_length": 4096, "n": 1}

``models`` are the request's models (empty: any model), lengths are tokens, ``n`` the generations that became
available (a new request's n, or 1 for a restart). ``id`` is for tracing and lets a waiter tell which
announcement its job answered.

Publishing fails open: :func:`publish` never raises. A Redis error or a reply slower than
:data:`ANNOUNCE_TIMEOUT_SECONDS` is counted on ``horde_queue_announcements_total{outcome="failed"}`` and
logged (a warning at the first failure after a success, debug after that); the client then skips publishing
for :data:`ANNOUNCE_SUSPEND_SECONDS` (``outcome="suspended"``), so a hung Redis costs one request a second a
quarter of a second, not every request five.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis

from horde_core.metrics import counter

log = logging.getLogger(__name__)

QUEUE_ANNOUNCE_CHANNEL = "horde:queue:announce"
#: The longest a publish may take before it is given up (counted as failed); a healthy PUBLISH takes well
#: under a millisecond.
ANNOUNCE_TIMEOUT_SECONDS = 0.25
#: After a failed publish, a client skips publishing this long.
ANNOUNCE_SUSPEND_SECONDS = 1.0

ANNOUNCEMENTS = counter(
    "horde.queue.announcements",
    "Queue announcements by outcome: published, failed (Redis error or timeout) or suspended (skipped "
    "after a failure)",
    ["horde.outcome"],
)

#: Per client: the monotonic time until which publishing is suspended after a failure.
_suspended: weakref.WeakKeyDictionary[redis.Redis, float] = weakref.WeakKeyDictionary()
#: Whether the last publish of this process failed (the warning is logged once per outage).
_failing = False


@dataclass(frozen=True, slots=True)
class Announcement:
    """A request some jobs of which became available. Lengths in tokens; ``models`` empty means any model."""

    request_id: str | None
    models: tuple[str, ...]
    is_chat: bool
    max_length: int
    max_context_length: int
    n: int = 1

    def to_json(self) -> str:
        """The wire message (see the module docstring)."""
        return json.dumps(
            {
                "id": self.request_id,
                "models": list(self.models),
                "is_chat": self.is_chat,
                "max_length": self.max_length,
                "max_context_length": self.max_context_length,
                "n": self.n,
            },
            separators=(",", ":"),
        )


def announcement(
    request_id: object,
    models: Iterable[str] | None,
    *,
    is_chat: bool,
    max_length: int,
    max_context_length: int,
    n: int = 1,
) -> Announcement:
    """An :class:`Announcement` from a request's stored fields (``request_id`` a UUID or str)."""
    return Announcement(
        request_id=None if request_id is None else str(request_id),
        models=tuple(models or ()),
        is_chat=bool(is_chat),
        max_length=int(max_length),
        max_context_length=int(max_context_length),
        n=max(1, int(n)),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(data: str | bytes) -> Announcement | None:
    """The announcement in a message's ``data``, or None when it is not one (malformed JSON, a field of the
    wrong type, a length or n below 0)."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(raw, dict):
        return None
    models = raw.get("models")
    if models is None:
        models = []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        return None
    request_id = raw.get("id")
    is_chat = raw.get("is_chat")
    max_length = _int(raw.get("max_length", 0))
    max_context_length = _int(raw.get("max_context_length", 0))
    n = _int(raw.get("n", 1))
    if (
        not isinstance(is_chat, bool)
        or (request_id is not None and not isinstance(request_id, str))
        or max_length is None
        or max_context_length is None
        or n is None
        or min(max_length, max_context_length, n) < 0
    ):
        return None
    return Announcement(request_id, tuple(models), is_chat, max_length, max_context_length, max(1, n))


async def publish(client: redis.Redis | None, message: Announcement) -> bool:
    """Publish ``message`` on :data:`QUEUE_ANNOUNCE_CHANNEL`; True when Redis took it.

    Call only after the transaction that queued the job committed. Never raises (see the module docstring);
    a ``None`` client publishes nothing and returns False.
    """
    global _failing
    if client is None:
        return False
    now = time.monotonic()
    if _suspended.get(client, 0.0) > now:
        ANNOUNCEMENTS.labels("suspended").inc()
        return False
    try:
        await asyncio.wait_for(
            client.publish(QUEUE_ANNOUNCE_CHANNEL, message.to_json()), ANNOUNCE_TIMEOUT_SECONDS
        )
    except Exception as exc:  # fail open: whatever Redis does, the request that queued the job succeeds
        ANNOUNCEMENTS.labels("failed").inc()
        _suspended[client] = time.monotonic() + ANNOUNCE_SUSPEND_SECONDS
        extra = {"request_id": message.request_id, "error": f"{type(exc).__name__}: {exc}"[:200]}
        if not _failing:
            log.warning(
                "queue announcement failed; waiting pops fall back to their periodic retry", extra=extra
            )
        else:
            log.debug("queue announcement failed", extra=extra)
        _failing = True
        return False
    ANNOUNCEMENTS.labels("published").inc()
    _failing = False
    return True
