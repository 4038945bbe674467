"""Legacy text routes (docs/native-api.md#text-route, #status-and-cancel), GET /v2/status/models
(docs/native-api.md#model-list) and GET /v2/status/models/{model_name} (docs/native-api.md#single-model-status)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from admission_helpers import add_chat_worker, allowance_decisions, chat_body, new_user, unique_model
from horde_core.redis_keys import models_cache_key

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def text_post(client: Any, body: dict[str, Any], key: str) -> Any:
    return await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})


async def test_text_request_is_stored_and_reported(client: Any, db: Any) -> None:
    user_id, key = await new_user(db)
    body = {
        "prompt": "Once upon a time",
        "params": {"max_length": 100, "n": 2, "temperature": 0.7},
        "models": ["m1"],
    }
    r = await text_post(client, body, key)
    assert r.status_code == 202, r.text
    out = r.json()
    # ctx(2048) = 3.4: round((100 * 3.4 / 100 + 1) * 2 + 1) = 10
    assert out["kudos"] == 10 and "warnings" not in out
    row = await db.fetchrow("SELECT * FROM waiting_prompts WHERE id = $1", uuid.UUID(out["id"]))
    assert not row["is_chat"] and row["messages"] is None and row["prompt"] == "Once upon a time"
    assert (row["n"], row["jobs"], row["max_length"], row["max_context_length"]) == (2, 2, 100, 2048)
    assert row["params"] == {"max_length": 100, "n": 2, "temperature": 0.7} and row["models"] == ["m1"]
    assert row["user_id"] == user_id and row["active"]

    s = (await client.get(f"/api/v2/generate/text/status/{out['id']}")).json()
    assert (s["waiting"], s["done"], s["queue_position"], s["generations"]) == (2, False, 1, [])
    assert "eligible_worker_threads" not in s and "context_adjustments" not in s
    # The chat routes do not see a text request.
    for method in ("GET", "DELETE"):
        r = await client.request(method, f"/api/v2/generate/chat/status/{out['id']}")
        assert r.json() == {
            "message": f"Chat Waiting Prompt (Status) with ID '{out['id']}' not found.",
            "rc": "RequestNotFound",
        }
    # Cancel: n = 0, done with nothing in flight.
    s = (await client.delete(f"/api/v2/generate/text/status/{out['id']}")).json()
    assert (s["done"], s["waiting"]) == (True, 0)


@pytest.mark.parametrize(
    ("body", "rc"),
    [
        ({"prompt": ""}, "MissingPrompt"),
        ({"params": {}}, "BadRequest"),
        ({"prompt": "x", "params": {"max_length": 99999}}, "BadRequest"),
        ({"prompt": "x", "params": {"max_length": 500, "max_context_length": 100}}, "TokenOverflow"),
        ({"prompt": "x", "params": {"sampler_order": [1, 2]}}, "MissingFullSamplerOrder"),
        ({"prompt": "x", "extra_source_images": [{}]}, "InvalidExtraSourceImages."),
    ],
)
async def test_text_refusals(client: Any, db: Any, body: dict[str, Any], rc: str) -> None:
    _, key = await new_user(db)
    r = await text_post(client, body, key)
    assert r.status_code == 400 and r.json()["rc"] == rc, r.text


async def test_text_auth_workers_and_dry_run(client: Any, db: Any) -> None:
    r = await text_post(client, {"prompt": "x"}, "bad key")
    assert r.status_code == 401 and r.json()["rc"] == "InvalidAPIKey"
    user_id, key = await new_user(db)
    r = await text_post(client, {"prompt": "x", "workers": [str(uuid.uuid4())]}, key)
    assert r.status_code == 404 and r.json()["rc"] == "WorkerNotFound"
    r = await text_post(client, {"prompt": "x", "dry_run": True}, key)
    assert r.status_code == 200 and set(r.json()) == {"kudos"}
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    # the anonymous key works on the text route
    r = await text_post(client, {"prompt": "x"}, "0000000000")
    assert r.status_code == 202


async def test_text_allow_downgrade(make_client: Any, db: Any) -> None:
    # The requests below must see the ones queued just before them (the competing-queue memo off).
    client = await make_client(competing_queue_memo_seconds=0)
    model = unique_model()
    # Text limits of 4096: the queued requests below are ones it could take, so they compete.
    await add_chat_worker(db, model, speed=100, max_length=4096)
    # the queue ahead pushes the allowance to the floor
    _, rich = await new_user(db, kudos=100_000)
    for _ in range(8):
        assert (
            await text_post(
                client,
                {
                    "prompt": "x",
                    "models": [model],
                    "params": {"max_length": 4096, "max_context_length": 8192},
                },
                rich,
            )
        ).status_code == 202
    _, poor = await new_user(db, kudos=0)
    body = {"prompt": "x", "models": [model], "params": {"max_length": 2048}}
    r = await text_post(client, body, poor)
    assert r.status_code == 403 and r.json()["rc"] == "KudosUpfront"
    r = await text_post(client, {**body, "allow_downgrade": True}, poor)
    assert r.status_code == 202
    row = await db.fetchrow(
        "SELECT max_length, params, slow_workers FROM waiting_prompts WHERE id = $1",
        uuid.UUID(r.json()["id"]),
    )
    assert (row["max_length"], row["params"]["max_length"], row["slow_workers"]) == (512, 512, True)


def text_decisions(outcome: str, requested: str, allowance: str = "<=512") -> float:
    """``horde.text.free_allowance.decisions`` of registered users' text requests (``horde.chat`` false)."""
    return allowance_decisions(outcome, requested, allowance, requester="registered", chat=False)


async def test_text_creations_are_counted_as_free_allowance_decisions(client: Any, db: Any) -> None:
    # A model no worker serves: no eligible worker, so the allowance is the floor (512).
    _, rich = await new_user(db, kudos=100_000)
    _, poor = await new_user(db, kudos=0)
    model = unique_model()
    small = {"prompt": "x", "models": [model], "params": {"max_length": 100}}
    large = {"prompt": "x", "models": [model], "params": {"max_length": 2048}}
    cases: list[tuple[str, dict[str, Any], int, str, str]] = [
        (rich, small, 202, "free", "<=512"),
        (rich, large, 202, "funded", "1025-2048"),
        (poor, large, 403, "refused", "1025-2048"),
        (poor, {**large, "allow_downgrade": True}, 202, "downgraded", "1025-2048"),
    ]
    for key, body, status, outcome, requested in cases:
        before = text_decisions(outcome, requested)
        r = await text_post(client, body, key)
        assert r.status_code == status, r.text
        assert text_decisions(outcome, requested) == before + 1, outcome
    # A dry run is not counted.
    before = text_decisions("funded", "1025-2048")
    assert (await text_post(client, {**large, "dry_run": True}, rich)).status_code == 200
    assert text_decisions("funded", "1025-2048") == before


async def test_models_chat_list(client: Any, db: Any) -> None:
    model = unique_model()
    text_only = unique_model()
    owner, _ = await new_user(db)
    await add_chat_worker(
        db, model, owner=owner, threads=2, max_context_length=4096, max_length=512, features=["seed"]
    )
    await add_chat_worker(
        db,
        model,
        threads=3,
        max_context_length=8192,
        max_length=1024,
        features=["tools"],
        accepts_prompt_jobs=False,
    )
    await db.execute(
        "INSERT INTO workers (user_id, name, threads, models, last_check_in) VALUES ($1, $2, 4, ARRAY[$3], now())",
        owner,
        f"w_{uuid.uuid4().hex[:8]}",
        text_only,
    )
    _, key = await new_user(db)
    r = await client.post(
        "/api/v2/generate/chat/async", json=chat_body(model, max_tokens=256), headers={"apikey": key}
    )
    assert r.status_code == 202

    # the list is cached 2 s across clients whatever the query string: start from no cache
    await client.horde_app.state.admission.redis.delete(models_cache_key(True), models_cache_key(False))
    r = await client.get("/api/v2/status/models", params={"type": "text", "chat": "true"})
    assert r.status_code == 200
    entries = {e["name"]: e for e in r.json()}
    assert text_only not in entries
    entry = entries[model]
    # the chat-only worker's threads are left out of count
    assert (entry["count"], entry["queued"], entry["jobs"], entry["type"]) == (2, 256, 1, "text")
    chat = entry["chat"]
    assert (chat["workers"], chat["max_context_length"], chat["max_length"]) == (2, 8192, 1024)
    assert chat["features"] == ["seed", "tools"] and isinstance(chat["created"], int)

    r = await client.get(
        "/api/v2/status/models", params={"type": "text", "min_count": 0, "model_state": "custom"}
    )
    plain = {e["name"]: e for e in r.json()}
    assert text_only in plain and "chat" not in plain[model]

    r = await client.get("/api/v2/status/models", params={"type": "image", "chat": "true"})
    assert r.status_code == 400 and r.json()["rc"] == "BadRequest"
    r = await client.get("/api/v2/status/models", params={"type": "text", "model_state": "weird"})
    assert r.status_code == 400
    assert (await client.get("/v2/status/models")).json() == []


async def test_single_model_status_is_the_models_entry_of_the_list(client: Any, db: Any) -> None:
    """Upstream's ModelSingle: a list with the model's entry (the same as in the list), found by its exact name,
    slashes and all; [] (200) for a model no online worker serves: unknown, offline or in maintenance."""
    model = f"koboldcpp/{unique_model()}"
    offline, maintained = unique_model(), unique_model()
    owner, _ = await new_user(db)
    await add_chat_worker(db, model, owner=owner, threads=3)
    await add_chat_worker(db, offline, owner=owner, online=False)
    worker = await add_chat_worker(db, maintained, owner=owner)
    await db.execute("UPDATE workers SET maintenance = true WHERE id = $1", worker)
    _, key = await new_user(db)
    r = await client.post(
        "/api/v2/generate/chat/async", json=chat_body(model, max_tokens=128), headers={"apikey": key}
    )
    assert r.status_code == 202
    await client.horde_app.state.admission.redis.delete(models_cache_key(True), models_cache_key(False))

    listed = {
        e["name"]: e for e in (await client.get("/api/v2/status/models", params={"type": "text"})).json()
    }
    r = await client.get(f"/api/v2/status/models/{model}")
    assert r.status_code == 200
    assert r.json() == [listed[model]]
    assert r.json()[0] | {"performance": 0.0, "eta": 0} == {
        "name": model, "count": 3, "performance": 0.0, "queued": 128, "jobs": 1, "eta": 0, "type": "text",
    }  # fmt: skip
    # the name's slash sent encoded, the route without /api, a type parameter (ignored, as upstream's)
    encoded = model.replace("/", "%2F")
    assert (await client.get(f"/api/v2/status/models/{encoded}")).json() == [listed[model]]
    assert (await client.get(f"/v2/status/models/{model}", params={"type": "text"})).json() == [listed[model]]
    for name in (offline, maintained, unique_model(), model.upper(), model.split("/")[1]):
        r = await client.get(f"/api/v2/status/models/{name}")
        assert (r.status_code, r.json()) == (200, [])
    # A line break is no route's path (the documented 404, found by schemathesis).
    r = await client.get("/api/v2/status/models/a%0Ab")
    assert (r.status_code, r.json()) == (404, {"message": "Not Found", "rc": "NotFound"})
