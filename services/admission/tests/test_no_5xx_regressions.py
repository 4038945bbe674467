"""5xx found by the no-5xx fuzz in admission's chat route, each now a 4xx."""

from __future__ import annotations

from typing import Any

import pytest
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_context_length_past_int32_is_the_range_refusal_not_a_500(client: Any, db: Any) -> None:
    # Found by the fuzz: horde.max_context_length 10**20 reached WorkerPool.GetAvailability, whose field is an
    # int32, and the request building raised ValueError (500). The availability query now asks at the int32
    # maximum (no worker declares more), and sizing refuses the value with the text params' range.
    model = unique_model()
    _, key = await new_user(db)
    await add_chat_worker(db, model)
    for value in (10**20, 2**31):
        body = chat_body(model, horde={"max_context_length": value, "context_fit": "reject"})
        r = await client.post("/api/v2/generate/chat/async", json=body, headers={"apikey": key})
        assert r.status_code == 400, r.text
        out = r.json()
        assert out["rc"] == "BadRequest"
        assert out["message"].startswith("'horde.max_context_length': Input payload validation failed:")
        assert "less than or equal to 1048576" in out["message"]
