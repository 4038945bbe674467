"""Queue announcements at creation (docs/worker-guide.md#long-poll): a newly created chat request is announced on
``horde:queue:announce`` after its commit, a dry run or an operation key's replay is not, and a Redis that hangs
does not fail (nor much delay) the creation."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model
from horde_core import queue_announce
from horde_core.redis_keys import signal_client
from horde_testing.signals import Subscriber

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = "/api/v2/generate/chat/async"


def announcements(messages: list[dict[str, Any]], request_id: str | None = None) -> list[dict[str, Any]]:
    return [m for m in messages if request_id is None or m.get("id") == request_id]


async def test_a_new_chat_request_is_announced_after_its_commit(
    client: Any, db: Any, redis_server: Any
) -> None:
    model = unique_model()
    _, key = await new_user(db)
    await add_chat_worker(db, model)
    redis = signal_client(redis_server.url)
    try:
        async with Subscriber(redis, uuid.uuid4(), channel=queue_announce.QUEUE_ANNOUNCE_CHANNEL) as sub:
            r = await client.post(
                CHAT, json=chat_body(model, "announce me", max_tokens=200), headers={"apikey": key}
            )
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            (message,) = announcements(await sub.messages(1), request_id)
            # the row is committed (and active) by the time anyone hears of it
            row = await db.fetchrow(
                "SELECT active, n FROM waiting_prompts WHERE id = $1", uuid.UUID(request_id)
            )
            assert row is not None and row["active"] and row["n"] == 1
    finally:
        await redis.aclose()
    assert message == {
        "id": request_id,
        "models": [model],
        "is_chat": True,
        "max_length": 200,
        "max_context_length": 2048,
        "n": 1,
    }
    assert (
        queue_announce.parse(
            queue_announce.announcement(
                request_id, [model], is_chat=True, max_length=200, max_context_length=2048
            ).to_json()
        )
        is not None
    )


async def test_a_new_text_request_is_announced_after_its_commit_and_a_dry_run_is_not(
    client: Any, db: Any, redis_server: Any
) -> None:
    model = unique_model()
    _, key = await new_user(db)
    redis = signal_client(redis_server.url)
    body = {"prompt": "announce me", "params": {"max_length": 48, "n": 2}, "models": [model]}
    try:
        async with Subscriber(redis, uuid.uuid4(), channel=queue_announce.QUEUE_ANNOUNCE_CHANNEL) as sub:
            dry = await client.post(
                "/api/v2/generate/text/async", json={**body, "dry_run": True}, headers={"apikey": key}
            )
            assert dry.status_code == 200, dry.text
            r = await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            received = await sub.messages(2, wait=1.0)
            row = await db.fetchrow(
                "SELECT active, n FROM waiting_prompts WHERE id = $1", uuid.UUID(request_id)
            )
            assert row is not None and row["active"] and row["n"] == 2
    finally:
        await redis.aclose()
    assert [m for m in received if m["models"] == [model]] == [
        {
            "id": request_id,
            "models": [model],
            "is_chat": False,
            "max_length": 48,
            "max_context_length": 2048,
            "n": 2,
        }
    ]


async def test_dry_runs_and_operation_key_replays_announce_nothing(
    client: Any, db: Any, redis_server: Any
) -> None:
    model = unique_model()
    _, key = await new_user(db)
    await add_chat_worker(db, model)
    redis = signal_client(redis_server.url)
    op = str(uuid.uuid4())
    try:
        async with Subscriber(redis, uuid.uuid4(), channel=queue_announce.QUEUE_ANNOUNCE_CHANNEL) as sub:
            dry = await client.post(
                CHAT, json=chat_body(model, horde={"dry_run": True}), headers={"apikey": key}
            )
            assert dry.status_code == 200, dry.text
            first = await client.post(
                CHAT, json=chat_body(model, horde={"operation_key": op}), headers={"apikey": key}
            )
            again = await client.post(
                CHAT, json=chat_body(model, horde={"operation_key": op}), headers={"apikey": key}
            )
            assert first.status_code == 202 and again.json()["id"] == first.json()["id"]
            received = await sub.messages(3, wait=1.0)
    finally:
        await redis.aclose()
    # only the one creation; other tests' requests carry other models
    assert [m["id"] for m in received if m["models"] == [model]] == [first.json()["id"]]


async def test_a_hung_redis_does_not_fail_the_creation(make_client: Any, db: Any, hung_redis: str) -> None:
    """Redis accepts and never answers: the announcement gives up after 0.25 s, is counted, and the request is
    created; the next creation within a second does not even try (suspended)."""
    client = await make_client(redis_url=hung_redis)
    model = unique_model()
    _, key = await new_user(db)
    await add_chat_worker(db, model)
    failed = queue_announce.ANNOUNCEMENTS.labels("failed")._value.get()
    suspended = queue_announce.ANNOUNCEMENTS.labels("suspended")._value.get()
    # The publish's own deadline is proven in horde_core's tests; here: counted, and the request created.
    for attempt in range(2):
        r = await asyncio.wait_for(
            client.post(CHAT, json=chat_body(model, f"hung {attempt}"), headers={"apikey": key}), 30
        )
        assert r.status_code == 202, r.text
        row = await db.fetchrow("SELECT active FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"]))
        assert row is not None and row["active"]
    assert queue_announce.ANNOUNCEMENTS.labels("failed")._value.get() == failed + 1
    assert queue_announce.ANNOUNCEMENTS.labels("suspended")._value.get() == suspended + 1
