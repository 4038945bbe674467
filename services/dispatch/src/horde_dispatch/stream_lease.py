"""The stream lease a pop writes for a generation whose request carries the stream hint.

Spec: chat-requests.md *Streaming progress*: ``horde:chat:lease:<generation id>`` on the chat signal
database, a hash of request, worker, model, owner, key (SHA-256 of the owner's stored key hash), max_bytes,
fake, started (Unix seconds), job_ttl, lease_cap and trusted, expiring CHAT_PROGRESS_LEASE_GRACE_SECONDS
after the job's TTL. Best effort: a Redis failure is logged and never fails the pop.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import Any

from horde_contract import (
    CHAT_PROGRESS_BYTES_PER_TOKEN,
    CHAT_PROGRESS_LEASE_GRACE_SECONDS,
    TEXT_JOB_LEASE_SECONDS,
)
from horde_core.redis_keys import stream_lease_key

log = logging.getLogger(__name__)


def lease_fields(
    *,
    request_id: str,
    worker_id: str,
    model: str,
    owner_id: int,
    owner_key_hash: str | None,
    max_length: int,
    started: datetime,
    lease_cap: int,
    trusted: bool,
) -> dict[str, str | int]:
    """The lease hash's fields (strings and integers, as Redis stores them)."""
    return {
        "request": request_id,
        "worker": worker_id,
        "model": model,
        "owner": owner_id,
        "key": hashlib.sha256((owner_key_hash or "").encode("utf-8")).hexdigest(),
        "max_bytes": CHAT_PROGRESS_BYTES_PER_TOKEN * max_length,
        "fake": 0,
        "started": int(started.timestamp()),
        "job_ttl": TEXT_JOB_LEASE_SECONDS,
        "lease_cap": lease_cap,
        "trusted": 1 if trusted else 0,
    }


async def write_stream_leases(client: Any, leases: dict[str, dict[str, str | int]]) -> bool:
    """Write each ``{generation id: fields}`` lease with its expiry in one pipeline; False on failure."""
    if client is None or not leases:
        return False
    try:
        async with client.pipeline(transaction=True) as pipe:
            for generation_id, fields in leases.items():
                key = stream_lease_key(generation_id)
                pipe.delete(key)
                pipe.hset(key, mapping=fields)
                pipe.expire(key, TEXT_JOB_LEASE_SECONDS + CHAT_PROGRESS_LEASE_GRACE_SECONDS)
            await pipe.execute()
    except Exception:
        log.warning("stream lease write failed", extra={"generations": list(leases)}, exc_info=True)
        return False
    return True
