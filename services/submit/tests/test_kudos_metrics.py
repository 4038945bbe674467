"""``horde_kudos_transferred_total``: a committed settlement counts the worker's reward and the requester's charge
it moved (docs/operator-guide.md#metrics); a lost claim, a fake generation and a refused settlement count nothing.
On the real submit app and stores."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import REGISTRY

from .test_settlement_refusal import _settle, _streamed_job

pytestmark = pytest.mark.asyncio(loop_scope="session")

SUBMIT = "/api/v2/generate/text/submit"


def moved() -> dict[str, float]:
    return {
        kind: REGISTRY.get_sample_value("horde_kudos_transferred_total", {"kind": kind}) or 0.0
        for kind in ("worker_reward", "requester_charge")
    }


def delta(before: dict[str, float]) -> dict[str, float]:
    after = moved()
    return {kind: round(after[kind] - before[kind], 6) for kind in after}


def reply(job, content: str = "Hello! " * 30) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "model_id": job.model,
    }


async def test_a_settled_submit_counts_the_reward_and_the_charge(app_client, factory) -> None:
    job = await factory.job(prompt="user: Hello there", max_length=512, max_context_length=4096)
    before = moved()
    r = await app_client.post(SUBMIT, json=reply(job), headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text
    reward = r.json()["reward"]
    assert reward > 0
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    charge = 1000 - requester["kudos"]
    assert charge == pytest.approx(reward + 1)
    assert delta(before) == pytest.approx({"worker_reward": reward, "requester_charge": charge})

    # The same reply again loses the compare-and-set: nothing moves, nothing is counted.
    before = moved()
    again = await app_client.post(SUBMIT, json=reply(job), headers={"apikey": job.owner.api_key})
    assert again.status_code == 400
    assert delta(before) == {"worker_reward": 0, "requester_charge": 0}


async def test_a_fake_generation_counts_nothing(app_client, factory) -> None:
    job = await factory.job()
    await factory.row("UPDATE processing_gens SET fake = true WHERE id = $1 RETURNING id", job.gen_id)
    before = moved()
    r = await app_client.post(SUBMIT, json=reply(job), headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text
    assert r.json()["reward"] > 0  # answered as a real job, but nothing paid
    assert delta(before) == {"worker_reward": 0, "requester_charge": 0}


async def test_a_cancel_settlement_counts_once_and_a_refused_one_not_at_all(
    app_client, submit_settings, factory
) -> None:
    refused = await _streamed_job(factory, cancelled=False)
    before = moved()
    with pytest.raises(grpc.aio.AioRpcError):
        await _settle(submit_settings, str(refused.gen_id))
    assert delta(before) == {"worker_reward": 0, "requester_charge": 0}

    job = await _streamed_job(factory, cancelled=True)
    before = moved()
    first = await _settle(submit_settings, str(job.gen_id))
    again = await _settle(submit_settings, str(job.gen_id))
    assert (first.settled, again.settled) == (True, False)
    worker = await factory.row("SELECT kudos FROM workers WHERE id = $1", job.worker_id)
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert worker["kudos"] > 0
    assert delta(before) == pytest.approx(
        {"worker_reward": worker["kudos"], "requester_charge": 1000 - requester["kudos"]}
    )
