"""GET/DELETE /v2/generate/chat/status/{id} and the text pair: status fields, the done rule, cancel, the
completion signal, and the route families kept apart (docs/native-api.md#routes, #submit, #completion-signal,
Impossible reason; docs/native-api.md#status-and-cancel)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model
from horde_core.chat_stream import (
    LeaseField,
    StreamEntry,
    StreamLease,
    progress_stream_key,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client, signal_client

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def queue(client: Any, key: str, body: dict[str, Any]) -> str:
    r = await client.post("/api/v2/generate/chat/async", json=body, headers={"apikey": key})
    assert r.status_code == 202, r.text
    rid: str = r.json()["id"]
    return rid


async def assign(db: Any, rid: str, worker: uuid.UUID, model: str) -> uuid.UUID:
    """What a pop does to the rows: n - 1 and a pending generation."""
    gen: uuid.UUID = await db.fetchval(
        """
        WITH d AS (UPDATE waiting_prompts SET n = n - 1 WHERE id = $1 RETURNING id)
        INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model)
        SELECT d.id, w.id, w.user_id, $3, $3 FROM d, workers w WHERE w.id = $2
        RETURNING id
        """,
        uuid.UUID(rid),
        worker,
        model,
    )
    return gen


async def complete(db: Any, gen: uuid.UUID, content: str) -> None:
    """What a structured submit stores."""
    await db.execute(
        """
        UPDATE processing_gens SET generation = $2, message = $3::jsonb, finish_reason = 'stop',
               native_finish_reason = 'eos', prompt_tokens = 5, completion_tokens = 2, reasoning_tokens = 1,
               charge_basis = 'output_estimate'
        WHERE id = $1
        """,
        gen,
        content,
        {"role": "assistant", "content": content, "reasoning_content": "hmm"},
    )


async def test_status_through_the_lifecycle(client: Any, db: Any) -> None:
    model = unique_model()
    worker = await add_chat_worker(db, model, threads=2, speed=20)
    _, key = await new_user(db)
    rid = await queue(client, key, chat_body(model, max_tokens=100))

    r = await client.get(f"/api/v2/generate/chat/status/{rid}")
    assert r.status_code == 200
    s = r.json()
    assert {k: s[k] for k in ("done", "faulted", "processing", "waiting", "finished", "restarted")} == {
        "done": False,
        "faulted": False,
        "processing": 0,
        "waiting": 1,
        "finished": 0,
        "restarted": 0,
    }
    assert s["queue_position"] == 1 and s["is_possible"] is True and s["eligible_worker_threads"] == 2
    # 100 tokens; two threads at 20 tok/s each (40 tok/s), but one job uses only half of it
    assert s["wait_time"] == 5
    assert s["kudos"] == 1 and s["generations"] == [] and s["impossible_reason"] is None
    assert s["context_adjustments"] is None and s["fault_reason"] is None and s["fault_rc"] is None

    gen = await assign(db, rid, worker, model)
    s = (await client.get(f"/v2/generate/chat/status/{rid}")).json()
    assert (s["processing"], s["waiting"], s["done"], s["queue_position"]) == (1, 0, False, 0)

    await complete(db, gen, "Hello there")
    s = (await client.get(f"/v2/generate/chat/status/{rid}")).json()
    assert (s["finished"], s["processing"], s["done"]) == (1, 0, True)
    (g,) = s["generations"]
    assert g["id"] == str(gen) and g["worker_id"] == str(worker) and g["model"] == model
    assert g["worker_name"].startswith("w_") and g["state"] == "ok" and g["text"] == "Hello there"
    assert g["message"] == {"role": "assistant", "content": "Hello there", "reasoning_content": "hmm"}
    assert (g["finish_reason"], g["native_finish_reason"], g["charge_basis"]) == (
        "stop",
        "eos",
        "output_estimate",
    )
    assert (g["prompt_tokens"], g["completion_tokens"], g["reasoning_tokens"]) == (5, 2, 1)
    assert g["queue_wait_seconds"] >= 0

    # The text routes do not see a chat request.
    for method in ("GET", "DELETE"):
        r = await client.request(method, f"/api/v2/generate/text/status/{rid}")
        assert r.status_code == 404
        assert r.json() == {
            "message": f"Text Waiting Prompt (Status) with ID '{rid}' not found.",
            "rc": "RequestNotFound",
        }


async def test_faulted_request_reports_fault_details(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    _, key = await new_user(db)
    rid = await queue(client, key, chat_body(model))
    await db.execute(
        "UPDATE waiting_prompts SET faulted = true, chat_fault_reason = 'bad', chat_fault_rc = 'ChatSubmitInvalid' "
        "WHERE id = $1",
        uuid.UUID(rid),
    )
    s = (await client.get(f"/api/v2/generate/chat/status/{rid}")).json()
    assert (s["done"], s["faulted"], s["fault_reason"], s["fault_rc"]) == (
        True,
        True,
        "bad",
        "ChatSubmitInvalid",
    )


async def test_impossible_reason_from_declaration_gap(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=[])  # no prompt_overflow_refused guarantee
    _, key = await new_user(db)
    rid = await queue(client, key, chat_body(model, max_tokens=64))
    s = (await client.get(f"/api/v2/generate/chat/status/{rid}")).json()
    assert s["is_possible"] is False and s["eligible_worker_threads"] == 0
    assert s["impossible_reason"] == {
        "kind": "declaration_gap",
        "missing_declarations": ["prompt_overflow_refused"],
        "exceeded_limits": [],
    }
    # best_effort does not need guarantees: the same worker serves it
    rid = await queue(client, key, chat_body(model, max_tokens=64, horde={"conformance": "best_effort"}))
    s = (await client.get(f"/api/v2/generate/chat/status/{rid}")).json()
    assert s["is_possible"] is True and s["impossible_reason"] is None


async def test_cancel_publishes_and_is_done(client: Any, db: Any, admission_env: dict[str, str]) -> None:
    model = unique_model()
    worker = await add_chat_worker(db, model)
    _, key = await new_user(db)
    subscriber = aioredis.from_url(admission_env["HORDE_REDIS_URL"], decode_responses=True)
    pubsub = subscriber.pubsub()
    try:
        # Nothing in flight: the cancel makes it done without a generation.
        rid = await queue(client, key, chat_body(model))
        await pubsub.subscribe(f"horde:chat:{rid}")
        await pubsub.get_message(timeout=1)  # the subscribe confirmation
        r = await client.delete(f"/api/v2/generate/chat/status/{rid}")
        assert r.status_code == 200
        s = r.json()
        assert (s["done"], s["waiting"], s["processing"], s["generations"]) == (True, 0, 0, [])
        row = await db.fetchrow("SELECT n, cancelled FROM waiting_prompts WHERE id = $1", uuid.UUID(rid))
        assert (row["n"], row["cancelled"]) == (0, True)
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
        assert message is not None and json.loads(message["data"]) == {
            "id": rid,
            "event": "cancelled",
            "generations": 0,
        }
        # A second cancel claims nothing and publishes nothing.
        assert (await client.delete(f"/api/v2/generate/chat/status/{rid}")).status_code == 200
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5) is None

        # In flight: the job finishes after the cancel; done once it does.
        rid = await queue(client, key, {**chat_body(model), "stream": True})
        gen = await assign(db, rid, worker, model)
        s = (await client.delete(f"/v2/generate/chat/status/{rid}")).json()
        assert (s["done"], s["processing"]) == (False, 1)
        await complete(db, gen, "late")
        s = (await client.get(f"/v2/generate/chat/status/{rid}")).json()
        assert (s["done"], s["finished"]) == (True, 1)
    finally:
        await pubsub.aclose()
        await subscriber.aclose()


async def test_cancel_releases_the_hold(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, speed=100)
    _, key = await new_user(db)
    rid = await queue(client, key, chat_body(model, max_tokens=64, horde={"slow_workers": False}))
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", uuid.UUID(rid)) == 1
    await client.delete(f"/api/v2/generate/chat/status/{rid}")
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", uuid.UUID(rid)) == 0


async def test_a_pending_fake_job_does_not_keep_the_hold_at_cancel(client: Any, db: Any) -> None:
    """A paused worker's fake generation never took a job (docs/native-api.md#workers): a request with only a
    fake pending is done at its cancel, its hold released, and the fake is in no count of the status."""
    model = unique_model()
    paused = await add_chat_worker(db, model, speed=100)
    _, key = await new_user(db)
    rid = await queue(client, key, chat_body(model, max_tokens=64, horde={"slow_workers": False}))
    await db.execute("UPDATE workers SET paused = true WHERE id = $1", paused)
    fake = await db.fetchval(
        """
        INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model, fake)
        SELECT $1, w.id, w.user_id, $3, $3, true FROM workers w WHERE w.id = $2
        RETURNING id
        """,
        uuid.UUID(rid),
        paused,
        model,
    )
    # A faulted fake beside it (its worker faulted it, or its lease lapsed) is no restart either.
    await db.execute(
        """
        INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model, fake, faulted)
        SELECT $1, w.id, w.user_id, $3, $3, true, true FROM workers w WHERE w.id = $2
        """,
        uuid.UUID(rid),
        await add_chat_worker(db, model),
        model,
    )
    s = (await client.get(f"/api/v2/generate/chat/status/{rid}")).json()
    assert (s["processing"], s["restarted"], s["waiting"], s["done"]) == (0, 0, 1, False)
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", uuid.UUID(rid)) == 1

    s = (await client.delete(f"/api/v2/generate/chat/status/{rid}")).json()
    assert (s["processing"], s["restarted"], s["done"]) == (0, 0, True)
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", uuid.UUID(rid)) == 0
    row = await db.fetchrow("SELECT faulted, generation FROM processing_gens WHERE id = $1", fake)
    assert (row["faulted"], row["generation"]) == (False, None)


@pytest.mark.parametrize("bad", ["not-a-uuid", str(uuid.uuid4())])
async def test_unknown_ids_are_404(client: Any, bad: str) -> None:
    for method in ("GET", "DELETE"):
        r = await client.request(method, f"/api/v2/generate/chat/status/{bad}")
        assert r.status_code == 404
        assert r.json() == {
            "message": f"Chat Waiting Prompt (Status) with ID '{bad}' not found.",
            "rc": "RequestNotFound",
        }


async def test_status_reads_are_concurrent_safe(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    _, key = await new_user(db)
    rid = await queue(client, key, chat_body(model))
    results = await asyncio.gather(*(client.get(f"/api/v2/generate/chat/status/{rid}") for _ in range(10)))
    assert {r.status_code for r in results} == {200}


async def test_cancel_flags_stream_leases(client: Any, db: Any, admission_env: dict[str, str]) -> None:
    model = unique_model()
    worker = await add_chat_worker(db, model, threads=2)
    _, key = await new_user(db)
    rid = await queue(client, key, {**chat_body(model), "stream": True})
    with_lease = await assign(db, rid, worker, model)
    await db.execute("UPDATE waiting_prompts SET n = 1 WHERE id = $1", uuid.UUID(rid))
    without_lease = await assign(db, rid, worker, model)
    signals = signal_client(admission_env["HORDE_REDIS_URL"])
    url_db = redis_client(admission_env["HORDE_REDIS_URL"])
    assert url_db.connection_pool.connection_kwargs["db"] != CHAT_SIGNAL_DB
    try:
        lease = StreamLease(
            request_id=rid,
            worker_id=str(worker),
            model=model,
            owner_id=1,
            key_check="",
            max_bytes=1024,
            started=0,
            job_ttl=150,
            lease_cap=200,
            trusted=False,
        )
        assert await write_stream_leases(signals, {str(with_lease): lease})
        s = (await client.delete(f"/api/v2/generate/chat/status/{rid}")).json()
        assert s["processing"] == 2  # submit's settlement is not reachable here: the jobs stay in flight
        assert await signals.hget(stream_lease_key(str(with_lease)), LeaseField.cancelled.value) == "1"
        assert not await signals.exists(stream_lease_key(str(without_lease)))
        entries: list[tuple[str, dict[str, str]]] = await signals.xrange(progress_stream_key(rid))  # type: ignore[assignment]
        assert [fields for _, fields in entries] == [{"gen": str(with_lease), "ended": "1"}]
        assert [StreamEntry.from_fields(i, f).ended for i, f in entries] == [True]
        assert 0 < await signals.ttl(progress_stream_key(rid)) <= 900
        # The cancel wrote on the chat signal database, not the one the URL names.
        assert await url_db.exists(progress_stream_key(rid), stream_lease_key(str(with_lease))) == 0
    finally:
        await signals.aclose()
        await url_db.aclose()
