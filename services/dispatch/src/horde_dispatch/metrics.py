"""The instruments dispatch records (spec: chat-requests.md *Job lease*, *Free output allowance*; the
long-poll pop), named after the spec with ``_`` for ``.``."""

from __future__ import annotations

from horde_core.metrics import counter, histogram, metric_name
from prometheus_client import REGISTRY, Gauge

QUEUE_WAIT_SECONDS = histogram(
    "horde.text.queue_wait_seconds",
    "Each assignment's time from request creation to pop",
    ["horde.requester", "horde.chat", "horde.requested_bucket"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200),
)
GATE_SHADOW_ASSIGNMENTS = counter(
    "horde.text.gate_shadow.assignments",
    "Legacy text jobs assigned over the worker's capacity",
    ["horde.worker_trusted", "horde.size_bucket"],
)


def size_bucket(tokens: int) -> str:
    """``horde.size_bucket``: <=512, 513-1024, 1025-2048, 2049-4096 or >4096 (TEXT_LENGTH_BUCKETS)."""
    for bound, label in ((512, "<=512"), (1024, "513-1024"), (2048, "1025-2048"), (4096, "2049-4096")):
        if tokens <= bound:
            return label
    return ">4096"


def requester_kind(user_id: int, shared_key: bool) -> str:
    """``horde.requester``: anonymous, registered or shared_key."""
    if user_id == 0:
        return "anonymous"
    return "shared_key" if shared_key else "registered"


def _gauge(spec_name: str, documentation: str) -> Gauge:
    """A gauge named after the spec instrument (the existing one when a test process imports this twice)."""
    name = metric_name(spec_name)
    found = getattr(REGISTRY, "_names_to_collectors", {}).get(name)
    if isinstance(found, Gauge):
        return found
    return Gauge(name, documentation)


# Long-poll pop (README: Long-poll pop; horde_dispatch.longpoll).
LONGPOLL_WAITING = _gauge("horde.pop.longpoll.waiting", "Pops of this process waiting for a job (long-poll)")
LONGPOLL_WAKES = counter(
    "horde.pop.longpoll.wakes",
    "Retries of a waiting pop's queue statement, by cause (announcement, reconnect, recheck) and outcome "
    "(job; empty; handed_on: empty, and the wake was passed to the next plausible waiter)",
    ["horde.cause", "horde.outcome"],
)
LONGPOLL_WAITS = counter(
    "horde.pop.longpoll.waits",
    "Ended waits of long-polling pops by outcome: job, timeout (answered empty at wait_seconds), gone (the "
    "worker disconnected), closed (released at shutdown)",
    ["horde.outcome"],
)
LONGPOLL_ANNOUNCEMENTS = counter(
    "horde.pop.longpoll.announcements",
    "Queue announcements this process received, by outcome: routed (to the waiters it woke, maybe none) or "
    "malformed",
    ["horde.outcome"],
)
LONGPOLL_SUBSCRIBER = counter(
    "horde.pop.longpoll.subscriber",
    "Events of the announcement subscriber: subscribed (every waiter is woken once), failed (reconnects with "
    "backoff)",
    ["horde.event"],
)
