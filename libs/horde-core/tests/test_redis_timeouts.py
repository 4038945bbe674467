"""Every Redis client made by horde_core has read and connect timeouts, so a hung store fails a command fast
(redis-py's default is to wait forever)."""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions
from horde_core.redis_keys import (
    REDIS_CONNECT_TIMEOUT_SECONDS,
    REDIS_SOCKET_TIMEOUT_SECONDS,
    redis_client,
    signal_client,
)


def test_clients_carry_the_timeouts() -> None:
    for client in (redis_client("redis://127.0.0.1:1/0"), signal_client("redis://127.0.0.1:1/0")):
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == REDIS_SOCKET_TIMEOUT_SECONDS == 5.0
        assert kwargs["socket_connect_timeout"] == REDIS_CONNECT_TIMEOUT_SECONDS == 2.0


async def test_a_hung_store_fails_a_command_within_the_read_timeout(hung_redis: str) -> None:
    for client in (redis_client(hung_redis, socket_timeout=0.3), signal_client(hung_redis)):
        # The store never answers: redis' own TimeoutError is the read timeout (the wait_for is a hang guard).
        with pytest.raises(redis.exceptions.TimeoutError):
            await asyncio.wait_for(client.get("k"), 30)
        await client.aclose()
