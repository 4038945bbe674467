"""Fixtures for the submit tests: the real submit app (in process, its lifespan run, its gRPC server on a free
port) on the real PostgreSQL and Redis of horde_testing, and SQL factories for the rows admission and dispatch
would have written (users, workers, requests, generations)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as redis
from horde_core.redis_keys import chat_signal_channel, redis_client
from horde_store.db import create_pool
from horde_store.users import create_user
from horde_submit.app import create_app
from horde_submit.settings import SubmitSettings
from horde_testing._proc import free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY


@pytest.fixture(scope="module")
def submit_settings(horde_settings_env: dict[str, str]) -> SubmitSettings:
    return SubmitSettings(
        database_url=horde_settings_env["HORDE_DATABASE_URL"],
        redis_url=horde_settings_env["HORDE_REDIS_URL"],
        secret_key=TEST_SECRET_KEY,
        submit_grpc_port=free_port(),
    )


@pytest.fixture(scope="module")
async def app_client(submit_settings: SubmitSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(submit_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://submit") as client:
            yield client


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(database_url)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture(scope="module")
async def signals(redis_url: str) -> AsyncIterator[redis.Redis]:
    client = redis_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@dataclass
class User:
    id: int
    api_key: str


@dataclass
class Job:
    """One popped job: its request, generation, worker and the two users."""

    wp_id: uuid.UUID
    gen_id: uuid.UUID
    worker_id: uuid.UUID
    owner: User
    requester: User
    model: str


_counter = iter(range(1, 1_000_000))


class Factory:
    """Inserts the rows admission and dispatch write, by SQL."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def user(self, kudos: float = 1000.0, trusted: bool = False) -> User:
        async with self.pool.acquire() as conn:
            record, key = await create_user(
                conn,
                f"user{next(_counter)}_{uuid.uuid4().hex[:6]}",
                salt=TEST_SECRET_KEY,
                kudos=kudos,
                trusted=trusted,
            )
        return User(record.id, key)

    async def worker(
        self, owner: User, model: str = "test/model-7b", bridge_agent: str = "horde-worker:0.1:test"
    ) -> uuid.UUID:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(
                """
                INSERT INTO workers (user_id, name, bridge_agent, models, accepts_chat_jobs, chat_model_id,
                                     chat_max_context_length, chat_max_length)
                VALUES ($1, $2, $3, $4, true, $5, 8192, 1024) RETURNING id
                """,
                owner.id,
                f"worker-{uuid.uuid4().hex[:10]}",
                bridge_agent,
                [model],
                model,
            )

    async def request(
        self,
        requester: User,
        *,
        is_chat: bool = True,
        model: str = "test/model-7b",
        chat_extras: dict[str, Any] | None = None,
        conformance: str = "strict",
        max_length: int = 512,
        max_context_length: int = 4096,
        prompt: str = "user: Hello there",
        n: int = 0,
        jobs: int = 1,
        hold: float = 0.0,
        expiry_seconds: float = 1200,
    ) -> uuid.UUID:
        messages = [{"role": "user", "content": "Hello there"}] if is_chat else None
        async with self.pool.acquire() as conn:
            wp_id = await conn.fetchval(
                """
                INSERT INTO waiting_prompts (user_id, is_chat, prompt, messages, params, models, n, jobs,
                                             max_length, max_context_length, active, chat_extras,
                                             chat_conformance, expiry, consumed_kudos)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, true, $11, $12,
                        now() + make_interval(secs => $13), 1)
                RETURNING id
                """,
                requester.id,
                is_chat,
                prompt,
                messages,
                {"max_length": max_length, "max_context_length": max_context_length},
                [model],
                n,
                jobs,
                max_length,
                max_context_length,
                chat_extras,
                conformance,
                float(expiry_seconds),
            )
            if hold:
                await conn.execute(
                    "INSERT INTO kudos_holds (wp_id, user_id, amount) VALUES ($1, $2, $3)",
                    wp_id,
                    requester.id,
                    hold,
                )
        return wp_id

    async def generation(
        self,
        wp_id: uuid.UUID,
        worker_id: uuid.UUID,
        owner: User,
        model: str = "test/model-7b",
        *,
        started_seconds_ago: float = 2.0,
        job_ttl: int = 150,
        chat: bool = True,
    ) -> uuid.UUID:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(
                """
                INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model,
                                             assigned_max_context_length, assigned_max_length, job_ttl,
                                             created, started_at)
                VALUES ($1, $2, $3, $4, $5, 8192, 1024, $6,
                        now() - make_interval(secs => $7), now() - make_interval(secs => $7))
                RETURNING id
                """,
                wp_id,
                worker_id,
                owner.id,
                model,
                model if chat else None,
                job_ttl,
                float(started_seconds_ago),
            )

    async def job(
        self,
        *,
        owner_trusted: bool = False,
        requester_kudos: float = 1000.0,
        model: str = "test/model-7b",
        bridge_agent: str = "horde-worker:0.1:test",
        **request_kwargs: Any,
    ) -> Job:
        owner = await self.user(kudos=0, trusted=owner_trusted)
        requester = await self.user(kudos=requester_kudos)
        worker_id = await self.worker(owner, model, bridge_agent)
        wp_id = await self.request(requester, model=model, **request_kwargs)
        gen_id = await self.generation(
            wp_id, worker_id, owner, model, chat=request_kwargs.get("is_chat", True)
        )
        return Job(wp_id, gen_id, worker_id, owner, requester, model)

    async def row(self, sql: str, *args: Any) -> asyncpg.Record:
        async with self.pool.acquire() as conn:
            record = await conn.fetchrow(sql, *args)
        assert record is not None
        return record


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
        # Wait for the subscribe confirmation so nothing published afterwards is missed.
        while True:
            msg = await self.pubsub.get_message(timeout=1.0)
            if msg and msg["type"] == "subscribe":
                return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.unsubscribe(self.channel)
        await self.pubsub.aclose()

    async def messages(self, count: int, wait: float = 3.0) -> list[dict[str, Any]]:
        """Up to ``count`` messages received within ``wait`` seconds."""
        out: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while len(out) < count and loop.time() < deadline:
            msg = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if msg and msg["type"] == "message":
                out.append(json.loads(msg["data"]))
        return out


@pytest.fixture
def subscribe(signals: redis.Redis):  # type: ignore[no-untyped-def]
    def make(request_id: uuid.UUID) -> Subscriber:
        return Subscriber(signals, request_id)

    return make


async def metric_value(client: httpx.AsyncClient, name: str, labels: dict[str, str]) -> float:
    """The value of one sample on ``/metrics`` (0 when absent)."""
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        body = line[len(name) + 1 : line.index("}")]
        found = dict(part.split("=", 1) for part in body.split(",") if part)
        found = {k: v.strip('"') for k, v in found.items()}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def metric():  # type: ignore[no-untyped-def]
    """``await metric(client, name, labels)``: one sample's value on ``/metrics``."""
    return metric_value
