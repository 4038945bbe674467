"""POST /v2/generate/text/submit with structured chat replies: storage, settlement, signals, refusals, CAS.

See docs/native-api.md#submit, #reasoning, #refusal-record, #pricing,
#completion-signal; docs/native-api.md#submit, #kudos.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from horde_submit import pricing

SUBMIT = "/v2/generate/text/submit"


def reply(job: Any, content: str | None = "Hi! How can I help?", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "model_id": job.model,
    }
    body.update(extra)
    return body


async def post(client: httpx.AsyncClient, body: Any, key: str, path: str = SUBMIT) -> httpx.Response:
    return await client.post(path, json=body, headers={"apikey": key})


async def test_chat_submit_stores_settles_and_signals(app_client, factory, subscribe) -> None:
    job = await factory.job(prompt="user: Hello there", max_length=512, max_context_length=4096)
    content = "Hello! " * 30  # 210 characters -> 53 tokens
    async with subscribe(job.wp_id) as sub:
        response = await post(
            app_client,
            reply(
                job,
                content,
                native_finish_reason="eos",
                prompt_tokens=12,
                completion_tokens=50,
                reasoning_tokens=3,
            ),
            job.owner.api_key,
        )
        assert response.status_code == 200, response.text
        events = await sub.messages(2)
    reward = response.json()["reward"]
    expected = pricing.generation_kudos(
        pricing.PricingInputs(
            reply_characters=len(content),
            prompt_characters=len("user: Hello there"),
            max_length=512,
            max_context_length=4096,
            parameters_billion=None,
            bridge_agent="horde-worker:0.1:test",
            owner_trusted=False,
        )
    )
    assert reward == expected
    assert events == [
        {"id": str(job.wp_id), "event": "generation", "generations": 1},
        {"id": str(job.wp_id), "event": "done", "generations": 1},
    ]
    gen = await factory.row("SELECT * FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["generation"] == content
    assert gen["message"] == {"role": "assistant", "content": content}
    assert gen["finish_reason"] == "stop"
    assert gen["native_finish_reason"] == "eos"
    assert (gen["prompt_tokens"], gen["completion_tokens"], gen["reasoning_tokens"]) == (12, 50, 3)
    assert gen["charge_basis"] == "output_estimate"
    assert gen["kudos"] == reward
    assert gen["completed_at"] is not None
    wp = await factory.row("SELECT * FROM waiting_prompts WHERE id = $1", job.wp_id)
    assert wp["consumed_kudos"] == pytest.approx(1 + reward + 1)
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - (reward + 1))
    owner = await factory.row("SELECT kudos, evaluating_kudos FROM users WHERE id = $1", job.owner.id)
    spendable, escrow = pricing.escrow_split(reward, owner_trusted=False, owner_anonymous=False)
    assert owner["kudos"] == pytest.approx(spendable)
    assert owner["evaluating_kudos"] == pytest.approx(escrow)
    worker = await factory.row("SELECT * FROM workers WHERE id = $1", job.worker_id)
    assert worker["kudos"] == pytest.approx(reward)
    assert worker["fulfilments"] == 1
    assert worker["contributions"] == 53
    perf = await factory.row(
        "SELECT count(*) AS n FROM worker_performances WHERE worker_id = $1", job.worker_id
    )
    assert perf["n"] == 1
    sample = await factory.row(
        "SELECT performance FROM worker_performances WHERE worker_id = $1", job.worker_id
    )
    assert sample["performance"] == pytest.approx(53 / 2, rel=0.2)  # the job started 2 s before the submit
    assert worker["speed"] == sample["performance"]
    model_perf = await factory.row("SELECT count(*) AS n FROM model_performances WHERE model = $1", job.model)
    assert model_perf["n"] >= 1


async def test_duplicate_submit_is_refused_by_the_compare_and_set(app_client, factory) -> None:
    job = await factory.job()
    first, second = await asyncio.gather(
        post(app_client, reply(job, "first"), job.owner.api_key),
        post(app_client, reply(job, "second"), job.owner.api_key),
    )
    statuses = sorted([first.status_code, second.status_code])
    assert statuses == [200, 400]
    loser = first if first.status_code == 400 else second
    winner_text = "first" if first.status_code == 200 else "second"
    assert loser.json() == {
        "message": f"Processing Generation with ID {job.gen_id} already submitted.",
        "rc": "DuplicateGen",
    }
    gen = await factory.row("SELECT generation FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["generation"] == winner_text
    worker = await factory.row("SELECT fulfilments FROM workers WHERE id = $1", job.worker_id)
    assert worker["fulfilments"] == 1


async def test_unknown_job_and_credentials(app_client, factory) -> None:
    job = await factory.job()
    missing = uuid.uuid4()
    r = await post(app_client, {**reply(job), "id": str(missing)}, job.owner.api_key)
    assert r.status_code == 404
    assert r.json() == {"message": f"Processing Job with ID {missing} does not exist.", "rc": "InvalidJobID"}
    r = await post(app_client, {**reply(job), "id": "not-a-uuid"}, job.owner.api_key)
    assert (r.status_code, r.json()["rc"]) == (404, "InvalidJobID")
    r = await post(app_client, reply(job), "no-such-key")
    assert r.status_code == 401
    assert r.json()["rc"] == "InvalidAPIKey"
    r = await post(app_client, reply(job), job.requester.api_key)
    assert r.status_code == 403
    assert r.json() == {"message": "Wrong credentials to submit as this worker.", "rc": "WrongCredentials"}
    gen = await factory.row(
        "SELECT generation, chat_refusal_rc FROM processing_gens WHERE id = $1", job.gen_id
    )
    assert gen["generation"] is None and gen["chat_refusal_rc"] is None


async def refusal_state(factory, job) -> tuple[Any, Any, Any, Any]:
    gen = await factory.row(
        "SELECT generation, faulted, chat_refusal_rc FROM processing_gens WHERE id = $1", job.gen_id
    )
    wp = await factory.row(
        "SELECT chat_fault_reason, chat_fault_rc FROM waiting_prompts WHERE id = $1", job.wp_id
    )
    return gen["generation"], gen["chat_refusal_rc"], wp["chat_fault_reason"], wp["chat_fault_rc"]


async def test_invalid_chat_body_is_refused_and_recorded(app_client, factory) -> None:
    job = await factory.job()
    body = reply(job)
    body.pop("finish_reason")
    r = await post(app_client, body, job.owner.api_key)
    assert r.status_code == 400
    assert r.json() == {
        "message": "'finish_reason': has to be one of stop, length, content_filter, tool_calls.",
        "rc": "ChatSubmitInvalid",
    }
    assert await refusal_state(factory, job) == (
        None,
        "ChatSubmitInvalid",
        "'finish_reason': has to be one of stop, length, content_filter, tool_calls.",
        "ChatSubmitInvalid",
    )
    # The generation stays pending: a corrected reply is accepted.
    r = await post(app_client, reply(job), job.owner.api_key)
    assert r.status_code == 200, r.text


async def test_invalid_body_from_another_key_records_nothing(app_client, factory) -> None:
    job = await factory.job()
    body = reply(job)
    body["generation"] = "both"
    r = await post(app_client, body, job.requester.api_key)
    assert (r.status_code, r.json()["rc"]) == (400, "ChatSubmitInvalid")
    assert await refusal_state(factory, job) == (None, None, None, None)


async def test_model_mismatch_is_refused_and_recorded(app_client, factory) -> None:
    job = await factory.job()
    r = await post(app_client, {**reply(job), "model_id": "other/model"}, job.owner.api_key)
    assert r.status_code == 400
    message = f"The submit's model_id 'other/model' is not the model this job was assigned to, '{job.model}'."
    assert r.json() == {"message": message, "rc": "ChatModelMismatch"}
    assert await refusal_state(factory, job) == (None, "ChatModelMismatch", message, "ChatModelMismatch")


async def test_text_form_submit_to_a_chat_job_is_refused(app_client, factory) -> None:
    job = await factory.job()
    r = await post(app_client, {"id": str(job.gen_id), "generation": "plain text"}, job.owner.api_key)
    assert r.status_code == 400
    assert r.json()["rc"] == "ChatSubmitInvalid"
    assert (await refusal_state(factory, job))[1] == "ChatSubmitInvalid"


async def test_reply_to_a_faulted_generation_is_aborted_before_it_is_checked(app_client, factory) -> None:
    job = await factory.job()
    await factory.row("UPDATE processing_gens SET faulted = true WHERE id = $1 RETURNING id", job.gen_id)
    r = await post(app_client, {**reply(job), "model_id": "other/model"}, job.owner.api_key)
    assert r.status_code == 400
    assert r.json() == {
        "message": (
            f"Processing Generation with ID {job.gen_id} took too long to process and has been aborted! "
            "Please submit within 150 seconds of the pop (the job's ttl)."
        ),
        "rc": "AbortedGen",
    }
    assert await refusal_state(factory, job) == (None, None, None, None)


async def test_reasoning_tool_calls_and_nul_are_stored(app_client, factory) -> None:
    tools = [{"type": "function", "function": {"name": "lookup_weather", "parameters": {"type": "object"}}}]
    job = await factory.job(chat_extras={"tools": tools, "tool_choice": "auto"})
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup_weather", "arguments": '{"c":"Oslo"}'},
        }
    ]
    body = reply(job, None, finish_reason="tool_calls")
    body["message"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": calls,
        "reasoning_content": "think\x00ing",
    }
    r = await post(app_client, body, job.owner.api_key)
    assert r.status_code == 200, r.text
    gen = await factory.row(
        "SELECT generation, message, finish_reason FROM processing_gens WHERE id = $1", job.gen_id
    )
    assert gen["generation"] == ""
    assert gen["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": calls,
        "reasoning_content": "think\ufffding",
    }
    assert gen["finish_reason"] == "tool_calls"


async def test_oversized_reasoning_is_refused(app_client, factory) -> None:
    job = await factory.job()
    body = reply(job)
    body["message"]["reasoning_content"] = "x" * (1024 * 1024 + 1)
    r = await post(app_client, body, job.owner.api_key)
    assert (r.status_code, r.json()["rc"]) == (400, "ChatSubmitInvalid")
    assert (await refusal_state(factory, job))[1] == "ChatSubmitInvalid"


async def test_reasoning_counts_toward_the_charge(app_client, factory) -> None:
    job = await factory.job(owner_trusted=True, max_length=1024)
    body = reply(job, "a" * 40)
    body["message"]["reasoning_content"] = "r" * 400
    r = await post(app_client, body, job.owner.api_key)
    assert r.status_code == 200, r.text
    worker = await factory.row("SELECT contributions FROM workers WHERE id = $1", job.worker_id)
    assert worker["contributions"] == 110  # ceil(440 / 4)
    ctx = pricing.context_multiplier(len("user: Hello there"), 4096)
    assert r.json()["reward"] == round(110 * ctx * 0.027, 2)


async def test_hold_is_consumed_and_released_on_completion(app_client, factory) -> None:
    job = await factory.job(hold=50.0)
    r = await post(app_client, reply(job), job.owner.api_key)
    assert r.status_code == 200
    async with factory.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", job.wp_id) == 0


async def test_no_done_while_jobs_remain(app_client, factory, subscribe) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester, n=0, jobs=2)
    gen_a = await factory.generation(wp, worker, owner)
    gen_b = await factory.generation(wp, worker, owner)
    async with subscribe(wp) as sub:
        body = {
            "message": {"role": "assistant", "content": "a"},
            "finish_reason": "stop",
            "model_id": "test/model-7b",
        }
        assert (await post(app_client, {"id": str(gen_a), **body}, owner.api_key)).status_code == 200
        assert await sub.messages(2, wait=1.0) == [{"id": str(wp), "event": "generation", "generations": 1}]
        assert (await post(app_client, {"id": str(gen_b), **body}, owner.api_key)).status_code == 200
        assert await sub.messages(2) == [
            {"id": str(wp), "event": "generation", "generations": 2},
            {"id": str(wp), "event": "done", "generations": 2},
        ]
