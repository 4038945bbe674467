"""POST /v2/generate/chat/async, to the letter of docs/native-api.md: max_tokens outside 16..16384 is
refused (never lowered), a model whose only workers are paused or in maintenance is known (403, not 404), a
retried operation key finds its request through a used-up or expired shared key, a decompression bomb is
SourceImageResolutionExceeded, and a shared key's kudos refusal is counted as a free allowance decision."""

from __future__ import annotations

import base64
import struct
import uuid
import zlib
from typing import Any

import pytest
from admission_helpers import add_chat_worker, allowance_decisions, chat_body, new_user, unique_model

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOO_LONG = "Input should be less than or equal to 16384"


async def post(client: Any, body: Any, key: str | None) -> Any:
    headers = {"apikey": key} if key is not None else {}
    return await client.post("/api/v2/generate/chat/async", json=body, headers=headers)


def err(r: Any) -> tuple[int, str, str]:
    body = r.json()
    return r.status_code, body["rc"], body["message"]


async def rows_of(db: Any, user_id: int) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id)
    return count


# --- max_tokens / max_completion_tokens: 16 to 16384, refused outside (Request body) ------------------------


@pytest.mark.parametrize("value", [16385, 20000])
@pytest.mark.parametrize("key_name", ["max_tokens", "max_completion_tokens"])
async def test_token_limit_above_16384_is_400_not_lowered(
    client: Any, db: Any, value: int, key_name: str
) -> None:
    model = unique_model()
    # A worker declaring a small max_length: the old path lowered any value to it instead of refusing.
    await add_chat_worker(db, model, max_length=1024)
    user_id, key = await new_user(db)
    limit: dict[str, Any] = {key_name: value}
    for horde in ({}, {"dry_run": True}):
        r = await post(client, chat_body(model, **limit, horde=horde), key)
        assert r.status_code == 400, r.text
        assert r.json() == {
            "message": f"'{key_name}': Input payload validation failed: max_length: {TOO_LONG}",
            "rc": "BadRequest",
            "errors": {"max_length": TOO_LONG},
        }
    assert await rows_of(db, user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 1000.0


async def test_token_limit_range_edges(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, max_length=1024)
    user_id, key = await new_user(db)
    # 16384 is in range: lowered to the largest declared max_length, as Context adjustments says.
    r = await post(client, chat_body(model, max_tokens=16384), key)
    assert r.status_code == 202, r.text
    row = await db.fetchrow(
        "SELECT max_length, params, context_adjustments FROM waiting_prompts WHERE id = $1",
        uuid.UUID(r.json()["id"]),
    )
    assert row["max_length"] == 1024 and row["params"]["max_length"] == 1024
    assert row["context_adjustments"] == [{"from": 16384, "to": 1024, "reason": "worker_max_length"}]
    # Below the floor: the same validation error.
    r = await post(client, chat_body(model, max_completion_tokens=15), key)
    assert err(r) == (
        400,
        "BadRequest",
        "'max_completion_tokens': Input payload validation failed: max_length: "
        "Input should be greater than or equal to 16",
    )
    assert await rows_of(db, user_id) == 1


# --- Known models: paused and maintenance workers keep a model known (Known models) -------------------------


async def test_model_served_only_in_maintenance_or_paused_is_403_not_404(client: Any, db: Any) -> None:
    owner_id, owner_key = await new_user(db)
    in_maintenance, paused = unique_model(), unique_model()
    await db.execute(
        "UPDATE workers SET maintenance = true WHERE id = $1",
        await add_chat_worker(db, in_maintenance, owner=owner_id),
    )
    await db.execute(
        "UPDATE workers SET paused = true WHERE id = $1", await add_chat_worker(db, paused, owner=owner_id)
    )
    user_id, key = await new_user(db)
    for model in (in_maintenance, paused):
        for horde in ({}, {"dry_run": True}):
            r = await post(client, chat_body(model, horde=horde), key)
            assert err(r) == (403, "NoEligibleWorker", f"No worker is currently serving the model '{model}'.")
            assert "impossible_reason" not in r.json()
    # Under models: every entry is known, none is served.
    body = {"models": [in_maintenance, paused], "messages": [{"role": "user", "content": "x"}]}
    assert err(await post(client, body, key)) == (
        403,
        "NoEligibleWorker",
        f"No worker is currently serving any of the models '{in_maintenance}', '{paused}'.",
    )
    # A served entry beside one known only through a worker in maintenance: accepted, nothing dropped.
    served = unique_model()
    await add_chat_worker(db, served)
    r = await post(client, {**body, "models": [served, in_maintenance]}, key)
    assert r.status_code == 202, r.text
    assert await db.fetchval(
        "SELECT models FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"])
    ) == [served, in_maintenance]
    assert await rows_of(db, user_id) == 1
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 999.0  # the one tax
    # Its owner is served by the worker in maintenance.
    r = await post(client, chat_body(in_maintenance), owner_key)
    assert r.status_code == 202, r.text

    # Past 300 s the worker no longer makes the model known, in maintenance or not.
    await db.execute(
        "UPDATE workers SET last_check_in = now() - interval '301 seconds' WHERE chat_model_id = $1",
        in_maintenance,
    )
    code, rc, _ = err(await post(client, chat_body(in_maintenance), key))
    assert (code, rc) == (404, "UnknownChatModel")
    code, rc, message = err(await post(client, {**body, "models": [served, in_maintenance]}, key))
    assert (code, rc) == (404, "UnknownChatModel") and message.startswith("'models[1]': ")


# --- Operation key through a used-up or expired shared key (Operation key) ----------------------------------


async def _shared_key(db: Any, owner_id: int, **kw: Any) -> Any:
    from horde_store import users

    owner = await users.get_user(db, user_id=owner_id)
    return await users.create_shared_key(db, owner.username, **kw)


@pytest.mark.parametrize(
    ("spoil", "rc", "message"),
    [
        (
            "UPDATE user_shared_keys SET kudos = 0 WHERE id = $1",
            "SharedKeyEmpty",
            "This shared key has no kudos left.",
        ),
        (
            "UPDATE user_shared_keys SET expiry = now() - interval '1 minute' WHERE id = $1",
            "SharedKeyExpired",
            "This shared key has expired.",
        ),
    ],
)
async def test_retry_through_a_spent_shared_key_gets_its_request(
    client: Any, db: Any, spoil: str, rc: str, message: str
) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    owner_id, _ = await new_user(db, kudos=300)
    shared = await _shared_key(db, owner_id, kudos=50)
    op = str(uuid.uuid4())
    body = chat_body(model, "retry me", max_tokens=64, horde={"operation_key": op})
    first = await post(client, body, str(shared.id))
    assert first.status_code == 202, first.text
    rid = first.json()["id"]
    row = await db.fetchrow(
        "SELECT user_id, shared_key_id, operation_key FROM waiting_prompts WHERE id = $1", uuid.UUID(rid)
    )
    assert (row["user_id"], row["shared_key_id"], str(row["operation_key"])) == (owner_id, shared.id, op)

    await db.execute(spoil, shared.id)
    owner_kudos = await db.fetchval("SELECT kudos FROM users WHERE id = $1", owner_id)
    key_row = await db.fetchrow("SELECT kudos, utilized FROM user_shared_keys WHERE id = $1", shared.id)

    # The retry is answered with the first request: 200 {id, kudos}, nothing queued or charged.
    r = await post(client, body, str(shared.id))
    assert r.status_code == 200, r.text
    assert r.json() == {"id": rid, "kudos": first.json()["kudos"]}
    assert await rows_of(db, owner_id) == 1
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", owner_id) == owner_kudos
    assert (
        await db.fetchrow("SELECT kudos, utilized FROM user_shared_keys WHERE id = $1", shared.id) == key_row
    )
    # Another body under the key is still that key's conflict.
    other = await post(client, chat_body(model, "other", horde={"operation_key": op}), str(shared.id))
    assert err(other)[:2] == (400, "OperationKeyConflict")

    # Anything new through the spent key is refused as before, with or without an operation key.
    for fresh in (
        chat_body(model, "new", horde={"operation_key": str(uuid.uuid4())}),
        chat_body(model, "new"),
    ):
        assert err(await post(client, fresh, str(shared.id))) == (403, rc, message)
    assert await rows_of(db, owner_id) == 1


async def test_operation_key_lookup_does_not_weaken_authentication(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    user_id, key = await new_user(db)
    op = str(uuid.uuid4())
    body = chat_body(model, "mine", horde={"operation_key": op})
    assert (await post(client, body, key)).status_code == 202
    # An unknown or missing key finds no claim: 401.
    for bad in ("not-a-key", str(uuid.uuid4()), None):
        assert err(await post(client, body, bad))[:2] == (401, "InvalidAPIKey")
    # A deleted user's retry is refused, not answered.
    await db.execute("UPDATE users SET deleted = true WHERE id = $1", user_id)
    assert err(await post(client, body, key)) == (403, "DeletedUser", "This user has been deleted.")


# --- A decompression bomb is SourceImageResolutionExceeded (Images) ------------------------------------------


def bomb_png(side: int = 15000) -> bytes:
    """A 1-bit PNG of side x side pixels, all zeros: ~27 KB that Pillow's guard refuses when opened."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\0" * ((side // 8 + 1) * side), 9)
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


async def test_decompression_bomb_is_resolution_exceeded(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=["prompt_overflow_refused", "vision"], image_transports=["url"])
    user_id, key = await new_user(db, kudos=100)
    url = "data:image/png;base64," + base64.b64encode(bomb_png()).decode()
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": 64}
    r = await post(client, body, key)
    assert err(r) == (
        400,
        "SourceImageResolutionExceeded",
        "'messages[0].content[1].image_url.url': the image is 225000000 pixels; at most 9437184 pixels "
        "(3072x3072) are allowed.",
    )
    assert await rows_of(db, user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 100.0


# --- horde.text.free_allowance.decisions counts shared-key refusals (Free output allowance) ------------------


def decisions(outcome: str, requested: str, allowance: str, requester: str = "shared_key") -> float:
    return allowance_decisions(outcome, requested, allowance, requester=requester, chat=True)


async def test_shared_key_kudos_refusals_are_counted(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, max_length=4096, speed=100)
    owner_id, _ = await new_user(db, kudos=1000)
    shared = await _shared_key(db, owner_id, kudos=5)

    # An eligible worker and an idle queue: the allowance is the ceiling (4096); the key cannot cover 1024.
    before = decisions("refused", "513-1024", "2049-4096")
    r = await post(client, chat_body(model, max_tokens=1024), str(shared.id))
    code, rc, message = err(r)
    assert (code, rc) == (403, "SharedKeyInsufficientKudos")
    assert message.startswith("This shared key has 5 kudos left; the request needs ")
    assert decisions("refused", "513-1024", "2049-4096") == before + 1

    # No eligible worker (the seed feature is missing): NoEligibleWorker in its place, at the floor (512).
    before = decisions("refused", "513-1024", "<=512")
    r = await post(client, chat_body(model, max_tokens=1024, seed=3), str(shared.id))
    assert err(r) == (
        403,
        "NoEligibleWorker",
        "No online worker can serve this request: no online worker serving the model declares seed.",
    )
    assert r.json()["impossible_reason"] == {
        "kind": "declaration_gap",
        "missing_declarations": ["seed"],
        "exceeded_limits": [],
    }
    assert decisions("refused", "513-1024", "<=512") == before + 1

    # Nothing was created or charged; an admitted request is counted once, as free.
    assert await rows_of(db, owner_id) == 0
    assert await db.fetchval("SELECT kudos FROM user_shared_keys WHERE id = $1", shared.id) == 5.0
    before_free = decisions("free", "<=512", "2049-4096")
    assert (await post(client, chat_body(model, max_tokens=16), str(shared.id))).status_code == 202
    assert decisions("free", "<=512", "2049-4096") == before_free + 1
    # A dry run is not recorded.
    refused = decisions("refused", "513-1024", "2049-4096")
    r = await post(client, chat_body(model, max_tokens=1024, horde={"dry_run": True}), str(shared.id))
    assert r.status_code == 200
    assert decisions("refused", "513-1024", "2049-4096") == refused
