"""A restarted job is announced to the waiting pops (docs/worker-guide.md#long-poll): a faulted submit puts the job back
in the queue and publishes it on ``horde:queue:announce`` after the commit; a fault that restarts nothing (a
cancelled request, a request faulted past FAULTED_GENERATIONS_LIMIT) announces nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from horde_core import queue_announce
from horde_testing.signals import Subscriber

pytestmark = pytest.mark.asyncio(loop_scope="session")

SUBMIT = "/v2/generate/text/submit"


def fault(job: Any) -> dict[str, Any]:
    return {"id": str(job.gen_id), "state": "faulted", "model_id": job.model}


async def announced(signals: Any, job: Any, app_client: Any, wait: float = 2.0) -> list[dict[str, Any]]:
    """The announcements of ``job``'s request published while its faulted submit is answered."""
    async with Subscriber(signals, uuid.uuid4(), channel=queue_announce.QUEUE_ANNOUNCE_CHANNEL) as sub:
        r = await app_client.post(SUBMIT, json=fault(job), headers={"apikey": job.owner.api_key})
        assert (r.status_code, r.json()) == (200, {"reward": 0})
        messages = await sub.messages(1, wait=wait)
    return [m for m in messages if m.get("id") == str(job.wp_id)]


@pytest.mark.parametrize("is_chat", [True, False])
async def test_a_faulted_submit_announces_the_restarted_job(
    app_client, factory, signals, is_chat: bool
) -> None:
    job = await factory.job(is_chat=is_chat, max_length=300, max_context_length=2048)
    messages = await announced(signals, job, app_client)
    assert messages == [
        {
            "id": str(job.wp_id),
            "models": [job.model],
            "is_chat": is_chat,
            "max_length": 300,
            "max_context_length": 2048,
            "n": 1,
        }
    ]
    row = await factory.row("SELECT n FROM waiting_prompts WHERE id = $1", job.wp_id)
    assert row["n"] == 1  # committed before the announcement


async def test_a_fault_that_restarts_nothing_announces_nothing(app_client, factory, signals) -> None:
    cancelled = await factory.job()
    async with factory.pool.acquire() as conn:
        await conn.execute("UPDATE waiting_prompts SET cancelled = true WHERE id = $1", cancelled.wp_id)
    assert await announced(signals, cancelled, app_client, wait=0.5) == []

    past_limit = await factory.job()
    for _ in range(2):  # two faulted generations already: the third fault faults the request
        gen = await factory.generation(past_limit.wp_id, past_limit.worker_id, past_limit.owner)
        async with factory.pool.acquire() as conn:
            await conn.execute("UPDATE processing_gens SET faulted = true WHERE id = $1", gen)
    assert await announced(signals, past_limit, app_client, wait=0.5) == []
    row = await factory.row("SELECT faulted FROM waiting_prompts WHERE id = $1", past_limit.wp_id)
    assert row["faulted"] is True
