"""Legacy text submits (docs/native-api.md#submit, #kudos), pricing numbers (docs/native-api.md#pricing) and the Settlement gRPC service."""

from __future__ import annotations

import uuid

import grpc
import pytest
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_core.grpc import insecure_channel
from horde_submit import pricing

SUBMIT = "/v2/generate/text/submit"


async def test_text_submit_is_stored_and_charged(app_client, factory, subscribe) -> None:
    job = await factory.job(is_chat=False, max_length=80, max_context_length=2048, prompt="Once upon a time")
    text = "there was a horde\x00 of workers. " * 4
    async with subscribe(job.wp_id) as sub:
        r = await app_client.post(
            SUBMIT,
            json={
                "id": str(job.gen_id),
                "generation": text,
                "seed": 42,
                "gen_metadata": [{"type": "censorship", "value": "csam"}],
            },
            headers={"apikey": job.owner.api_key},
        )
        assert r.status_code == 200, r.text
        assert await sub.messages(1, wait=0.5) == []  # text requests do not publish
    tokens = min(max(-(-len(text) // 4), 20), 80)
    ctx = pricing.context_multiplier(len("Once upon a time"), 2048)
    assert r.json() == {"reward": round(ctx, 2)}  # unknown model, untrusted owner: ctx
    gen = await factory.row("SELECT * FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["generation"] == text.replace("\x00", "\ufffd")
    assert gen["message"] is None and gen["charge_basis"] is None
    assert gen["seed"] == 42
    assert gen["gen_metadata"] == [{"type": "censorship", "value": "csam"}]
    worker = await factory.row("SELECT contributions FROM workers WHERE id = $1", job.worker_id)
    assert worker["contributions"] == tokens
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - round(ctx, 2) - 1)


async def test_censored_text_submit_charges_only_the_burn(app_client, factory) -> None:
    job = await factory.job(is_chat=False, owner_trusted=True)
    r = await app_client.post(
        SUBMIT,
        json={"id": str(job.gen_id), "generation": "x" * 100, "state": "censored"},
        headers={"apikey": job.owner.api_key},
    )
    assert r.status_code == 200
    gen = await factory.row("SELECT state, censored FROM processing_gens WHERE id = $1", job.gen_id)
    assert (gen["state"], gen["censored"]) == ("censored", True)
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(999)


async def test_text_job_refuses_chat_and_missing_generation(app_client, factory) -> None:
    job = await factory.job(is_chat=False)
    r = await app_client.post(
        SUBMIT,
        json={
            "id": str(job.gen_id),
            "message": {"role": "assistant", "content": "x"},
            "finish_reason": "stop",
            "model_id": job.model,
        },
        headers={"apikey": job.owner.api_key},
    )
    assert r.status_code == 400
    assert r.json() == {
        "message": "A text job is submitted with generation; message belongs to chat jobs.",
        "rc": "ChatSubmitInvalid",
    }
    r = await app_client.post(SUBMIT, json={"id": str(job.gen_id)}, headers={"apikey": job.owner.api_key})
    assert r.status_code == 400
    assert r.json() == {
        "message": "'generation': Missing required parameter 'generation'.",
        "rc": "BadRequest",
    }
    gen = await factory.row(
        "SELECT generation, chat_refusal_rc FROM processing_gens WHERE id = $1", job.gen_id
    )
    assert (gen["generation"], gen["chat_refusal_rc"]) == (None, None)


async def test_api_path_alias(app_client, factory) -> None:
    job = await factory.job(is_chat=False)
    r = await app_client.post(
        "/api" + SUBMIT,
        json={"id": str(job.gen_id), "generation": "ok"},
        headers={"apikey": job.owner.api_key},
    )
    assert r.status_code == 200


def test_pricing_numbers() -> None:
    """The text formula (docs/native-api.md#submit): known model, bridge factor, trust on unknown models, caps."""
    base = dict(prompt_characters=4096, max_length=512, max_context_length=4096, owner_trusted=False)
    ctx = pricing.context_multiplier(4096, 4096)
    assert ctx == pytest.approx(1.2 + 2.2**0)  # 1024 prompt tokens
    known = pricing.PricingInputs(
        reply_characters=400, parameters_billion=13.0, bridge_agent="KoboldCppEmbedWorker:2:x", **base
    )
    assert pricing.generation_kudos(known) == round(100 * 1.0 * 13 / 125 * ctx, 2)
    unvalidated = pricing.PricingInputs(
        reply_characters=400, parameters_billion=13.0, bridge_agent="mine:1:x", **base
    )
    assert pricing.generation_kudos(unvalidated) == round(100 * 13 / 125 * 0.3 * ctx, 2)
    big = pricing.PricingInputs(
        reply_characters=400, parameters_billion=70.0, bridge_agent="TabbyAPI:1:x", **base
    )
    assert pricing.generation_kudos(big) == round(100 * (70 / 13) ** 0.2 * 70 / 125 * ctx, 2)
    # The charge counts at least 20 and at most max_length tokens.
    short = pricing.PricingInputs(
        reply_characters=1, parameters_billion=13.0, bridge_agent="TabbyAPI:1:x", **base
    )
    assert pricing.generation_kudos(short) == round(20 * 13 / 125 * ctx, 2)
    long = pricing.PricingInputs(
        reply_characters=100_000, parameters_billion=13.0, bridge_agent="TabbyAPI:1:x", **base
    )
    assert pricing.generation_kudos(long) == round(512 * 13 / 125 * ctx, 2)
    unknown = pricing.PricingInputs(reply_characters=400, parameters_billion=None, bridge_agent=None, **base)
    assert pricing.generation_kudos(unknown) == round(ctx, 2)
    trusted = pricing.PricingInputs(
        reply_characters=400,
        parameters_billion=None,
        bridge_agent=None,
        prompt_characters=4096,
        max_length=512,
        max_context_length=4096,
        owner_trusted=True,
    )
    assert pricing.generation_kudos(trusted) == round(100 * ctx * 0.027, 2)
    assert pricing.requester_charge(3.5) == 4.5
    assert pricing.requester_charge(3.5, censored=True) == 1.0
    assert pricing.escrow_split(3.0, owner_trusted=False, owner_anonymous=False) == (1.5, 1.5)
    assert pricing.escrow_split(3.0, owner_trusted=True, owner_anonymous=False) == (3.0, 0.0)
    assert pricing.speed_sample(400, 512, 10.0) == 10.0
    assert pricing.speed_sample(400, 512, 0) == 1.0
    assert pricing.context_multiplier(10**7, 10**7) == 30.0


async def test_grpc_fault_generation(app_client, submit_settings, factory) -> None:
    job = await factory.job()
    channel = insecure_channel(f"127.0.0.1:{submit_settings.submit_grpc_port}")
    try:
        stub = settlement_pb2_grpc.SettlementServiceStub(channel)
        request = settlement_pb2.FaultGenerationRequest(
            generation_id=str(job.gen_id), cause=settlement_pb2.FAULT_CAUSE_LEASE_LAPSED
        )
        first = await stub.FaultGeneration(request, timeout=5)
        second = await stub.FaultGeneration(request, timeout=5)
        assert (first.faulted, first.request_faulted) == (True, False)
        assert (second.faulted, second.request_faulted) == (False, False)
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.FaultGeneration(settlement_pb2.FaultGenerationRequest(generation_id="nope"), timeout=5)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        missing = await stub.FaultGeneration(
            settlement_pb2.FaultGenerationRequest(generation_id=str(uuid.uuid4())), timeout=5
        )
        assert missing.faulted is False
    finally:
        await channel.close()
    row = await factory.row("SELECT n FROM waiting_prompts WHERE id = $1", job.wp_id)
    assert row["n"] == 1
    r = await app_client.post(
        SUBMIT,
        json={
            "id": str(job.gen_id),
            "message": {"role": "assistant", "content": "late"},
            "finish_reason": "stop",
            "model_id": job.model,
        },
        headers={"apikey": job.owner.api_key},
    )
    assert (r.status_code, r.json()["rc"]) == (400, "AbortedGen")


async def test_empty_reply_is_counted_and_tool_calls_are_not(app_client, factory, metric) -> None:
    job = await factory.job(model="empty/model")
    before = await metric(app_client, "horde_text_empty_generations_total", {"model": "empty/model"})
    body = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": ""},
        "finish_reason": "stop",
        "model_id": job.model,
    }
    r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    assert r.status_code == 200
    assert r.json()["reward"] > 0  # an empty reply is charged and rewarded (20 tokens)
    after = await metric(app_client, "horde_text_empty_generations_total", {"model": "empty/model"})
    assert after == before + 1


async def test_over_capacity_legacy_job_outcomes(app_client, factory, metric, submit_settings) -> None:
    labels = {"worker_trusted": "false", "size_bucket": "513-1024"}
    done = await factory.job(is_chat=False, max_length=1000)
    faulted = await factory.job(is_chat=False, max_length=1000)
    lapsed = await factory.job(is_chat=False, max_length=1000)
    for job in (done, faulted, lapsed):
        await factory.row(
            "UPDATE processing_gens SET over_capacity_at_assignment = true WHERE id = $1 RETURNING id",
            job.gen_id,
        )
    before = {
        o: await metric(app_client, "horde_text_gate_shadow_outcomes_total", {**labels, "outcome": o})
        for o in ("completed", "faulted", "aborted")
    }
    r = await app_client.post(
        SUBMIT, json={"id": str(done.gen_id), "generation": "text"}, headers={"apikey": done.owner.api_key}
    )
    assert r.status_code == 200
    r = await app_client.post(
        SUBMIT,
        json={"id": str(faulted.gen_id), "generation": "x", "state": "faulted"},
        headers={"apikey": faulted.owner.api_key},
    )
    assert r.status_code == 200
    channel = insecure_channel(f"127.0.0.1:{submit_settings.submit_grpc_port}")
    try:
        stub = settlement_pb2_grpc.SettlementServiceStub(channel)
        await stub.FaultGeneration(
            settlement_pb2.FaultGenerationRequest(
                generation_id=str(lapsed.gen_id), cause=settlement_pb2.FAULT_CAUSE_LEASE_LAPSED
            ),
            timeout=5,
        )
    finally:
        await channel.close()
    for outcome in ("completed", "faulted", "aborted"):
        value = await metric(
            app_client, "horde_text_gate_shadow_outcomes_total", {**labels, "outcome": outcome}
        )
        assert value == before[outcome] + 1, outcome
    count = await metric(app_client, "horde_text_gate_shadow_service_seconds_count", labels)
    assert count >= 1
