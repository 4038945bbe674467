"""DELETE /v2/generate/chat/status/{id} of a streamed request against a real submit process: the cancel settles
each in-flight generation on its posted content, and a settlement call that fails never leaves the worker
penalised for the job it was told to drop.

See docs/native-api.md#submit ("For a streamed request it settles each in-flight generation on
the content its worker posted; the generation is faulted as cancelled, does not count toward the worker's
aborted-job threshold and is not restarted"), docs/native-api.md#pricing, #progress (the lease is flagged, the
worker's next post answers cancelled: true, a submit after the cancel returns 400 AbortedGen); docs/native-api.md#submit
(``ProcessingGeneration.cancel`` pays on the current text), §6 (``log_aborted_job``).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from admission_helpers import TEST_SECRET_KEY, add_chat_worker, chat_body, new_user, unique_model
from horde_core.chat_stream import (
    LeaseField,
    StreamLease,
    lease_key_check,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.redis_keys import signal_client
from horde_store.users import hash_api_key
from horde_testing.launcher import ServiceProcess, free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")

SUBMIT = "/v2/generate/text/submit"
PROGRESS = "/v2/generate/text/progress"


class Submit:
    """The launched submit process: its HTTP base URL and its Settlement gRPC target."""

    def __init__(self, http_port: int, grpc_port: int) -> None:
        self.url = f"http://127.0.0.1:{http_port}"
        self.target = f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def submit(admission_env: dict[str, str]) -> Iterator[Submit]:
    """A real submit process on the stores admission uses (the Settlement service the cancel calls)."""
    http_port, grpc_port = free_port(), free_port()
    env = {
        **admission_env,
        "HORDE_SUBMIT_HTTP_PORT": str(http_port),
        "HORDE_SUBMIT_GRPC_PORT": str(grpc_port),
        "HORDE_LOG_LEVEL": "WARNING",
    }
    with ServiceProcess(
        "submit",
        [sys.executable, "-m", "horde_submit"],
        env=env,
        health_url=f"http://127.0.0.1:{http_port}/healthz",
    ):
        yield Submit(http_port, grpc_port)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def settling_client(make_client: Any, submit: Submit) -> httpx.AsyncClient:
    """An admission client whose cancel reaches the submit process."""
    made: httpx.AsyncClient = await make_client(submit_grpc_target=submit.target)
    return made


class Streamed:
    """A streamed chat request with one generation in flight on a worker, as a pop leaves them."""

    def __init__(self, rid: str, gen: uuid.UUID, worker: uuid.UUID, owner_key: str, requester: int) -> None:
        self.rid = rid
        self.gen = gen
        self.worker = worker
        self.owner_key = owner_key
        self.requester = requester


async def streamed_job(client: Any, db: Any, admission_env: dict[str, str]) -> Streamed:
    """Queue a streamed request through admission, assign it (what the pop writes: ``n - 1``, the generation,
    the stream lease on the signal database)."""
    model = unique_model()
    owner, owner_key = await new_user(db, kudos=0)
    worker = await add_chat_worker(db, model, owner=owner)
    requester, key = await new_user(db)
    r = await client.post(
        "/api/v2/generate/chat/async", json={**chat_body(model), "stream": True}, headers={"apikey": key}
    )
    assert r.status_code == 202, r.text
    rid: str = r.json()["id"]
    gen: uuid.UUID = await db.fetchval(
        """
        WITH d AS (UPDATE waiting_prompts SET n = n - 1 WHERE id = $1 RETURNING id)
        INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model, lease_cap)
        SELECT d.id, w.id, w.user_id, $3, $3, 200 FROM d, workers w WHERE w.id = $2
        RETURNING id
        """,
        uuid.UUID(rid),
        worker,
        model,
    )
    lease = StreamLease(
        request_id=rid,
        worker_id=str(worker),
        model=model,
        owner_id=owner,
        key_check=lease_key_check(hash_api_key(owner_key, TEST_SECRET_KEY)),
        max_bytes=8192,
        started=int(time.time()),
        job_ttl=150,
        lease_cap=200,
        trusted=False,
    )
    signals = signal_client(admission_env["HORDE_REDIS_URL"])
    try:
        assert await write_stream_leases(signals, {str(gen): lease})
    finally:
        await signals.aclose()
    return Streamed(rid, gen, worker, owner_key, requester)


async def post_progress(submit: Submit, job: Streamed, seq: int, content: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=submit.url, trust_env=False) as http:
        return await http.post(
            PROGRESS,
            json={"id": str(job.gen), "seq": seq, "delta": {"content": content}},
            headers={"apikey": job.owner_key},
        )


async def submit_reply(submit: Submit, job: Streamed, db: Any, body: dict[str, Any]) -> httpx.Response:
    model = await db.fetchval("SELECT assigned_model FROM processing_gens WHERE id = $1", job.gen)
    async with httpx.AsyncClient(base_url=submit.url, trust_env=False) as http:
        return await http.post(
            SUBMIT, json={"id": str(job.gen), "model_id": model, **body}, headers={"apikey": job.owner_key}
        )


REPLY = {
    "message": {"role": "assistant", "content": "the whole reply, after the cancel"},
    "finish_reason": "stop",
}


async def state(db: Any, job: Streamed) -> dict[str, Any]:
    row = await db.fetchrow(
        """
        SELECT g.faulted, g.cancelled, g.generation, g.settled_character_count, g.kudos AS gen_kudos,
               w.kudos AS worker_kudos, w.aborted_jobs, w.uncompleted_jobs, w.maintenance,
               r.kudos AS requester_kudos, wp.n, wp.consumed_kudos
          FROM processing_gens g JOIN workers w ON w.id = g.worker_id
          JOIN waiting_prompts wp ON wp.id = g.wp_id JOIN users r ON r.id = wp.user_id
         WHERE g.id = $1
        """,
        job.gen,
    )
    assert row is not None
    return dict(row)


def assert_settled_as_cancelled(found: dict[str, Any], characters: int, requester_before: float) -> None:
    """Paid on the posted content, charged with the extra burn, faulted as cancelled, no dropped job."""
    assert (found["faulted"], found["cancelled"], found["generation"]) == (True, True, None)
    assert found["settled_character_count"] == characters
    assert found["gen_kudos"] > 0
    assert found["worker_kudos"] == pytest.approx(found["gen_kudos"])
    assert found["requester_kudos"] == pytest.approx(requester_before - found["gen_kudos"] - 1)
    assert (found["aborted_jobs"], found["uncompleted_jobs"], found["maintenance"]) == (0, 0, False)
    assert found["n"] == 0  # not restarted


async def requester_kudos(db: Any, job: Streamed) -> float:
    return float(await db.fetchval("SELECT kudos FROM users WHERE id = $1", job.requester))


async def test_cancel_settles_the_streamed_generation_on_its_posted_content(
    settling_client: Any, db: Any, submit: Submit, admission_env: dict[str, str]
) -> None:
    job = await streamed_job(settling_client, db, admission_env)
    for seq, part in enumerate(["a" * 100, "b" * 50], start=1):
        assert (await post_progress(submit, job, seq, part)).status_code == 200
    before = await requester_kudos(db, job)
    r = await settling_client.delete(f"/api/v2/generate/chat/status/{job.rid}")
    assert r.status_code == 200
    s = r.json()
    assert (s["done"], s["processing"], s["restarted"], s["finished"], s["generations"]) == (
        True,
        0,
        1,
        0,
        [],
    )
    found = await state(db, job)
    assert_settled_as_cancelled(found, 150, before)
    assert s["kudos"] == round(found["consumed_kudos"])
    # The worker is told to stop; a submit after the cancel is AbortedGen and changes nothing.
    r = await post_progress(submit, job, 3, "c")
    assert (r.status_code, r.json()) == (200, {"accepted_seq": 3, "cancelled": True})
    r = await submit_reply(submit, job, db, REPLY)
    assert r.status_code == 400
    assert r.json() == {
        "message": f"Processing Generation with ID {job.gen} has been aborted because its request was cancelled.",
        "rc": "AbortedGen",
    }
    assert await state(db, job) == found


async def test_failed_settlement_then_the_late_reply_settles_it_as_cancelled(
    client: Any, db: Any, submit: Submit, admission_env: dict[str, str]
) -> None:
    """The default test client's submit target does not answer, so the cancel's SettleCancelledGeneration fails:
    the cancel still stands and flags the lease, and the generation stays in flight. The worker's reply that
    arrives anyway is answered AbortedGen and settles it exactly as the cancel would have."""
    job = await streamed_job(client, db, admission_env)
    assert (await post_progress(submit, job, 1, "x" * 120)).status_code == 200
    before = await requester_kudos(db, job)
    r = await client.delete(f"/api/v2/generate/chat/status/{job.rid}")
    assert r.status_code == 200
    assert (r.json()["done"], r.json()["processing"]) == (False, 1)
    pending = await state(db, job)
    assert (pending["faulted"], pending["aborted_jobs"], pending["worker_kudos"]) == (False, 0, 0)
    signals = signal_client(admission_env["HORDE_REDIS_URL"])
    try:
        assert await signals.hget(stream_lease_key(str(job.gen)), LeaseField.cancelled.value) == "1"
    finally:
        await signals.aclose()
    r = await submit_reply(submit, job, db, REPLY)
    assert (r.status_code, r.json()["rc"]) == (400, "AbortedGen")
    assert_settled_as_cancelled(await state(db, job), 120, before)
    s = (await client.get(f"/api/v2/generate/chat/status/{job.rid}")).json()
    assert (s["done"], s["processing"], s["generations"]) == (True, 0, [])


async def test_failed_settlement_then_the_worker_fault_is_not_a_dropped_job(
    client: Any, db: Any, submit: Submit, admission_env: dict[str, str]
) -> None:
    job = await streamed_job(client, db, admission_env)
    assert (await post_progress(submit, job, 1, "y" * 60)).status_code == 200
    before = await requester_kudos(db, job)
    assert (await client.delete(f"/api/v2/generate/chat/status/{job.rid}")).status_code == 200
    r = await submit_reply(submit, job, db, {"state": "faulted", "fault_reason": "generation_error"})
    assert (r.status_code, r.json()) == (200, {"reward": 0})
    assert_settled_as_cancelled(await state(db, job), 60, before)


async def test_failed_settlement_is_settled_by_the_janitor_when_the_worker_stops(
    client: Any, db: Any, submit: Submit, admission_env: dict[str, str]
) -> None:
    """The worker does what the flagged lease tells it: it stops and never submits. The janitor's next pass
    settles the generation as cancelled through submit, so the worker is paid for what it posted and is not
    counted as having dropped the job (before, the lease lapsed and counted as an aborted job)."""
    job = await streamed_job(client, db, admission_env)
    assert (await post_progress(submit, job, 1, "z" * 80)).status_code == 200
    before = await requester_kudos(db, job)
    assert (await client.delete(f"/api/v2/generate/chat/status/{job.rid}")).json()["processing"] == 1
    port = free_port()
    env = {
        **admission_env,
        "HORDE_JANITOR_HTTP_PORT": str(port),
        "HORDE_SUBMIT_GRPC_TARGET": submit.target,
        "HORDE_JANITOR_INTERVAL_SECONDS": "0.2",
        "HORDE_LOG_LEVEL": "WARNING",
    }
    with ServiceProcess(
        "janitor",
        [sys.executable, "-m", "horde_janitor"],
        env=env,
        health_url=f"http://127.0.0.1:{port}/healthz",
    ):
        deadline = asyncio.get_running_loop().time() + 15
        while asyncio.get_running_loop().time() < deadline:
            if await db.fetchval("SELECT faulted FROM processing_gens WHERE id = $1", job.gen):
                break
            await asyncio.sleep(0.1)
    assert_settled_as_cancelled(await state(db, job), 80, before)
    s = (await client.get(f"/api/v2/generate/chat/status/{job.rid}")).json()
    assert (s["done"], s["processing"]) == (True, 0)
