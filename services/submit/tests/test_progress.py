"""POST /v2/generate/text/progress, lease upkeep at submit and fault, and SettleCancelledGeneration
(docs/native-api.md#progress, #job-lease, #pricing)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as redis
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_core.chat_stream import (
    LeaseField,
    StreamLease,
    lease_key_check,
    progress_stream_key,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.grpc import insecure_channel
from horde_store.users import hash_api_key
from horde_submit import pricing
from horde_submit.app import create_app
from horde_submit.settings import SubmitSettings
from horde_testing.pytest_plugin import TEST_SECRET_KEY

PROGRESS = "/v2/generate/text/progress"
SUBMIT = "/v2/generate/text/submit"


@pytest.fixture(scope="module")
def signal_db(signal_redis: redis.Redis) -> redis.Redis:
    """The chat signal database (7), where leases and streams live."""
    return signal_redis


@pytest.fixture(scope="module")
def url_db(url_redis: redis.Redis) -> redis.Redis:
    """The database the Redis URL names (0): nothing of the progress stream may land there."""
    return url_redis


async def streamed_job(
    factory,
    signal_db,
    *,
    started_ago: float = 5,
    lease_cap: int = 200,
    max_bytes: int = 8192,
    cancelled: bool = False,
    trusted: bool = False,
    job_ttl: int = 150,
):  # type: ignore[no-untyped-def]
    """A popped streamed chat job and the lease the pop writes (started ``started_ago`` seconds ago)."""
    job = await factory.job(chat_extras={"stream_progress": True}, owner_trusted=trusted)
    await factory.row(
        "UPDATE waiting_prompts SET stream_progress = true WHERE id = $1 RETURNING id", job.wp_id
    )
    started = int(time.time() - started_ago)
    await factory.row(
        "UPDATE processing_gens SET started_at = to_timestamp($2), lease_cap = $3, job_ttl = $4 WHERE id = $1 "
        "RETURNING id",
        job.gen_id,
        float(started),
        lease_cap,
        job_ttl,
    )
    lease = StreamLease(
        request_id=str(job.wp_id),
        worker_id=str(job.worker_id),
        model=job.model,
        owner_id=job.owner.id,
        key_check=lease_key_check(hash_api_key(job.owner.api_key, TEST_SECRET_KEY)),
        max_bytes=max_bytes,
        started=started,
        job_ttl=job_ttl,
        lease_cap=lease_cap,
        trusted=trusted,
    )
    assert await write_stream_leases(signal_db, {str(job.gen_id): lease})
    if cancelled:
        await signal_db.hset(stream_lease_key(str(job.gen_id)), LeaseField.cancelled.value, "1")
    return job


def post_body(job, seq: int, content: str = "Hel", reasoning: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    delta = {"content": content}
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    return {"id": str(job.gen_id), "seq": seq, "delta": delta}


async def entries(signal_db, job) -> list[dict]:  # type: ignore[no-untyped-def]
    return [fields for _, fields in await signal_db.xrange(progress_stream_key(str(job.wp_id)))]


async def test_posts_append_in_sequence_and_retry(app_client, factory, signal_db, url_db) -> None:
    job = await streamed_job(factory, signal_db)
    key = {"apikey": job.owner.api_key}
    r = await app_client.post(PROGRESS, json=post_body(job, 1, "Hel", "hmm"), headers=key)
    assert (r.status_code, r.json()) == (200, {"accepted_seq": 1, "cancelled": False})
    r = await app_client.post(PROGRESS, json=post_body(job, 1, "Hel", "hmm"), headers=key)  # a retry
    assert (r.status_code, r.json()) == (200, {"accepted_seq": 1, "cancelled": False})
    r = await app_client.post(PROGRESS, json=post_body(job, 1, "Other"), headers=key)
    assert r.status_code == 409
    assert r.json() == {
        "message": "seq 1 is out of sequence; the next post of this generation is seq 2.",
        "rc": "ChatProgressOutOfSequence",
        "expected_seq": 2,
    }
    r = await app_client.post(PROGRESS, json=post_body(job, 3), headers=key)
    assert (r.status_code, r.json()["expected_seq"]) == (409, 2)
    r = await app_client.post(PROGRESS, json=post_body(job, 2, "lo"), headers=key)
    assert r.status_code == 200
    assert await entries(signal_db, job) == [
        {
            "gen": str(job.gen_id),
            "seq": "1",
            "content": "Hel",
            "reasoning_content": "hmm",
            "worker": str(job.worker_id),
            "model": job.model,
        },
        {
            "gen": str(job.gen_id),
            "seq": "2",
            "content": "lo",
            "worker": str(job.worker_id),
            "model": job.model,
        },
    ]
    assert 0 < await signal_db.ttl(progress_stream_key(str(job.wp_id))) <= 900
    assert await signal_db.hget(stream_lease_key(str(job.gen_id)), LeaseField.last_seq.value) == "2"
    # On the chat signal database only.
    assert await url_db.exists(progress_stream_key(str(job.wp_id))) == 0


async def test_refusals(app_client, factory, signal_db) -> None:
    job = await streamed_job(factory, signal_db)
    r = await app_client.post(
        PROGRESS,
        json={"id": str(job.gen_id), "seq": 1, "delta": {"content": ""}},
        headers={"apikey": job.owner.api_key},
    )
    assert r.status_code == 400
    assert r.json() == {
        "message": "The delta carries neither content nor reasoning_content.",
        "rc": "BadRequest",
    }
    r = await app_client.post(PROGRESS, json=post_body(job, 1), headers={"apikey": job.requester.api_key})
    assert r.status_code == 403
    assert r.json() == {"message": "Wrong credentials to submit as this worker.", "rc": "WrongCredentials"}
    assert await entries(signal_db, job) == []


async def test_without_a_lease(app_client, factory) -> None:
    job = await factory.job()
    r = await app_client.post(PROGRESS, json=post_body(job, 1), headers={"apikey": job.owner.api_key})
    assert r.status_code == 404
    assert r.json() == {
        "message": f"Generation {job.gen_id} does not stream progress. Stop posting progress; still submit the reply.",
        "rc": "ChatProgressNotStreaming",
    }
    await factory.row("UPDATE processing_gens SET faulted = true WHERE id = $1 RETURNING id", job.gen_id)
    r = await app_client.post(PROGRESS, json=post_body(job, 1), headers={"apikey": job.owner.api_key})
    assert r.status_code == 404
    assert r.json() == {
        "message": f"Generation {job.gen_id} was aborted. Stop generating and do not submit it.",
        "rc": "ChatJobAborted",
    }
    r = await app_client.post(
        PROGRESS,
        json={"id": "gone", "seq": 1, "delta": {"content": "x"}},
        headers={"apikey": job.owner.api_key},
    )
    assert (r.status_code, r.json()["rc"]) == (404, "ChatJobAborted")


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'{"id": "a\\udc00", "seq": 1, "delta": {"content": "x"}}', "lone UTF-16 surrogate"),
        (b'{"id": "a", "seq": 1, "delta": {"content": "\\ud800"}}', "lone UTF-16 surrogate"),
        (b"[" * 100_000 + b"]" * 100_000, "The JSON body has more than 1024 elements"),
        (b'{"id": "x", "seq": 1, "delta": ' + b"[" * 65 + b"]" * 65 + b"}", "nests deeper than 64 levels"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"id": NaN}', "not valid JSON"),
    ],
)
async def test_hostile_bodies_are_400_before_any_store_is_touched(app_client, raw, message) -> None:
    r = await app_client.post(PROGRESS, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["rc"] == "BadRequest" and message in r.json()["message"]


async def test_a_body_past_any_cap_is_refused_unread(app_client) -> None:
    from horde_contract.limits import MAX_PROGRESS_BODY_BYTES

    raw = b'{"id": "x", "seq": 1, "delta": {"content": "' + b"a" * MAX_PROGRESS_BODY_BYTES + b'"}}'
    r = await app_client.post(PROGRESS, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json() == {
        "message": "This post is larger than any generation's progress cap. Stop posting progress; still submit "
        "the reply.",
        "rc": "ChatProgressCapReached",
    }


async def test_nul_is_relayed_as_the_submit_stores_it(app_client, factory, signal_db) -> None:
    job = await streamed_job(factory, signal_db)
    r = await app_client.post(
        PROGRESS, json=post_body(job, 1, "a\x00b", "r\x00"), headers={"apikey": job.owner.api_key}
    )
    assert r.status_code == 200
    (entry,) = await entries(signal_db, job)
    assert (entry["content"], entry["reasoning_content"]) == ("a\ufffdb", "r\ufffd")


async def test_byte_cap(app_client, factory, signal_db) -> None:
    job = await streamed_job(factory, signal_db, max_bytes=10)
    key = {"apikey": job.owner.api_key}
    assert (await app_client.post(PROGRESS, json=post_body(job, 1, "12345"), headers=key)).status_code == 200
    r = await app_client.post(PROGRESS, json=post_body(job, 2, "123456"), headers=key)
    assert r.status_code == 413
    assert r.json()["rc"] == "ChatProgressCapReached"


async def test_lease_renewal_up_to_the_cap(app_client, factory, signal_db, metric) -> None:
    job = await streamed_job(factory, signal_db, started_ago=100, lease_cap=200)
    key = {"apikey": job.owner.api_key}
    before = await metric(
        app_client, "horde_text_lease_renewals_total", {"outcome": "granted", "worker_trusted": "false"}
    )
    assert (await app_client.post(PROGRESS, json=post_body(job, 1), headers=key)).status_code == 200
    gen = await factory.row("SELECT job_ttl FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["job_ttl"] == 200  # 100 s + 150 s, capped at 200 s from the pop
    assert await signal_db.hget(stream_lease_key(str(job.gen_id)), LeaseField.job_ttl.value) == "200"
    # The stream lease's expiry moved with it: started + 200 + 90 s, about 190 s from now.
    assert 185 <= await signal_db.ttl(stream_lease_key(str(job.gen_id))) <= 190
    after = await metric(
        app_client, "horde_text_lease_renewals_total", {"outcome": "granted", "worker_trusted": "false"}
    )
    assert after == before + 1
    at_cap = await metric(
        app_client, "horde_text_lease_renewals_total", {"outcome": "at_cap", "worker_trusted": "false"}
    )
    assert (await app_client.post(PROGRESS, json=post_body(job, 2), headers=key)).status_code == 200
    assert (
        await metric(
            app_client, "horde_text_lease_renewals_total", {"outcome": "at_cap", "worker_trusted": "false"}
        )
        == at_cap + 1
    )


@pytest.fixture(scope="module")
async def short_lease_client(submit_settings: SubmitSettings) -> AsyncIterator[httpx.AsyncClient]:
    """A second submit app on the same stores with HORDE_TEXT_JOB_LEASE_SECONDS=20."""
    settings = submit_settings.model_copy(update={"text_job_lease_seconds": 20, "submit_grpc_enabled": False})
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://submit") as client:
            yield client


async def renewed(client, factory, signal_db, lease_seconds: int = 150, **job_kwargs):  # type: ignore[no-untyped-def]
    """Post seq 1 of a fresh streamed job; the generation's job_ttl, the lease's, the lease's TTL after, and
    the job_ttl values a renewal to ``lease_seconds`` after the post may give (the post's second is only
    known to lie between the clock readings around it, however slow the machine)."""
    job = await streamed_job(factory, signal_db, **job_kwargs)
    lease = stream_lease_key(str(job.gen_id))
    started = int(await signal_db.hget(lease, LeaseField.started.value))
    before = time.time()
    r = await client.post(PROGRESS, json=post_body(job, 1), headers={"apikey": job.owner.api_key})
    after = time.time()
    assert r.status_code == 200
    gen = await factory.row("SELECT job_ttl FROM processing_gens WHERE id = $1", job.gen_id)
    possible = range(
        math.ceil(before - started + lease_seconds), math.ceil(after - started + lease_seconds) + 1
    )
    return (
        gen["job_ttl"],
        await signal_db.hget(lease, LeaseField.job_ttl.value),
        await signal_db.ttl(lease),
        possible,
    )


async def test_renewal_extends_by_the_configured_lease(
    app_client, short_lease_client, factory, signal_db
) -> None:
    # Popped 8 s ago with a 10 s lease: a post now extends it to end 20 s (150 s by default) after the post.
    job_ttl, lease_ttl, expiry, possible = await renewed(
        short_lease_client, factory, signal_db, lease_seconds=20, started_ago=8, job_ttl=10
    )
    assert job_ttl in possible and lease_ttl == str(job_ttl)
    # The lease expires started + job_ttl + 90 s grace; TTL was read a moment after the post.
    assert job_ttl + 90 - (possible[-1] - 20) - 2 <= expiry <= job_ttl + 90 - 8
    job_ttl, lease_ttl, _, possible = await renewed(app_client, factory, signal_db, started_ago=8, job_ttl=10)
    assert job_ttl in possible and lease_ttl == str(job_ttl)
    # A post after the short lease lapsed does not extend it.
    job_ttl, lease_ttl, _, _ = await renewed(
        short_lease_client, factory, signal_db, started_ago=15, job_ttl=10
    )
    assert (job_ttl, lease_ttl) == (10, "10")


async def test_cancelled_lease_answers_cancelled_without_renewal(app_client, factory, signal_db) -> None:
    job = await streamed_job(factory, signal_db, started_ago=100, cancelled=True)
    r = await app_client.post(PROGRESS, json=post_body(job, 1), headers={"apikey": job.owner.api_key})
    assert (r.status_code, r.json()) == (200, {"accepted_seq": 1, "cancelled": True})
    gen = await factory.row("SELECT job_ttl FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["job_ttl"] == 150


async def test_submit_deletes_the_lease_and_a_fault_ends_the_stream(
    app_client, factory, signal_db, url_db
) -> None:
    job = await streamed_job(factory, signal_db)
    body = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": "Hello"},
        "finish_reason": "stop",
        "model_id": job.model,
    }
    assert (
        await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    ).status_code == 200
    assert await signal_db.exists(stream_lease_key(str(job.gen_id))) == 0

    job = await streamed_job(factory, signal_db)
    body = {"id": str(job.gen_id), "state": "faulted", "model_id": job.model}
    assert (
        await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    ).status_code == 200
    assert await signal_db.exists(stream_lease_key(str(job.gen_id))) == 0
    assert await entries(signal_db, job) == [{"gen": str(job.gen_id), "ended": "1"}]
    assert await url_db.exists(progress_stream_key(str(job.wp_id))) == 0


async def test_settle_cancelled_generation(app_client, submit_settings, factory, signal_db) -> None:
    job = await streamed_job(factory, signal_db)
    key = {"apikey": job.owner.api_key}
    for seq, part in enumerate(["a" * 100, "b" * 100, "c" * 40], start=1):
        assert (
            await app_client.post(PROGRESS, json=post_body(job, seq, part, "r" * 50), headers=key)
        ).status_code == 200
    # The cancel (admission's) has claimed the request: only then is its streamed generation settled as cancelled.
    await factory.row(
        "UPDATE waiting_prompts SET cancelled = true, n = 0 WHERE id = $1 RETURNING id", job.wp_id
    )
    channel = insecure_channel(f"127.0.0.1:{submit_settings.submit_grpc_port}")
    try:
        stub = settlement_pb2_grpc.SettlementServiceStub(channel)
        request = settlement_pb2.SettleCancelledGenerationRequest(generation_id=str(job.gen_id))
        first = await stub.SettleCancelledGeneration(request, timeout=5)
        again = await stub.SettleCancelledGeneration(request, timeout=5)
    finally:
        await channel.close()
    expected = pricing.generation_kudos(
        pricing.PricingInputs(
            reply_characters=240,
            prompt_characters=len("user: Hello there"),
            max_length=512,
            max_context_length=4096,
            parameters_billion=None,
            bridge_agent="horde-worker:0.1:test",
            owner_trusted=False,
        )
    )
    assert (first.settled, first.character_count, first.kudos) == (True, 240, pytest.approx(expected))
    assert again.settled is False
    gen = await factory.row(
        "SELECT faulted, cancelled, settled_character_count, generation, finish_reason, charge_basis, kudos "
        "FROM processing_gens WHERE id = $1",
        job.gen_id,
    )
    assert (gen["faulted"], gen["cancelled"], gen["settled_character_count"]) == (True, True, 240)
    assert (gen["generation"], gen["finish_reason"], gen["charge_basis"]) == (None, None, None)
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - expected - 1)
    worker = await factory.row(
        "SELECT kudos, aborted_jobs, uncompleted_jobs FROM workers WHERE id = $1", job.worker_id
    )
    assert worker["kudos"] == pytest.approx(expected)
    assert (worker["aborted_jobs"], worker["uncompleted_jobs"]) == (0, 0)
    wp = await factory.row("SELECT n FROM waiting_prompts WHERE id = $1", job.wp_id)
    assert wp["n"] == 0  # not restarted
    body = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": "late"},
        "finish_reason": "stop",
        "model_id": job.model,
    }
    r = await app_client.post(SUBMIT, json=body, headers=key)
    assert (r.status_code, r.json()["rc"]) == (400, "AbortedGen")
