"""Redis with a password and TLS (``rediss://:<password>@host:port/0?ssl_ca_certs=<CA file>``,
docs/operator-guide.md, HORDE_REDIS_URL): every Redis client the services make connects through the URL alone.

A real ``redis-server`` with ``requirepass`` and a TLS port only (horde_testing.redis_tls; certificates made for
the test): the clients of :mod:`horde_core.redis_keys` (the URL's database and the signal database), pub/sub
(the front's signal hub and a completion signal), the rate limiter's ``limits`` storage, and ``horde-admin``.
Wrong password, no CA and plain ``redis://`` are refused, so the connection really is authenticated TLS.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
import redis.asyncio as redis
from horde_contract.errors import HordeError
from horde_core.ratelimit import RATE_LIMIT_STORE_ERRORS, Limiter, parse_limits
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client, signal_client
from horde_core.signals import SignalHub, publish_chat_event
from horde_testing.redis_tls import TlsRedis
from redis import exceptions as redis_errors


async def test_the_key_clients_connect_with_password_and_tls(tls_redis: TlsRedis) -> None:
    url = tls_redis.url()
    assert url.startswith("rediss://:") and "ssl_ca_certs=" in url
    cache, signals = redis_client(url), signal_client(url)
    try:
        assert await cache.ping()
        await cache.set("horde:test:tls", "on-db-0")
        await signals.set("horde:test:tls", "on-db-7")
        assert signals.connection_pool.connection_kwargs["db"] == CHAT_SIGNAL_DB
        assert await cache.get("horde:test:tls") == "on-db-0"
        assert await signals.get("horde:test:tls") == "on-db-7"
        assert cache.connection_pool.connection_class.__name__ == "SSLConnection"
        # The client's own timeouts still apply (the URL's query does not replace them).
        assert cache.connection_pool.connection_kwargs["socket_timeout"] == 5.0
        # A stream, as the front's progress reader uses one.
        await signals.xadd("horde:test:tls:stream", {"t": "delta"})
        entries: Any = await signals.xread({"horde:test:tls:stream": "0"}, count=1, block=250)
        assert entries and entries[0][1][0][1] == {"t": "delta"}
    finally:
        await cache.aclose()
        await signals.aclose()


async def test_pub_sub_signals_reach_the_front_signal_hub(tls_redis: TlsRedis) -> None:
    url = tls_redis.url()
    hub = SignalHub(url)
    publisher = signal_client(url)
    try:
        await hub.start()
        assert await hub.wait_connected(5)
        sub = await hub.subscribe("tls-req-1")
        assert await publish_chat_event(publisher, "tls-req-1", "done", 1)
        event = await sub.wait(5)
        assert event == {"id": "tls-req-1", "event": "done", "generations": 1}
    finally:
        await hub.stop()
        await publisher.aclose()


async def test_the_rate_limiter_counts_in_the_tls_redis(tls_redis: TlsRedis) -> None:
    limiter = Limiter(tls_redis.url(), timeout=2.0)
    errors = RATE_LIMIT_STORE_ERRORS.labels("tls")._value.get()
    one_per_minute = parse_limits("1/minute")
    await limiter.check("tls", [(one_per_minute, ["tls-client"])])
    with pytest.raises(HordeError) as refused:
        await limiter.check("tls", [(one_per_minute, ["tls-client"])])
    assert refused.value.status == 429
    # Counted for real, not let through by a failing store.
    assert RATE_LIMIT_STORE_ERRORS.labels("tls")._value.get() == errors


async def test_a_wrong_password_no_ca_and_plain_redis_are_refused(tls_redis: TlsRedis) -> None:
    async def ping(url: str) -> None:
        client: redis.Redis = redis_client(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            await client.ping()
        finally:
            await client.aclose()

    with pytest.raises(redis_errors.AuthenticationError):
        await ping(tls_redis.url(password="wrong"))
    with pytest.raises(redis_errors.ConnectionError, match=r"(?i)certificate"):
        await ping(tls_redis.url(ca=False))  # the system's trust store does not know the test CA
    with pytest.raises((redis_errors.ConnectionError, redis_errors.TimeoutError)):
        await ping(tls_redis.url().replace("rediss://", "redis://", 1).split("?")[0])


def test_horde_admin_uses_the_tls_url(tls_redis: TlsRedis) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_")}
    env["HORDE_REDIS_URL"] = tls_redis.url()
    env["HORDE_DATABASE_URL"] = "postgresql://unused@127.0.0.1:1/unused"
    out = subprocess.run(
        [sys.executable, "-m", "horde_store.admin", "ip-timeout", "203.0.113.9", "--minutes", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr

    async def ttl() -> int:
        client = redis_client(tls_redis.url())
        try:
            return int(await client.ttl("horde:admission:ip_timeout:203.0.113.9"))
        finally:
            await client.aclose()

    assert 0 < asyncio.run(ttl()) <= 300
