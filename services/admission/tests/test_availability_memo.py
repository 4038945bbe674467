"""The text route's availability memo: one GetAvailability per needs and memo window.

Against the real dispatch process of conftest; workers are inserted by SQL as a pop would store them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import grpc
import httpx
import pytest
from admission_helpers import add_chat_worker, new_user, unique_model
from horde.dispatch.v1 import worker_pool_pb2_grpc
from horde_admission.availability import AvailabilityMemo, RequestNeeds
from horde_admission.chat import NO_WORKER_WARNING
from horde_contract.errors import HordeError

pytestmark = pytest.mark.asyncio(loop_scope="session")


class CountingStub:
    """The real WorkerPool stub, counting the GetAvailability calls made through it."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = worker_pool_pb2_grpc.WorkerPoolServiceStub(self.channel)
        self.calls = 0

    async def GetAvailability(self, request: Any, timeout: float) -> Any:  # noqa: ASYNC109 - the gRPC stub signature
        self.calls += 1
        return await self.stub.GetAvailability(request, timeout=timeout)


async def text_async(client: httpx.AsyncClient, key: str, model: str) -> httpx.Response:
    body = {"prompt": "hello", "params": {"max_length": 32}, "models": [model]}
    return await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})


async def test_text_route_reuses_the_answer_within_the_window(
    make_client: Any, db: asyncpg.Connection
) -> None:
    memoised = await make_client(text_availability_memo_seconds=60.0)
    fresh = await make_client(text_availability_memo_seconds=0)
    _, key = await new_user(db)
    model = unique_model()
    for client in (memoised, fresh):
        first = await text_async(client, key, model)
        assert first.status_code == 202 and first.json()["message"] == NO_WORKER_WARNING
    await add_chat_worker(db, model)
    again = await text_async(memoised, key, model)
    assert again.status_code == 202 and again.json()["message"] == NO_WORKER_WARNING
    asked = await text_async(fresh, key, model)
    assert asked.status_code == 202 and "message" not in asked.json()
    rows = await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE $1 = ANY(models) AND active", model)
    assert rows == 4


async def test_concurrent_lookups_share_one_call(dispatch: Any, db: asyncpg.Connection) -> None:
    stub = CountingStub(dispatch.target)
    try:
        model = unique_model()
        await add_chat_worker(db, model, threads=3)
        memo = AvailabilityMemo(60.0)
        needs = RequestNeeds(models=[model], max_length=64)
        found = await asyncio.gather(*(memo.get(stub, needs, 5.0) for _ in range(8)))
        assert stub.calls == 1
        assert {f.eligible_threads for f in found} == {3}
        other = await memo.get(stub, RequestNeeds(models=[model], max_length=65), 5.0)
        assert stub.calls == 2 and other.eligible_threads == 3
        assert (await memo.get(stub, needs, 5.0)).eligible_threads == 3 and stub.calls == 2
    finally:
        await stub.channel.close()


async def test_a_failure_is_not_remembered_and_zero_turns_it_off(dispatch: Any) -> None:
    down = CountingStub("127.0.0.1:9")
    try:
        memo = AvailabilityMemo(60.0)
        needs = RequestNeeds(models=[unique_model()])
        for attempt in (1, 2):
            with pytest.raises(HordeError) as refused:
                await memo.get(down, needs, 1.0)
            assert (refused.value.status, refused.value.rc) == (503, "WorkerPoolUnavailable")
            assert down.calls == attempt
    finally:
        await down.channel.close()
    up = CountingStub(dispatch.target)
    try:
        off = AvailabilityMemo(0)
        for _ in range(3):
            await off.get(up, RequestNeeds(models=[unique_model()]), 5.0)
        assert up.calls == 3
    finally:
        await up.channel.close()


async def test_the_least_recently_used_needs_go_first_past_the_bound(dispatch: Any) -> None:
    stub = CountingStub(dispatch.target)
    try:
        memo = AvailabilityMemo(60.0, max_entries=2)
        a, b, c = (RequestNeeds(models=[unique_model()]) for _ in range(3))
        for needs in (a, b, c, c, b):
            await memo.get(stub, needs, 5.0)
        assert stub.calls == 3
        await memo.get(stub, a, 5.0)
        assert stub.calls == 4
    finally:
        await stub.channel.close()
