"""The free output allowance's competing requests (docs/native-api.md#free-output-allowance): a queued request
competes when one of the new request's eligible workers could take it by its models, its chat opt-in and its
length limits: a chat request needs a worker serving one of its models with chat within its chat limits, a
text request a worker taking prompt jobs that lists one of its models (or any, for a request without models)
within its text limits. A chat request on a model shared with text-only workers does not count against them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from admission_helpers import add_chat_worker, new_user, unique_model
from horde_admission import store
from horde_admission.creation import CompetingQueueMemo
from horde_store.db import create_pool

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def add_text_worker(
    db: asyncpg.Connection, model: str, *, max_length: int = 512, ctx: int = 4096
) -> uuid.UUID:
    """An online text-only worker listing ``model`` (what a classic pop stores)."""
    owner, _ = await new_user(db)
    worker_id: uuid.UUID = await db.fetchval(
        """INSERT INTO workers (user_id, name, models, max_length, max_context_length, last_check_in)
           VALUES ($1, $2, ARRAY[$3], $4, $5, now()) RETURNING id""",
        owner,
        f"t_{uuid.uuid4().hex[:12]}",
        model,
        max_length,
        ctx,
    )
    return worker_id


async def queue(
    db: asyncpg.Connection, *, is_chat: bool, models: list[str], max_length: int, ctx: int, n: int = 1
) -> uuid.UUID:
    """An active queued request as admission writes it; returns its id."""
    owner, _ = await new_user(db)
    request_id: uuid.UUID = await db.fetchval(
        """INSERT INTO waiting_prompts (user_id, is_chat, models, max_length, max_context_length, n, jobs, prompt,
                                        params, active)
           VALUES ($1, $2, $3::text[], $4, $5, $6, $6, 'queued', '{}'::jsonb, true) RETURNING id""",
        owner,
        is_chat,
        models,
        max_length,
        ctx,
        n,
    )
    return request_id


# (eligible workers, queued request, whether it competes). "T": a text-only worker, max_length 512 and context
# 4096; "C": a chat-only worker (prompt_jobs false) with chat limits 1024 / 8192. "m" is the workers' model,
# "other" a model neither serves, "none" a request without models.
CASES = [
    ("T", ("text", "m", 256, 2048), True),
    ("T", ("text", "none", 256, 2048), True),
    ("T", ("text", "m", 1024, 2048), False),  # above the text max_length
    ("T", ("text", "m", 256, 8192), False),  # above the text context
    ("T", ("text", "other", 256, 2048), False),
    ("T", ("chat", "m", 256, 2048), False),  # a shared model, but T takes no chat jobs
    ("C", ("chat", "m", 512, 4096), True),
    ("C", ("chat", "m", 2048, 4096), False),  # above the chat max_length
    ("C", ("chat", "m", 512, 16384), False),  # above the chat context
    ("C", ("chat", "other", 512, 4096), False),
    ("C", ("text", "m", 256, 2048), False),  # C does not take prompt jobs
    ("C", ("text", "none", 256, 2048), False),
    ("TC", ("chat", "m", 512, 4096), True),
    ("TC", ("text", "m", 256, 2048), True),
    ("", ("text", "m", 256, 2048), False),  # no eligible worker
]


@pytest.mark.parametrize(("workers", "queued", "competes"), CASES)
async def test_competing_requests_follow_the_eligible_workers(
    db: asyncpg.Connection, workers: str, queued: tuple[str, str, int, int], competes: bool
) -> None:
    model, other = unique_model(), unique_model()
    ids: list[str] = []
    if "T" in workers:
        ids.append(str(await add_text_worker(db, model)))
    if "C" in workers:
        ids.append(
            str(
                await add_chat_worker(
                    db, model, max_length=1024, max_context_length=8192, accepts_prompt_jobs=False
                )
            )
        )
    kind, which, max_length, ctx = queued
    models = {"m": [model], "other": [other], "none": []}[which]
    # A request without models competes with every worker taking prompt jobs: only the horde-wide queue can
    # tell it apart, so compare the counts with and without it.
    before = await store.competing_queue(db, ids)
    request_id = await queue(db, is_chat=kind == "chat", models=models, max_length=max_length, ctx=ctx, n=3)
    try:
        after = await store.competing_queue(db, ids)
    finally:
        # A request without models would stand in every later test's queue.
        await db.execute("DELETE FROM waiting_prompts WHERE id = $1", request_id)
    added = (after[0] - before[0], after[1] - before[1])
    assert added == ((max_length * 3, 3) if competes else (0, 0))


async def pop_classic(dispatch: Any, key: str, name: str, model: str) -> None:
    base = dispatch.process.health_url.removesuffix("/readyz")
    body = {"name": name, "models": [model], "max_length": 2048, "max_context_length": 4096}
    async with httpx.AsyncClient(base_url=base) as http:
        r = await http.post("/api/v2/generate/text/pop", json=body, headers={"apikey": key})
    assert r.status_code == 200, r.text


async def test_a_chat_queue_on_a_shared_model_leaves_a_text_requests_allowance(
    make_client: Any, dispatch: Any, db: asyncpg.Connection
) -> None:
    # The second request must see the queue as it is, not the competing sum of the first (a second ago).
    client = await make_client(competing_queue_memo_seconds=0)
    model = unique_model()
    _, worker_key = await new_user(db)
    await pop_classic(dispatch, worker_key, f"t-{model}", model)
    # 20 chat jobs of 4096 tokens on the same model: 81,920 tokens, hours at 10 tokens/s, if they competed.
    await queue(db, is_chat=True, models=[model], max_length=4096, ctx=8192, n=20)
    uid, key = await new_user(db, kudos=0)
    body = {"prompt": "Once upon a time", "models": [model], "params": {"max_length": 1024}}
    r = await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})
    # Above the 512 floor, yet free: the text worker's queue is empty, so the allowance is the ceiling.
    assert r.status_code == 202, r.text
    assert "message" not in r.json()
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE user_id = $1", uid) == 0

    # A text request queued ahead of it does compete: 4 jobs of 2048 tokens on one thread at 10 tokens/s.
    await queue(db, is_chat=False, models=[model], max_length=2048, ctx=4096, n=4)
    _, other_key = await new_user(db, kudos=0)
    r = await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": other_key})
    assert r.status_code == 403
    assert r.json()["rc"] == "KudosUpfront"
    assert r.json()["message"].startswith("Due to heavy demand, for requests over 512 tokens,")


class CountingPool:
    """A real pool that counts the connections taken from it (one per competing-queue statement)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.acquired = 0

    def acquire(self) -> Any:
        self.acquired += 1
        return self.pool.acquire()


@pytest.fixture
async def counting_pool(pg_dsn: str) -> AsyncIterator[CountingPool]:
    pool = await create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        yield CountingPool(pool)
    finally:
        await pool.close()


async def test_the_memo_reuses_the_sum_for_the_same_workers_within_the_window(
    db: asyncpg.Connection, counting_pool: CountingPool
) -> None:
    model = unique_model()
    worker = str(await add_text_worker(db, model))
    other = str(await add_text_worker(db, model))
    memo = CompetingQueueMemo(counting_pool, 60.0)
    first = await asyncio.gather(*(memo.get([worker, other]) for _ in range(8)))
    assert counting_pool.acquired == 1 and len(set(first)) == 1  # concurrent lookups share one statement
    request_id = await queue(db, is_chat=False, models=[model], max_length=256, ctx=2048, n=2)
    try:
        # Same workers in another order: the same set, so the remembered sum (the new request not in it).
        assert await memo.get([other, worker]) == first[0]
        assert counting_pool.acquired == 1
        # Another set is read afresh and sees the new request.
        fresh = await memo.get([worker])
        assert counting_pool.acquired == 2 and fresh[1] >= 2 and fresh[0] >= 512
        off = CompetingQueueMemo(counting_pool, 0)
        assert await off.get([worker, other]) == (first[0][0] + 512, first[0][1] + 2)
        assert await off.get([worker, other]) == (first[0][0] + 512, first[0][1] + 2)
        assert counting_pool.acquired == 4  # 0 reads every time
        assert await memo.get([]) == (0, 0) and counting_pool.acquired == 4  # no workers, no statement
    finally:
        await db.execute("DELETE FROM waiting_prompts WHERE id = $1", request_id)


async def test_the_memo_forgets_after_its_window(db: asyncpg.Connection, counting_pool: CountingPool) -> None:
    model = unique_model()
    worker = str(await add_text_worker(db, model))
    memo = CompetingQueueMemo(counting_pool, 0.2)
    before = await memo.get([worker])
    request_id = await queue(db, is_chat=False, models=[model], max_length=100, ctx=2048, n=1)
    try:
        await asyncio.sleep(0.3)
        assert await memo.get([worker]) == (before[0] + 100, before[1] + 1)
        assert counting_pool.acquired == 2
    finally:
        await db.execute("DELETE FROM waiting_prompts WHERE id = $1", request_id)
