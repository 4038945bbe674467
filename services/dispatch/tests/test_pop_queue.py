"""The queue at pop: eligibility rules in SQL, the speed gate, queue order, skipped, text jobs to chat
workers, the chat job payload and the assignment snapshot (docs/native-api.md#eligibility, #tool-temperature-limit,
docs/native-api.md#job-lease, #chat-job-payload, docs/native-api.md#images, #progress; docs/native-api.md#pop)."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from horde_core.chat_stream import LeaseField, lease_key_check, stream_lease_key
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client, signal_client
from horde_dispatch import queue
from horde_dispatch.app import create_app
from horde_store.db import connect
from horde_store.users import hash_api_key
from horde_testing.launcher import free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")

Harness = Any
CHAT_MODEL = "koboldcpp/test-chat-7b"
TEXT_MODEL = "koboldcpp/test-text-7b"


async def popped_wp(h: Harness, r: Any) -> uuid.UUID | None:
    assert r.status_code == 200, r.text
    gen_id = r.json()["id"]
    if gen_id is None:
        return None
    return await h.db.fetchval("SELECT wp_id FROM processing_gens WHERE id = $1", uuid.UUID(gen_id))


async def test_chat_job_payload_and_assignment(h: Harness) -> None:
    requester, _ = await h.user()
    owner, key = await h.user()
    wp = await h.request(
        user_id=requester,
        max_length=300,
        max_context_length=2048,
        params={"temperature": 0.7, "stop_sequence": ["\n\n"], "seed": 42},
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        chat_extras={
            "tools": [
                {"type": "function", "function": {"name": "a"}},
                {"type": "function", "function": {"name": "b"}},
            ],
            "tool_choice": {"type": "function", "function": {"name": "b"}},
        },
        chat_required_features=["seed", "tools"],
        chat_tools_temperature=0.7,
        models=["some/other", CHAT_MODEL],
    )
    expiry_before = await h.db.fetchval(
        "UPDATE waiting_prompts SET expiry = now() + interval '1 minute' WHERE id = $1 RETURNING expiry", wp
    )
    body = h.chat_body("w-payload", chat_features=["seed", "tools", "tool_choice_enforced"])
    r = await h.pop(key, body)
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["chat"] is True
    assert job["ttl"] == 150
    assert job["model"] == CHAT_MODEL
    assert job["skipped"] == {}
    assert job["ids"] == [job["id"]]
    assert job["payload"] == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "b"}}],
        "tool_choice": "required",
        "temperature": 0.7,
        "top_p": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "rep_pen": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "stop_sequence": ["\n\n"],
        "seed": 42,
        "max_length": 300,
        "max_context_length": 2048,
        "n": 1,
    }
    gen = await h.db.fetchrow("SELECT * FROM processing_gens WHERE id = $1", uuid.UUID(job["id"]))
    assert gen["wp_id"] == wp
    assert gen["user_id"] == owner
    assert gen["model"] == CHAT_MODEL
    assert (gen["assigned_model"], gen["assigned_max_context_length"], gen["assigned_max_length"]) == (
        CHAT_MODEL,
        8192,
        1024,
    )
    assert gen["job_ttl"] == 150
    assert gen["lease_cap"] == 200  # untrusted owner
    assert gen["image_transport"] is None
    assert gen["generation"] is None and gen["faulted"] is False
    row = await h.db.fetchrow("SELECT n, expiry FROM waiting_prompts WHERE id = $1", wp)
    assert row["n"] == 0
    assert row["expiry"] > expiry_before  # refreshed to now + 20 minutes
    # Nothing else to hand out.
    again = await h.pop(key, body)
    assert again.json() == {"payload": {}, "id": None, "ids": [], "skipped": {}}


async def test_text_job_to_a_chat_worker_under_its_text_limits(h: Harness) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    too_long = await h.request(user_id=requester, is_chat=False, models=[CHAT_MODEL], max_length=600)
    fits = await h.request(
        user_id=requester, is_chat=False, models=[], max_length=400, params={"temperature": 0.5, "n": 1}
    )
    # The chat limits (1024) would take 600; the text limit (512) does not.
    r = await h.pop(key, h.chat_body("w-text"))
    job = r.json()
    assert await popped_wp(h, r) == fits
    assert "chat" not in job
    assert job["model"] == CHAT_MODEL
    assert job["payload"] == {
        "temperature": 0.5,
        "prompt": "Once upon a time",
        "max_length": 400,
        "max_context_length": 4096,
        "n": 1,
    }
    r = await h.pop(key, h.chat_body("w-text"))
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {"max_length": 1}}
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", too_long) == 1
    # A worker that does not take prompt jobs is offered no text request.
    await h.db.execute("UPDATE waiting_prompts SET max_length = 100 WHERE id = $1", too_long)
    r = await h.pop(key, h.chat_body("w-chat-only", prompt_jobs=False))
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {"prompt_jobs": 1}}
    # A worker that predates chat never sees a chat request.
    await h.request(user_id=requester)
    r = await h.pop(key, {"name": "w-old", "models": [CHAT_MODEL], "max_context_length": 4096})
    assert await popped_wp(h, r) == too_long


@pytest.mark.parametrize(
    ("request_columns", "declaration", "reason"),
    [
        ({"models": ["other/model"]}, {}, None),
        ({"chat_required_features": ["seed"]}, {"chat_features": ["tools"]}, "chat_features"),
        (
            {"chat_required_features": ["prompt_overflow_refused"]},
            {"chat_features": ["seed"]},
            "chat_features",
        ),
        ({"has_images": True}, {"chat_features": ["vision"]}, "image_transports"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "horde-r2://x"}}]}
                ]
            },
            {"chat_features": ["vision"]},
            "image_transports",
        ),
        ({"max_context_length": 9000}, {}, "max_context_length"),
        ({"max_length": 1100, "max_context_length": 4096}, {}, "max_length"),
        (
            {"chat_tools_temperature": 1.5},
            {"chat_limits": {"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0}},
            "tools_max_temperature",
        ),
        ({"trusted_workers": True}, {}, "untrusted"),
        ({"validated_backends": True}, {"bridge_agent": "My Own Bridge:1:x"}, "bridge_version"),
        ({"workers": [uuid.uuid4()]}, {}, "worker_id"),
    ],
    ids=[
        "model",
        "feature",
        "guarantee",
        "images-flag",
        "images-in-messages",
        "context",
        "length",
        "tools-temperature",
        "trusted",
        "validated",
        "only",
    ],
)
async def test_eligibility_refusals(
    h: Harness, request_columns: dict[str, Any], declaration: dict[str, Any], reason: str | None
) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    wp = await h.request(user_id=requester, **request_columns)
    r = await h.pop(key, h.chat_body("w-refused", **declaration))
    assert r.status_code == 200, r.text
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {reason: 1} if reason else {}}
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens") == 0


async def test_eligibility_acceptances(h: Harness) -> None:
    """Each refusal above is lifted by the matching declaration."""
    requester, _ = await h.user()
    owner, key = await h.user(trusted=True)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        (
            {"chat_required_features": ["seed", "prompt_overflow_refused"]},
            {"chat_features": ["prompt_overflow_refused", "seed", "tools"]},
        ),
        (
            {"chat_tools_temperature": 1.0},
            {"chat_limits": {"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0}},
        ),
        ({"chat_tools_temperature": 1.9}, {}),  # no tools limit declared: every temperature applies
        ({"max_length": 1024, "max_context_length": 8192}, {}),
        ({"trusted_workers": True, "validated_backends": True}, {}),
        ({"worker_blacklist": True, "workers": [uuid.uuid4()]}, {}),
    ]
    for columns, declaration in cases:
        wp = await h.request(user_id=requester, **columns)
        r = await h.pop(key, h.chat_body("w-accept", **declaration))
        assert await popped_wp(h, r) == wp, (columns, declaration, r.json())
    gen = await h.db.fetchrow("SELECT lease_cap FROM processing_gens LIMIT 1")
    assert gen["lease_cap"] == 600  # trusted owner
    worker_id = await h.db.fetchval("SELECT id FROM workers WHERE name = 'w-accept'")
    listed = await h.request(user_id=requester, workers=[worker_id])
    assert await popped_wp(h, await h.pop(key, h.chat_body("w-accept"))) == listed
    ignored = await h.request(user_id=requester, workers=[worker_id], worker_blacklist=True)
    assert (await h.pop(key, h.chat_body("w-accept"))).json()["skipped"] == {"worker_id": 1}
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", ignored) == 1
    assert owner


async def test_speed_gate(h: Harness) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    body = h.chat_body("w-speed", chat_limits={"max_context_length": 8192, "max_length": 4096})
    assert (await h.pop(key, body)).status_code == 200
    # Unmeasured: 10 tok/s, so 1200 tokens.
    over = await h.request(user_id=requester, max_length=1201)
    r = await h.pop(key, body)
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {"lease_speed": 1}}
    at = await h.request(user_id=requester, max_length=1200)
    assert await popped_wp(h, await h.pop(key, body)) == at
    # Measured 5 tok/s: 600 tokens.
    await h.set_worker("w-speed", speed=5.0)
    await h.db.execute("UPDATE waiting_prompts SET max_length = 601 WHERE id = $1", over)
    assert (await h.pop(key, body)).json()["skipped"] == {"lease_speed": 1}
    await h.db.execute("UPDATE waiting_prompts SET max_length = 600 WHERE id = $1", over)
    assert await popped_wp(h, await h.pop(key, body)) == over
    # A legacy text job is never gated; it is recorded as over capacity.
    text = await h.request(user_id=requester, is_chat=False, max_length=700, max_context_length=2048)
    await h.set_worker(
        "w-speed", max_length=1024, created=await h.db.fetchval("SELECT now() - interval '1 hour'")
    )
    assert await popped_wp(h, await h.pop(key, body)) == text
    assert (
        await h.db.fetchval("SELECT over_capacity_at_assignment FROM processing_gens WHERE wp_id = $1", text)
        is True
    )


async def test_lease_capacity_limited_counter(h: Harness) -> None:
    from prometheus_client import REGISTRY

    def count() -> float:
        return REGISTRY.get_sample_value("horde_pop_lease_capacity_limited_total", {"gentype": "text"}) or 0.0

    _, key = await h.user()
    before = count()
    await h.pop(key, h.chat_body("w-cap", chat_limits={"max_context_length": 8192, "max_length": 1024}))
    assert count() == before  # 1200 >= 1024
    await h.pop(key, h.chat_body("w-cap", chat_limits={"max_context_length": 8192, "max_length": 2048}))
    assert count() == before + 1


async def test_queue_order(h: Harness, past: Any) -> None:
    requester, _ = await h.user()
    owner, key = await h.user()
    friend, _ = await h.user()
    old_low = await h.request(user_id=requester, extra_priority=0, created=past(100))
    new_high = await h.request(user_id=requester, extra_priority=50, created=past(10))
    old_high = await h.request(user_id=requester, extra_priority=50, created=past(50))
    own = await h.request(user_id=owner, extra_priority=-100, created=past(1))
    friends = await h.request(user_id=friend, extra_priority=-100, created=past(1))
    body = h.chat_body("w-order")
    order = [await popped_wp(h, await h.pop(key, body)) for _ in range(4)]
    # The owner's own request first, then the queue in extra_priority DESC, created ASC.
    assert order == [own, old_high, new_high, old_low]
    # A priority user's request comes first too.
    body["priority_usernames"] = [f"friend#{friend}"]
    assert await popped_wp(h, await h.pop(key, body)) == friends


async def test_inactive_expired_faulted_and_empty_rows_are_skipped(h: Harness, past: Any) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    await h.request(user_id=requester, active=False)
    await h.request(user_id=requester, faulted=True)
    await h.request(user_id=requester, n=0)
    await h.request(user_id=requester, expiry=past(1))
    await h.request(user_id=requester, cancelled=True)
    r = await h.pop(key, h.chat_body("w-states"))
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {}}


async def test_text_batch_takes_min_of_amount_and_n(h: Harness) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    wp = await h.request(
        user_id=requester, is_chat=False, models=[TEXT_MODEL], n=5, max_length=100, max_context_length=2048
    )
    body = {"name": "w-batch", "models": [TEXT_MODEL], "amount": 3}
    job = (await h.pop(key, body)).json()
    assert len(job["ids"]) == 3 and job["id"] == job["ids"][0]
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 2
    job = (await h.pop(key, body)).json()
    assert len(job["ids"]) == 2
    await h.db.execute("UPDATE waiting_prompts SET n = 4, disable_batching = true WHERE id = $1", wp)
    assert len((await h.pop(key, body)).json()["ids"]) == 1


async def test_image_transports_at_pop(h: Harness, s3_endpoint: Any) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    jpeg = b"\xff\xd8\xff\xe0 not really a jpeg \xff\xd9"
    s3 = s3_endpoint.client()
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "horde-r2://req_chat_0.jpg", "detail": "low"}},
            ],
        }
    ]
    s3.put_object(Bucket=s3_endpoint.image_bucket, Key="req_chat_0.jpg", Body=jpeg)
    features = {"chat_features": ["vision"]}

    wp = await h.request(user_id=requester, messages=messages, has_images=True)
    r = await h.pop(key, h.chat_body("w-b64", image_transports=["base64"], **features))
    assert await popped_wp(h, r) == wp
    part = r.json()["payload"]["messages"][0]["content"][1]
    assert part == {
        "type": "image_url",
        "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpeg).decode(), "detail": "low"},
    }
    assert await h.db.fetchval("SELECT image_transport FROM processing_gens WHERE wp_id = $1", wp) == "base64"
    # The stored messages keep the reference.
    stored = await h.db.fetchval("SELECT messages FROM waiting_prompts WHERE id = $1", wp)
    assert stored[0]["content"][1]["image_url"]["url"] == "horde-r2://req_chat_0.jpg"

    wp = await h.request(user_id=requester, messages=messages, has_images=True)
    r = await h.pop(key, h.chat_body("w-url", image_transports=["base64", "url"], **features))
    assert await popped_wp(h, r) == wp
    url = r.json()["payload"]["messages"][0]["content"][1]["image_url"]["url"]
    assert url.startswith(s3_endpoint.endpoint_url) and "req_chat_0.jpg" in url and "X-Amz-Signature" in url
    assert "X-Amz-Expires=600" in url
    assert await h.db.fetchval("SELECT image_transport FROM processing_gens WHERE wp_id = $1", wp) == "url"

    # An offloaded request goes by messages_url to a worker that declares it, inline otherwise.
    wp = await h.request(user_id=requester, messages=messages, has_images=True, chat_messages_offloaded=True)
    r = await h.pop(key, h.chat_body("w-murl", image_transports=["messages_url", "url"], **features))
    assert await popped_wp(h, r) == wp
    payload = r.json()["payload"]
    assert "messages" not in payload
    assert (
        f"{wp}_chat_messages.json" in payload["messages_url"]
        and "X-Amz-Expires=120" in payload["messages_url"]
    )
    assert (
        await h.db.fetchval("SELECT image_transport FROM processing_gens WHERE wp_id = $1", wp)
        == "messages_url"
    )
    wp = await h.request(user_id=requester, messages=messages, has_images=True, chat_messages_offloaded=True)
    r = await h.pop(key, h.chat_body("w-url", image_transports=["url"], **features))
    assert await popped_wp(h, r) == wp
    assert r.json()["payload"]["messages"][0]["content"][1]["image_url"]["url"].startswith(
        s3_endpoint.endpoint_url
    )


async def test_stream_lease_written_at_pop(h: Harness) -> None:
    requester, _ = await h.user()
    owner, key = await h.user()
    wp = await h.request(
        user_id=requester, max_length=200, stream_progress=True, chat_extras={"stream_progress": True}
    )
    r = await h.pop(key, h.chat_body("w-stream"))
    assert await popped_wp(h, r) == wp
    job = r.json()
    assert job["payload"]["stream_progress"] is True
    signals = signal_client(h.settings.redis_url)
    url_db = redis_client(h.settings.redis_url)
    try:
        lease = await signals.hgetall(stream_lease_key(job["id"]))
        ttl = await signals.ttl(stream_lease_key(job["id"]))
        # The chat signal database, not the one the URL names.
        assert url_db.connection_pool.connection_kwargs["db"] != CHAT_SIGNAL_DB
        assert await url_db.exists(stream_lease_key(job["id"])) == 0
    finally:
        await signals.aclose()
        await url_db.aclose()
    worker_id = await h.db.fetchval("SELECT id::text FROM workers WHERE name = 'w-stream'")
    # What the progress route computes from the posting key: the worker owner's key authenticates.
    key_hash = hash_api_key(key, h.settings.secret_key)
    assert await h.db.fetchval("SELECT api_key_hash FROM users WHERE id = $1", owner) == key_hash
    started = await h.db.fetchval(
        "SELECT floor(extract(epoch FROM started_at))::bigint FROM processing_gens WHERE id = $1",
        uuid.UUID(job["id"]),
    )
    assert lease == {
        LeaseField.request: str(wp),
        LeaseField.worker: worker_id,
        LeaseField.model: CHAT_MODEL,
        LeaseField.owner: str(owner),
        LeaseField.key: lease_key_check(key_hash),
        LeaseField.max_bytes: str(16 * 200),
        LeaseField.fake: "0",
        LeaseField.started: str(started),
        LeaseField.job_ttl: "150",
        LeaseField.lease_cap: "200",
        LeaseField.trusted: "0",
    }
    assert 150 < ttl <= 240


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def short_lease_pop(dispatch_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A second dispatch app on the same stores with HORDE_TEXT_JOB_LEASE_SECONDS=7."""
    settings = dispatch_settings.model_copy(
        update={
            "text_job_lease_seconds": 7,
            "dispatch_grpc_enabled": False,
            "dispatch_grpc_port": free_port(),
        }
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dispatch") as client:
            yield client


async def test_job_lease_setting_sets_ttl_job_ttl_and_lease_expiry(h: Harness, short_lease_pop: Any) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    wp = await h.request(
        user_id=requester, max_length=200, stream_progress=True, chat_extras={"stream_progress": True}
    )
    r = await short_lease_pop.post(
        "/api/v2/generate/text/pop", json=h.chat_body("w-short"), headers={"apikey": key}
    )
    assert await popped_wp(h, r) == wp
    job = r.json()
    assert job["ttl"] == 7
    assert await h.db.fetchval("SELECT job_ttl FROM processing_gens WHERE id = $1", uuid.UUID(job["id"])) == 7
    signals = signal_client(h.settings.redis_url)
    try:
        assert await signals.hget(stream_lease_key(job["id"]), LeaseField.job_ttl.value) == "7"
        assert 90 < await signals.ttl(stream_lease_key(job["id"])) <= 97  # 7 s + the 90 s grace
    finally:
        await signals.aclose()
    # A text job gets the same lease.
    wp = await h.request(
        user_id=requester, is_chat=False, models=[TEXT_MODEL], max_length=100, max_context_length=2048
    )
    body = {"name": "w-short-text", "models": [TEXT_MODEL]}
    r = await short_lease_pop.post("/api/v2/generate/text/pop", json=body, headers={"apikey": key})
    assert await popped_wp(h, r) == wp
    assert r.json()["ttl"] == 7
    assert (
        await h.db.fetchval("SELECT job_ttl FROM processing_gens WHERE id = $1", uuid.UUID(r.json()["id"]))
        == 7
    )


# The head variant of the pop statement (docs/operator-guide.md#latency-and-throughput).


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The pop statements built, in order: True for the head variant, False for the full statement."""
    built: list[bool] = []
    build = queue.build_pop_statement

    def recording(w: queue.PopWorker, *, head: bool = False) -> tuple[str, list[Any]]:
        built.append(head)
        return build(w, head=head)

    monkeypatch.setattr(queue, "build_pop_statement", recording)
    return built


async def queue_unfit(h: Harness, user_id: int, count: int, created: Any) -> None:
    """``count`` queued text requests for a model no test worker serves, all created at ``created``."""
    await h.db.execute(
        """INSERT INTO waiting_prompts (user_id, is_chat, models, max_length, max_context_length, n, jobs,
                                        params, prompt, extra_priority, created, active)
           SELECT $1, false, ARRAY['other/unserved-model'], 100, 2048, 1, 1,
                  '{"max_length": 100, "max_context_length": 2048}'::jsonb, 'x', 0, $2, true
           FROM generate_series(1, $3)""",
        user_id,
        created,
        count,
    )


async def test_head_variant_serves_the_front_of_the_queue(h: Harness, past: Any, ran: list[bool]) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    first = await h.request(user_id=requester, created=past(20))
    second = await h.request(user_id=requester, created=past(10))
    body = h.chat_body("w-head")
    assert await popped_wp(h, await h.pop(key, body)) == first
    assert await popped_wp(h, await h.pop(key, body)) == second
    assert ran == [True, True]
    # An empty queue: the head variant finds nothing, and the full statement confirms it.
    assert await popped_wp(h, await h.pop(key, body)) is None
    assert ran == [True, True, True, False]


async def test_a_request_behind_the_head_is_found_by_the_full_statement(
    h: Harness, past: Any, ran: list[bool]
) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    await queue_unfit(h, requester, queue.HEAD_SCAN_ROWS + 44, past(60))
    fitting = await h.request(user_id=requester, created=past(1))
    assert await popped_wp(h, await h.pop(key, h.chat_body("w-deep"))) == fitting
    assert ran == [True, False]
    # One fewer unfit request ahead, and the head variant reaches the next one.
    await h.db.execute(
        "DELETE FROM waiting_prompts WHERE id IN (SELECT id FROM waiting_prompts WHERE user_id = $1"
        " AND models = ARRAY['other/unserved-model'] LIMIT 45)",
        requester,
    )
    near = await h.request(user_id=requester, created=past(1))
    assert await popped_wp(h, await h.pop(key, h.chat_body("w-deep"))) == near
    assert ran == [True, False, True]


async def test_the_owners_request_comes_first_past_the_head(h: Harness, past: Any, ran: list[bool]) -> None:
    requester, _ = await h.user()
    owner, key = await h.user()
    front = await h.request(user_id=requester, created=past(30))
    own = await h.request(user_id=owner, extra_priority=-100, created=past(1))
    body = h.chat_body("w-owner-head")
    assert await popped_wp(h, await h.pop(key, body)) == own
    assert ran == [True, False]
    assert await popped_wp(h, await h.pop(key, body)) == front
    assert ran == [True, False, True]


async def test_head_candidates_all_locked_fall_back_to_the_full_statement(
    h: Harness, past: Any, ran: list[bool]
) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    ids = [
        await h.request(user_id=requester, created=past(100 - i)) for i in range(queue.HEAD_CANDIDATES + 1)
    ]
    other = await connect(h.settings.database_url)
    try:
        async with other.transaction():
            # Other pops hold the first HEAD_CANDIDATES requests.
            await other.execute(
                "SELECT 1 FROM waiting_prompts WHERE id = ANY($1::uuid[]) FOR UPDATE", ids[:-1]
            )
            assert await popped_wp(h, await h.pop(key, h.chat_body("w-locked"))) == ids[-1]
            assert ran == [True, False]
    finally:
        await other.close()


async def test_head_connections_plan_generically_and_can_be_turned_off(
    h: Harness, dispatch_settings: Any, ran: list[bool]
) -> None:
    head = h.app.state.dispatch.head
    assert head is not None
    row = await head.fetchrow("SELECT current_setting('plan_cache_mode') AS mode", [])
    assert row is not None and row["mode"] == "force_generic_plan"
    # The main pool plans as PostgreSQL's default does (the full statement's generic plan is a disaster).
    async with h.app.state.dispatch.pool.acquire() as conn:
        assert await conn.fetchval("SELECT current_setting('plan_cache_mode')") == "auto"
    requester, _ = await h.user()
    _, key = await h.user()
    for update in ({"pop_head_pool_size": 0}, {"database_statement_cache_size": 0}):
        settings = dispatch_settings.model_copy(
            update={**update, "dispatch_grpc_enabled": False, "dispatch_grpc_port": free_port()}
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            assert app.state.dispatch.head is None
            wp = await h.request(user_id=requester)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://dispatch") as client:
                r = await client.post(
                    "/api/v2/generate/text/pop", json=h.chat_body("w-no-head"), headers={"apikey": key}
                )
            assert await popped_wp(h, r) == wp
    assert ran == [False, False]


async def test_concurrent_pops_hand_out_each_request_once(h: Harness, past: Any) -> None:
    """Many pops at once, on the head variant and the full statement alike: every request goes to one worker."""
    requester, _ = await h.user()
    _, key = await h.user(trusted=True)  # eight workers: an untrusted owner may have three
    queued = {await h.request(user_id=requester, created=past(200 - i)) for i in range(24)}
    pops = [h.pop(key, h.chat_body(f"w-race-{i % 8}")) for i in range(40)]  # under the 60/s pop limit
    popped = [await popped_wp(h, r) for r in await asyncio.gather(*pops)]
    taken = [wp for wp in popped if wp is not None]
    assert sorted(map(str, taken)) == sorted(map(str, queued))
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens") == 24
    assert await h.db.fetchval("SELECT sum(n) FROM waiting_prompts") == 0
