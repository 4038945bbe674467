"""Fixtures for the submit tests: the real submit app (in process, its lifespan run, its gRPC server on a free
port) on the real PostgreSQL and Redis of horde_testing, and SQL factories for the rows admission and dispatch
would have written (users, workers, requests, generations)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as redis
from horde_core.redis_keys import redis_client
from horde_store.db import create_pool
from horde_submit.app import create_app
from horde_submit.settings import SubmitSettings
from horde_testing import seed
from horde_testing._proc import free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY
from horde_testing.seed import DEFAULT_MODEL, User
from horde_testing.signals import Subscriber


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
class Job:
    """One popped job: its request, generation, worker and the two users."""

    wp_id: uuid.UUID
    gen_id: uuid.UUID
    worker_id: uuid.UUID
    owner: User
    requester: User
    model: str


class Factory(seed.Factory):
    """The shared row factory with submit's defaults: a bridge agent on workers, request params, chat extras
    and conformance, assigned limits on generations, and whole jobs."""

    async def worker(  # type: ignore[override]
        self, owner: User, model: str = DEFAULT_MODEL, bridge_agent: str = "horde-worker:0.1:test"
    ) -> uuid.UUID:
        return await super().worker(owner, model, bridge_agent=bridge_agent)

    async def request(  # type: ignore[override]
        self,
        requester: User,
        *,
        is_chat: bool = True,
        model: str = DEFAULT_MODEL,
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
        return await super().request(
            requester,
            is_chat=is_chat,
            model=model,
            message="Hello there",
            prompt=prompt,
            n=n,
            jobs=jobs,
            max_length=max_length,
            max_context_length=max_context_length,
            expiry_seconds=expiry_seconds,
            hold=hold,
            params={"max_length": max_length, "max_context_length": max_context_length},
            chat_extras=chat_extras,
            chat_conformance=conformance,
            consumed_kudos=1,
        )

    async def generation(  # type: ignore[override]
        self,
        wp_id: uuid.UUID,
        worker_id: uuid.UUID,
        owner: User,
        model: str = DEFAULT_MODEL,
        *,
        started_seconds_ago: float = 2.0,
        job_ttl: int = 150,
        chat: bool = True,
    ) -> uuid.UUID:
        return await super().generation(
            wp_id,
            worker_id,
            owner,
            model,
            started_seconds_ago=started_seconds_ago,
            job_ttl=job_ttl,
            assigned_model=model if chat else None,
            assigned_max_context_length=8192,
            assigned_max_length=1024,
        )

    async def job(
        self,
        *,
        owner_trusted: bool = False,
        requester_kudos: float = 1000.0,
        model: str = DEFAULT_MODEL,
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
        record = await super().row(sql, *args)
        assert record is not None
        return record


@pytest.fixture(scope="module")
def factory(pool: asyncpg.Pool) -> Factory:
    return Factory(pool)


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
