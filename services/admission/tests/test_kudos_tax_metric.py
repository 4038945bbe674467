"""``horde_kudos_transferred_total{kind="horde_tax"}``: a created request counts the horde tax its activation
took, once committed; a dry run and a refused request count nothing (docs/operator-guide.md#metrics)."""

from __future__ import annotations

from typing import Any

import pytest
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model
from prometheus_client import REGISTRY

pytestmark = pytest.mark.asyncio(loop_scope="session")

ASYNC = "/api/v2/generate/chat/async"


def taxed() -> float:
    return REGISTRY.get_sample_value("horde_kudos_transferred_total", {"kind": "horde_tax"}) or 0.0


async def test_a_created_request_counts_its_tax(client: Any, db: Any) -> None:
    model = unique_model()
    user_id, key = await new_user(db, kudos=500)
    await add_chat_worker(db, model)
    before = taxed()
    r = await client.post(ASYNC, json=chat_body(model, "Say hi", max_tokens=64), headers={"apikey": key})
    assert r.status_code == 202, r.text
    kudos = await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id)
    assert taxed() - before == pytest.approx(500 - kudos) == pytest.approx(1.0)

    before = taxed()
    dry = chat_body(model, "Say hi", max_tokens=64, horde={"dry_run": True})
    assert (await client.post(ASYNC, json=dry, headers={"apikey": key})).status_code == 200
    unknown = chat_body(unique_model(), "Say hi", max_tokens=64)
    assert (await client.post(ASYNC, json=unknown, headers={"apikey": key})).status_code >= 400
    assert taxed() == before
