"""Status reads reuse a request's queue position for HORDE_STATUS_QUEUE_MEMO_SECONDS; the rest of the
status is read fresh every time."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from admission_helpers import new_user, unique_model

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def queue_text(client: Any, key: str, model: str) -> str:
    body = {"prompt": "hello", "params": {"max_length": 32}, "models": [model]}
    r = await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})
    assert r.status_code == 202, r.text
    rid: str = r.json()["id"]
    return rid


async def status(client: Any, rid: str) -> dict[str, Any]:
    r = await client.get(f"/api/v2/generate/text/status/{rid}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_position_is_reused_within_the_window_and_done_is_fresh(
    make_client: Any, db: asyncpg.Connection
) -> None:
    memoised = await make_client(status_queue_memo_seconds=60.0)
    fresh = await make_client(status_queue_memo_seconds=0)
    _, key = await new_user(db, kudos=100_000)
    model = unique_model()
    first = await queue_text(fresh, key, model)
    second = await queue_text(fresh, key, model)
    assert (await status(memoised, second))["queue_position"] == 2
    assert (await status(fresh, second))["queue_position"] == 2
    assert (await fresh.delete(f"/api/v2/generate/text/status/{first}")).status_code == 200
    # The memo still has the position from before the cancel; a read without it sees the new one.
    assert (await status(memoised, second))["queue_position"] == 2
    assert (await status(fresh, second))["queue_position"] == 1
    # Done and the counts are never memoised: a cancel shows at once, and a done request has no position.
    assert (await fresh.delete(f"/api/v2/generate/text/status/{second}")).status_code == 200
    done = await status(memoised, second)
    assert done["done"] is True and done["queue_position"] == 0
    waiting = await db.fetchval(
        "SELECT count(*) FROM waiting_prompts WHERE $1 = ANY(models) AND n > 0", model
    )
    assert waiting == 0


async def test_concurrent_reads_of_one_request_do_not_exhaust_the_pool(
    make_client: Any, db: asyncpg.Connection
) -> None:
    client = await make_client(status_queue_memo_seconds=60.0, db_pool_max_size=2)
    _, key = await new_user(db, kudos=100_000)
    rid = await queue_text(client, key, unique_model())
    bodies = await asyncio.gather(*(status(client, rid) for _ in range(20)))
    assert {b["queue_position"] for b in bodies} == {1}
