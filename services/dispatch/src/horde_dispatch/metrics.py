"""The instruments dispatch records (docs/native-api.md#job-lease, #free-output-allowance; the
long-poll pop), named after the spec with ``_`` for ``.``."""

from __future__ import annotations

from horde_core.metrics import counter, gauge, histogram

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


# Long-poll pop (docs/worker-guide.md#long-poll; horde_dispatch.longpoll).
LONGPOLL_WAITING = gauge("horde.pop.longpoll.waiting", "Pops of this process waiting for a job (long-poll)")
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
