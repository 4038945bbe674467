"""The janitor's pass against real stores and a real submit process (docs/native-api.md#completion-signal, #job-lease,
docs/native-api.md#submit, #expiry)."""

from __future__ import annotations

import asyncio
import sys
import uuid

import httpx
from horde_contract import CHAT_WORKER_FAULT_MESSAGES, ChatFaultReason
from horde_core import queue_announce
from horde_core.chat_stream import (
    StreamEntry,
    StreamLease,
    progress_stream_key,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.redis_keys import redis_client, signal_client
from horde_janitor.sweeper import Janitor
from horde_testing.launcher import ServiceProcess, free_port
from horde_testing.signals import Subscriber
from prometheus_client import REGISTRY


def stale_aborts(trusted: str, chat: str) -> float:
    value = REGISTRY.get_sample_value(
        "horde_text_stale_aborts_total", {"worker_trusted": trusted, "chat": chat}
    )
    return value or 0.0


async def test_expired_requests_are_deleted_and_signalled(janitor: Janitor, factory, subscribe) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    refused = await factory.request(
        requester,
        expiry_seconds=-5,
        chat_fault_reason="The reply is bad.",
        chat_fault_rc="ChatSubmitNonconformant",
    )
    plain = await factory.request(requester, expiry_seconds=-5)
    text = await factory.request(requester, is_chat=False, expiry_seconds=-5)
    alive = await factory.request(requester, expiry_seconds=600)
    gen = await factory.generation(refused, worker, owner)
    async with factory.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO kudos_holds (wp_id, user_id, amount) VALUES ($1, $2, 30)", refused, requester.id
        )
    async with subscribe(refused) as sub_refused, subscribe(plain) as sub_plain:
        result = await janitor.run_pass()
        events_refused = await sub_refused.messages(1)
        events_plain = await sub_plain.messages(1)
    assert result.expired >= 3
    assert events_refused == [
        {
            "id": str(refused),
            "event": "faulted",
            "generations": 0,
            "fault_reason": "The reply is bad.",
            "fault_rc": "ChatSubmitNonconformant",
        }
    ]
    assert events_plain == [{"id": str(plain), "event": "faulted", "generations": 0}]
    for wp in (refused, plain, text):
        assert await factory.row("SELECT 1 FROM waiting_prompts WHERE id = $1", wp) is None
    assert await factory.row("SELECT 1 FROM processing_gens WHERE id = $1", gen) is None
    assert await factory.row("SELECT 1 FROM kudos_holds WHERE wp_id = $1", refused) is None
    assert await factory.row("SELECT 1 FROM waiting_prompts WHERE id = $1", alive) is not None


async def test_lapsed_lease_is_faulted_through_submit(janitor: Janitor, factory) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester)
    lapsed = await factory.generation(wp, worker, owner, started_seconds_ago=151)
    wp_fresh = await factory.request(requester)
    fresh = await factory.generation(wp_fresh, worker, owner, started_seconds_ago=100)
    before = stale_aborts("false", "true")
    await janitor.run_pass()
    assert stale_aborts("false", "true") == before + 1
    gen = await factory.row("SELECT faulted FROM processing_gens WHERE id = $1", lapsed)
    assert gen["faulted"] is True
    row = await factory.row("SELECT n, faulted FROM waiting_prompts WHERE id = $1", wp)
    assert (row["n"], row["faulted"]) == (1, False)  # restarted
    w = await factory.row("SELECT aborted_jobs, uncompleted_jobs FROM workers WHERE id = $1", worker)
    assert (w["aborted_jobs"], w["uncompleted_jobs"]) == (1, 1)
    still = await factory.row("SELECT faulted FROM processing_gens WHERE id = $1", fresh)
    assert still["faulted"] is False
    # A second pass finds nothing new to abort.
    await janitor.run_pass()
    assert stale_aborts("false", "true") == before + 1


async def test_a_lapsed_lease_announces_the_restarted_job(
    janitor: Janitor, factory, subscriber_client
) -> None:
    """The restart a lapsed lease causes (applied by submit's FaultGeneration) is announced to the waiting pops
    (docs/worker-guide.md#long-poll), so an idle worker picks the job up at once."""
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester, max_length=256, max_context_length=1024)
    await factory.generation(wp, worker, owner, started_seconds_ago=151)
    async with Subscriber(
        subscriber_client, uuid.uuid4(), channel=queue_announce.QUEUE_ANNOUNCE_CHANNEL
    ) as sub:
        await janitor.run_pass()
        messages = [m for m in await sub.messages(1) if m.get("id") == str(wp)]
    assert messages == [
        {
            "id": str(wp),
            "models": [factory.model],
            "is_chat": True,
            "max_length": 256,
            "max_context_length": 1024,
            "n": 1,
        }
    ]


async def test_lapse_honours_each_generations_job_ttl(janitor: Janitor, factory) -> None:
    """The sweep reads the per-generation job_ttl: a short lease (HORDE_TEXT_JOB_LEASE_SECONDS in the e2e tests)
    lapses after its own length, and a lease renewed by progress past the base 150 s does not lapse at it."""
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    short = await factory.generation(
        await factory.request(requester), worker, owner, started_seconds_ago=5, job_ttl=3
    )
    renewed = await factory.generation(
        await factory.request(requester), worker, owner, started_seconds_ago=200, job_ttl=300
    )
    await janitor.run_pass()
    assert (await factory.row("SELECT faulted FROM processing_gens WHERE id = $1", short))["faulted"] is True
    assert (await factory.row("SELECT faulted FROM processing_gens WHERE id = $1", renewed))[
        "faulted"
    ] is False


async def test_lapsed_streamed_generation_ends_its_stream_on_the_signal_db(
    janitor: Janitor, factory, redis_url: str
) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester, stream_progress=True, chat_extras={"stream_progress": True})
    gen = await factory.generation(wp, worker, owner, started_seconds_ago=200)
    signals = signal_client(redis_url)
    url_db = redis_client(redis_url)
    try:
        lease = StreamLease(str(wp), str(worker), "m", owner.id, "", 1024, 0, 150, 200, False)
        assert await write_stream_leases(signals, {str(gen): lease})
        await janitor.run_pass()
        assert await signals.exists(stream_lease_key(str(gen))) == 0
        raw: list[tuple[str, dict[str, str]]] = await signals.xrange(progress_stream_key(str(wp)))  # type: ignore[assignment]
        entries = [StreamEntry.from_fields(i, f) for i, f in raw]
        assert [(e.gen, e.ended) for e in entries] == [(str(gen), True)]
        assert await url_db.exists(progress_stream_key(str(wp))) == 0
    finally:
        await signals.aclose()
        await url_db.aclose()


async def test_lapsed_nonconformant_reply_counts_as_nonconformant(janitor: Janitor, factory) -> None:
    owner = await factory.user(kudos=0, trusted=True)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester)
    await factory.generation(wp, worker, owner, started_seconds_ago=200, refusal_rc="ChatSubmitNonconformant")
    before = stale_aborts("true", "true")
    await janitor.run_pass()
    assert stale_aborts("true", "true") == before + 1
    w = await factory.row(
        "SELECT aborted_jobs, uncompleted_jobs, nonconformant_replies FROM workers WHERE id = $1", worker
    )
    assert (w["aborted_jobs"], w["uncompleted_jobs"], w["nonconformant_replies"]) == (0, 0, 1)


async def test_third_lapse_faults_the_request_and_signals(janitor: Janitor, factory, subscribe) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    message = CHAT_WORKER_FAULT_MESSAGES[ChatFaultReason.generation_error]
    wp = await factory.request(requester, chat_fault_reason=message, chat_fault_rc="ChatWorkerFault")
    for _ in range(2):
        gen = await factory.generation(wp, worker, owner)
        async with factory.pool.acquire() as conn:
            await conn.execute("UPDATE processing_gens SET faulted = true WHERE id = $1", gen)
    await factory.generation(wp, worker, owner, started_seconds_ago=500)
    async with subscribe(wp) as sub:
        result = await janitor.run_pass()
        events = await sub.messages(1)
    assert result.requests_faulted == 1
    assert events == [
        {
            "id": str(wp),
            "event": "faulted",
            "generations": 0,
            "fault_reason": message,
            "fault_rc": "ChatWorkerFault",
        }
    ]
    row = await factory.row("SELECT faulted FROM waiting_prompts WHERE id = $1", wp)
    assert row["faulted"] is True


async def test_concurrent_janitors_fault_a_lapse_once(janitor: Janitor, factory) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    wp = await factory.request(requester)
    await factory.generation(wp, worker, owner, started_seconds_ago=300)
    twin = Janitor(janitor.pool, janitor.signal, janitor.settlement)
    results = await asyncio.gather(janitor.run_pass(), twin.run_pass())
    assert sum(r.stale_faulted for r in results) == 1
    row = await factory.row("SELECT n FROM waiting_prompts WHERE id = $1", wp)
    assert row["n"] == 1


async def test_janitor_process_runs_its_loop(horde_settings_env, submit_process, factory) -> None:
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner)
    expired = await factory.request(requester, expiry_seconds=-1)
    wp = await factory.request(requester)
    gen = await factory.generation(wp, worker, owner, started_seconds_ago=400)
    port = free_port()
    env = {
        **horde_settings_env,
        "HORDE_JANITOR_HTTP_PORT": str(port),
        "HORDE_SUBMIT_GRPC_TARGET": submit_process.target,
        "HORDE_JANITOR_INTERVAL_SECONDS": "0.2",
    }
    with ServiceProcess(
        "janitor",
        [sys.executable, "-m", "horde_janitor"],
        env=env,
        health_url=f"http://127.0.0.1:{port}/healthz",
    ):
        deadline = asyncio.get_running_loop().time() + 10
        while asyncio.get_running_loop().time() < deadline:
            g = await factory.row("SELECT faulted FROM processing_gens WHERE id = $1", gen)
            gone = await factory.row("SELECT 1 FROM waiting_prompts WHERE id = $1", expired) is None
            if g["faulted"] and gone:
                break
            await asyncio.sleep(0.1)
        assert g["faulted"] is True and gone
        async with httpx.AsyncClient(trust_env=False) as client:
            metrics = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            ready = await client.get(f"http://127.0.0.1:{port}/readyz")
    assert 'horde_text_stale_aborts_total{chat="true",worker_trusted="false"} 1.0' in metrics
    assert ready.status_code == 200


async def test_expired_chat_objects_are_deleted_and_retries_drained(
    janitor: Janitor, factory, s3_endpoint, redis_url
) -> None:
    from horde_core.redis_keys import CHAT_IMAGE_DELETE_RETRY_KEY, redis_client

    requester = await factory.user()
    wp = await factory.request(requester, expiry_seconds=-1, chat_messages_offloaded=True)
    image = f"{wp}_chat_0.jpg"
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": f"horde-r2://{image}"}},
            ],
        },
    ]
    async with factory.pool.acquire() as conn:
        await conn.execute(
            "UPDATE waiting_prompts SET messages = $2, has_images = true WHERE id = $1", wp, messages
        )
    s3 = s3_endpoint.client()
    s3.put_object(Bucket=s3_endpoint.image_bucket, Key=image, Body=b"jpeg")
    s3.put_object(Bucket=s3_endpoint.messages_bucket, Key=f"{wp}_chat_messages.json", Body=b"[]")
    orphan = f"{uuid.uuid4()}_chat_3.jpg"
    s3.put_object(Bucket=s3_endpoint.image_bucket, Key=orphan, Body=b"jpeg")
    cache = redis_client(redis_url)
    try:
        await cache.sadd(CHAT_IMAGE_DELETE_RETRY_KEY, orphan)
        result = await janitor.run_pass()
        assert await cache.sismember(CHAT_IMAGE_DELETE_RETRY_KEY, orphan) == 0
    finally:
        await cache.aclose()
    assert result.objects_deleted == 2 and result.objects_failed == 0
    assert result.objects_retried >= 1

    def exists(bucket: str, key: str) -> bool:
        return s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0) > 0

    assert not exists(s3_endpoint.image_bucket, image)
    assert not exists(s3_endpoint.messages_bucket, f"{wp}_chat_messages.json")
    assert not exists(s3_endpoint.image_bucket, orphan)
