"""Redis clients and the names of every Redis key and channel the services use.

Signals publish on logical database ``CHAT_SIGNAL_DB`` (7); Redis delivers pub/sub on every logical
database, so a subscriber only needs the host. Stream leases and progress streams live on the same database;
their keys, fields and scripts are in :mod:`horde_core.chat_stream`, the queue announcement channel and message
in :mod:`horde_core.queue_announce`, the completion signal's message and publishers in :mod:`horde_core.signals`.
Rate-limit counters are the ``limits`` library's own keys (:mod:`horde_core.ratelimit`).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as redis

CHAT_SIGNAL_DB = 7

#: The set of object keys the store did not delete, which the janitor retries (admission and janitor add to it).
CHAT_IMAGE_DELETE_RETRY_KEY = "horde:chat:image_delete_retry"
#: ``horde:admission:availability:<request id>``: a request's availability, kept for its status reads.
AVAILABILITY_CACHE_KEY_PREFIX = "horde:admission:availability:"
#: ``horde:admission:models:v2:<chat | text>``: the cached answer of a models route.
MODELS_CACHE_KEY_PREFIX = "horde:admission:models:v2:"
#: ``horde:admission:ip_timeout:<address>``: an operator's timeout of a client address or IPv6 /64
#: (``horde-admin ip-timeout``), on the URL's database; the key's TTL is the timeout's remaining life
#: (docs/operator-guide.md#operator-controls).
IP_TIMEOUT_KEY_PREFIX = "horde:admission:ip_timeout:"
#: ``horde:oai:hub:<token>``: the front's signal hub's own channel, one per process (nobody publishes on it).
SIGNAL_HUB_CHANNEL_PREFIX = "horde:oai:hub:"
#: ``horde:oai:relay:<request id>``: who may resume a relayed stream, on the front's stream database.
RELAY_RECORD_PREFIX = "horde:oai:relay:"
#: ``horde:oai:operation:<call key>``: the record of one client call, on the front's stream database.
OPERATION_RECORD_PREFIX = "horde:oai:operation:"

#: Client timeouts of every Redis client made here, so a hung or unreachable store fails a command fast
#: (redis.exceptions.TimeoutError / ConnectionError, which the app factory answers 503) instead of holding
#: the request forever. The longest blocking read a service makes (the front's XREAD BLOCK, 250 ms; pub/sub
#: reads pass their own timeout) is well inside the read timeout.
REDIS_SOCKET_TIMEOUT_SECONDS = 5.0
REDIS_CONNECT_TIMEOUT_SECONDS = 2.0


def chat_signal_channel(request_id: str) -> str:
    """``horde:chat:<request id>``: the completion signal channel of one chat request."""
    return f"horde:chat:{request_id}"


def availability_cache_key(request_id: str) -> str:
    """``horde:admission:availability:<request id>``."""
    return f"{AVAILABILITY_CACHE_KEY_PREFIX}{request_id}"


def models_cache_key(chat: bool) -> str:
    """``horde:admission:models:v2:chat`` or ``...:text``: the cache key of the computed text model list
    (``chat`` is the only parameter that shapes it)."""
    return f"{MODELS_CACHE_KEY_PREFIX}{'chat' if chat else 'text'}"


def ip_timeout_key(address: str) -> str:
    """``horde:admission:ip_timeout:<address>``: the timeout of one IPv4 client address, or of an IPv6 /64
    (``2001:db8::/64``), as ``ipaddress`` writes it (``horde_store.modes.timeout_target``: an IPv4-mapped
    address is its IPv4 address, so every spelling of one client is one key)."""
    return f"{IP_TIMEOUT_KEY_PREFIX}{address}"


def signal_hub_channel(token: str) -> str:
    """``horde:oai:hub:<token>``."""
    return f"{SIGNAL_HUB_CHANNEL_PREFIX}{token}"


def relay_record_key(request_id: str) -> str:
    """``horde:oai:relay:<request id>``: who may resume a relayed stream, on the stream database."""
    return f"{RELAY_RECORD_PREFIX}{request_id}"


def operation_record_key(call_key: str) -> str:
    """``horde:oai:operation:<call key>``: the record of one client call, on the stream database."""
    return f"{OPERATION_RECORD_PREFIX}{call_key}"


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
