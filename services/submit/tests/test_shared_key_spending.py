"""Shared keys at the worker routes and at settlement (docs/native-api.md#submit Money, #kudos Shared keys).

A shared key is a spending key: submit and progress take only the worker owner's own key (a shared key of that
owner is 401 InvalidAPIKey at submit, as upstream's ``find_user_by_api_key`` never resolves one, and 403
WrongCredentials at progress, whose only key refusal that is). Settlement and cancel settlement debit the shared
key a request was sent with by the requester's charge (kudos + 1), floored at 0; an unlimited key (-1) stays
unlimited; both add the charge to the key's ``utilized``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_core.chat_stream import StreamLease, lease_key_check, progress_stream_key, write_stream_leases
from horde_core.grpc import insecure_channel
from horde_store.users import hash_api_key
from horde_submit import pricing
from horde_testing.pytest_plugin import TEST_SECRET_KEY

SUBMIT = "/v2/generate/text/submit"
PROGRESS = "/v2/generate/text/progress"
PROMPT = "user: Hello there"


def expected_reward(characters: int) -> float:
    """The reward of a reply of ``characters`` on the factory's job (unknown model, untrusted owner)."""
    return pricing.generation_kudos(
        pricing.PricingInputs(
            reply_characters=characters,
            prompt_characters=len(PROMPT),
            max_length=512,
            max_context_length=4096,
            parameters_billion=None,
            bridge_agent="horde-worker:0.1:test",
            owner_trusted=False,
        )
    )


async def shared_key(factory: Any, user_id: int, kudos: float, *, expired: bool = False) -> uuid.UUID:
    row = await factory.row(
        "INSERT INTO user_shared_keys (user_id, kudos, expiry) "
        "VALUES ($1, $2, CASE WHEN $3 THEN now() - interval '1 day' END) RETURNING id",
        user_id,
        kudos,
        expired,
    )
    key_id: uuid.UUID = row["id"]
    return key_id


async def sent_with(factory: Any, wp_id: uuid.UUID, key_id: uuid.UUID) -> None:
    """The request was submitted with the shared key (admission stores it on the row)."""
    await factory.row(
        "UPDATE waiting_prompts SET shared_key_id = $2 WHERE id = $1 RETURNING id", wp_id, key_id
    )


async def key_state(factory: Any, key_id: uuid.UUID) -> tuple[float, float]:
    row = await factory.row("SELECT kudos, utilized FROM user_shared_keys WHERE id = $1", key_id)
    return row["kudos"], row["utilized"]


def chat_reply(job: Any, content: str) -> dict[str, Any]:
    return {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "model_id": job.model,
    }


async def test_submit_and_progress_refuse_the_owners_shared_keys(app_client, factory, signal_redis) -> None:
    job = await factory.job(chat_extras={"stream_progress": True})
    await factory.row(
        "UPDATE waiting_prompts SET stream_progress = true WHERE id = $1 RETURNING id", job.wp_id
    )
    lease = StreamLease(
        request_id=str(job.wp_id),
        worker_id=str(job.worker_id),
        model=job.model,
        owner_id=job.owner.id,
        key_check=lease_key_check(hash_api_key(job.owner.api_key, TEST_SECRET_KEY)),
        max_bytes=8192,
        started=int(time.time() - 2),
        job_ttl=150,
        lease_cap=200,
        trusted=False,
    )
    assert await write_stream_leases(signal_redis, {str(job.gen_id): lease})
    valid = await shared_key(factory, job.owner.id, -1)
    expired = await shared_key(factory, job.owner.id, 100, expired=True)
    for key in (valid, expired):
        r = await app_client.post(SUBMIT, json=chat_reply(job, "Hi"), headers={"apikey": str(key)})
        assert (r.status_code, r.json()) == (
            401,
            {
                "message": "No user matching sent API Key. Have you remembered to register at "
                "https://stablehorde.net/register ?",
                "rc": "InvalidAPIKey",
            },
        )
        r = await app_client.post(
            PROGRESS,
            json={"id": str(job.gen_id), "seq": 1, "delta": {"content": "Hel"}},
            headers={"apikey": str(key)},
        )
        assert (r.status_code, r.json()) == (
            403,
            {"message": "Wrong credentials to submit as this worker.", "rc": "WrongCredentials"},
        )
    assert await signal_redis.xrange(progress_stream_key(str(job.wp_id))) == []
    gen = await factory.row("SELECT generation, faulted FROM processing_gens WHERE id = $1", job.gen_id)
    assert (gen["generation"], gen["faulted"]) == (None, False)
    assert (await factory.row("SELECT kudos FROM workers WHERE id = $1", job.worker_id))["kudos"] == 0
    # The owner's own key is still the worker's credential.
    r = await app_client.post(SUBMIT, json=chat_reply(job, "Hi"), headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text


async def test_settlement_debits_the_shared_key_by_the_charge(app_client, factory) -> None:
    job = await factory.job(prompt=PROMPT)
    key = await shared_key(factory, job.requester.id, 500)
    await sent_with(factory, job.wp_id, key)
    content = "Hello! " * 30
    r = await app_client.post(SUBMIT, json=chat_reply(job, content), headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text
    reward = r.json()["reward"]
    assert reward == expected_reward(len(content)) and reward > 0
    charge = reward + 1
    assert await key_state(factory, key) == (pytest.approx(500 - charge), pytest.approx(charge))
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - charge)
    # A duplicate submit settles nothing more.
    again = await app_client.post(
        SUBMIT, json=chat_reply(job, content), headers={"apikey": job.owner.api_key}
    )
    assert (again.status_code, again.json()["rc"]) == (400, "DuplicateGen")
    assert await key_state(factory, key) == (pytest.approx(500 - charge), pytest.approx(charge))


async def test_an_unlimited_key_stays_unlimited_and_a_short_key_floors_at_zero(app_client, factory) -> None:
    unlimited_job = await factory.job(prompt=PROMPT)
    unlimited = await shared_key(factory, unlimited_job.requester.id, -1)
    await sent_with(factory, unlimited_job.wp_id, unlimited)
    r = await app_client.post(
        SUBMIT, json=chat_reply(unlimited_job, "x" * 200), headers={"apikey": unlimited_job.owner.api_key}
    )
    assert r.status_code == 200, r.text
    charge = r.json()["reward"] + 1
    assert await key_state(factory, unlimited) == (-1.0, pytest.approx(charge))

    # A legacy text job: the same settlement; the key had less than the charge.
    short_job = await factory.job(is_chat=False, prompt="Once upon a time")
    short = await shared_key(factory, short_job.requester.id, 0.5)
    await sent_with(factory, short_job.wp_id, short)
    r = await app_client.post(
        SUBMIT,
        json={"id": str(short_job.gen_id), "generation": "there was a horde. " * 10},
        headers={"apikey": short_job.owner.api_key},
    )
    assert r.status_code == 200, r.text
    charge = r.json()["reward"] + 1
    assert charge > 0.5
    assert await key_state(factory, short) == (0.0, pytest.approx(charge))
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", short_job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - charge)  # the owner pays the whole charge


async def test_a_censored_reply_debits_the_burn(app_client, factory) -> None:
    job = await factory.job(is_chat=False)
    key = await shared_key(factory, job.requester.id, 50)
    await sent_with(factory, job.wp_id, key)
    r = await app_client.post(
        SUBMIT,
        json={"id": str(job.gen_id), "generation": "x" * 100, "state": "censored"},
        headers={"apikey": job.owner.api_key},
    )
    assert r.status_code == 200, r.text
    assert await key_state(factory, key) == (49.0, 1.0)


async def test_cancel_settlement_debits_the_shared_key(
    app_client, submit_settings, factory, signal_redis
) -> None:
    job = await factory.job(chat_extras={"stream_progress": True}, prompt=PROMPT)
    await factory.row(
        "UPDATE waiting_prompts SET stream_progress = true, cancelled = true WHERE id = $1 RETURNING id",
        job.wp_id,
    )
    key = await shared_key(factory, job.requester.id, 300)
    await sent_with(factory, job.wp_id, key)
    lease = StreamLease(
        request_id=str(job.wp_id),
        worker_id=str(job.worker_id),
        model=job.model,
        owner_id=job.owner.id,
        key_check=lease_key_check(hash_api_key(job.owner.api_key, TEST_SECRET_KEY)),
        max_bytes=8192,
        started=int(time.time() - 2),
        job_ttl=150,
        lease_cap=200,
        trusted=False,
    )
    assert await write_stream_leases(signal_redis, {str(job.gen_id): lease})
    posted = "a" * 120
    r = await app_client.post(
        PROGRESS,
        json={"id": str(job.gen_id), "seq": 1, "delta": {"content": posted}},
        headers={"apikey": job.owner.api_key},
    )
    assert r.status_code == 200, r.text
    channel = insecure_channel(f"127.0.0.1:{submit_settings.submit_grpc_port}")
    try:
        stub = settlement_pb2_grpc.SettlementServiceStub(channel)
        request = settlement_pb2.SettleCancelledGenerationRequest(generation_id=str(job.gen_id))
        first = await stub.SettleCancelledGeneration(request, timeout=5)
        again = await stub.SettleCancelledGeneration(request, timeout=5)
    finally:
        await channel.close()
    reward = expected_reward(len(posted))
    assert (first.settled, first.character_count, first.kudos) == (True, len(posted), pytest.approx(reward))
    assert again.settled is False
    charge = reward + 1
    assert await key_state(factory, key) == (pytest.approx(300 - charge), pytest.approx(charge))
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - charge)
