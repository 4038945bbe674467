"""``PUT /v2/workers/{id}`` (docs/native-api.md#modify-worker) and the worker list's upstream behaviour
(docs/native-api.md#worker-details): who may set what, the stored state the next pop reads, and every
refusal's status, rc and message, with nothing written on a refusal."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from horde_contract.refusals import INVALID_API_KEY_MESSAGE

Harness = Any

pytestmark = pytest.mark.asyncio(loop_scope="session")

INVALID_KEY = {"message": INVALID_API_KEY_MESSAGE, "rc": "InvalidAPIKey"}
NOT_OWNER = "Only this worker's owner or a moderator may change its maintenance, info, name or team."
NOT_MODERATOR_PAUSE = "Only a moderator may pause or unpause a worker."
DEFAULT_MAINTENANCE = "This worker has been put into maintenance mode by its owner."
STATE = "SELECT name, info, maintenance, maintenance_msg, paused FROM workers WHERE id = $1"


def text_body(name: str) -> dict[str, Any]:
    return {"name": name, "models": ["koboldcpp/test-text-7b"], "bridge_agent": "AI Horde Worker:1:test"}


async def popped_worker(h: Harness, name: str | None = None) -> tuple[str, str, int]:
    """A worker created by its owner's pop: ``(worker id, owner key, owner id)``."""
    uid, key = await h.user()
    name = name or f"worker-{uuid.uuid4().hex[:8]}"
    r = await h.pop(key, text_body(name))
    assert r.status_code == 200, r.text
    worker_id = await h.db.fetchval("SELECT id::text FROM workers WHERE name = $1", name)
    return worker_id, key, uid


async def moderator(h: Harness) -> str:
    uid, key = await h.user()
    await h.db.execute("UPDATE users SET moderator = true WHERE id = $1", uid)
    return str(key)


async def put(h: Harness, worker_id: str, key: str | None, body: Any = None, **kw: Any) -> httpx.Response:
    headers = {"apikey": key} if key is not None else {}
    if body is not None:
        kw["json"] = body
    response: httpx.Response = await h.client.put(f"/api/v2/workers/{worker_id}", headers=headers, **kw)
    return response


async def stored(h: Harness, worker_id: str) -> dict[str, Any]:
    return dict(await h.db.fetchrow(STATE, uuid.UUID(worker_id)))


async def test_the_owner_sets_maintenance_and_the_next_pop_is_refused_with_its_message(h: Harness) -> None:
    worker_id, key, _ = await popped_worker(h, "maint-worker")
    r = await put(h, worker_id, key, {"maintenance": True, "maintenance_msg": "Back after the upgrade."})
    assert (r.status_code, r.json()) == (200, {"maintenance": True})
    state = await stored(h, worker_id)
    assert (state["maintenance"], state["maintenance_msg"]) == (True, "Back after the upgrade.")
    pop = await h.pop(key, text_body("maint-worker"))
    assert (pop.status_code, pop.json()) == (
        403,
        {"message": "Back after the upgrade.", "rc": "WorkerMaintenance"},
    )
    details = (await h.client.get(f"/api/v2/workers/{worker_id}")).json()
    assert details["maintenance_mode"] is True

    # turning it off clears the message; on again without one, the pop gives the default message
    r = await put(h, worker_id, key, {"maintenance": False, "maintenance_msg": "ignored"})
    assert (r.status_code, r.json()) == (200, {"maintenance": False})
    assert (await stored(h, worker_id))["maintenance_msg"] is None
    assert (await h.pop(key, text_body("maint-worker"))).status_code == 200
    assert (await put(h, worker_id, key, {"maintenance": True, "maintenance_msg": ""})).status_code == 200
    pop = await h.pop(key, text_body("maint-worker"))
    assert pop.json() == {"message": DEFAULT_MAINTENANCE, "rc": "WorkerMaintenance"}


async def test_the_owner_sets_info_name_and_clears_the_team(h: Harness) -> None:
    worker_id, key, _ = await popped_worker(h)
    r = await put(
        h,
        worker_id,
        key,
        {"info": "A 4090 in a cupboard", "name": "Renamed Worker", "team": "", "unknown": 1},
    )
    assert (r.status_code, r.json()) == (
        200,
        {"info": "A 4090 in a cupboard", "name": "Renamed Worker", "team": "None"},
    )
    state = await stored(h, worker_id)
    assert (state["name"], state["info"]) == ("Renamed Worker", "A 4090 in a cupboard")
    details = (await h.client.get(f"/api/v2/workers/{worker_id}")).json()
    assert (details["name"], details["info"]) == ("Renamed Worker", "A 4090 in a cupboard")
    # the renamed worker pops under its new name; its old name is free
    assert (await h.pop(key, text_body("Renamed Worker"))).status_code == 200
    assert await h.db.fetchval("SELECT count(*) FROM workers") == 1
    # null keys are absent; setting the same name again changes nothing and is answered
    r = await put(h, worker_id, key, {"name": "Renamed Worker", "info": None, "maintenance": None})
    assert (r.status_code, r.json()) == (200, {"name": "Renamed Worker"})


async def test_only_a_moderator_pauses_and_a_moderator_may_set_everything(h: Harness) -> None:
    worker_id, key, _ = await popped_worker(h)
    before = await stored(h, worker_id)
    r = await put(h, worker_id, key, {"maintenance": True, "paused": True})
    assert (r.status_code, r.json()) == (403, {"message": NOT_MODERATOR_PAUSE, "rc": "NotModerator"})
    assert await stored(h, worker_id) == before  # nothing written, not even the allowed maintenance

    mod = await moderator(h)
    r = await put(
        h, worker_id, mod, {"paused": True, "maintenance": True, "info": "checked", "name": "Mod Named"}
    )
    assert (r.status_code, r.json()) == (
        200,
        {"paused": True, "maintenance": True, "info": "checked", "name": "Mod Named"},
    )
    state = await stored(h, worker_id)
    assert (state["paused"], state["maintenance"], state["info"], state["name"]) == (
        True,
        True,
        "checked",
        "Mod Named",
    )
    # paused is shown to a moderator (or the owner) only: docs/native-api.md#worker-details.
    details = (await h.client.get(f"/api/v2/workers/{worker_id}", headers={"apikey": mod})).json()
    assert details["paused"] is True
    r = await put(h, worker_id, mod, {"paused": False})
    assert (r.status_code, r.json()) == (200, {"paused": False})
    assert (await stored(h, worker_id))["paused"] is False


@pytest.mark.parametrize(
    ("body", "rc", "message"),
    [
        ({"maintenance": True}, "NotOwner", NOT_OWNER),
        ({"info": "mine now"}, "NotOwner", NOT_OWNER),
        ({"paused": True}, "NotModerator", NOT_MODERATOR_PAUSE),
        ({"name": "Stolen Name"}, "NotModerator", NOT_OWNER),
        ({"team": ""}, "NotModerator", NOT_OWNER),
    ],
)
async def test_another_user_is_refused_and_nothing_changes(
    h: Harness, body: dict[str, Any], rc: str, message: str
) -> None:
    worker_id, _, _ = await popped_worker(h)
    _, stranger = await h.user()
    before = await stored(h, worker_id)
    r = await put(h, worker_id, stranger, body)
    assert (r.status_code, r.json()) == (403, {"message": message, "rc": rc})
    assert await stored(h, worker_id) == before


async def test_a_missing_unknown_or_shared_key_is_401(h: Harness) -> None:
    worker_id, _, uid = await popped_worker(h)
    shared = await h.db.fetchval("INSERT INTO user_shared_keys (user_id) VALUES ($1) RETURNING id::text", uid)
    before = await stored(h, worker_id)
    for key in (None, "", "wrong-key", shared):
        r = await put(h, worker_id, key, {"maintenance": True})
        assert (r.status_code, r.json()) == (401, INVALID_KEY), key
    assert await stored(h, worker_id) == before


async def test_a_deleted_owner_is_refused(h: Harness) -> None:
    worker_id, key, uid = await popped_worker(h)
    await h.db.execute("UPDATE users SET deleted = true WHERE id = $1", uid)
    r = await put(h, worker_id, key, {"maintenance": True})
    assert (r.status_code, r.json()) == (403, {"message": "This user has been deleted.", "rc": "DeletedUser"})


@pytest.mark.parametrize("worker_id", [str(uuid.uuid4()), "not-a-uuid", "x" * 200])
async def test_an_unknown_worker_is_404(h: Harness, worker_id: str) -> None:
    _, key = await h.user()
    r = await put(h, worker_id, key, {"maintenance": True})
    assert (r.status_code, r.json()) == (
        404,
        {"message": f"Worker with ID '{worker_id[:64]}' not found.", "rc": "WorkerNotFound"},
    )


async def test_nothing_selected_a_taken_name_and_an_unknown_team(h: Harness) -> None:
    worker_id, key, _ = await popped_worker(h)
    await popped_worker(h, "Taken Name")
    before = await stored(h, worker_id)
    for body in ({}, {"maintenance_msg": "alone"}, {"maintenance": None}, None):
        r = await put(h, worker_id, key, body)
        assert (r.status_code, r.json()) == (
            400,
            {
                "message": "The body sets none of maintenance, paused, info, name or team.",
                "rc": "NoWorkerModSelected",
            },
        ), body
    r = await put(h, worker_id, key, {"name": "Taken Name", "info": "x"})
    assert (r.status_code, r.json()) == (
        400,
        {"message": "The worker name 'Taken Name' is already taken.", "rc": "WorkerNameAlreadyExists"},
    )
    team = str(uuid.uuid4())
    r = await put(h, worker_id, key, {"team": team, "info": "x"})
    assert (r.status_code, r.json()) == (
        404,
        {"message": f"Team with ID '{team}' not found.", "rc": "TeamNotFound"},
    )
    assert await stored(h, worker_id) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"maintenance": "yes"}, "maintenance"),
        ({"paused": 1}, "paused"),
        ({"info": 5}, "info"),
        ({"info": "i" * 1001}, "info"),
        ({"maintenance": True, "maintenance_msg": "m" * 1001}, "maintenance_msg"),
        ({"name": "abcd"}, "name"),
        ({"name": "n" * 101}, "name"),
        ({"team": "t" * 37}, "team"),
    ],
)
async def test_a_field_of_the_wrong_type_or_length_is_400(
    h: Harness, body: dict[str, Any], field: str
) -> None:
    worker_id, key, _ = await popped_worker(h)
    before = await stored(h, worker_id)
    r = await put(h, worker_id, key, body)
    assert r.status_code == 400
    assert r.json()["rc"] == "BadRequest"
    assert r.json()["message"].startswith(f"Input payload validation failed: {field}:")
    assert await stored(h, worker_id) == before


@pytest.mark.parametrize(
    ("content", "status", "rc"),
    [
        (b"{not json", 400, "BadRequest"),
        (b"[]", 400, "BadRequest"),
        (b'"maintenance"', 400, "BadRequest"),
        (json.dumps({"info": list(range(100))}).encode(), 400, "BadRequest"),
        (json.dumps({"info": {"a": {"b": 1}}}).encode(), 400, "BadRequest"),
        (b'{"info": "a\\u0000b"}', 400, "NulByteInPayload"),
        (json.dumps({"info": "x" * 70_000}).encode(), 413, "RequestTooLarge"),
        (json.dumps({"name": "My Colab Box"}).encode(), 400, "BadRequest"),
    ],
)
async def test_a_malformed_or_oversized_body_is_refused_before_anything_else(
    h: Harness, content: bytes, status: int, rc: str
) -> None:
    worker_id, key, _ = await popped_worker(h)
    before = await stored(h, worker_id)
    headers = {"Content-Type": "application/json"}
    r = await h.client.put(
        f"/api/v2/workers/{worker_id}", headers={**headers, "apikey": key}, content=content
    )
    assert (r.status_code, r.json()["rc"]) == (status, rc)
    assert await stored(h, worker_id) == before
    # the body is read first: an unknown worker with a bad body is still the body's refusal
    r = await h.client.put(f"/api/v2/workers/{uuid.uuid4()}", headers=headers, content=content)
    assert (r.status_code, r.json()["rc"]) == (status, rc)


async def test_the_worker_list_is_online_workers_and_the_name_query_ignores_case(h: Harness) -> None:
    online, _, _ = await popped_worker(h, "Listed Worker")
    stale, _, _ = await popped_worker(h, "Stale Worker")
    await h.set_worker("Stale Worker", last_check_in=await h.db.fetchval("SELECT now() - interval '1 hour'"))
    listed = (await h.client.get("/api/v2/workers")).json()
    assert [w["id"] for w in listed] == [online]
    for query in ({"name": "listed worker"}, {"name": "LISTED WORKER", "type": "image"}):
        r = await h.client.get("/api/v2/workers", params=query)
        assert [w["id"] for w in r.json()] == [online], query
    assert (await h.client.get("/api/v2/workers", params={"name": "stale worker"})).json() == []
    assert (await h.client.get("/api/v2/workers", params={"name": "n" * 5000})).json() == []
    assert (await h.client.get("/api/v2/workers", params={"type": "image"})).json() == []
    # a stale worker is still found by id, as upstream
    assert (await h.client.get(f"/api/v2/workers/{stale}")).json()["online"] is False


async def test_the_document_describes_the_modify_route(h: Harness) -> None:
    doc = h.app.openapi()
    put_op = doc["paths"]["/api/v2/workers/{worker_id}"]["put"]
    assert put_op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ModifyWorkerInput"
    }
    assert {"200", "400", "401", "403", "404", "408", "413", "503"} <= set(put_op["responses"])
    assert set(doc["components"]["schemas"]["ModifyWorkerInput"]["properties"]) == {
        "maintenance", "maintenance_msg", "paused", "info", "name", "team",
    }  # fmt: skip
