"""Worker details show ``paused`` and ``suspicious`` only to the worker's owner or a moderator
(docs/native-api.md#worker-details; upstream's details_privilege): anyone else, with no key, the anonymous key,
an unknown key or another user's key, gets the details without them (absent, not false), so nobody can tell
which workers are paused and get fake jobs (docs/native-api.md#workers)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.asyncio(loop_scope="session")

Harness = Any
PRIVILEGED = ("paused", "suspicious")


def text_body(name: str) -> dict[str, Any]:
    return {"name": name, "models": ["koboldcpp/test-text-7b"], "bridge_agent": "AI Horde Worker:1:test"}


async def views(h: Harness, name: str, worker_id: str, apikey: str | None) -> list[dict[str, Any]]:
    """The worker as each details route shows it to ``apikey``: by id, by name, in the list and by ``?name=``."""
    headers = {"apikey": apikey} if apikey is not None else {}
    answers = [
        await h.client.get(f"/api/v2/workers/{worker_id}", headers=headers),
        await h.client.get(f"/api/v2/workers/name/{name}", headers=headers),
        await h.client.get("/api/v2/workers", headers=headers),
        await h.client.get("/api/v2/workers", params={"name": name.upper()}, headers=headers),
    ]
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    listed = [[w for w in r.json() if w["id"] == worker_id] for r in answers[2:]]
    assert [len(found) for found in listed] == [1, 1]
    return [answers[0].json(), answers[1].json(), listed[0][0], listed[1][0]]


async def test_paused_and_suspicious_are_shown_to_the_owner_and_moderators_only(h: Harness) -> None:
    owner_id, owner_key = await h.user()
    assert (await h.pop(owner_key, text_body("w-private"))).status_code == 200
    _, other_key = await h.user()
    assert (await h.pop(other_key, text_body("w-public"))).status_code == 200
    mod_id, mod_key = await h.user()
    await h.db.execute("UPDATE users SET moderator = true WHERE id = $1", mod_id)
    await h.set_worker("w-private", paused=True)
    worker_id = await h.db.fetchval("SELECT id::text FROM workers WHERE name = 'w-private'")
    other_worker = await h.db.fetchval("SELECT id::text FROM workers WHERE name = 'w-public'")
    await h.db.execute(
        "INSERT INTO worker_suspicions (worker_id, suspicion) VALUES ($1::uuid, 'test')", worker_id
    )
    shared = await h.db.fetchval(
        "INSERT INTO user_shared_keys (user_id) VALUES ($1) RETURNING id::text", owner_id
    )

    # Anyone else: no key, the anonymous key, an unknown key, another user's key, the owner's shared key (a
    # spending key, not the owner's credential). The same details, without the two fields, and no error.
    anonymous = await views(h, "w-private", worker_id, None)
    for details in anonymous:
        assert not set(PRIVILEGED) & set(details), details
        assert details["maintenance_mode"] is False and details["name"] == "w-private"
    for key in ("0000000000", "not-a-key-of-anyone", other_key, shared):
        assert await views(h, "w-private", worker_id, key) == anonymous, key

    # The owner sees them on its own worker, not on another user's.
    for details in await views(h, "w-private", worker_id, owner_key):
        assert {k: details[k] for k in PRIVILEGED} == {"paused": True, "suspicious": 1}
        assert {k: v for k, v in details.items() if k not in PRIVILEGED} == anonymous[0]
    for details in await views(h, "w-public", other_worker, owner_key):
        assert not set(PRIVILEGED) & set(details), details
    # The other worker's owner sees its own (unpaused, unsuspected) worker's: false and 0, not absent.
    for details in await views(h, "w-public", other_worker, other_key):
        assert {k: details[k] for k in PRIVILEGED} == {"paused": False, "suspicious": 0}

    # A moderator sees them on every worker.
    for details in await views(h, "w-private", worker_id, mod_key):
        assert {k: details[k] for k in PRIVILEGED} == {"paused": True, "suspicious": 1}
    for details in await views(h, "w-public", other_worker, mod_key):
        assert {k: details[k] for k in PRIVILEGED} == {"paused": False, "suspicious": 0}

    # A deleted moderator is no one.
    await h.db.execute("UPDATE users SET deleted = true WHERE id = $1", mod_id)
    assert await views(h, "w-private", worker_id, mod_key) == anonymous


async def test_the_document_describes_the_optional_key_and_fields(h: Harness) -> None:
    doc = h.app.openapi()
    schema = doc["components"]["schemas"]["WorkerDetails"]
    for name in PRIVILEGED:
        assert name in schema["properties"] and name not in schema.get("required", [])
        assert "owner or a moderator" in schema["properties"][name]["description"]
    for path in ("/api/v2/workers", "/api/v2/workers/{worker_id}", "/api/v2/workers/name/{worker_name}"):
        params = doc["paths"][path]["get"].get("parameters", [])
        (apikey,) = [p for p in params if p["name"] == "apikey"]
        assert (apikey["in"], apikey["required"]) == ("header", False)
