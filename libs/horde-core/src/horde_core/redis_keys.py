"""Redis clients, the completion signal channel and its publisher (spec: Completion signal).

Signals publish on logical database ``CHAT_SIGNAL_DB`` (7); Redis delivers pub/sub on every logical
database, so a subscriber only needs the host. Stream leases and progress streams live on the same database;
their keys, fields and scripts are in :mod:`horde_core.chat_stream`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as redis

log = logging.getLogger(__name__)

CHAT_SIGNAL_DB = 7
CHAT_IMAGE_DELETE_RETRY_KEY = "horde:chat:image_delete_retry"

#: Client timeouts of every Redis client made here, so a hung or unreachable store fails a command fast
#: (redis.exceptions.TimeoutError / ConnectionError, which the app factory answers 503) instead of holding
#: the request forever. The longest blocking read a service makes (the front's XREAD BLOCK, 250 ms; pub/sub
#: reads pass their own timeout) is well inside the read timeout.
REDIS_SOCKET_TIMEOUT_SECONDS = 5.0
REDIS_CONNECT_TIMEOUT_SECONDS = 2.0


def chat_signal_channel(request_id: str) -> str:
    """``horde:chat:<request id>``: the completion signal channel of one chat request."""
    return f"horde:chat:{request_id}"


def redis_client(url: str, db: int | None = None, **kwargs: Any) -> redis.Redis:
    """An asyncio client for ``url``, on logical database ``db`` when given (else the URL's), decoding replies
    to str, with the read and connect timeouts above (redis-py's default is to wait forever). ``kwargs`` go to
    the connection pool and override those."""
    kwargs.setdefault("socket_timeout", REDIS_SOCKET_TIMEOUT_SECONDS)
    kwargs.setdefault("socket_connect_timeout", REDIS_CONNECT_TIMEOUT_SECONDS)
    pool = redis.ConnectionPool.from_url(url, decode_responses=True, **kwargs)
    if db is not None:
        # from_url lets the URL's database (``redis://host/0``, ``?db=``) win over a ``db`` keyword, which
        # would put the signal database's keys on the URL's.
        pool.connection_kwargs["db"] = db
    return redis.Redis.from_pool(pool)


def signal_client(url: str) -> redis.Redis:
    """A client on the chat signal database (7) of the Redis at ``url``, whatever database the URL names: the
    completion signal, stream leases and progress streams all go through it."""
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
