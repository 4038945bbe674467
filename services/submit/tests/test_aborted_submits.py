"""Replies to aborted generations, late settlement of cancelled streamed generations, progress on an expired
request, and the ``horde.job_submit.done`` record.

See docs/native-api.md#submit ("A chat reply for a faulted generation returns 400 AbortedGen
before the reply is checked, so a refusal is not stored on the request and the abort counts as a dropped job"),
docs/native-api.md#job-lease, #progress (ChatJobAborted), docs/native-api.md#pricing (a cancelled streamed generation is settled
on its posted content, faulted as cancelled, not counted toward the worker's aborted-job threshold, not
restarted), docs/native-api.md#reply-verification (``horde.job_submit.done`` carries ``dropped_tool_calls``); docs/native-api.md#submit.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
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
from horde_testing.pytest_plugin import TEST_SECRET_KEY

SUBMIT = "/v2/generate/text/submit"
PROGRESS = "/v2/generate/text/progress"
DONE = "horde.job_submit.done"


@pytest.fixture(scope="module")
def signal_db(signal_redis):  # type: ignore[no-untyped-def]
    """The chat signal database (7), where leases and streams live."""
    return signal_redis


def reply(job: Any, content: str | None = "Hi!", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "model_id": job.model,
    }
    body.update(extra)
    return body


async def post(client: Any, body: Any, key: str, path: str = SUBMIT) -> Any:
    return await client.post(path, json=body, headers={"apikey": key})


def lapse_message(gen_id: uuid.UUID) -> str:
    return (
        f"Processing Generation with ID {gen_id} took too long to process and has been aborted! "
        "Please submit within 150 seconds of the pop (the job's ttl)."
    )


async def stored_state(factory, job) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The generation, request, worker and requester columns a refused or aborted reply must not touch."""
    row = await factory.row(
        """
        SELECT g.generation, g.faulted, g.cancelled, g.chat_refusal_rc, g.kudos AS gen_kudos,
               g.settled_character_count,
               wp.chat_fault_reason, wp.chat_fault_rc, wp.n, wp.consumed_kudos,
               w.kudos AS worker_kudos, w.aborted_jobs, w.uncompleted_jobs, w.nonconformant_replies,
               w.fulfilments, r.kudos AS requester_kudos
          FROM processing_gens g JOIN waiting_prompts wp ON wp.id = g.wp_id
          JOIN workers w ON w.id = g.worker_id JOIN users r ON r.id = wp.user_id
         WHERE g.id = $1
        """,
        job.gen_id,
    )
    return dict(row)


async def fault(factory, job) -> None:  # type: ignore[no-untyped-def]
    """The generation faulted (as the janitor's lapse does), without touching the counters under test."""
    await factory.row("UPDATE processing_gens SET faulted = true WHERE id = $1 RETURNING id", job.gen_id)


# --- 1. AbortedGen before the reply is checked ----------------------------------------------------------


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(lambda body: body.pop("finish_reason"), id="missing finish_reason"),
        pytest.param(lambda body: body.update(generation="both"), id="generation beside message"),
        pytest.param(lambda body: body.update(message={"role": "user", "content": "x"}), id="wrong role"),
        pytest.param(lambda body: body.pop("model_id"), id="missing model_id"),
    ],
)
async def test_malformed_reply_to_a_faulted_generation_is_aborted_gen(app_client, factory, broken) -> None:
    job = await factory.job()
    await fault(factory, job)
    before = await stored_state(factory, job)
    body = reply(job)
    broken(body)
    r = await post(app_client, body, job.owner.api_key)
    assert r.status_code == 400
    assert r.json() == {"message": lapse_message(job.gen_id), "rc": "AbortedGen"}
    after = await stored_state(factory, job)
    assert after == before
    assert (after["chat_refusal_rc"], after["chat_fault_reason"], after["chat_fault_rc"]) == (
        None,
        None,
        None,
    )


async def test_nonconformant_reply_to_a_faulted_generation_is_aborted_and_counts_as_dropped(
    app_client, factory
) -> None:
    """A reply that breaks a strict json_object format is refused as nonconformant only while the generation is
    pending; to a faulted one it is AbortedGen, no refusal is stored, and the worker's later fault submit (for a
    job that is already faulted) changes nothing."""
    job = await factory.job(chat_extras={"response_format": {"type": "json_object"}})
    await fault(factory, job)
    r = await post(app_client, reply(job, "not json"), job.owner.api_key)
    assert (r.status_code, r.json()["rc"]) == (400, "AbortedGen")
    state = await stored_state(factory, job)
    assert state["chat_refusal_rc"] is None and state["nonconformant_replies"] == 0
    r = await post(
        app_client, {"id": str(job.gen_id), "state": "faulted", "model_id": job.model}, job.owner.api_key
    )
    assert (r.status_code, r.json()) == (200, {"reward": 0})
    assert await stored_state(factory, job) == state


async def test_malformed_text_reply_to_a_faulted_generation_is_aborted_gen(app_client, factory) -> None:
    job = await factory.job(is_chat=False)
    await fault(factory, job)
    r = await post(app_client, {"id": str(job.gen_id), "seed": "x"}, job.owner.api_key)
    assert r.status_code == 400
    assert r.json() == {"message": lapse_message(job.gen_id), "rc": "AbortedGen"}
    r = await post(app_client, {"id": str(job.gen_id)}, job.owner.api_key)  # no generation
    assert (r.status_code, r.json()["rc"]) == (400, "AbortedGen")


async def test_malformed_reply_from_another_key_keeps_the_parse_error(app_client, factory) -> None:
    """The state is only told to the worker's owner: another key gets the parser's 400, and nothing is stored."""
    job = await factory.job()
    await fault(factory, job)
    body = reply(job)
    body.pop("finish_reason")
    r = await post(app_client, body, job.requester.api_key)
    assert (r.status_code, r.json()["rc"]) == (400, "ChatSubmitInvalid")
    assert (await stored_state(factory, job))["chat_refusal_rc"] is None


async def test_malformed_reply_to_a_stored_generation_is_duplicate_gen(app_client, factory) -> None:
    job = await factory.job()
    assert (await post(app_client, reply(job), job.owner.api_key)).status_code == 200
    body = reply(job)
    body.pop("finish_reason")
    r = await post(app_client, body, job.owner.api_key)
    assert r.status_code == 400
    assert r.json() == {
        "message": f"Processing Generation with ID {job.gen_id} already submitted.",
        "rc": "DuplicateGen",
    }


async def test_reply_to_a_generation_of_an_expired_request_is_aborted_gen(app_client, factory) -> None:
    """A pending generation whose request is past its expiry (the janitor has not deleted it yet) is aborted:
    its reply, well-formed or not, is 400 AbortedGen and nothing is claimed, paid or charged."""
    job = await factory.job(expiry_seconds=-5)
    before = await stored_state(factory, job)
    expected = {
        "message": f"Processing Generation with ID {job.gen_id} has been aborted because its request expired.",
        "rc": "AbortedGen",
    }
    r = await post(app_client, reply(job), job.owner.api_key)
    assert (r.status_code, r.json()) == (400, expected)
    body = reply(job, "not json")
    body.pop("finish_reason")
    r = await post(app_client, body, job.owner.api_key)
    assert (r.status_code, r.json()) == (400, expected)
    assert await stored_state(factory, job) == before
    # Once the janitor deleted the request, the generation is gone: 404 InvalidJobID (docs/native-api.md#expiry).
    await factory.row("DELETE FROM waiting_prompts WHERE id = $1 RETURNING id", job.wp_id)
    r = await post(app_client, reply(job), job.owner.api_key)
    assert r.status_code == 404
    assert r.json() == {
        "message": f"Processing Job with ID {job.gen_id} does not exist.",
        "rc": "InvalidJobID",
    }


async def test_reply_to_a_cancelled_request_that_does_not_stream_is_stored(app_client, factory) -> None:
    """In-flight jobs of a cancelled request finish and are paid (docs/native-api.md#status-and-cancel) unless the request streams."""
    job = await factory.job()
    await factory.row("UPDATE waiting_prompts SET cancelled = true WHERE id = $1 RETURNING id", job.wp_id)
    r = await post(app_client, reply(job, "late but paid"), job.owner.api_key)
    assert r.status_code == 200, r.text
    state = await stored_state(factory, job)
    assert state["generation"] == "late but paid" and state["faulted"] is False


# --- 4. A cancel whose settlement call failed: settled as cancelled, never a dropped job -----------------


async def cancelled_streamed_job(factory, app_client, signal_db, posts: list[str]):  # type: ignore[no-untyped-def]
    """A popped streamed chat job with its lease, ``posts`` posted through the progress route, then its request
    cancelled the way the cancel route claims it (``n = 0``, ``cancelled``) and its lease flagged, without the
    settlement call getting through: the generation is still pending."""
    job = await factory.job(chat_extras={"stream_progress": True})
    await factory.row(
        "UPDATE waiting_prompts SET stream_progress = true WHERE id = $1 RETURNING id", job.wp_id
    )
    started = int(time.time()) - 5
    await factory.row(
        "UPDATE processing_gens SET started_at = to_timestamp($2), lease_cap = 200 WHERE id = $1 RETURNING id",
        job.gen_id,
        float(started),
    )
    lease = StreamLease(
        request_id=str(job.wp_id),
        worker_id=str(job.worker_id),
        model=job.model,
        owner_id=job.owner.id,
        key_check=lease_key_check(hash_api_key(job.owner.api_key, TEST_SECRET_KEY)),
        max_bytes=8192,
        started=started,
        job_ttl=150,
        lease_cap=200,
        trusted=False,
    )
    assert await write_stream_leases(signal_db, {str(job.gen_id): lease})
    for seq, part in enumerate(posts, start=1):
        body = {"id": str(job.gen_id), "seq": seq, "delta": {"content": part}}
        r = await app_client.post(PROGRESS, json=body, headers={"apikey": job.owner.api_key})
        assert r.status_code == 200, r.text
    await factory.row(
        "UPDATE waiting_prompts SET n = 0, cancelled = true WHERE id = $1 RETURNING id", job.wp_id
    )
    await signal_db.hset(stream_lease_key(str(job.gen_id)), LeaseField.cancelled.value, "1")
    return job


def posted_kudos(characters: int) -> float:
    return pricing.generation_kudos(
        pricing.PricingInputs(
            reply_characters=characters,
            prompt_characters=len("user: Hello there"),
            max_length=512,
            max_context_length=4096,
            parameters_billion=None,
            bridge_agent="horde-worker:0.1:test",
            owner_trusted=False,
        )
    )


def assert_settled_as_cancelled(state: dict[str, Any], characters: int) -> None:
    kudos = posted_kudos(characters)
    assert (state["faulted"], state["cancelled"], state["generation"]) == (True, True, None)
    assert state["settled_character_count"] == characters
    assert state["gen_kudos"] == pytest.approx(kudos)
    assert state["worker_kudos"] == pytest.approx(kudos)
    assert state["requester_kudos"] == pytest.approx(1000 - kudos - 1)
    assert state["consumed_kudos"] == pytest.approx(1 + kudos + 1)
    assert (state["aborted_jobs"], state["uncompleted_jobs"], state["nonconformant_replies"]) == (0, 0, 0)
    assert state["n"] == 0  # not restarted
    assert (state["chat_refusal_rc"], state["chat_fault_reason"]) == (None, None)


async def test_late_reply_after_a_failed_cancel_settlement_is_aborted_and_settled(
    app_client, factory, signal_db
) -> None:
    job = await cancelled_streamed_job(factory, app_client, signal_db, ["a" * 100, "b" * 60])
    r = await post(app_client, reply(job, "the whole reply, too late"), job.owner.api_key)
    assert r.status_code == 400
    assert r.json() == {
        "message": f"Processing Generation with ID {job.gen_id} has been aborted because its request was cancelled.",
        "rc": "AbortedGen",
    }
    assert_settled_as_cancelled(await stored_state(factory, job), 160)
    # Settled once: a second reply and the worker's fault change nothing.
    settled = await stored_state(factory, job)
    assert (await post(app_client, reply(job), job.owner.api_key)).json()["rc"] == "AbortedGen"
    fault_body = {"id": str(job.gen_id), "state": "faulted", "model_id": job.model}
    assert (await post(app_client, fault_body, job.owner.api_key)).json() == {"reward": 0}
    assert await stored_state(factory, job) == settled


async def test_malformed_or_nonconformant_reply_after_a_failed_cancel_settlement(
    app_client, factory, signal_db
) -> None:
    job = await cancelled_streamed_job(factory, app_client, signal_db, ["c" * 80])
    body = reply(job)
    body.pop("finish_reason")
    r = await post(app_client, body, job.owner.api_key)
    assert (r.status_code, r.json()["rc"]) == (400, "AbortedGen")
    assert_settled_as_cancelled(await stored_state(factory, job), 80)


async def test_worker_fault_after_a_failed_cancel_settlement_is_not_a_dropped_job(
    app_client, factory, signal_db
) -> None:
    job = await cancelled_streamed_job(factory, app_client, signal_db, ["d" * 120])
    body = {
        "id": str(job.gen_id),
        "state": "faulted",
        "model_id": job.model,
        "fault_reason": "generation_error",
    }
    r = await post(app_client, body, job.owner.api_key)
    assert (r.status_code, r.json()) == (200, {"reward": 0})
    assert_settled_as_cancelled(await stored_state(factory, job), 120)


async def test_lapse_after_a_failed_cancel_settlement_is_settled_not_faulted(
    app_client, submit_settings, factory, signal_db
) -> None:
    """The janitor's FaultGeneration for the lapsed lease of a generation the cancel did not settle settles it as
    cancelled (answering faulted=false, so it is not counted as a stale abort) instead of faulting it as a
    dropped job; the cancel's own SettleCancelledGeneration afterwards finds nothing to settle."""
    job = await cancelled_streamed_job(factory, app_client, signal_db, ["e" * 40])
    channel = insecure_channel(f"127.0.0.1:{submit_settings.submit_grpc_port}")
    try:
        stub = settlement_pb2_grpc.SettlementServiceStub(channel)
        lapsed = await stub.FaultGeneration(
            settlement_pb2.FaultGenerationRequest(
                generation_id=str(job.gen_id), cause=settlement_pb2.FAULT_CAUSE_LEASE_LAPSED
            ),
            timeout=5,
        )
        late = await stub.SettleCancelledGeneration(
            settlement_pb2.SettleCancelledGenerationRequest(generation_id=str(job.gen_id)), timeout=5
        )
    finally:
        await channel.close()
    assert (lapsed.faulted, lapsed.request_faulted) == (False, False)
    assert late.settled is False
    assert_settled_as_cancelled(await stored_state(factory, job), 40)
    hold = await factory.row("SELECT count(*) AS n FROM kudos_holds WHERE wp_id = $1", job.wp_id)
    assert hold["n"] == 0


# --- 2. Progress on a live lease whose request expired ----------------------------------------------------


async def streamed_job(factory, signal_db, **request: Any):  # type: ignore[no-untyped-def]
    job = await factory.job(chat_extras={"stream_progress": True}, **request)
    await factory.row(
        "UPDATE waiting_prompts SET stream_progress = true WHERE id = $1 RETURNING id", job.wp_id
    )
    started = int(time.time()) - 5
    await factory.row(
        "UPDATE processing_gens SET started_at = to_timestamp($2), lease_cap = 200 WHERE id = $1 RETURNING id",
        job.gen_id,
        float(started),
    )
    lease = StreamLease(
        str(job.wp_id),
        str(job.worker_id),
        job.model,
        job.owner.id,
        lease_key_check(hash_api_key(job.owner.api_key, TEST_SECRET_KEY)),
        8192,
        started,
        150,
        200,
        False,
    )
    assert await write_stream_leases(signal_db, {str(job.gen_id): lease})
    return job


async def test_progress_on_a_live_lease_of_an_expired_request_is_chat_job_aborted(
    app_client, factory, signal_db
) -> None:
    job = await streamed_job(factory, signal_db, expiry_seconds=-1)
    body = {"id": str(job.gen_id), "seq": 1, "delta": {"content": "Hel"}}
    r = await app_client.post(PROGRESS, json=body, headers={"apikey": job.owner.api_key})
    assert r.status_code == 404
    assert r.json() == {
        "message": f"Generation {job.gen_id} was aborted. Stop generating and do not submit it.",
        "rc": "ChatJobAborted",
    }
    gen = await factory.row("SELECT job_ttl, faulted FROM processing_gens WHERE id = $1", job.gen_id)
    assert (gen["job_ttl"], gen["faulted"]) == (150, False)  # not renewed; the janitor deletes it
    assert await signal_db.exists(stream_lease_key(str(job.gen_id))) == 0
    fields = [f for _, f in await signal_db.xrange(progress_stream_key(str(job.wp_id)))]
    assert fields[-1] == {"gen": str(job.gen_id), "ended": "1"}
    # Every later post finds neither the lease nor (once deleted) the generation.
    body["seq"] = 2
    r = await app_client.post(PROGRESS, json=body, headers={"apikey": job.owner.api_key})
    assert (r.status_code, r.json()["rc"]) == (404, "ChatJobAborted")


async def test_progress_on_a_live_lease_of_a_deleted_request_is_chat_job_aborted(
    app_client, factory, signal_db
) -> None:
    """The request expired and was deleted while its lease was left behind (the janitor could not reach Redis):
    the renewing post finds no generation, answers ChatJobAborted and ends the lease."""
    job = await streamed_job(factory, signal_db)
    await factory.row("DELETE FROM waiting_prompts WHERE id = $1 RETURNING id", job.wp_id)
    body = {"id": str(job.gen_id), "seq": 1, "delta": {"content": "Hel"}}
    r = await app_client.post(PROGRESS, json=body, headers={"apikey": job.owner.api_key})
    assert (r.status_code, r.json()["rc"]) == (404, "ChatJobAborted")
    assert await signal_db.exists(stream_lease_key(str(job.gen_id))) == 0
    fields = [f for _, f in await signal_db.xrange(progress_stream_key(str(job.wp_id)))]
    assert fields[-1] == {"gen": str(job.gen_id), "ended": "1"}


# --- 5. horde.job_submit.done for every done submit -------------------------------------------------------


def done_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == DONE]


async def test_done_record_for_every_stored_reply(app_client, factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="horde_submit.submit")
    chat = await factory.job()
    text = await factory.job(is_chat=False)
    fake = await factory.job()
    await factory.row("UPDATE processing_gens SET fake = true WHERE id = $1 RETURNING id", fake.gen_id)
    caplog.clear()
    assert (await post(app_client, reply(chat, "Hello " * 20), chat.owner.api_key)).status_code == 200
    assert (
        await post(app_client, {"id": str(text.gen_id), "generation": "once upon"}, text.owner.api_key)
    ).status_code == 200
    assert (await post(app_client, reply(fake, "fake"), fake.owner.api_key)).status_code == 200
    records = done_records(caplog)
    assert [r.generation_id for r in records] == [str(chat.gen_id), str(text.gen_id), str(fake.gen_id)]  # type: ignore[attr-defined]
    first, second, third = records
    kudos = posted_kudos(len("Hello " * 20))
    assert first.levelno == logging.INFO
    assert (first.request_id, first.worker_id, first.chat, first.fake) == (  # type: ignore[attr-defined]
        str(chat.wp_id),
        str(chat.worker_id),
        True,
        False,
    )
    assert (first.finish_reason, first.reply_characters, first.request_done) == ("stop", 120, True)  # type: ignore[attr-defined]
    assert first.kudos == pytest.approx(kudos)  # type: ignore[attr-defined]
    assert not hasattr(first, "dropped_tool_calls")
    assert (second.chat, second.fake, second.finish_reason, second.state) == (False, False, None, "ok")  # type: ignore[attr-defined]
    assert (third.chat, third.fake, third.kudos) == (True, True, 0.0)  # type: ignore[attr-defined]


async def test_done_record_carries_dropped_tool_calls(app_client, factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="horde_submit.submit")
    tools = [
        {"type": "function", "function": {"name": "lookup_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "lookup_time", "parameters": {"type": "object"}}},
    ]
    job = await factory.job(chat_extras={"tools": tools, "tool_choice": "auto", "parallel_tool_calls": False})
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i, name in enumerate(["lookup_weather", "lookup_time", "lookup_time"])
    ]
    caplog.clear()
    body = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": None, "tool_calls": calls},
        "finish_reason": "tool_calls",
        "model_id": job.model,
    }
    assert (await post(app_client, body, job.owner.api_key)).status_code == 200
    (record,) = done_records(caplog)
    assert (record.generation_id, record.dropped_tool_calls) == (str(job.gen_id), 2)  # type: ignore[attr-defined]


async def test_no_done_record_for_refused_aborted_duplicate_or_faulted_submits(
    app_client, factory, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="horde_submit.submit")
    refused = await factory.job()
    aborted = await factory.job()
    await fault(factory, aborted)
    faulted = await factory.job()
    caplog.clear()
    assert (
        await post(app_client, {**reply(refused), "model_id": "other"}, refused.owner.api_key)
    ).status_code == 400
    assert (await post(app_client, reply(aborted), aborted.owner.api_key)).status_code == 400
    fault_body = {"id": str(faulted.gen_id), "state": "faulted", "model_id": faulted.model}
    assert (await post(app_client, fault_body, faulted.owner.api_key)).status_code == 200
    assert done_records(caplog) == []
    assert (await post(app_client, reply(refused), refused.owner.api_key)).status_code == 200
    assert (await post(app_client, reply(refused), refused.owner.api_key)).json()["rc"] == "DuplicateGen"
    assert [r.generation_id for r in done_records(caplog)] == [str(refused.gen_id)]  # type: ignore[attr-defined]
