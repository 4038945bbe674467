"""Two janitor replicas sweeping at once (issue 13: every stage correct with N replicas; docs/operator-guide.md#scaling).

Each janitor has its own pool, Redis clients, S3 client and channel to the real submit process, as two processes
would; their passes run concurrently over one set of expired requests, lapsed leases, a cancelled streamed
generation left unsettled and queued object deletes. Every side effect that is not idempotent happens once: an
expired request is deleted, counted (``horde_janitor_expired_requests_total``), signalled ``faulted``, has its
objects deleted and its in-flight streams ended by one replica; a lapsed lease is faulted, counted
(``horde_text_stale_aborts_total``) and restarted once, its worker's counters moving by one; a cancelled
generation is paid once. The delete-retry set may be worked by both (deleting an object twice is idempotent):
every queued key ends deleted and out of the set.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis
from horde.submit.v1 import settlement_pb2_grpc
from horde_core.chat_stream import (
    StreamEntry,
    StreamLease,
    progress_stream_key,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.grpc import insecure_channel
from horde_core.redis_keys import (
    CHAT_IMAGE_DELETE_RETRY_KEY,
    chat_signal_channel,
    redis_client,
    signal_client,
)
from horde_janitor.objects import ObjectCleaner
from horde_janitor.sweeper import Janitor, PassResult
from horde_store.db import create_pool
from prometheus_client import REGISTRY

# Small batches, so each replica's expiry runs several statements and the two interleave.
EXPIRY_BATCH = 2
ROUNDS = 3


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def expired_count(chat: str) -> float:
    return sample("horde_janitor_expired_requests_total", {"chat": chat})


def stale_aborts(trusted: str, chat: str) -> float:
    return sample("horde_text_stale_aborts_total", {"worker_trusted": trusted, "chat": chat})


def all_stale_aborts() -> float:
    return sum(stale_aborts(t, c) for t in ("true", "false") for c in ("true", "false"))


@pytest.fixture(scope="module")
async def replicas(
    janitor: Janitor, database_url: str, redis_url: str, submit_process: Any, s3_endpoint: Any
) -> AsyncIterator[tuple[Janitor, Janitor]]:
    """Two janitors: the fixture's stores with small batches, and a second set of stores of its own."""
    pool = await create_pool(database_url)
    signal = signal_client(redis_url)
    cache = redis_client(redis_url)
    channel = insecure_channel(submit_process.target)
    objects = ObjectCleaner(
        s3_endpoint.client(), s3_endpoint.image_bucket, s3_endpoint.messages_bucket, cache
    )
    first = Janitor(
        janitor.pool,
        janitor.signal,
        janitor.settlement,
        expiry_batch=EXPIRY_BATCH,
        grpc_timeout=5.0,
        objects=janitor.objects,
    )
    second = Janitor(
        pool,
        signal,
        settlement_pb2_grpc.SettlementServiceStub(channel),
        expiry_batch=EXPIRY_BATCH,
        grpc_timeout=5.0,
        objects=objects,
    )
    try:
        yield first, second
    finally:
        await channel.close()
        await cache.aclose()
        await signal.aclose()
        await pool.close()


async def sweep_together(a: Janitor, b: Janitor, rounds: int = ROUNDS) -> list[PassResult]:
    results: list[PassResult] = []
    for _ in range(rounds):
        results.extend(await asyncio.gather(a.run_pass(), b.run_pass()))
    return results


class Channels:
    """Every message on some requests' signal channels, read up to a sentinel the test publishes last: what a
    replica published before the sentinel arrived first (one server, publishes in the order they were made)."""

    SENTINEL = "sentinel"

    def __init__(self, client: redis.Redis, request_ids: list[uuid.UUID]) -> None:
        self.pubsub = client.pubsub()
        self.channels = [chat_signal_channel(str(r)) for r in request_ids]

    async def __aenter__(self) -> Channels:
        await self.pubsub.subscribe(*self.channels)
        confirmed = 0
        while confirmed < len(self.channels):
            message = await self.pubsub.get_message(timeout=5.0)
            confirmed += bool(message and message["type"] == "subscribe")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.aclose()  # type: ignore[no-untyped-call]

    async def drain(self, publisher: redis.Redis) -> dict[str, list[dict[str, Any]]]:
        """The messages of each channel before its sentinel."""
        for channel in self.channels:
            await publisher.publish(channel, json.dumps({"event": self.SENTINEL}))
        seen: dict[str, list[dict[str, Any]]] = {c: [] for c in self.channels}
        open_channels = set(self.channels)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while open_channels and loop.time() < deadline:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if not message or message["type"] != "message":
                continue
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            event = json.loads(message["data"])
            if event.get("event") == self.SENTINEL:
                open_channels.discard(channel)
            else:
                seen[channel].append(event)
        assert not open_channels, f"no sentinel on {open_channels}"
        return seen


async def test_two_janitors_process_each_expiry_lapse_and_cancel_once(
    replicas: tuple[Janitor, Janitor], factory: Any, s3_endpoint: Any, redis_url: str
) -> None:
    a, b = replicas
    await a.run_pass()  # whatever earlier tests left due, so the counters below move by this test's rows only
    owner = await factory.user(kudos=0, trusted=True)
    requester = await factory.user(kudos=100_000)
    lapsing = await factory.worker(owner)
    streaming = await factory.worker(owner)
    cancelled_worker = await factory.worker(owner)

    # Expired: chat requests (two streaming a generation in flight, one with stored objects) and text requests.
    reasons = [("The reply is bad.", "ChatSubmitNonconformant"), (None, None)]
    expired_chat = [
        await factory.request(
            requester,
            expiry_seconds=-5,
            chat_fault_reason=reasons[i % 2][0],
            chat_fault_rc=reasons[i % 2][1],
            stream_progress=i < 2,
            chat_extras={"stream_progress": True} if i < 2 else {},
            chat_messages_offloaded=i == 2,
        )
        for i in range(6)
    ]
    expired_text = [await factory.request(requester, is_chat=False, expiry_seconds=-5) for _ in range(2)]
    signals = signal_client(redis_url)
    cache = redis_client(redis_url)
    streamed_gens = {}
    for wp in expired_chat[:2]:
        gen = await factory.generation(wp, streaming, owner, started_seconds_ago=5)
        lease = StreamLease(str(wp), str(streaming), "m", owner.id, "", 1024, 0, 150, 200, False)
        assert await write_stream_leases(signals, {str(gen): lease})
        streamed_gens[wp] = gen
    with_objects = expired_chat[2]
    image = f"{with_objects}_chat_0.jpg"
    async with factory.pool.acquire() as conn:
        await conn.execute(
            "UPDATE waiting_prompts SET messages = $2, has_images = true WHERE id = $1",
            with_objects,
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": f"horde-r2://{image}"}}],
                }
            ],
        )
    s3 = s3_endpoint.client()
    s3.put_object(Bucket=s3_endpoint.image_bucket, Key=image, Body=b"jpeg")
    s3.put_object(Bucket=s3_endpoint.messages_bucket, Key=f"{with_objects}_chat_messages.json", Body=b"[]")
    orphans = [f"{uuid.uuid4()}_chat_1.jpg" for _ in range(3)]
    for key in orphans:
        s3.put_object(Bucket=s3_endpoint.image_bucket, Key=key, Body=b"jpeg")
    await cache.sadd(CHAT_IMAGE_DELETE_RETRY_KEY, *orphans)

    # Lapsed leases: text requests' generations on a trusted owner's worker (their own metric label).
    lapsed = {}
    for _ in range(5):
        wp = await factory.request(requester, is_chat=False)
        lapsed[wp] = await factory.generation(wp, lapsing, owner, started_seconds_ago=300)

    # A cancelled streamed request whose cancel did not settle its generation.
    cancelled = await factory.request(
        requester, stream_progress=True, chat_extras={"stream_progress": True}, cancelled=True
    )
    cancelled_gen = await factory.generation(cancelled, cancelled_worker, owner, started_seconds_ago=5)

    before_chat, before_text = expired_count("true"), expired_count("false")
    before_lapsed, before_all = stale_aborts("true", "false"), all_stale_aborts()
    try:
        async with Channels(cache, expired_chat) as channels:
            results = await sweep_together(a, b)
            events = await channels.drain(cache)

        # Expiry: once each.
        assert sum(r.expired for r in results) == 8
        assert sum(r.expired_chat for r in results) == 6
        assert (expired_count("true") - before_chat, expired_count("false") - before_text) == (6, 2)
        for i, wp in enumerate(expired_chat):
            expected: dict[str, Any] = {"id": str(wp), "event": "faulted", "generations": 0}
            if reasons[i % 2][0] is not None:
                expected |= {"fault_reason": reasons[i % 2][0], "fault_rc": reasons[i % 2][1]}
            assert events[chat_signal_channel(str(wp))] == [expected]
        for wp in [*expired_chat, *expired_text]:
            assert await factory.row("SELECT 1 FROM waiting_prompts WHERE id = $1", wp) is None
        assert sum(r.leases_ended for r in results) == 2
        for wp, gen in streamed_gens.items():
            raw: Any = await signals.xrange(progress_stream_key(str(wp)))
            assert [(e.gen, e.ended) for e in (StreamEntry.from_fields(i, f) for i, f in raw)] == [
                (str(gen), True)
            ]
            assert await signals.exists(stream_lease_key(str(gen))) == 0
        assert sum(r.objects_deleted for r in results) == 2
        assert sum(r.objects_failed for r in results) == 0

        def stored(bucket: str, key: str) -> bool:
            return bool(s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0))

        assert not stored(s3_endpoint.image_bucket, image)
        assert not stored(s3_endpoint.messages_bucket, f"{with_objects}_chat_messages.json")
        # The retry set: worked by either or both, every key deleted and out of the set.
        assert sum(r.objects_retried for r in results) >= len(orphans)
        assert not any([await cache.sismember(CHAT_IMAGE_DELETE_RETRY_KEY, k) for k in orphans])
        assert not any(stored(s3_endpoint.image_bucket, k) for k in orphans)
        streamer = await factory.row(
            "SELECT aborted_jobs, uncompleted_jobs FROM workers WHERE id = $1", streaming
        )
        assert (streamer["aborted_jobs"], streamer["uncompleted_jobs"]) == (0, 0)  # expired, not faulted

        # Lapsed leases: each faulted, restarted and counted once.
        assert stale_aborts("true", "false") - before_lapsed == 5
        assert all_stale_aborts() - before_all == sum(r.stale_faulted for r in results)
        for wp, gen in lapsed.items():
            g = await factory.row("SELECT faulted FROM processing_gens WHERE id = $1", gen)
            assert g["faulted"] is True
            row = await factory.row("SELECT n, faulted FROM waiting_prompts WHERE id = $1", wp)
            assert (row["n"], row["faulted"]) == (1, False)
        w = await factory.row("SELECT aborted_jobs, uncompleted_jobs FROM workers WHERE id = $1", lapsing)
        assert (w["aborted_jobs"], w["uncompleted_jobs"]) == (5, 5)

        # The cancelled generation: settled (paid) once.
        assert sum(r.cancels_settled for r in results) == 1
        settled = await factory.row(
            """SELECT g.faulted, g.cancelled, g.kudos AS gen_kudos, w.kudos AS worker_kudos, w.aborted_jobs
                 FROM processing_gens g JOIN workers w ON w.id = g.worker_id WHERE g.id = $1""",
            cancelled_gen,
        )
        assert (settled["faulted"], settled["cancelled"], settled["aborted_jobs"]) == (True, True, 0)
        assert settled["gen_kudos"] > 0
        assert settled["worker_kudos"] == pytest.approx(settled["gen_kudos"])
    finally:
        await signals.aclose()
        await cache.aclose()


async def test_the_stale_sweep_leaves_a_request_past_its_expiry_to_the_expiry(
    replicas: tuple[Janitor, Janitor], factory: Any
) -> None:
    """A lapsed lease of a request past its expiry is not faulted by the stale sweep (another replica's expiry
    may hold the request): the expiry deletes it, its worker counts no dropped job."""
    a, b = replicas
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester, expiry_seconds=-5)
    gen = await factory.generation(wp, worker, owner, started_seconds_ago=300)
    before = all_stale_aborts()
    swept = PassResult()
    await b.fault_stale(swept)
    assert (await factory.row("SELECT faulted FROM processing_gens WHERE id = $1", gen))["faulted"] is False
    assert all_stale_aborts() == before + swept.stale_faulted
    result = PassResult()
    await a.expire(result)
    assert result.expired >= 1
    assert await factory.row("SELECT 1 FROM waiting_prompts WHERE id = $1", wp) is None
    w = await factory.row("SELECT aborted_jobs, uncompleted_jobs FROM workers WHERE id = $1", worker)
    assert (w["aborted_jobs"], w["uncompleted_jobs"]) == (0, 0)
