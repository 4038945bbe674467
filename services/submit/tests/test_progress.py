"""POST /v2/generate/text/progress, lease upkeep at submit and fault, and SettleCancelledGeneration
(spec: **Streaming progress**, **Job lease**, **Pricing**)."""

from __future__ import annotations

import hashlib
import time

import pytest
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_core.grpc import insecure_channel
from horde_core.redis_keys import progress_stream_key, redis_client, stream_lease_key
from horde_store.users import hash_api_key
from horde_submit import pricing
from horde_testing.pytest_plugin import TEST_SECRET_KEY

PROGRESS = "/v2/generate/text/progress"
SUBMIT = "/v2/generate/text/submit"


@pytest.fixture(scope="module")
async def signal_db(redis_url):  # type: ignore[no-untyped-def]
    client = redis_client(redis_url, db=7)
    try:
        yield client
    finally:
        await client.aclose()


async def streamed_job(
    factory,
    signal_db,
    *,
    started_ago: float = 5,
    lease_cap: int = 200,
    max_bytes: int = 8192,
    cancelled: bool = False,
    trusted: bool = False,
):  # type: ignore[no-untyped-def]
    job = await factory.job(chat_extras={"stream_progress": True}, owner_trusted=trusted)
    await factory.row(
        "UPDATE waiting_prompts SET stream_progress = true WHERE id = $1 RETURNING id", job.wp_id
    )
    started = int(time.time() - started_ago)
    await factory.row(
        "UPDATE processing_gens SET started_at = to_timestamp($2), lease_cap = $3 WHERE id = $1 RETURNING id",
        job.gen_id,
        float(started),
        lease_cap,
    )
    fields = {
        "request": str(job.wp_id),
        "worker": str(job.worker_id),
        "model": job.model,
        "owner": job.owner.id,
        "key": hashlib.sha256(hash_api_key(job.owner.api_key, TEST_SECRET_KEY).encode()).hexdigest(),
        "max_bytes": max_bytes,
        "fake": 0,
        "started": started,
        "job_ttl": 150,
        "lease_cap": lease_cap,
        "trusted": 1 if trusted else 0,
    }
    if cancelled:
        fields["cancelled"] = 1
    await signal_db.hset(stream_lease_key(str(job.gen_id)), mapping=fields)
    await signal_db.expire(stream_lease_key(str(job.gen_id)), 240)
    return job


def post_body(job, seq: int, content: str = "Hel", reasoning: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    delta = {"content": content}
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    return {"id": str(job.gen_id), "seq": seq, "delta": delta}


async def entries(signal_db, job) -> list[dict]:  # type: ignore[no-untyped-def]
    return [fields for _, fields in await signal_db.xrange(progress_stream_key(str(job.wp_id)))]


async def test_posts_append_in_sequence_and_retry(app_client, factory, signal_db) -> None:
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
    assert await signal_db.hget(stream_lease_key(str(job.gen_id)), "job_ttl") == "200"
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


async def test_cancelled_lease_answers_cancelled_without_renewal(app_client, factory, signal_db) -> None:
    job = await streamed_job(factory, signal_db, started_ago=100, cancelled=True)
    r = await app_client.post(PROGRESS, json=post_body(job, 1), headers={"apikey": job.owner.api_key})
    assert (r.status_code, r.json()) == (200, {"accepted_seq": 1, "cancelled": True})
    gen = await factory.row("SELECT job_ttl FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["job_ttl"] == 150


async def test_submit_deletes_the_lease_and_a_fault_ends_the_stream(app_client, factory, signal_db) -> None:
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


async def test_settle_cancelled_generation(app_client, submit_settings, factory, signal_db) -> None:
    job = await streamed_job(factory, signal_db)
    key = {"apikey": job.owner.api_key}
    for seq, part in enumerate(["a" * 100, "b" * 100, "c" * 40], start=1):
        assert (
            await app_client.post(PROGRESS, json=post_body(job, seq, part, "r" * 50), headers=key)
        ).status_code == 200
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
