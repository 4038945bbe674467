"""The whole stack on a Redis with a password and TLS: ``HORDE_REDIS_URL=rediss://:<password>@127.0.0.1:<port>/0
?ssl_ca_certs=<CA file>`` for every process (horde_testing.redis_tls: a real redis-server, TLS port only).

Every service is ready (its ``/readyz`` pings Redis), chat completions (plain and streamed) are answered by a
worker, and the TLS server holds what the services wrote there: the rate limits' counters, the front's signal
hub connection and the progress stream of the streamed request.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client
from horde_testing.redis_tls import TlsRedis

from .conftest import MODEL, SERVICES, Stack
from .test_walking_skeleton import GREETING


@pytest.fixture(scope="module")
def stack_env_overrides(tls_redis: TlsRedis) -> dict[str, str]:
    return {"HORDE_REDIS_URL": tls_redis.url()}


def on_tls_redis(tls: TlsRedis, db: int, *command: str) -> object:
    async def run() -> object:
        client = redis_client(tls.url(db))
        try:
            return await client.execute_command(*command)
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_the_stack_runs_on_rediss(stack: Stack, tls_redis: TlsRedis) -> None:
    assert stack.env["HORDE_REDIS_URL"].startswith("rediss://:")
    for service in SERVICES:
        r = httpx.get(f"{stack.url(service)}/readyz", timeout=10)
        assert r.status_code == 200, (service, r.text)
        assert r.json()["checks"].get("redis") == "ok", (service, r.text)

    stack.start_worker("tls-worker")
    client = openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=90)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "over tls"}])
    assert reply.choices[0].message.content == f"{GREETING} over tls"
    chunks = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "streamed over tls"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"{GREETING} streamed over tls"

    # What the services keep in Redis is in the TLS server.
    clients = str(on_tls_redis(tls_redis, 0, "CLIENT", "LIST"))
    assert "horde-oai-signals:" in clients  # the front's signal hub (pub/sub)
    limit_keys = on_tls_redis(tls_redis, 0, "KEYS", "LIMITS*")
    assert isinstance(limit_keys, list) and limit_keys  # the rate limits' counters
    streams = on_tls_redis(tls_redis, CHAT_SIGNAL_DB, "KEYS", "*")
    assert isinstance(streams, list) and streams  # leases / progress streams on the signal database
