"""Fake jobs for paused workers (docs/native-api.md#workers, #pop; upstream's countermeasure) and the pop
response's ``softprompt`` (docs/native-api.md#pop).

A paused worker picks as an unpaused one would: its owner's request is a real job, another user's request a
fake generation that looks the same on the wire, leaves the request's n and expiry alone (a real worker still
takes it), is kept out of the queue wait record, is answered at submit with the reward a real job would earn
while paying nothing, and never reaches the client's status. The pops run in-process on the conftest's
dispatch app; submit and admission run as real processes on the same stores, so the submit and the status go
through their routes.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_core.chat_stream import LeaseField, progress_stream_key, stream_lease_key
from horde_core.grpc import insecure_channel
from horde_dispatch.metrics import QUEUE_WAIT_SECONDS
from horde_dispatch.settings import DispatchSettings
from horde_janitor.sweeper import Janitor, PassResult
from horde_store.db import create_pool
from horde_testing.launcher import ServiceProcess, free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")

Harness = Any
CHAT_MODEL = "koboldcpp/test-chat-7b"
TEXT_MODEL = "koboldcpp/test-text-7b"
SUBMIT = "/api/v2/generate/text/submit"
PROGRESS = "/api/v2/generate/text/progress"
REPLY = "and they all lived happily ever after, " * 4


@pytest.fixture(scope="module")
def submit_process(horde_settings_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A real submit process on this module's stores: its base URL and its Settlement gRPC target."""
    port, grpc_port = free_port(), free_port()
    env = {
        **horde_settings_env,
        "HORDE_SUBMIT_HTTP_PORT": str(port),
        "HORDE_SUBMIT_GRPC_PORT": str(grpc_port),
        "HORDE_LOG_JSON": "false",
    }
    url = f"http://127.0.0.1:{port}"
    with ServiceProcess("submit", [sys.executable, "-m", "horde_submit"], env, f"{url}/healthz"):
        yield url, f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def submit_url(submit_process: tuple[str, str]) -> str:
    return submit_process[0]


@pytest.fixture(scope="module")
def settlement_target(submit_process: tuple[str, str]) -> str:
    return submit_process[1]


@pytest.fixture(scope="module")
def admission_url(horde_settings_env: dict[str, str], dispatch_settings: DispatchSettings) -> Iterator[str]:
    """A real admission process on this module's stores (asking the in-process dispatch for availability)."""
    port = free_port()
    env = {
        **horde_settings_env,
        "HORDE_ADMISSION_HTTP_PORT": str(port),
        "HORDE_DISPATCH_GRPC_PORT": str(dispatch_settings.dispatch_grpc_port),
        "HORDE_LOG_JSON": "false",
    }
    url = f"http://127.0.0.1:{port}"
    with ServiceProcess("admission", [sys.executable, "-m", "horde_admission"], env, f"{url}/healthz"):
        yield url


def text_body(name: str) -> dict[str, Any]:
    """A legacy text worker's pop (the KoboldAI bridge's fields)."""
    return {
        "name": name,
        "models": [TEXT_MODEL],
        "max_length": 2048,
        "max_context_length": 4096,
        "bridge_agent": "KoboldAI Bridge:10:https://github.com/db0/KoboldAI-Horde-Bridge",
        "softprompts": [],
    }


def queue_wait_count() -> float:
    """Assignments recorded in horde.text.queue_wait_seconds, over every label set."""
    total = 0.0
    for metric in QUEUE_WAIT_SECONDS.collect():
        total += sum(s.value for s in metric.samples if s.name.endswith("_count"))
    return total


async def post(url: str, path: str, body: dict[str, Any], apikey: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30) as http:
        return await http.post(path, json=body, headers={"apikey": apikey})


async def text_status(
    admission_url: str, request_id: uuid.UUID, *, kind: str = "text", method: str = "GET"
) -> dict[str, Any]:
    """The client's view: admission's ``GET /v2/generate/text/status/{id}`` (asserted 200); ``kind="chat"``
    reads the chat route, ``method="DELETE"`` cancels."""
    async with httpx.AsyncClient(base_url=admission_url, trust_env=False, timeout=30) as http:
        r = await http.request(method, f"/api/v2/generate/{kind}/status/{request_id}")
    assert r.status_code == 200, r.text
    status: dict[str, Any] = r.json()
    return status


async def hold(h: Harness, wp: uuid.UUID, user_id: int, amount: float) -> None:
    """The upfront kudos hold admission takes for ``wp``."""
    await h.db.execute(
        "INSERT INTO kudos_holds (wp_id, user_id, amount) VALUES ($1, $2, $3)", wp, user_id, amount
    )


async def holds(h: Harness, wp: uuid.UUID) -> int:
    return int(await h.db.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", wp))


async def worker(
    h: Harness, name: str, body: dict[str, Any], *, paused: bool = False
) -> tuple[int, str, uuid.UUID]:
    """A worker created by an empty pop (paused afterwards when asked): ``(owner id, owner key, worker id)``."""
    owner, key = await h.user()
    r = await h.pop(key, body)
    assert (r.status_code, r.json()["id"]) == (200, None), r.text
    if paused:
        await h.set_worker(name, paused=True)
    worker_id: uuid.UUID = await h.db.fetchval("SELECT id FROM workers WHERE name = $1", name)
    return owner, key, worker_id


async def test_paused_worker_gets_fake_jobs_for_others_and_real_ones_for_its_owner(
    h: Harness, submit_url: str, admission_url: str
) -> None:
    paused_owner, paused_key, paused_id = await worker(h, "w-paused", text_body("w-paused"), paused=True)
    _, real_key, real_id = await worker(h, "w-real", text_body("w-real"))
    requester, _ = await h.user(kudos=1000)
    wp = await h.request(
        user_id=requester,
        is_chat=False,
        models=[TEXT_MODEL],
        max_length=1300,  # over the unmeasured worker's 1200 token capacity: a real job would be over capacity
        params={"temperature": 0.7, "n": 1},
        prompt="Once upon a time",
    )
    expiry = await h.db.fetchval("SELECT expiry FROM waiting_prompts WHERE id = $1", wp)
    waits = queue_wait_count()

    # The paused worker is handed the request, on the wire like any job.
    r = await h.pop(paused_key, text_body("w-paused"))
    assert r.status_code == 200, r.text
    fake_job = r.json()
    assert fake_job["id"] is not None, fake_job
    fake_id = uuid.UUID(fake_job["id"])
    assert fake_job == {
        "id": str(fake_id),
        "ids": [str(fake_id)],
        "model": TEXT_MODEL,
        "payload": {
            "temperature": 0.7,
            "prompt": "Once upon a time",
            "max_length": 1300,
            "max_context_length": 4096,
            "n": 1,
        },
        "ttl": 150,
        "softprompt": None,
        "skipped": {},
    }
    gen = await h.db.fetchrow("SELECT * FROM processing_gens WHERE id = $1", fake_id)
    assert (gen["wp_id"], gen["worker_id"], gen["user_id"], gen["model"]) == (
        wp,
        paused_id,
        paused_owner,
        TEXT_MODEL,
    )
    assert (gen["fake"], gen["over_capacity_at_assignment"], gen["generation"], gen["faulted"]) == (
        True,
        False,
        None,
        False,
    )
    # The request is not taken: its job is still left and its expiry was not refreshed.
    row = await h.db.fetchrow("SELECT n, expiry FROM waiting_prompts WHERE id = $1", wp)
    assert (row["n"], row["expiry"]) == (1, expiry)
    assert queue_wait_count() == waits

    # Its owner's request comes first (the owner's requests lead the queue) and is a real job.
    own = await h.request(user_id=paused_owner, is_chat=False, models=[TEXT_MODEL], max_length=100)
    r = await h.pop(paused_key, text_body("w-paused"))
    assert r.status_code == 200, r.text
    own_gen = await h.db.fetchrow(
        "SELECT wp_id, fake FROM processing_gens WHERE id = $1", uuid.UUID(r.json()["id"])
    )
    assert (own_gen["wp_id"], own_gen["fake"]) == (own, False)
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", own) == 0
    assert queue_wait_count() == waits + 1

    # One decoy per request: popping again, the paused worker is not handed the same request a second time
    # (it would otherwise loop on it as fast as it can pop), though the request is still queued.
    r = await h.pop(paused_key, text_body("w-paused"))
    assert (r.status_code, r.json()["id"]) == (200, None), r.text
    assert (
        await h.db.fetchval(
            "SELECT count(*) FROM processing_gens WHERE wp_id = $1 AND worker_id = $2", wp, paused_id
        )
        == 1
    )
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1

    # A real worker still takes the other request, and takes it for real.
    r = await h.pop(real_key, text_body("w-real"))
    assert r.status_code == 200, r.text
    real_job = r.json()
    real_gen_id = uuid.UUID(real_job["id"])
    assert set(real_job) == set(fake_job)
    assert real_job["payload"] == fake_job["payload"]
    gen = await h.db.fetchrow(
        "SELECT wp_id, fake, over_capacity_at_assignment FROM processing_gens WHERE id = $1", real_gen_id
    )
    assert (gen["wp_id"], gen["fake"], gen["over_capacity_at_assignment"]) == (wp, False, True)
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 0
    assert queue_wait_count() == waits + 2
    # Nothing is left for anyone, the paused worker included.
    r = await h.pop(paused_key, text_body("w-paused"))
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {}}

    balances = "SELECT id, kudos, evaluating_kudos FROM users WHERE id = ANY($1::bigint[]) ORDER BY id"
    before = [tuple(x) for x in await h.db.fetch(balances, [paused_owner, requester])]
    stats = "SELECT kudos, contributions, fulfilments, speed FROM workers WHERE id = $1"
    paused_stats = tuple(await h.db.fetchrow(stats, paused_id))

    # The fake submit is answered as a real one would be, pays nothing and is not shown to the client.
    r = await post(submit_url, SUBMIT, {"id": str(fake_id), "generation": REPLY}, paused_key)
    assert r.status_code == 200, r.text
    fake_reward = r.json()["reward"]
    assert fake_reward > 0
    assert [tuple(x) for x in await h.db.fetch(balances, [paused_owner, requester])] == before
    assert tuple(await h.db.fetchrow(stats, paused_id)) == paused_stats
    gen = await h.db.fetchrow("SELECT generation, kudos, fake FROM processing_gens WHERE id = $1", fake_id)
    assert (gen["generation"], gen["kudos"], gen["fake"]) == (REPLY, 0.0, True)
    status = await text_status(admission_url, wp)
    assert (status["finished"], status["processing"], status["done"], status["generations"]) == (
        0,
        1,
        False,
        [],
    )
    # A second submit of the fake job is a duplicate, as for a real one.
    r = await post(submit_url, SUBMIT, {"id": str(fake_id), "generation": REPLY}, paused_key)
    assert (r.status_code, r.json()["rc"]) == (400, "DuplicateGen")

    # The real worker's identical reply earns what the fake one was told, and is the only one delivered.
    r = await post(submit_url, SUBMIT, {"id": str(real_gen_id), "generation": REPLY}, real_key)
    assert r.status_code == 200, r.text
    assert r.json()["reward"] == pytest.approx(fake_reward)
    assert await h.db.fetchval(
        "SELECT kudos FROM processing_gens WHERE id = $1", real_gen_id
    ) == pytest.approx(fake_reward)
    assert await h.db.fetchval("SELECT kudos FROM users WHERE id = $1", requester) < before[-1][1]
    status = await text_status(admission_url, wp)
    assert (status["finished"], status["processing"], status["done"]) == (1, 0, True)
    assert [(g["text"], g["worker_id"], g["worker_name"]) for g in status["generations"]] == [
        (REPLY, str(real_id), "w-real")
    ]


async def test_a_faulted_fake_job_does_not_requeue_the_request(h: Harness, submit_url: str) -> None:
    _, paused_key, paused_id = await worker(h, "w-paused-fault", text_body("w-paused-fault"), paused=True)
    requester, _ = await h.user()
    wp = await h.request(user_id=requester, is_chat=False, models=[TEXT_MODEL], max_length=100)
    r = await h.pop(paused_key, text_body("w-paused-fault"))
    fake_id = r.json()["id"]
    r = await post(submit_url, SUBMIT, {"id": fake_id, "generation": "", "state": "faulted"}, paused_key)
    assert (r.status_code, r.json()) == (200, {"reward": 0})
    gen = await h.db.fetchrow("SELECT faulted, fake FROM processing_gens WHERE id = $1", uuid.UUID(fake_id))
    assert (gen["faulted"], gen["fake"]) == (True, True)
    # n stays 1 (the fake never took the job), and the worker's dropped-job counter is untouched.
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1
    assert await h.db.fetchval("SELECT aborted_jobs FROM workers WHERE id = $1", paused_id) == 0


async def test_faulted_fake_jobs_neither_restart_nor_fault_the_request(
    h: Harness, submit_url: str, settlement_target: str, admission_url: str
) -> None:
    """Three paused workers fault their fake jobs of one request, one by a faulted submit (with a known fault
    reason), one by a lapsed lease faulted through submit's FaultGeneration, one by a lapsed lease the janitor's
    sweep finds: past FAULTED_GENERATIONS_LIMIT had they been real. Each is only marked faulted: no restart (n
    stays 1), no request fault, no fault reason on the request, no worker counter, no hold released or taken,
    no ``restarted`` in the client's status; a real worker then serves the request as if nothing happened."""
    names = [f"w-paused-fault-{i}" for i in range(3)]
    created = [await worker(h, name, h.chat_body(name), paused=True) for name in names]
    _, real_key, real_id = await worker(h, "w-real-after-fakes", h.chat_body("w-real-after-fakes"))
    requester, _ = await h.user(kudos=1000)
    wp = await h.request(user_id=requester, max_length=300)
    await hold(h, wp, requester, 12.0)
    paused: list[tuple[str, uuid.UUID, uuid.UUID]] = []
    for name, (_, key, worker_id) in zip(names, created, strict=True):
        r = await h.pop(key, h.chat_body(name))
        assert r.status_code == 200 and r.json()["id"] is not None, r.text
        paused.append((key, worker_id, uuid.UUID(r.json()["id"])))
    fakes = [gen for _, _, gen in paused]
    workers = [worker_id for _, worker_id, _ in paused]
    counters_sql = """
        SELECT aborted_jobs, uncompleted_jobs, nonconformant_replies, last_aborted_job, maintenance
          FROM workers WHERE id = ANY($1) ORDER BY id
    """
    counters_before = [tuple(c) for c in await h.db.fetch(counters_sql, workers)]
    assert [c[:3] + c[4:] for c in counters_before] == [(0, 0, 0, False)] * 3
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE id = ANY($1) AND fake", fakes) == 3
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1

    # 1. A faulted submit, with a known fault reason.
    body = {
        "id": str(fakes[0]),
        "state": "faulted",
        "model_id": CHAT_MODEL,
        "fault_reason": "generation_error",
    }
    r = await post(submit_url, SUBMIT, body, paused[0][0])
    assert (r.status_code, r.json()) == (200, {"reward": 0})

    # 2. and 3. Lapsed leases: one faulted through FaultGeneration, the other found by the janitor's sweep.
    await h.db.execute(
        "UPDATE processing_gens SET started_at = now() - interval '1 hour' WHERE id = ANY($1)", fakes[1:]
    )
    channel = insecure_channel(settlement_target)
    pool = await create_pool(h.settings.database_url)
    try:
        stub = settlement_pb2_grpc.SettlementServiceStub(channel)
        response = await stub.FaultGeneration(
            settlement_pb2.FaultGenerationRequest(
                generation_id=str(fakes[1]), cause=settlement_pb2.FAULT_CAUSE_LEASE_LAPSED
            ),
            timeout=10,
        )
        assert (response.faulted, response.request_faulted) == (True, False)
        swept = PassResult()
        await Janitor(pool, None, stub, grpc_timeout=10.0).fault_stale(swept)
        assert (swept.stale_found, swept.stale_faulted, swept.requests_faulted) == (1, 1, 0)
    finally:
        await pool.close()
        await channel.close()

    gens = await h.db.fetch(
        "SELECT faulted, fake, generation, kudos FROM processing_gens WHERE id = ANY($1)", fakes
    )
    assert [tuple(g) for g in gens] == [(True, True, None, 0.0)] * 3
    row = await h.db.fetchrow(
        "SELECT n, jobs, faulted, cancelled, chat_fault_reason, chat_fault_rc FROM waiting_prompts WHERE id = $1",
        wp,
    )
    assert tuple(row) == (1, 1, False, False, None, None)
    assert [tuple(c) for c in await h.db.fetch(counters_sql, workers)] == counters_before
    assert await holds(h, wp) == 1
    status = await text_status(admission_url, wp, kind="chat")
    assert {k: status[k] for k in ("finished", "processing", "restarted", "waiting", "done", "faulted")} == {
        "finished": 0,
        "processing": 0,
        "restarted": 0,
        "waiting": 1,
        "done": False,
        "faulted": False,
    }

    # A real worker still gets the request's one job, and its reply completes it.
    r = await h.pop(real_key, h.chat_body("w-real-after-fakes"))
    assert r.status_code == 200 and r.json()["id"] is not None, r.text
    real_gen = uuid.UUID(r.json()["id"])
    real_row = await h.db.fetchrow("SELECT wp_id, fake FROM processing_gens WHERE id = $1", real_gen)
    assert (real_row["wp_id"], real_row["fake"]) == (wp, False)
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 0
    reply = {
        "id": str(real_gen),
        "model_id": CHAT_MODEL,
        "message": {"role": "assistant", "content": "Hi there"},
        "finish_reason": "stop",
    }
    r = await post(submit_url, SUBMIT, reply, real_key)
    assert r.status_code == 200 and r.json()["reward"] > 0, r.text
    status = await text_status(admission_url, wp, kind="chat")
    assert (status["finished"], status["restarted"], status["done"], status["faulted"]) == (1, 0, True, False)
    assert [g["worker_id"] for g in status["generations"]] == [str(real_id)]
    assert await holds(h, wp) == 0
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 0


async def test_a_cancel_with_only_a_fake_job_pending_releases_the_hold(
    h: Harness, submit_url: str, admission_url: str
) -> None:
    """A fake job never took a job: a cancel finds nothing in flight, so the request is done and its hold
    released at once, not at expiry; the fake's later submit changes nothing."""
    _, paused_key, _ = await worker(h, "w-paused-cancel", text_body("w-paused-cancel"), paused=True)
    requester, _ = await h.user(kudos=1000)
    wp = await h.request(user_id=requester, is_chat=False, models=[TEXT_MODEL], max_length=100)
    await hold(h, wp, requester, 7.0)
    r = await h.pop(paused_key, text_body("w-paused-cancel"))
    fake_id = uuid.UUID(r.json()["id"])
    assert await h.db.fetchval("SELECT fake FROM processing_gens WHERE id = $1", fake_id) is True

    status = await text_status(admission_url, wp, method="DELETE")
    assert (status["processing"], status["waiting"], status["done"]) == (0, 0, True)
    assert await holds(h, wp) == 0
    row = await h.db.fetchrow("SELECT n, cancelled FROM waiting_prompts WHERE id = $1", wp)
    assert tuple(row) == (0, True)

    balance = await h.db.fetchval("SELECT kudos FROM users WHERE id = $1", requester)
    r = await post(submit_url, SUBMIT, {"id": str(fake_id), "generation": REPLY}, paused_key)
    assert r.status_code == 200, r.text
    assert await h.db.fetchval("SELECT kudos FROM users WHERE id = $1", requester) == balance
    assert await holds(h, wp) == 0
    status = await text_status(admission_url, wp)
    assert (status["finished"], status["processing"], status["done"]) == (0, 0, True)


async def test_a_streamed_fake_chat_job_has_a_fake_lease_whose_posts_are_not_appended(
    h: Harness, submit_url: str, signal_redis: Any
) -> None:
    _, paused_key, _ = await worker(h, "w-paused-chat", h.chat_body("w-paused-chat"), paused=True)
    _, real_key, _ = await worker(h, "w-real-chat", h.chat_body("w-real-chat"))
    requester, _ = await h.user()
    wp = await h.request(user_id=requester, stream_progress=True, max_length=300)

    r = await h.pop(paused_key, h.chat_body("w-paused-chat"))
    assert r.status_code == 200, r.text
    fake_job = r.json()
    assert (fake_job["chat"], fake_job["softprompt"], fake_job["payload"]["messages"]) == (
        True,
        None,
        [{"role": "user", "content": "Hello"}],
    )
    fake_lease = await signal_redis.hgetall(stream_lease_key(fake_job["id"]))
    assert fake_lease[LeaseField.fake] == "1"
    assert fake_lease[LeaseField.request] == str(wp)
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1

    # The fake job's progress post is answered as a real one's, and the client's stream gets nothing.
    body = {"id": fake_job["id"], "seq": 1, "delta": {"content": "Hi"}}
    r = await post(submit_url, PROGRESS, body, paused_key)
    assert r.status_code == 200, r.text
    fake_answer = r.json()
    assert fake_answer["cancelled"] is False
    assert await signal_redis.xlen(progress_stream_key(str(wp))) == 0

    # The real worker takes the request; its lease is a real one and its post reaches the stream.
    r = await h.pop(real_key, h.chat_body("w-real-chat"))
    assert r.status_code == 200, r.text
    real_job = r.json()
    assert set(real_job) == set(fake_job)
    real_lease = await signal_redis.hgetall(stream_lease_key(real_job["id"]))
    assert real_lease[LeaseField.fake] == "0"
    body = {"id": real_job["id"], "seq": 1, "delta": {"content": "Hi"}}
    r = await post(submit_url, PROGRESS, body, real_key)
    assert r.status_code == 200, r.text
    assert set(r.json()) == set(fake_answer)
    assert await signal_redis.xlen(progress_stream_key(str(wp))) == 1


async def test_every_job_carries_a_null_softprompt_and_the_document_lists_it(h: Harness) -> None:
    _, key = await h.user()
    requester, _ = await h.user()
    await h.request(user_id=requester)
    r = await h.pop(key, h.chat_body("w-softprompt"))
    assert r.status_code == 200, r.text
    assert "softprompt" in r.json() and r.json()["softprompt"] is None
    schema = h.app.openapi()["components"]["schemas"]["PopResponse"]
    assert schema["properties"]["softprompt"]["type"] == "null"
    assert "softprompt: null" in schema["description"]
