"""The legacy text route under attack: the prompt, models, workers and params are
bounded before authentication; the anonymous user's concurrency counts a request whatever ``models`` holds;
a shared key's limits (max_text_tokens, kudos, expiry) apply as on the chat route. Each refusal stores and
charges nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from admission_helpers import new_user, unique_model
from horde_contract.limits import (
    MAX_MODEL_NAME_LENGTH,
    MAX_TEXT_MODEL_COUNT,
    MAX_TEXT_PARAMS_BYTES,
    MAX_TEXT_PROMPT_BYTES,
    MAX_TEXT_WORKER_IDS,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

ANON = "0000000000"
ANON_ACTIVE = (
    "SELECT coalesce(sum(n), 0) FROM waiting_prompts WHERE user_id = 0 AND NOT faulted AND n >= 1 AND active"
)


async def post(client: Any, body: Any, key: str) -> Any:
    return await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})


def bad(text: str) -> dict[str, str]:
    return {"message": f"Input payload validation failed: {text}", "rc": "BadRequest"}


async def nothing_stored(db: Any, user_id: int, kudos: float) -> None:
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == kudos
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE user_id = $1", user_id) == 0


async def test_bounds_are_sane() -> None:
    assert MAX_TEXT_PROMPT_BYTES == 1024 * 1024
    assert (MAX_TEXT_MODEL_COUNT, MAX_MODEL_NAME_LENGTH, MAX_TEXT_WORKER_IDS) == (200, 255, 100)
    assert MAX_TEXT_PARAMS_BYTES == 256 * 1024


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # 2 MiB of ASCII, and a prompt whose characters are under the bound but whose UTF-8 is over it.
        (
            {"prompt": "a" * (2 * MAX_TEXT_PROMPT_BYTES)},
            "prompt: takes 2097152 bytes of UTF-8; at most 1048576 are allowed",
        ),
        (
            {"prompt": "é" * (MAX_TEXT_PROMPT_BYTES // 2 + 1)},
            "prompt: takes 1048578 bytes of UTF-8; at most 1048576 are allowed",
        ),
        (
            {"prompt": "hi", "models": [f"m{i}" for i in range(10_000)]},
            "models: lists 10000 models; at most 200 are allowed",
        ),
        (
            {"prompt": "hi", "models": ["ok", "m" * 256]},
            "models[1]: is 256 characters long; a model name has at most 255",
        ),
        (
            {"prompt": "hi", "workers": [str(uuid.uuid4()) for _ in range(101)]},
            "workers: lists 101 worker ids; at most 100 are allowed",
        ),
        ({"prompt": "hi", "workers": ["x" * 65]}, "workers[0]: has to be a worker id"),
        (
            {"prompt": "hi", "params": {"max_length": 80, "junk": "x" * MAX_TEXT_PARAMS_BYTES}},
            f"params: takes {MAX_TEXT_PARAMS_BYTES + 27} bytes as JSON; at most 262144 are allowed",
        ),
    ],
    ids=["prompt-ascii", "prompt-utf8", "models-count", "model-name", "workers-count", "worker-id", "params"],
)
async def test_text_body_bounds(client: Any, db: Any, body: dict[str, Any], message: str) -> None:
    user_id, key = await new_user(db, kudos=100)
    r = await post(client, body, key)
    assert r.status_code == 400, r.text
    assert r.json() == bad(message)
    await nothing_stored(db, user_id, 100.0)


async def test_text_bounds_are_checked_before_authentication(client: Any) -> None:
    r = await post(client, {"prompt": "a" * (MAX_TEXT_PROMPT_BYTES + 1)}, "not-a-key")
    assert r.status_code == 400 and r.json()["rc"] == "BadRequest"


async def test_text_bounds_accept_the_limits(client: Any, db: Any) -> None:
    user_id, key = await new_user(db, kudos=100)
    body = {
        "prompt": "a" * MAX_TEXT_PROMPT_BYTES,
        "models": [unique_model() + "m" * (MAX_MODEL_NAME_LENGTH - 14)]
        + [unique_model() for _ in range(MAX_TEXT_MODEL_COUNT - 1)],
        "params": {"max_length": 80},
    }
    r = await post(client, body, key)
    assert r.status_code == 202, r.text
    row = await db.fetchrow(
        "SELECT length(prompt) AS chars, cardinality(models) AS models FROM waiting_prompts WHERE id = $1",
        uuid.UUID(r.json()["id"]),
    )
    assert (row["chars"], row["models"]) == (MAX_TEXT_PROMPT_BYTES, MAX_TEXT_MODEL_COUNT)
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 99.0


async def test_anonymous_concurrency_counts_requests_without_models(client: Any, db: Any) -> None:
    """Upstream counts the anonymous user's requests that list a requested model, so a request without
    models counted as zero and never met the limit; it now competes with every anonymous request."""
    original = await db.fetchval("SELECT concurrency FROM users WHERE id = 0")
    created: list[uuid.UUID] = []
    try:
        before = int(await db.fetchval(ANON_ACTIVE))
        await db.execute("UPDATE users SET concurrency = $1 WHERE id = 0", before + 2)
        for _ in range(2):
            r = await post(client, {"prompt": "hi"}, ANON)
            assert r.status_code == 202, r.text
            created.append(uuid.UUID(r.json()["id"]))
        r = await post(client, {"prompt": "hi"}, ANON)
        assert r.status_code == 429
        assert r.json() == {
            "rc": "TooManyPrompts",
            "message": f"Parallel requests ({before + 3}) exceeded user limit ({before + 2}). Please try again "
            "later or request to increase your concurrency.",
        }
        assert int(await db.fetchval(ANON_ACTIVE)) == before + 2

        # A request listing a model competes with the requests that may take any model.
        model = unique_model()
        without_models = int(
            await db.fetchval(
                ANON_ACTIVE + " AND cardinality(models) = 0 AND NOT (id = ANY($1::uuid[]))", created
            )
        )
        await db.execute("UPDATE users SET concurrency = $1 WHERE id = 0", without_models + 2)
        r = await post(client, {"prompt": "hi", "models": [model]}, ANON)
        assert r.status_code == 429
        assert r.json()["message"].startswith(
            f"Parallel requests ({without_models + 3}) exceeded user limit ({without_models + 2})."
        )
        assert int(await db.fetchval(ANON_ACTIVE)) == before + 2
    finally:
        await db.execute("UPDATE users SET concurrency = $1 WHERE id = 0", original)
        await db.execute("DELETE FROM waiting_prompts WHERE id = ANY($1::uuid[])", created)


# --- Shared keys on the text route ---------------------------------------------------------


async def _shared_key(db: Any, owner_id: int, **kw: Any) -> Any:
    from horde_store import users

    owner = await users.get_user(db, user_id=owner_id)
    return await users.create_shared_key(db, owner.username, **kw)


async def key_state(db: Any, key_id: Any) -> tuple[float, float]:
    row = await db.fetchrow("SELECT kudos, utilized FROM user_shared_keys WHERE id = $1", key_id)
    return float(row["kudos"]), float(row["utilized"])


async def test_text_route_applies_the_shared_key_max_text_tokens(client: Any, db: Any) -> None:
    owner_id, _ = await new_user(db, kudos=300)
    shared = await _shared_key(db, owner_id, kudos=100, max_text_tokens=100)
    r = await post(client, {"prompt": "hi", "params": {"max_length": 200}}, str(shared.id))
    assert r.status_code == 400
    assert r.json() == {
        "rc": "BadRequest",
        "message": "This shared key is limited to 100 tokens per request; max_tokens is 200.",
    }
    await nothing_stored(db, owner_id, 300.0)
    assert await key_state(db, shared.id) == (100.0, 0.0)
    # Within the limit the request is queued and the tax is charged to the owner and the key.
    r = await post(client, {"prompt": "hi", "params": {"max_length": 100}}, str(shared.id))
    assert r.status_code == 202, r.text
    assert await key_state(db, shared.id) == (99.0, 1.0)


async def test_text_route_applies_the_shared_key_kudos(client: Any, db: Any) -> None:
    owner_id, _ = await new_user(db, kudos=300)
    shared = await _shared_key(db, owner_id, kudos=5)
    # No models, max_length 80, context 2048: round((80 * 13 * 3.4 / 100 + 1) + 1) = 37 kudos.
    r = await post(client, {"prompt": "hi"}, str(shared.id))
    assert r.status_code == 403
    assert r.json() == {
        "rc": "SharedKeyInsufficientKudos",
        "message": "This shared key has 5 kudos left; the request needs 37.",
    }
    await nothing_stored(db, owner_id, 300.0)
    assert await key_state(db, shared.id) == (5.0, 0.0)
    # allow_downgrade does not lift a shared key's kudos (the key would pay for what it cannot cover).
    r = await post(client, {"prompt": "hi", "allow_downgrade": True}, str(shared.id))
    assert (r.status_code, r.json()["rc"]) == (403, "SharedKeyInsufficientKudos")
    await nothing_stored(db, owner_id, 300.0)


async def test_text_route_refuses_an_expired_shared_key(client: Any, db: Any) -> None:
    owner_id, _ = await new_user(db, kudos=300)
    shared = await _shared_key(db, owner_id, kudos=100)
    await db.execute(
        "UPDATE user_shared_keys SET expiry = now() - interval '1 minute' WHERE id = $1", shared.id
    )
    r = await post(client, {"prompt": "hi"}, str(shared.id))
    assert r.status_code == 403
    assert r.json() == {"rc": "SharedKeyExpired", "message": "This shared key has expired."}
    await nothing_stored(db, owner_id, 300.0)
    assert await key_state(db, shared.id) == (100.0, 0.0)
