"""Faulted submits: fault reasons, the worker_faults counter, restarts, worker counters and the request fault
past FAULTED_GENERATIONS_LIMIT (docs/native-api.md#worker-fault-reasons, #refusal-record,
docs/native-api.md#submit, #expiry, #text-route)."""

from __future__ import annotations

import pytest
from horde_contract import CHAT_WORKER_FAULT_MESSAGES, ChatFaultReason

SUBMIT = "/v2/generate/text/submit"
FAULTS = "horde_chat_worker_faults_total"


def fault(job, reason: str | None = None) -> dict:
    body = {"id": str(job.gen_id), "state": "faulted", "model_id": job.model}
    if reason is not None:
        body["fault_reason"] = reason
    return body


async def state(factory, job) -> dict:
    row = await factory.row(
        """
        SELECT g.faulted, g.generation, wp.n, wp.faulted AS wp_faulted, wp.chat_fault_reason, wp.chat_fault_rc,
               w.aborted_jobs, w.uncompleted_jobs, w.nonconformant_replies
          FROM processing_gens g JOIN waiting_prompts wp ON wp.id = g.wp_id JOIN workers w ON w.id = g.worker_id
         WHERE g.id = $1
        """,
        job.gen_id,
    )
    return dict(row)


@pytest.mark.parametrize("reason", sorted(CHAT_WORKER_FAULT_MESSAGES))
async def test_each_fault_reason_is_stored_counted_and_restarts(app_client, factory, metric, reason) -> None:
    job = await factory.job()
    before = await metric(app_client, FAULTS, {"reason": reason, "worker_trusted": "false"})
    r = await app_client.post(SUBMIT, json=fault(job, reason), headers={"apikey": job.owner.api_key})
    assert (r.status_code, r.json()) == (200, {"reward": 0})
    after = await metric(app_client, FAULTS, {"reason": reason, "worker_trusted": "false"})
    assert after == before + 1
    s = await state(factory, job)
    assert s["faulted"] is True and s["generation"] is None
    assert s["n"] == 1  # the job is handed out again
    assert s["wp_faulted"] is False
    assert (s["chat_fault_reason"], s["chat_fault_rc"]) == (
        CHAT_WORKER_FAULT_MESSAGES[reason],
        "ChatWorkerFault",
    )
    assert (s["aborted_jobs"], s["uncompleted_jobs"], s["nonconformant_replies"]) == (1, 1, 0)


@pytest.mark.parametrize(("sent", "label"), [(None, "none"), ("cosmic_rays", "unknown")])
async def test_missing_or_unknown_reason_is_counted_not_stored(
    app_client, factory, metric, sent, label
) -> None:
    job = await factory.job(owner_trusted=True)
    before = await metric(app_client, FAULTS, {"reason": label, "worker_trusted": "true"})
    r = await app_client.post(SUBMIT, json=fault(job, sent), headers={"apikey": job.owner.api_key})
    assert (r.status_code, r.json()) == (200, {"reward": 0})
    assert await metric(app_client, FAULTS, {"reason": label, "worker_trusted": "true"}) == before + 1
    s = await state(factory, job)
    assert s["faulted"] is True and s["n"] == 1
    assert (s["chat_fault_reason"], s["chat_fault_rc"]) == (None, None)


async def test_repeated_fault_is_counted_again_and_writes_nothing(app_client, factory, metric) -> None:
    job = await factory.job()
    labels = {"reason": "generation_error", "worker_trusted": "false"}
    before = await metric(app_client, FAULTS, labels)
    for _ in range(2):
        r = await app_client.post(
            SUBMIT, json=fault(job, "generation_error"), headers={"apikey": job.owner.api_key}
        )
        assert (r.status_code, r.json()) == (200, {"reward": 0})
    assert await metric(app_client, FAULTS, labels) == before + 2
    s = await state(factory, job)
    assert s["n"] == 1  # restarted once
    assert (s["aborted_jobs"], s["uncompleted_jobs"]) == (1, 1)


async def test_fault_after_a_nonconformant_refusal_keeps_the_refusal(app_client, factory, metric) -> None:
    job = await factory.job(chat_extras={"response_format": {"type": "json_object"}})
    body = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": "not json"},
        "finish_reason": "stop",
        "model_id": job.model,
    }
    refused = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    assert refused.json()["rc"] == "ChatSubmitNonconformant"
    labels = {"reason": "reply_refused", "worker_trusted": "false"}
    before = await metric(app_client, FAULTS, labels)
    r = await app_client.post(SUBMIT, json=fault(job, "reply_refused"), headers={"apikey": job.owner.api_key})
    assert r.status_code == 200
    assert await metric(app_client, FAULTS, labels) == before + 1
    s = await state(factory, job)
    assert (s["chat_fault_reason"], s["chat_fault_rc"]) == (
        refused.json()["message"],
        "ChatSubmitNonconformant",
    )
    # A nonconformant reply is not a dropped job.
    assert (s["nonconformant_replies"], s["aborted_jobs"], s["uncompleted_jobs"]) == (1, 0, 0)


async def test_fault_after_an_invalid_refusal_counts_as_dropped(app_client, factory) -> None:
    job = await factory.job()
    r = await app_client.post(
        SUBMIT,
        json={
            "id": str(job.gen_id),
            "message": {"role": "user"},
            "finish_reason": "stop",
            "model_id": job.model,
        },
        headers={"apikey": job.owner.api_key},
    )
    assert r.json()["rc"] == "ChatSubmitInvalid"
    await app_client.post(SUBMIT, json=fault(job, "reply_refused"), headers={"apikey": job.owner.api_key})
    s = await state(factory, job)
    assert s["chat_fault_rc"] == "ChatSubmitInvalid"
    assert (s["nonconformant_replies"], s["aborted_jobs"], s["uncompleted_jobs"]) == (0, 1, 1)


async def test_fault_of_a_cancelled_request_does_not_restart(app_client, factory) -> None:
    job = await factory.job()
    await factory.row(
        "UPDATE waiting_prompts SET cancelled = true, n = 0 WHERE id = $1 RETURNING id", job.wp_id
    )
    r = await app_client.post(SUBMIT, json=fault(job), headers={"apikey": job.owner.api_key})
    assert r.status_code == 200
    s = await state(factory, job)
    assert s["faulted"] is True and s["n"] == 0


async def test_request_faults_past_the_limit_and_signals(app_client, factory, subscribe) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester)
    async with subscribe(wp) as sub:
        for attempt in range(3):
            gen = await factory.generation(wp, worker, owner)
            await factory.row("UPDATE waiting_prompts SET n = 0 WHERE id = $1 RETURNING id", wp)  # the pop
            body = {
                "id": str(gen),
                "state": "faulted",
                "model_id": "test/model-7b",
                "fault_reason": "prompt_overflow",
            }
            r = await app_client.post(SUBMIT, json=body, headers={"apikey": owner.api_key})
            assert r.status_code == 200
            row = await factory.row("SELECT faulted, n FROM waiting_prompts WHERE id = $1", wp)
            assert row["faulted"] is (attempt == 2)
        events = await sub.messages(1)
    assert events == [
        {
            "id": str(wp),
            "event": "faulted",
            "generations": 0,
            "fault_reason": CHAT_WORKER_FAULT_MESSAGES[ChatFaultReason.prompt_overflow],
            "fault_rc": "ChatWorkerFault",
        }
    ]


async def test_text_job_fault_restarts_without_the_chat_counter(app_client, factory) -> None:
    job = await factory.job(is_chat=False)
    total_before = await _total(app_client)
    r = await app_client.post(
        SUBMIT,
        json={"id": str(job.gen_id), "state": "faulted", "generation": "Faulted"},
        headers={"apikey": job.owner.api_key},
    )
    assert (r.status_code, r.json()) == (200, {"reward": 0})
    assert await _total(app_client) == total_before
    s = await state(factory, job)
    assert s["faulted"] is True and s["n"] == 1


async def _total(client) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(FAULTS + "{"))


async def test_worker_goes_to_maintenance_after_too_many_drops(app_client, factory) -> None:
    job = await factory.job()
    await factory.row(
        "UPDATE workers SET aborted_jobs = 20, last_aborted_job = now() WHERE id = $1 RETURNING id",
        job.worker_id,
    )
    await app_client.post(SUBMIT, json=fault(job), headers={"apikey": job.owner.api_key})
    row = await factory.row(
        "SELECT maintenance, maintenance_msg, aborted_jobs FROM workers WHERE id = $1", job.worker_id
    )
    assert row["maintenance"] is True
    assert row["aborted_jobs"] == 0
    assert "dropped too many jobs" in row["maintenance_msg"]
