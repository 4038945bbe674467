"""Stream lease and progress stream upkeep at submit and fault (spec: **Streaming progress**).

A successful submit deletes the generation's lease and leaves the stream to expire; a fault of a streamed
generation appends ``{gen, ended: 1}`` to the request's stream and deletes the lease. Both are best effort: a
Redis failure is logged and never fails the submit or fault.
"""

from __future__ import annotations

import logging

import redis.asyncio as redis
from horde_contract.limits import CHAT_PROGRESS_STREAM_MAX_ENTRIES, CHAT_PROGRESS_STREAM_TTL_SECONDS
from horde_core.redis_keys import progress_stream_key, stream_lease_key

log = logging.getLogger(__name__)


async def delete_lease(client: redis.Redis | None, generation_id: str) -> None:
    """Delete ``horde:chat:lease:<generation id>`` after a stored submit."""
    if client is None:
        return
    try:
        await client.delete(stream_lease_key(generation_id))
    except Exception:
        log.warning("stream lease delete failed", extra={"generation_id": generation_id}, exc_info=True)


async def end_stream(client: redis.Redis | None, request_id: str, generation_id: str) -> None:
    """Append the ended marker of a faulted generation to the request's stream and delete its lease."""
    if client is None:
        return
    key = progress_stream_key(request_id)
    try:
        async with client.pipeline(transaction=True) as pipe:
            pipe.xadd(
                key,
                {"gen": generation_id, "ended": 1},
                maxlen=CHAT_PROGRESS_STREAM_MAX_ENTRIES,
                approximate=True,
            )
            pipe.expire(key, CHAT_PROGRESS_STREAM_TTL_SECONDS)
            pipe.delete(stream_lease_key(generation_id))
            await pipe.execute()
    except Exception:
        log.warning(
            "progress stream end failed",
            extra={"request_id": request_id, "generation_id": generation_id},
            exc_info=True,
        )
