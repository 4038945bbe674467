"""Against real stores and a real submit process: a cancel whose settlement call failed is settled by the
sweep (never faulted as a dropped job), an expired request ends its generations' progress (so a post is
ChatJobAborted), and S3 per-key delete errors go to the retry set.

See docs/native-api.md#pricing and #submit (a cancelled streamed generation is settled on its
posted content, faulted as cancelled, does not count toward the worker's aborted-job threshold and is not
restarted), docs/native-api.md#progress (ChatJobAborted "is not stored, as after its request expired"),
docs/native-api.md#completion-signal (expiry), docs/native-api.md#images ("A key the store does not delete is added to the Redis set
horde:chat:image_delete_retry ... each cleanup tick retries up to 1000 of them, removing each key that
deletes").
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from horde_core.chat_stream import (
    LeaseField,
    StreamLease,
    lease_key_check,
    progress_stream_key,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.redis_keys import CHAT_IMAGE_DELETE_RETRY_KEY, redis_client, signal_client
from horde_janitor.objects import ObjectCleaner
from horde_janitor.sweeper import Janitor
from horde_store.objects import delete_objects
from horde_store.users import hash_api_key
from horde_testing.pytest_plugin import TEST_SECRET_KEY
from prometheus_client import REGISTRY

PROGRESS = "/v2/generate/text/progress"


def stale_aborts(trusted: str, chat: str) -> float:
    value = REGISTRY.get_sample_value(
        "horde_text_stale_aborts_total", {"worker_trusted": trusted, "chat": chat}
    )
    return value or 0.0


@pytest.fixture
async def signals(redis_url: str):  # type: ignore[no-untyped-def]
    client = signal_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def streamed(factory, requester, owner, worker, *, started_ago: float = 5, **request: Any):  # type: ignore[no-untyped-def]
    """A streamed chat request and one generation in flight on ``worker``."""
    wp = await factory.request(
        requester, stream_progress=True, chat_extras={"stream_progress": True}, **request
    )
    gen = await factory.generation(wp, worker, owner, started_seconds_ago=started_ago)
    return wp, gen


async def write_lease(signals, wp, gen, worker, owner, *, fake: bool = False) -> None:  # type: ignore[no-untyped-def]
    lease = StreamLease(
        request_id=str(wp),
        worker_id=str(worker),
        model="test/model-7b",
        owner_id=owner.id,
        key_check=lease_key_check(hash_api_key(owner.api_key, TEST_SECRET_KEY)),
        max_bytes=8192,
        started=int(time.time()) - 5,
        job_ttl=150,
        lease_cap=200,
        trusted=False,
        fake=fake,
    )
    assert await write_stream_leases(signals, {str(gen): lease})


async def post_progress(submit_process, gen, owner, seq: int, content: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{submit_process.http_port}", trust_env=False
    ) as client:
        return await client.post(
            PROGRESS,
            json={"id": str(gen), "seq": seq, "delta": {"content": content}},
            headers={"apikey": owner.api_key},
        )


async def money(factory, gen, worker, requester) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    row = await factory.row(
        """
        SELECT g.faulted, g.cancelled, g.generation, g.settled_character_count, g.kudos AS gen_kudos,
               w.kudos AS worker_kudos, w.aborted_jobs, w.uncompleted_jobs, w.maintenance,
               r.kudos AS requester_kudos, wp.n, wp.consumed_kudos
          FROM processing_gens g JOIN workers w ON w.id = g.worker_id
          JOIN waiting_prompts wp ON wp.id = g.wp_id JOIN users r ON r.id = wp.user_id
         WHERE g.id = $1
        """,
        gen,
    )
    assert row is not None
    return dict(row)


# --- A cancel whose settlement call failed ----------------------------------------------------------------


async def test_sweep_settles_a_cancelled_streamed_generation_on_its_posted_content(
    janitor: Janitor, factory, submit_process, signals
) -> None:
    """The cancel claimed the request and flagged the lease, but its SettleCancelledGeneration call failed: the
    generation is still pending and its worker stopped. The next pass settles it through submit as the cancel
    would have: paid on the posted content, the requester charged with the extra burn, faulted as cancelled,
    not restarted, no aborted or uncompleted job counted, the hold released, and no stale abort counted."""
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp, gen = await streamed(factory, requester, owner, worker, hold=50)
    await write_lease(signals, wp, gen, worker, owner)
    for seq, part in enumerate(["a" * 90, "b" * 70], start=1):
        r = await post_progress(submit_process, gen, owner, seq, part)
        assert r.status_code == 200, r.text
    async with factory.pool.acquire() as conn:
        await conn.execute("UPDATE waiting_prompts SET n = 0, cancelled = true WHERE id = $1", wp)
    await signals.hset(stream_lease_key(str(gen)), LeaseField.cancelled.value, "1")
    before = stale_aborts("false", "true")
    result = await janitor.run_pass()
    assert result.cancels_settled == 1 and result.stale_faulted == 0
    assert stale_aborts("false", "true") == before
    state = await money(factory, gen, worker, requester)
    assert (state["faulted"], state["cancelled"], state["generation"]) == (True, True, None)
    assert state["settled_character_count"] == 160
    assert state["gen_kudos"] > 0
    assert state["worker_kudos"] == pytest.approx(state["gen_kudos"])
    assert state["requester_kudos"] == pytest.approx(1000 - state["gen_kudos"] - 1)
    assert (state["aborted_jobs"], state["uncompleted_jobs"], state["maintenance"], state["n"]) == (
        0,
        0,
        False,
        0,
    )
    assert await factory.row("SELECT 1 FROM kudos_holds WHERE wp_id = $1", wp) is None
    # A later pass finds nothing more to do.
    again = await janitor.run_pass()
    assert again.cancels_settled == 0
    assert await money(factory, gen, worker, requester) == state


async def test_lapsed_cancelled_streamed_generation_is_settled_not_faulted(janitor: Janitor, factory) -> None:
    """Its lease lapsed too (the worker stopped when told): still settled as cancelled, at the floor of 20 tokens
    without a post, and not counted toward the worker's aborted-job threshold."""
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp, gen = await streamed(factory, requester, owner, worker, started_ago=400)
    async with factory.pool.acquire() as conn:
        await conn.execute("UPDATE waiting_prompts SET n = 0, cancelled = true WHERE id = $1", wp)
    result = await janitor.run_pass()
    assert result.cancels_settled == 1
    state = await money(factory, gen, worker, requester)
    assert (state["faulted"], state["cancelled"], state["settled_character_count"]) == (True, True, 0)
    assert state["worker_kudos"] > 0
    assert (state["aborted_jobs"], state["uncompleted_jobs"]) == (0, 0)


async def test_lapsed_generation_of_a_cancelled_request_that_does_not_stream_is_a_dropped_job(
    janitor: Janitor, factory
) -> None:
    """Without streaming the worker was never told to stop, so its lapsed lease is a dropped job as usual: faulted
    (not restarted, the request being cancelled) and counted."""
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester)
    gen = await factory.generation(wp, worker, owner, started_seconds_ago=400)
    async with factory.pool.acquire() as conn:
        await conn.execute("UPDATE waiting_prompts SET n = 0, cancelled = true WHERE id = $1", wp)
    result = await janitor.run_pass()
    assert result.cancels_settled == 0 and result.stale_faulted >= 1
    state = await money(factory, gen, worker, requester)
    assert (state["faulted"], state["cancelled"], state["n"]) == (True, False, 0)
    assert (state["aborted_jobs"], state["uncompleted_jobs"], state["worker_kudos"]) == (1, 1, 0)


# --- Expiry ends the progress of in-flight streamed generations -------------------------------------------


async def test_expiry_ends_progress_so_a_post_on_the_left_lease_is_chat_job_aborted(
    janitor: Janitor, factory, submit_process, signals
) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp, gen = await streamed(factory, requester, owner, worker, expiry_seconds=-5)
    fake = await factory.generation(wp, worker, owner)
    async with factory.pool.acquire() as conn:
        await conn.execute("UPDATE processing_gens SET fake = true WHERE id = $1", fake)
    await write_lease(signals, wp, gen, worker, owner)
    await write_lease(signals, wp, fake, worker, owner, fake=True)
    result = await janitor.run_pass()
    assert result.leases_ended == 2
    assert await factory.row("SELECT 1 FROM waiting_prompts WHERE id = $1", wp) is None
    assert await signals.exists(stream_lease_key(str(gen)), stream_lease_key(str(fake))) == 0
    fields = [f for _, f in await signals.xrange(progress_stream_key(str(wp)))]
    assert fields == [{"gen": str(gen), "ended": "1"}]  # none for the fake generation
    for target in (gen, fake):
        r = await post_progress(submit_process, target, owner, 1, "more")
        assert r.status_code == 404
        assert r.json() == {
            "message": f"Generation {target} was aborted. Stop generating and do not submit it.",
            "rc": "ChatJobAborted",
        }


# --- S3 per-key delete errors -------------------------------------------------------------------------------


@pytest.fixture
def guarded_bucket(s3_endpoint: Any) -> Iterator[tuple[Any, str]]:
    """A bucket of its own (a policy on the shared ones would reach other tests) and a client; the bucket's
    policy is whatever the test sets, and the bucket is emptied and removed afterwards."""
    client = s3_endpoint.client()
    bucket = f"keyerr-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    try:
        yield client, bucket
    finally:
        client.delete_bucket_policy(Bucket=bucket)
        for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)


def deny_delete(client: Any, bucket: str, *keys: str) -> None:
    """A bucket policy refusing s3:DeleteObject on ``keys``: DeleteObjects then answers HTTP 200 with a per-key
    ``Errors`` entry (AccessDenied) for each of them and deletes the others."""
    statement = {
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:DeleteObject",
        "Resource": [f"arn:aws:s3:::{bucket}/{key}" for key in keys],
    }
    client.put_bucket_policy(
        Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    )


def stored(client: Any, bucket: str, key: str) -> bool:
    return bool(client.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0))


def test_delete_objects_returns_the_keys_the_store_refused(guarded_bucket) -> None:
    client, bucket = guarded_bucket
    keys = [f"{uuid.uuid4()}_chat_{n}.jpg" for n in range(3)]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b"jpeg")
    deny_delete(client, bucket, keys[1])
    # The store's own answer: a 200 whose Errors names the refused key.
    answer = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": keys[1]}], "Quiet": True})
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert [(e["Key"], e["Code"]) for e in answer["Errors"]] == [(keys[1], "AccessDenied")]
    missing = f"{uuid.uuid4()}_chat_0.jpg"  # never stored: S3 answers it as deleted
    assert delete_objects(client, bucket, [*keys, missing]) == [keys[1]]
    assert [stored(client, bucket, k) for k in keys] == [False, True, False]
    # A whole call that fails (no such bucket) returns every key.
    assert delete_objects(client, f"absent-{uuid.uuid4().hex[:8]}", keys) == keys


async def test_per_key_delete_errors_go_to_the_retry_set(
    janitor: Janitor, factory, guarded_bucket, redis_url: str
) -> None:
    """An expired chat request's image and messages object the store refuses to delete are queued in
    horde:chat:image_delete_retry (the deleted one is not); the pass's retry leaves them there while the store
    refuses, and the pass after the store relents deletes them and empties them out of the set."""
    client, bucket = guarded_bucket
    cache = redis_client(redis_url)
    cleaner = ObjectCleaner(client, bucket, bucket, cache)
    sweeper = Janitor(janitor.pool, janitor.signal, janitor.settlement, objects=cleaner)
    requester = await factory.user()
    wp = await factory.request(requester, expiry_seconds=-1, chat_messages_offloaded=True)
    images = [f"{wp}_chat_0.jpg", f"{wp}_chat_1.jpg"]
    messages_key = f"{wp}_chat_messages.json"
    parts = [{"type": "image_url", "image_url": {"url": f"horde-r2://{key}"}} for key in images]
    async with factory.pool.acquire() as conn:
        await conn.execute(
            "UPDATE waiting_prompts SET messages = $2, has_images = true WHERE id = $1",
            wp,
            [{"role": "user", "content": [{"type": "text", "text": "what are these?"}, *parts]}],
        )
    for key in [*images, messages_key]:
        client.put_object(Bucket=bucket, Key=key, Body=b"data")
    deny_delete(client, bucket, images[1], messages_key)
    try:
        result = await sweeper.run_pass()
        assert (result.objects_deleted, result.objects_failed) == (3, 2)
        queued = await cache.smembers(CHAT_IMAGE_DELETE_RETRY_KEY)
        assert {images[1], messages_key} <= queued and images[0] not in queued
        assert not stored(client, bucket, images[0])
        assert stored(client, bucket, images[1]) and stored(client, bucket, messages_key)
        # Still refused: the retry keeps them queued.
        await cleaner.retry()
        assert {images[1], messages_key} <= await cache.smembers(CHAT_IMAGE_DELETE_RETRY_KEY)
        client.delete_bucket_policy(Bucket=bucket)
        result = await sweeper.run_pass()
        assert result.objects_retried >= 2
        assert not stored(client, bucket, images[1]) and not stored(client, bucket, messages_key)
        assert not {images[1], messages_key} & await cache.smembers(CHAT_IMAGE_DELETE_RETRY_KEY)
    finally:
        await cache.srem(CHAT_IMAGE_DELETE_RETRY_KEY, *images, messages_key)
        await cache.aclose()
