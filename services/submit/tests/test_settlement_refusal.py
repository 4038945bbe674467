"""``SettlementService.SettleCancelledGeneration`` settles only what a cancel settles: a pending generation
whose request was not cancelled (or that does not stream progress) is refused with FAILED_PRECONDITION and
left as it was, unpaid and still the worker's to submit. Over real gRPC, on the real submit app and stores."""

from __future__ import annotations

import grpc
import pytest
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_core.grpc import insecure_channel

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _settle(submit_settings, generation_id: str):  # type: ignore[no-untyped-def]
    channel = insecure_channel(f"127.0.0.1:{submit_settings.submit_grpc_port}")
    try:
        stub = settlement_pb2_grpc.SettlementServiceStub(channel)
        return await stub.SettleCancelledGeneration(
            settlement_pb2.SettleCancelledGenerationRequest(generation_id=generation_id), timeout=5
        )
    finally:
        await channel.close()


async def _state(factory, job):  # type: ignore[no-untyped-def]
    gen = await factory.row(
        "SELECT faulted, cancelled, settled_character_count, kudos FROM processing_gens WHERE id = $1",
        job.gen_id,
    )
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    worker = await factory.row("SELECT kudos FROM workers WHERE id = $1", job.worker_id)
    return (
        gen["faulted"],
        gen["cancelled"],
        gen["settled_character_count"],
        requester["kudos"],
        worker["kudos"],
    )


async def _streamed_job(factory, *, cancelled: bool):  # type: ignore[no-untyped-def]
    job = await factory.job(chat_extras={"stream_progress": True})
    await factory.row(
        "UPDATE waiting_prompts SET stream_progress = true, cancelled = $2, n = 0 WHERE id = $1 RETURNING id",
        job.wp_id,
        cancelled,
    )
    return job


async def test_a_generation_whose_request_was_not_cancelled_is_refused(
    app_client, submit_settings, factory
) -> None:
    job = await _streamed_job(factory, cancelled=False)
    before = await _state(factory, job)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _settle(submit_settings, str(job.gen_id))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        f"Generation {job.gen_id}: its request was not cancelled, so it is not settled as cancelled."
    )
    assert await _state(factory, job) == before
    assert before[:3] == (False, False, None)

    # the worker's reply is still taken and paid
    body = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": "Hello"},
        "finish_reason": "stop",
        "model_id": job.model,
    }
    r = await app_client.post(
        "/api/v2/generate/text/submit", json=body, headers={"apikey": job.owner.api_key}
    )
    assert r.status_code == 200, r.text
    assert r.json()["reward"] > 0


async def test_a_generation_that_does_not_stream_is_refused(app_client, submit_settings, factory) -> None:
    job = await factory.job()
    await factory.row(
        "UPDATE waiting_prompts SET cancelled = true, n = 0 WHERE id = $1 RETURNING id", job.wp_id
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _settle(submit_settings, str(job.gen_id))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        f"Generation {job.gen_id} does not stream progress: a cancel does not settle it."
    )
    assert (await _state(factory, job))[:3] == (False, False, None)


async def test_a_cancelled_streamed_generation_is_settled_once(app_client, submit_settings, factory) -> None:
    job = await _streamed_job(factory, cancelled=True)
    first = await _settle(submit_settings, str(job.gen_id))
    again = await _settle(submit_settings, str(job.gen_id))
    assert (first.settled, again.settled) == (True, False)
    faulted, cancelled, characters, _, _ = await _state(factory, job)
    assert (faulted, cancelled, characters) == (True, True, 0)


async def test_an_unknown_or_malformed_generation(app_client, submit_settings) -> None:
    assert (await _settle(submit_settings, "00000000-0000-0000-0000-000000000000")).settled is False
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await _settle(submit_settings, "not-a-uuid")
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
