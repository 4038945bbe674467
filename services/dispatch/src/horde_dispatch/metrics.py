"""The instruments dispatch records (spec: chat-requests.md *Job lease*, *Free output allowance*), named
after the spec with ``_`` for ``.``."""

from __future__ import annotations

from horde_core.metrics import counter, histogram

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
