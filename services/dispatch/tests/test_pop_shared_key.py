"""A shared key is a spending key, never a worker's credential (docs/native-api.md#pop, #kudos: the pop takes
the worker owner's API key, looked up as upstream's ``find_user_by_api_key``, which never resolves a shared key):
it neither creates a worker nor pops as its owner's, valid or expired."""

from __future__ import annotations

from typing import Any

import pytest
from horde_store import users

Harness = Any

pytestmark = pytest.mark.asyncio(loop_scope="session")

INVALID_API_KEY = {
    "message": "No user matching sent API Key. Have you remembered to register?",
    "rc": "InvalidAPIKey",
}


async def test_a_shared_key_cannot_create_a_worker(h: Harness) -> None:
    uid, _ = await h.user(kudos=1000)
    owner = await users.get_user(h.db, user_id=uid)
    shared = await users.create_shared_key(h.db, owner.username, kudos=100)
    r = await h.pop(str(shared.id), h.chat_body("w-shared-new"))
    assert (r.status_code, r.json()) == (401, INVALID_API_KEY)
    assert await h.db.fetchval("SELECT count(*) FROM workers WHERE user_id = $1", uid) == 0


async def test_a_shared_key_cannot_pop_as_its_owners_worker(h: Harness) -> None:
    uid, key = await h.user(kudos=1000)
    owner = await users.get_user(h.db, user_id=uid)
    r = await h.pop(key, h.chat_body("w-shared-owned"))
    assert r.status_code == 200, r.text
    before = await h.db.fetchrow("SELECT last_check_in, ipaddr FROM workers WHERE name = 'w-shared-owned'")
    # A request the worker could take: the shared key must not get it.
    wp = await h.request(user_id=uid)
    shared = await users.create_shared_key(h.db, owner.username, kudos=-1)
    expired = await users.create_shared_key(h.db, owner.username, kudos=100)
    await h.db.execute(
        "UPDATE user_shared_keys SET expiry = now() - interval '1 day' WHERE id = $1", expired.id
    )
    for spending_key in (shared.id, expired.id):
        r = await h.pop(str(spending_key), h.chat_body("w-shared-owned"))
        assert (r.status_code, r.json()) == (401, INVALID_API_KEY)
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE wp_id = $1", wp) == 0
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1
    after = await h.db.fetchrow("SELECT last_check_in, ipaddr FROM workers WHERE name = 'w-shared-owned'")
    assert after == before
    # The owner's own key still pops it.
    r = await h.pop(key, h.chat_body("w-shared-owned"))
    assert r.status_code == 200 and r.json()["id"] is not None, r.text
