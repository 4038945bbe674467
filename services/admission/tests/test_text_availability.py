"""Legacy text requests are measured against the text workers (docs/native-api.md#text-route,
#status-and-cancel, #free-output-allowance): a request a text-only worker serves gets no "no available
workers" warning and its status is possible; a request no text worker can take keeps both.

The workers register by popping the real dispatch process as a classic text worker does: no chat fields.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from admission_helpers import add_chat_worker, new_user, unique_model
from horde_admission.chat import NO_WORKER_WARNING

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def pop_classic(dispatch: Any, key: str, name: str, model: str, **fields: Any) -> None:
    """Pop as the AI-Horde-Worker scribe bridge does (no chat fields), which registers the worker."""
    base = dispatch.process.health_url.removesuffix("/readyz")
    body = {
        "name": name,
        "models": [model],
        "max_length": 512,
        "max_context_length": 4096,
        "bridge_agent": "AI Horde Worker:26:https://github.com/Haidra-Org/AI-Horde-Worker",
        "threads": 1,
        "softprompts": [],
        **fields,
    }
    async with httpx.AsyncClient(base_url=base) as http:
        r = await http.post("/api/v2/generate/text/pop", json=body, headers={"apikey": key})
    # 200 with or without a job: a request without models another test left queued fits any text worker.
    assert r.status_code == 200, r.text


async def text_async(client: httpx.AsyncClient, key: str, **body: Any) -> httpx.Response:
    return await client.post(
        "/api/v2/generate/text/async", json={"prompt": "Once upon a time", **body}, headers={"apikey": key}
    )


async def status(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    r = await client.get(f"/api/v2/generate/text/status/{request_id}")
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


async def test_a_text_only_worker_serves_a_text_request_without_the_warning(
    client: httpx.AsyncClient, dispatch: Any, db: asyncpg.Connection
) -> None:
    model = unique_model()
    _, worker_key = await new_user(db)
    await pop_classic(dispatch, worker_key, f"text-{model}", model)
    row = await db.fetchrow(
        "SELECT accepts_chat_jobs, accepts_prompt_jobs FROM workers WHERE name = $1", f"text-{model}"
    )
    assert row is not None
    assert (row["accepts_chat_jobs"], row["accepts_prompt_jobs"]) == (False, True)

    _, key = await new_user(db)
    r = await text_async(client, key, models=[model], params={"max_length": 80, "max_context_length": 2048})
    assert r.status_code == 202
    body = r.json()
    assert "message" not in body
    stored = await db.fetchrow(
        "SELECT is_chat, active, models FROM waiting_prompts WHERE id = $1::uuid", body["id"]
    )
    assert stored is not None
    assert (stored["is_chat"], stored["active"], stored["models"]) == (False, True, [model])
    found = await status(client, body["id"])
    assert found["is_possible"] is True
    assert found["queue_position"] >= 1


async def test_a_request_no_text_worker_can_take_keeps_the_warning(
    client: httpx.AsyncClient, dispatch: Any, db: asyncpg.Connection
) -> None:
    model = unique_model()
    _, worker_key = await new_user(db)
    await pop_classic(dispatch, worker_key, f"small-{model}", model)
    # A chat worker that does not take prompt jobs does not serve text requests either.
    await add_chat_worker(db, model, max_length=4096, accepts_prompt_jobs=False)
    _, key = await new_user(db)
    # Above the text worker's max_length of 512.
    r = await text_async(client, key, models=[model], params={"max_length": 1024, "max_context_length": 2048})
    assert r.status_code == 202
    body = r.json()
    assert body["message"] == NO_WORKER_WARNING
    assert (await status(client, body["id"]))["is_possible"] is False


async def test_a_text_request_for_any_model_counts_every_text_worker(
    client: httpx.AsyncClient, dispatch: Any, db: asyncpg.Connection
) -> None:
    model = unique_model()
    _, worker_key = await new_user(db)
    await pop_classic(dispatch, worker_key, f"any-{model}", model)
    uid, key = await new_user(db)
    r = await text_async(client, key, params={"max_length": 80})
    try:
        assert r.status_code == 202
        assert "message" not in r.json()
        assert (await status(client, r.json()["id"]))["is_possible"] is True
    finally:
        # A request without models would stand in every later test's queue.
        await db.execute("DELETE FROM waiting_prompts WHERE user_id = $1", uid)
