"""Fixtures for the janitor tests: the real submit process (its Settlement gRPC server is what the janitor calls),
a gRPC stub to it, real PostgreSQL and Redis from horde_testing, and SQL factories for requests and jobs."""

from __future__ import annotations

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
from horde_core.redis_keys import redis_client, signal_client
from horde_janitor.objects import ObjectCleaner
from horde_janitor.sweeper import Janitor
from horde_store.db import create_pool
from horde_testing import seed
from horde_testing.launcher import ServiceProcess, free_port
from horde_testing.signals import Subscriber


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


class Factory(seed.Factory):
    """The shared row factory; the janitor's tests name a generation's refusal code ``refusal_rc``."""

    async def generation(  # type: ignore[override]
        self,
        wp_id: uuid.UUID,
        worker_id: uuid.UUID,
        owner: seed.User,
        *,
        started_seconds_ago: float = 2.0,
        job_ttl: int = 150,
        refusal_rc: str | None = None,
    ) -> uuid.UUID:
        return await super().generation(
            wp_id,
            worker_id,
            owner,
            started_seconds_ago=started_seconds_ago,
            job_ttl=job_ttl,
            chat_refusal_rc=refusal_rc,
        )


@pytest.fixture(scope="module")
def factory(pool: asyncpg.Pool) -> Factory:
    return Factory(pool)


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
