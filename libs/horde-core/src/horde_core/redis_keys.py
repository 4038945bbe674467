"""Redis clients, the chat key names, and the completion signal (spec: Completion signal, Streaming progress).

Signals publish on logical database ``CHAT_SIGNAL_DB`` (7); Redis delivers pub/sub on every logical
database, so a subscriber only needs the host.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as redis

log = logging.getLogger(__name__)

CHAT_SIGNAL_DB = 7
CHAT_IMAGE_DELETE_RETRY_KEY = "horde:chat:image_delete_retry"


def chat_signal_channel(request_id: str) -> str:
    """``horde:chat:<request id>``: the completion signal channel of one chat request."""
    return f"horde:chat:{request_id}"


def stream_lease_key(generation_id: str) -> str:
    """``horde:chat:lease:<generation id>``: the stream lease hash of one streamed generation."""
    return f"horde:chat:lease:{generation_id}"


def progress_stream_key(request_id: str) -> str:
    """``horde:chat:stream:<request id>``: the progress stream of one chat request."""
    return f"horde:chat:stream:{request_id}"


def redis_client(url: str, db: int | None = None, **kwargs: Any) -> redis.Redis:
    """An asyncio client for ``url``, on logical database ``db`` when given (else the URL's)."""
    if db is not None:
        kwargs["db"] = db
    client: redis.Redis = redis.from_url(url, decode_responses=True, **kwargs)
    return client


def signal_client(url: str) -> redis.Redis:
    """A client on the chat signal database (7) of the Redis at ``url``."""
    return redis_client(url, db=CHAT_SIGNAL_DB)


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
    returns False, never raises (spec: Completion signal).
    """
    message: dict[str, Any] = {"id": request_id, "event": event, "generations": generations}
    if event == "faulted" and (fault_reason is not None or fault_rc is not None):
        message["fault_reason"] = fault_reason
        message["fault_rc"] = fault_rc
    try:
        await client.publish(chat_signal_channel(request_id), json.dumps(message, separators=(",", ":")))
    except Exception:
        log.warning("chat signal publish failed", extra={"request_id": request_id, "event": event}, exc_info=True)
        return False
    return True
