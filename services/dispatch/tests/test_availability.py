"""``WorkerPoolService.GetAvailability`` over a real gRPC channel to the server the app's lifespan started
(docs/native-api.md#known-models, #eligibility, #job-lease, #impossible-reason, #free-output-allowance)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from horde.dispatch.v1 import worker_pool_pb2, worker_pool_pb2_grpc
from horde_core.grpc import check_health, insecure_channel

pytestmark = pytest.mark.asyncio(loop_scope="session")

Harness = Any
CHAT_MODEL = "koboldcpp/test-chat-7b"
OTHER_MODEL = "koboldcpp/other-chat-13b"


@pytest_asyncio.fixture(loop_scope="session")
async def stub(h: Harness) -> AsyncIterator[Any]:
    async with insecure_channel(f"127.0.0.1:{h.settings.dispatch_grpc_port}") as channel:
        assert await check_health(channel, "horde.dispatch.v1.WorkerPoolService")
        yield worker_pool_pb2_grpc.WorkerPoolServiceStub(channel)


async def ask(stub: Any, **fields: Any) -> Any:
    fields.setdefault("slow_workers", True)
    return await stub.GetAvailability(worker_pool_pb2.GetAvailabilityRequest(**fields), timeout=5)


async def add_worker(h: Harness, key: str, name: str, **declaration: Any) -> None:
    r = await h.pop(key, h.chat_body(name, **declaration))
    assert r.status_code == 200, r.text


async def test_no_worker(h: Harness, stub: Any) -> None:
    r = await ask(stub, models=[CHAT_MODEL], max_length=512)
    assert (r.serving_workers, r.eligible_workers, r.eligible_threads, r.max_chat_length) == (0, 0, 0, 0)
    assert not r.HasField("declaration_gap")


async def test_counts_limits_threads_and_speed(h: Harness, stub: Any) -> None:
    _, key = await h.user()
    await add_worker(h, key, "a-1", threads=2)  # 8192 / 1024, unmeasured
    await add_worker(
        h,
        key,
        "a-2",
        threads=3,
        models=[OTHER_MODEL],
        model_id=OTHER_MODEL,
        chat_limits={"max_context_length": 32768, "max_length": 4096},
    )
    await add_worker(h, key, "a-3", chat_limits={"max_context_length": 65536, "max_length": 8192})
    await h.set_worker("a-2", speed=40.0)
    await h.set_worker("a-3", last_check_in=await h.db.fetchval("SELECT now() - interval '301 seconds'"))
    await add_worker(h, key, "a-text", chat_jobs=False)

    r = await ask(stub, models=[CHAT_MODEL, OTHER_MODEL], max_length=512, max_context_length=4096)
    assert r.serving_workers == 2  # a-3 is offline, a-text serves no chat
    assert (r.max_chat_context_length, r.max_chat_length) == (32768, 4096)
    assert (r.eligible_workers, r.eligible_threads) == (2, 5)
    assert r.tokens_per_second == pytest.approx(2 * 10.0 + 3 * 40.0)

    only_one = await ask(stub, models=[CHAT_MODEL], max_length=512)
    assert (only_one.serving_workers, only_one.eligible_threads, only_one.max_chat_length) == (1, 2, 1024)


async def test_rules_and_declaration_gap(h: Harness, stub: Any) -> None:
    owner, key = await h.user()
    await add_worker(h, key, "g-1", chat_features=["seed"])
    await add_worker(h, key, "g-2", chat_features=["tools", "vision"])

    # Rule 2: a missing feature on one worker, the other eligible: no gap.
    r = await ask(stub, models=[CHAT_MODEL], required_features=["seed"], max_length=256)
    assert (r.eligible_workers, r.HasField("declaration_gap")) == (1, False)

    # Every worker refused for declarations: the union of what they miss.
    r = await ask(stub, models=[CHAT_MODEL], required_features=["json_schema", "seed"], max_length=256)
    assert r.eligible_workers == 0
    assert list(r.declaration_gap.missing_declarations) == ["json_schema", "seed"]
    assert list(r.declaration_gap.exceeded_limits) == []

    # Images need url or base64.
    r = await ask(stub, models=[CHAT_MODEL], required_features=["vision"], has_images=True)
    assert list(r.declaration_gap.missing_declarations) == ["image_transports", "vision"]

    # Rule 3: size limits are refusals (not filtered), so they make a gap too.
    r = await ask(stub, models=[CHAT_MODEL], max_context_length=9000, max_length=256)
    assert (r.eligible_workers, list(r.declaration_gap.exceeded_limits)) == (0, ["max_context_length"])
    await h.pop(
        key,
        h.chat_body(
            "g-1", chat_limits={"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0}
        ),
    )
    await h.pop(
        key,
        h.chat_body(
            "g-2", chat_limits={"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 0.5}
        ),
    )
    r = await ask(stub, models=[CHAT_MODEL], tools_temperature=1.2)
    assert list(r.declaration_gap.exceeded_limits) == ["tools_max_temperature"]
    r = await ask(stub, models=[CHAT_MODEL], tools_temperature=0.8)
    assert (r.eligible_workers, r.HasField("declaration_gap")) == (1, False)

    # The speed gate refuses without a gap (speed changes while a request waits).
    r = await ask(stub, models=[CHAT_MODEL], max_length=1024)
    assert r.eligible_workers == 2
    await h.set_worker("g-1", speed=5.0)
    await h.set_worker("g-2", speed=5.0)
    r = await ask(stub, models=[CHAT_MODEL], max_length=1024)
    assert (r.serving_workers, r.eligible_workers, r.HasField("declaration_gap")) == (2, 0, False)

    # Rule 4 excludes workers before the gap: only workers that pass it are considered.
    ids = [str(x) for x in await h.db.fetchval("SELECT array_agg(id ORDER BY name) FROM workers")]
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, only_worker_ids=[ids[0]])
    assert (r.eligible_workers, r.eligible_threads) == (1, 1)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, ignore_worker_ids=ids)
    assert (r.serving_workers, r.eligible_workers, r.HasField("declaration_gap")) == (2, 0, False)
    r = await ask(
        stub, models=[CHAT_MODEL], max_length=256, trusted_workers=True, required_features=["json_object"]
    )
    assert (r.eligible_workers, r.HasField("declaration_gap")) == (0, False)
    await h.db.execute("UPDATE users SET trusted = true WHERE id = $1", owner)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, trusted_workers=True)
    assert r.eligible_workers == 2

    # A worker in maintenance serves only its owner.
    await h.set_worker("g-1", maintenance=True)
    await h.set_worker("g-2", maintenance=True)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256)
    assert (r.serving_workers, r.eligible_workers) == (0, 0)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, requester_user_id=owner)
    assert (r.serving_workers, r.eligible_workers) == (2, 2)

    # A flagged or deleted owner's workers serve no one, the owner included: their pops are refused
    # (WorkerFlaggedMaintenance, DeletedUser), so counting them would keep clients waiting on them.
    await h.set_worker("g-1", maintenance=False)
    await h.set_worker("g-2", maintenance=False)
    for column in ("flagged", "deleted"):
        await h.db.execute(f"UPDATE users SET {column} = true WHERE id = $1", owner)
        for requester in (0, owner):
            r = await ask(stub, models=[CHAT_MODEL], max_length=256, requester_user_id=requester)
            assert (r.serving_workers, r.eligible_workers) == (0, 0), (column, requester)
        await h.db.execute(f"UPDATE users SET {column} = false WHERE id = $1", owner)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256)
    assert (r.serving_workers, r.eligible_workers) == (2, 2)


async def test_empty_models_is_invalid_argument(stub: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ask(stub, models=[])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def classic_body(name: str, model: str = CHAT_MODEL, **fields: Any) -> dict[str, Any]:
    """A classic text worker's pop (no chat fields): it takes prompt jobs only."""
    return {"name": name, "models": [model], "max_length": 512, "max_context_length": 4096, **fields}


async def test_a_legacy_text_request_counts_the_text_workers(h: Harness, stub: Any) -> None:
    owner, key = await h.user()
    for body in (
        classic_body("t-1", threads=2),
        classic_body("t-2", model=OTHER_MODEL),
        h.chat_body("t-chat-only", prompt_jobs=False),
        h.chat_body("t-chat-and-text", max_length=1024),
    ):
        assert (await h.pop(key, body)).status_code == 200
    await h.set_worker("t-1", speed=30.0)

    r = await ask(stub, models=[CHAT_MODEL], max_length=256, max_context_length=2048, prompt_jobs=True)
    # t-1 (2 threads at 30 tokens/s) and t-chat-and-text (1 unmeasured thread); not the chat-only worker.
    assert (r.known_workers, r.serving_workers, r.eligible_workers, r.eligible_threads) == (2, 2, 2, 3)
    assert r.tokens_per_second == 2 * 30.0 + 10.0
    assert (r.max_chat_length, r.HasField("declaration_gap")) == (0, False)
    ids = await h.db.fetch("SELECT id::text FROM workers WHERE name IN ('t-1', 't-chat-and-text')")
    assert sorted(r.eligible_worker_ids) == sorted(row["id"] for row in ids)

    # The text limits: above 512 only t-chat-and-text (1024) takes it; above 1024 nobody.
    r = await ask(stub, models=[CHAT_MODEL], max_length=1024, prompt_jobs=True)
    assert (r.serving_workers, r.eligible_workers) == (2, 1)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, max_context_length=8192, prompt_jobs=True)
    assert (r.serving_workers, r.eligible_workers, r.eligible_threads) == (2, 0, 0)

    # Without models any text worker serves it.
    r = await ask(stub, models=[], max_length=256, prompt_jobs=True)
    assert (r.eligible_workers, r.eligible_threads) == (3, 4)

    # Rule 4 applies; a paused worker serves only its owner.
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, validated_backends=True, prompt_jobs=True)
    assert r.eligible_workers == 1  # the chat body's bridge is the validated reference worker; t-1's unknown
    await h.set_worker("t-chat-and-text", paused=True)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, prompt_jobs=True)
    assert (r.known_workers, r.serving_workers, r.eligible_workers) == (2, 1, 1)
    r = await ask(stub, models=[CHAT_MODEL], max_length=256, prompt_jobs=True, requester_user_id=owner)
    assert (r.serving_workers, r.eligible_workers) == (2, 2)
