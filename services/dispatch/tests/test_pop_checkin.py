"""Pop refusals, the chat declaration and worker check-in (docs/native-api.md#chat-declaration, #worker-details;
docs/native-api.md#pop refusals, #workers creation and check-in)."""

from __future__ import annotations

from typing import Any

import pytest

Harness = Any
CHAT_MODEL = "koboldcpp/test-chat-7b"

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_missing_and_unknown_key_are_401(h: Harness) -> None:
    for key in (None, "not-a-key"):
        r = await h.pop(key, h.chat_body("w-auth"))
        assert r.status_code == 401
        assert r.json()["rc"] == "InvalidAPIKey"
    assert await h.db.fetchval("SELECT count(*) FROM workers") == 0


async def test_anonymous_key_is_forbidden(h: Harness) -> None:
    r = await h.pop("0000000000", h.chat_body("w-anon"))
    assert r.status_code == 403
    assert r.json() == {
        "message": "Anonymous user is forbidden from running a worker.",
        "rc": "AnonForbiddenWorker",
    }


async def test_flagged_owner_is_refused(h: Harness) -> None:
    uid, key = await h.user()
    await h.db.execute("UPDATE users SET flagged = true WHERE id = $1", uid)
    r = await h.pop(key, h.chat_body("w-flagged"))
    assert r.status_code == 403
    assert r.json()["rc"] == "WorkerFlaggedMaintenance"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"threads": 0}, "threads"),
        ({"threads": 51}, "threads"),
        ({"amount": 21}, "amount"),
        ({"amount": 0}, "amount"),
        ({"models": ["ab"]}, "models.0"),
        ({"bridge_agent": "x" * 1001}, "bridge_agent"),
        ({"name": ""}, "name"),
    ],
)
async def test_text_fields_are_validated(h: Harness, change: dict[str, object], field: str) -> None:
    _, key = await h.user()
    r = await h.pop(key, {**h.chat_body("w-valid"), **change})
    assert r.status_code == 400
    body = r.json()
    assert body["rc"] == "BadRequest"
    assert body["message"].startswith(f"Input payload validation failed: {field}:")


async def test_name_is_required_and_models_must_not_be_empty(h: Harness) -> None:
    _, key = await h.user()
    body = h.chat_body("x")
    del body["name"]
    r = await h.pop(key, body)
    assert (r.status_code, r.json()["rc"]) == (400, "BadRequest")
    assert "name" in r.json()["message"]
    r = await h.pop(key, {"name": "w-nomodels", "models": []})
    assert r.status_code == 400
    assert r.json() == {
        "message": "Unfortunately we cannot accept workers serving unrecognised models at this time",
        "rc": "BadRequest",
    }


async def test_priority_usernames_need_an_id(h: Harness) -> None:
    _, key = await h.user()
    r = await h.pop(key, h.chat_body("w-prio", priority_usernames=["alice"]))
    assert r.status_code == 400
    assert r.json()["rc"] == "InvalidPriorityUsername"


async def test_too_many_priority_usernames_are_400_and_nothing_is_stored(h: Harness) -> None:
    _, key = await h.user()
    r = await h.pop(key, h.chat_body("w-prio-many", priority_usernames=[f"u#{i}" for i in range(101)]))
    assert r.status_code == 400
    assert r.json()["rc"] == "BadRequest"
    assert r.json()["message"].startswith("Input payload validation failed: priority_usernames: ")
    assert await h.db.fetchval("SELECT count(*) FROM workers WHERE name = 'w-prio-many'") == 0


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"chat_limits": None}, "chat_limits"),
        ({"model_id": None}, "model_id"),
        (
            {"chat_limits": {"max_context_length": 4096, "max_length": 512, "tools_max_temperature": -0.1}},
            "chat_limits.tools_max_temperature",
        ),
        ({"model_id": "some/other-model"}, "model_id"),
        ({"chat_jobs": False, "prompt_jobs": False}, "prompt_jobs"),
    ],
    ids=[
        "no-limits",
        "no-model-id",
        "negative-tools-temperature",
        "model-id-not-in-models",
        "prompt-only-off",
    ],
)
async def test_invalid_declarations_are_refused(h: Harness, change: dict[str, object], param: str) -> None:
    _, key = await h.user()
    body = {k: v for k, v in {**h.chat_body("w-decl"), **change}.items() if v is not None}
    r = await h.pop(key, body)
    assert r.status_code == 400
    payload = r.json()
    assert payload["rc"] == "ChatDeclarationInvalid"
    assert payload["message"].startswith(f"'{param}'")
    # Refused before any check-in.
    assert await h.db.fetchval("SELECT count(*) FROM workers WHERE name = 'w-decl'") == 0


async def test_worker_is_created_with_its_declaration(h: Harness) -> None:
    uid, key = await h.user()
    body = h.chat_body(
        "w-new",
        threads=3,
        chat_features=["seed", "tools", "made_up_feature", "prompt_overflow_refused"],
        image_transports=["url", "carrier-pigeon"],
        chat_limits={"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0},
    )
    r = await h.pop(key, body)
    assert r.status_code == 200, r.text
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {}}
    row = await h.db.fetchrow("SELECT * FROM workers WHERE name = 'w-new'")
    assert row["user_id"] == uid
    assert row["threads"] == 3
    assert row["models"] == [CHAT_MODEL]
    assert row["accepts_chat_jobs"] is True
    assert row["accepts_prompt_jobs"] is True
    assert row["chat_model_id"] == CHAT_MODEL
    assert row["chat_features"] == ["prompt_overflow_refused", "seed", "tools"]
    assert row["image_transports"] == ["url"]
    assert (row["chat_max_context_length"], row["chat_max_length"], row["chat_tools_max_temperature"]) == (
        8192,
        1024,
        1.0,
    )


async def test_a_name_owned_by_another_user_is_wrong_credentials(h: Harness) -> None:
    _, key1 = await h.user()
    _, key2 = await h.user()
    assert (await h.pop(key1, h.chat_body("w-owned"))).status_code == 200
    r = await h.pop(key2, h.chat_body("w-owned"))
    assert r.status_code == 403
    assert r.json() == {"message": "Wrong credentials to submit as this worker.", "rc": "WrongCredentials"}


async def test_declaration_is_stored_on_every_pop_inside_the_window(h: Harness) -> None:
    """The second pop comes within 30 s of the first (and the worker is older than 30 s): the text fields
    are not rewritten, the declaration is."""
    _, key = await h.user()
    assert (await h.pop(key, h.chat_body("w-window"))).status_code == 200
    await h.db.execute(
        "UPDATE workers SET created = now() - interval '1 hour', last_check_in = now() - interval '5 seconds' "
        "WHERE name = 'w-window'"
    )
    plain = {"name": "w-window", "models": [CHAT_MODEL], "max_length": 80, "threads": 7}
    r = await h.pop(key, plain)
    assert r.status_code == 200
    row = await h.db.fetchrow("SELECT * FROM workers WHERE name = 'w-window'")
    # The declaration is withdrawn at once ...
    assert row["accepts_chat_jobs"] is False
    assert row["chat_model_id"] is None and row["chat_max_length"] is None and row["chat_features"] is None
    # ... while the check-in fields wait for the window to pass.
    assert (row["threads"], row["max_length"]) == (1, 512)

    await h.db.execute(
        "UPDATE workers SET last_check_in = now() - interval '31 seconds' WHERE name = 'w-window'"
    )
    r = await h.pop(key, h.chat_body("w-window", threads=4, chat_features=["seed"]))
    assert r.status_code == 200
    row = await h.db.fetchrow("SELECT * FROM workers WHERE name = 'w-window'")
    assert (row["threads"], row["accepts_chat_jobs"], row["chat_features"]) == (4, True, ["seed"])
    assert row["uptime"] >= 31


async def test_chat_only_worker(h: Harness) -> None:
    _, key = await h.user()
    assert (await h.pop(key, h.chat_body("w-chatonly", prompt_jobs=False))).status_code == 200
    row = await h.db.fetchrow(
        "SELECT accepts_prompt_jobs, accepts_chat_jobs FROM workers WHERE name = 'w-chatonly'"
    )
    assert (row["accepts_prompt_jobs"], row["accepts_chat_jobs"]) == (False, True)


async def test_worker_details_carry_the_declaration(h: Harness) -> None:
    _, key = await h.user()
    body = h.chat_body(
        "w-details",
        chat_features=["tools", "seed", "bogus"],
        image_transports=["url", "base64", "bogus"],
        chat_limits={"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0},
    )
    assert (await h.pop(key, body)).status_code == 200
    assert (await h.pop(key, {"name": "w-textonly", "models": ["koboldcpp/old-model"]})).status_code == 200
    await h.db.execute("UPDATE workers SET nonconformant_replies = 2 WHERE name = 'w-details'")
    worker_id = await h.db.fetchval("SELECT id::text FROM workers WHERE name = 'w-details'")

    by_id = (await h.client.get(f"/api/v2/workers/{worker_id}")).json()
    by_name = (await h.client.get("/v2/workers/name/w-details")).json()
    assert by_id == by_name
    assert by_id["id"] == worker_id
    assert by_id["accepts_chat_jobs"] is True
    assert by_id["accepts_prompt_jobs"] is True
    assert by_id["nonconformant_replies"] == 2
    assert by_id["chat"] == {
        "model_id": CHAT_MODEL,
        "features": ["seed", "tools"],
        "limits": {"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0},
        "image_transports": ["base64", "url"],
    }
    assert by_id["online"] is True
    assert by_id["type"] == "text"

    text_only = (await h.client.get("/api/v2/workers/name/w-textonly")).json()
    assert text_only["accepts_chat_jobs"] is False
    assert "chat" not in text_only

    listed = (await h.client.get("/api/v2/workers")).json()
    assert {w["name"] for w in listed} == {"w-details", "w-textonly"}
    assert (await h.client.get("/api/v2/workers", params={"type": "image"})).json() == []

    for path in ("/api/v2/workers/00000000-0000-0000-0000-000000000000", "/api/v2/workers/name/nobody"):
        r = await h.client.get(path)
        assert r.status_code == 404
        assert r.json()["rc"] == "WorkerNotFound"


async def test_worker_in_maintenance_without_own_requests_is_refused(h: Harness) -> None:
    uid, key = await h.user()
    assert (await h.pop(key, h.chat_body("w-maint"))).status_code == 200
    await h.db.execute(
        "UPDATE workers SET maintenance = true, maintenance_msg = 'resting' WHERE name = 'w-maint'"
    )
    other, _ = await h.user()
    await h.request(user_id=other)
    r = await h.pop(key, h.chat_body("w-maint"))
    assert r.status_code == 403
    assert r.json() == {"message": "resting", "rc": "WorkerMaintenance"}
    own = await h.request(user_id=uid)
    r = await h.pop(key, h.chat_body("w-maint"))
    assert r.status_code == 200
    assert await h.db.fetchval("SELECT wp_id FROM processing_gens") == own
