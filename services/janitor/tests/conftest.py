"""Fixtures for the janitor tests: the real submit process (its Settlement gRPC server is what the janitor calls),
a gRPC stub to it, real PostgreSQL and Redis from horde_testing, and SQL factories for requests and jobs."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import redis.asyncio as redis
from horde.submit.v1 import settlement_pb2_grpc
from horde_core.grpc import insecure_channel
from horde_core.redis_keys import chat_signal_channel, redis_client, signal_client
from horde_janitor.objects import ObjectCleaner
from horde_janitor.sweeper import Janitor
from horde_store.db import create_pool
from horde_store.users import create_user
from horde_testing.launcher import ServiceProcess, free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY


@dataclass
class SubmitProcess:
    process: ServiceProcess
    http_port: int
    grpc_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@pytest.fixture(scope="module")
def submit_process(horde_settings_env: dict[str, str]) -> Iterator[SubmitProcess]:
    http_port, grpc_port = free_port(), free_port()
    env = {
        **horde_settings_env,
        "HORDE_SUBMIT_HTTP_PORT": str(http_port),
        "HORDE_SUBMIT_GRPC_PORT": str(grpc_port),
        "HORDE_LOG_LEVEL": "WARNING",
    }
    with ServiceProcess(
        "submit",
        [sys.executable, "-m", "horde_submit"],
        env=env,
        health_url=f"http://127.0.0.1:{http_port}/healthz",
    ) as proc:
        yield SubmitProcess(proc, http_port, grpc_port)


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(database_url)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture(scope="module")
async def janitor(
    pool: asyncpg.Pool, redis_url: str, submit_process: SubmitProcess, s3_endpoint: Any
) -> AsyncIterator[Janitor]:
    channel = insecure_channel(submit_process.target)
    signal = signal_client(redis_url)
    cache = redis_client(redis_url)
    objects = ObjectCleaner(
        s3_endpoint.client(), s3_endpoint.image_bucket, s3_endpoint.messages_bucket, cache
    )
    try:
        yield Janitor(
            pool,
            signal,
            settlement_pb2_grpc.SettlementServiceStub(channel),
            grpc_timeout=5.0,
            objects=objects,
        )
    finally:
        await cache.aclose()
        await signal.aclose()
        await channel.close()


@dataclass
class User:
    id: int
    api_key: str


class Factory:
    """Inserts the rows admission and dispatch write, by SQL."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def user(self, kudos: float = 1000.0, trusted: bool = False) -> User:
        async with self.pool.acquire() as conn:
            record, key = await create_user(
                conn, f"u_{uuid.uuid4().hex[:12]}", salt=TEST_SECRET_KEY, kudos=kudos, trusted=trusted
            )
        return User(record.id, key)

    async def worker(self, owner: User, model: str = "test/model-7b") -> uuid.UUID:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(
                """
                INSERT INTO workers (user_id, name, models, accepts_chat_jobs, chat_model_id,
                                     chat_max_context_length, chat_max_length)
                VALUES ($1, $2, $3, true, $4, 8192, 1024) RETURNING id
                """,
                owner.id,
                f"w-{uuid.uuid4().hex[:10]}",
                [model],
                model,
            )

    async def request(
        self, requester: User, *, is_chat: bool = True, expiry_seconds: float = 1200, n: int = 0, **cols: Any
    ) -> uuid.UUID:
        async with self.pool.acquire() as conn:
            wp_id = await conn.fetchval(
                """
                INSERT INTO waiting_prompts (user_id, is_chat, prompt, messages, models, n, jobs, max_length,
                                             max_context_length, active, expiry)
                VALUES ($1, $2, 'user: hi', $3, '{test/model-7b}', $4, 1, 512, 4096, true,
                        now() + make_interval(secs => $5))
                RETURNING id
                """,
                requester.id,
                is_chat,
                [{"role": "user", "content": "hi"}] if is_chat else None,
                n,
                float(expiry_seconds),
            )
            for column, value in cols.items():
                await conn.execute(f"UPDATE waiting_prompts SET {column} = $2 WHERE id = $1", wp_id, value)
        return wp_id

    async def generation(
        self,
        wp_id: uuid.UUID,
        worker_id: uuid.UUID,
        owner: User,
        *,
        started_seconds_ago: float = 2.0,
        job_ttl: int = 150,
        refusal_rc: str | None = None,
    ) -> uuid.UUID:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(
                """
                INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model, job_ttl,
                                             created, started_at, chat_refusal_rc)
                VALUES ($1, $2, $3, 'test/model-7b', 'test/model-7b', $4,
                        now() - make_interval(secs => $5), now() - make_interval(secs => $5), $6)
                RETURNING id
                """,
                wp_id,
                worker_id,
                owner.id,
                job_ttl,
                float(started_seconds_ago),
                refusal_rc,
            )

    async def row(self, sql: str, *args: Any) -> asyncpg.Record | None:
        async with self.pool.acquire() as conn:
            return await conn.fetchrow(sql, *args)


@pytest.fixture(scope="module")
def factory(pool: asyncpg.Pool) -> Factory:
    return Factory(pool)


class Subscriber:
    """A real Redis subscriber on one request's completion channel."""

    def __init__(self, client: redis.Redis, request_id: uuid.UUID) -> None:
        self.pubsub = client.pubsub()
        self.channel = chat_signal_channel(str(request_id))

    async def __aenter__(self) -> Subscriber:
        await self.pubsub.subscribe(self.channel)
        while True:
            msg = await self.pubsub.get_message(timeout=1.0)
            if msg and msg["type"] == "subscribe":
                return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.unsubscribe(self.channel)
        await self.pubsub.aclose()

    async def messages(self, count: int, wait: float = 3.0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while len(out) < count and loop.time() < deadline:
            msg = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if msg and msg["type"] == "message":
                out.append(json.loads(msg["data"]))
        return out


@pytest.fixture(scope="module")
async def subscriber_client(redis_url: str) -> AsyncIterator[redis.Redis]:
    client = redis_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def subscribe(subscriber_client: redis.Redis):  # type: ignore[no-untyped-def]
    def make(request_id: uuid.UUID) -> Subscriber:
        return Subscriber(subscriber_client, request_id)

    return make
