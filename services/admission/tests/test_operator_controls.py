"""Operator controls on both generate routes (docs/native-api.md#operator-controls): maintenance mode (the
refusal, its place in the order, and the abort of queued requests), IP timeouts and the moderation
replacement filter with CorruptPrompt.

Maintenance mode is horde-wide, so its tests run on a database of their own (``make_database``) with the
modes cache off (``modes_cache_seconds=0``): switching it never touches the requests of other tests, and no
assertion depends on the cache's timing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model
from horde_contract import (
    build_operation_fingerprint,
    estimate_chat_prompt_tokens,
    flatten_messages,
    parse_chat_request,
)
from horde_contract.moderation import CORRUPT_PROMPT_MESSAGE
from horde_contract.operator_controls import MAINTENANCE_MODE_MESSAGE, MAINTENANCE_RETRY_AFTER_SECONDS
from horde_core.redis_keys import ip_timeout_key, redis_client, signal_client
from horde_store.db import connect, create_pool
from horde_store.modes import clear_ip_timeout, read_modes, set_ip_timeout, set_maintenance
from horde_testing.seed import Factory

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEXT = "/api/v2/generate/text/async"
CHAT = "/api/v2/generate/chat/async"
PASSKEY = "operator-controls-passkey"
#: The model of the text requests queued on the shared database: a request without models competes with every
#: model, so leaving one queued would move other tests' queue positions.
TEXT_MODEL = f"operator-controls-{uuid.uuid4().hex[:8]}"


# --- maintenance mode ------------------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def own_db(make_database: Callable[[], str]) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A fresh migrated database of this test (its DSN and a connection)."""
    dsn = make_database()
    conn = await connect(dsn)
    try:
        yield dsn, conn
    finally:
        await conn.close()


async def _rows_of(conn: asyncpg.Connection, user_id: int) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id))


def _assert_maintenance(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    assert r.json() == {"message": MAINTENANCE_MODE_MESSAGE, "rc": "MaintenanceMode"}
    assert r.headers["Retry-After"] == str(MAINTENANCE_RETRY_AFTER_SECONDS)
    assert r.headers["x-should-retry"] == "false"


async def test_maintenance_refuses_both_routes_before_authentication(
    make_client: Any, own_db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = own_db
    client = await make_client(database_url=dsn, modes_cache_seconds=0)
    user_id, key = await new_user(conn)
    await set_maintenance(conn, True)
    try:
        assert (await read_modes(conn)).maintenance
        text = {"prompt": "hello there", "params": {"max_length": 32}}
        for path, body in ((TEXT, text), (CHAT, chat_body(unique_model()))):
            _assert_maintenance(await client.post(path, json=body, headers={"apikey": key}))
            # Before authentication (spec: maintenance mode, then authentication): an unknown key gets the
            # same refusal, not 401.
            _assert_maintenance(await client.post(path, json=body, headers={"apikey": "not-a-key"}))
        # Dry runs create nothing, and are refused all the same.
        _assert_maintenance(await client.post(TEXT, json={**text, "dry_run": True}, headers={"apikey": key}))
        # The body is still validated first (a malformed body is the caller's error whatever the mode).
        r = await client.post(TEXT, json={"prompt": 5}, headers={"apikey": key})
        assert r.status_code == 400 and r.json()["rc"] == "BadRequest"
        assert await _rows_of(conn, user_id) == 0
    finally:
        await set_maintenance(conn, False)

    assert not (await read_modes(conn)).maintenance
    r = await client.post(TEXT, json={"prompt": "hello there"}, headers={"apikey": key})
    assert r.status_code == 202, r.text
    assert await _rows_of(conn, user_id) == 1


async def test_a_repeated_operation_key_is_answered_in_maintenance(
    make_client: Any, own_db: tuple[str, asyncpg.Connection]
) -> None:
    """Spec step 3 comes before step 5: a repeated operation key creates nothing, so it is still answered."""
    dsn, conn = own_db
    client = await make_client(database_url=dsn, modes_cache_seconds=0)
    op_key = str(uuid.uuid4())
    body = chat_body(unique_model(), horde={"operation_key": op_key})
    fingerprint = build_operation_fingerprint(parse_chat_request(body, defer_length_limits=True))
    pool = await create_pool(dsn)
    try:
        requester = await Factory(pool).user()
        rid = await Factory(pool).request(
            requester, n=1, operation_key=uuid.UUID(op_key), operation_fingerprint=fingerprint, kudos=3
        )
    finally:
        await pool.close()
    await set_maintenance(conn, True)
    try:
        r = await client.post(CHAT, json=body, headers={"apikey": requester.api_key})
        assert r.status_code == 200, r.text
        assert r.json() == {"id": str(rid), "kudos": 3}
        # A new operation is refused.
        other = chat_body(unique_model(), horde={"operation_key": str(uuid.uuid4())})
        _assert_maintenance(await client.post(CHAT, json=other, headers={"apikey": requester.api_key}))
        assert await _rows_of(conn, requester.id) == 1
        row = await conn.fetchrow("SELECT n, cancelled FROM waiting_prompts WHERE id = $1", rid)
        assert row is not None and (row["n"], row["cancelled"]) == (0, True)  # aborted by the switch
    finally:
        await set_maintenance(conn, False)


async def test_maintenance_on_aborts_incomplete_requests_and_signals_them(
    own_db: tuple[str, asyncpg.Connection], redis_server: Any
) -> None:
    dsn, conn = own_db
    pool = await create_pool(dsn)
    signals = signal_client(redis_server.url)
    subscriber = aioredis.from_url(redis_server.url, decode_responses=True)
    pubsub = subscriber.pubsub()
    try:
        f = Factory(pool, model="m-maint")
        requester = await f.user(kudos=500)
        owner = await f.user()
        worker = await f.worker(owner)
        queued = await f.request(requester, n=1, hold=20)  # nothing popped yet
        flying = await f.request(requester, n=2, jobs=3, hold=30)  # one job in flight, two to go
        gen = await f.generation(flying, worker, owner)
        finished = await f.request(requester, n=1, jobs=2)  # one result stored, one job to go
        await f.generation(
            finished, worker, owner, generation="done", message=json.dumps({"role": "assistant"})
        )
        text = await f.request(requester, is_chat=False, n=1, hold=5)
        # A streamed request with a job in flight and another to hand out: cancelling it would settle its job as
        # cancelled, so it only stops handing out jobs.
        streamed = await f.request(requester, n=1, jobs=2, hold=9, stream_progress=True)
        streamed_gen = await f.generation(streamed, worker, owner)
        # Only a paused worker's fake job pending: it never took a job, so nothing is in flight and the hold goes.
        faked = await f.request(requester, n=1, hold=11)
        fake_gen = await f.generation(faked, worker, owner, fake=True)
        untouched = {
            "cancelled": await f.request(requester, n=0, cancelled=True, hold=7),
            "faulted": await f.request(requester, n=1, faulted=True),
            "served": await f.request(requester, n=0),  # every job handed out
        }
        for rid in (queued, flying, finished, text, faked):
            await pubsub.subscribe(f"horde:chat:{rid}")
            await pubsub.get_message(timeout=1)  # the subscribe confirmation
        before = {
            r["id"]: (r["n"], r["cancelled"])
            for r in await conn.fetch(
                "SELECT id, n, cancelled FROM waiting_prompts WHERE id = ANY($1)", list(untouched.values())
            )
        }

        change = await set_maintenance(conn, True, signals)

        assert change.maintenance and (await read_modes(conn)).maintenance
        assert {a.id for a in change.aborted} == {queued, flying, finished, text, streamed, faked}
        # The cancelled chat requests; a text request has no completion signal, the streamed one goes on.
        assert change.signalled == 4
        rows = {
            r["id"]: r
            for r in await conn.fetch(
                "SELECT id, n, cancelled, faulted FROM waiting_prompts WHERE id = ANY($1)",
                [queued, flying, finished, text, faked],
            )
        }
        for rid in (queued, flying, finished, text, faked):
            assert (rows[rid]["n"], rows[rid]["cancelled"], rows[rid]["faulted"]) == (0, True, False)
        holds = {r["wp_id"]: r["amount"] for r in await conn.fetch("SELECT wp_id, amount FROM kudos_holds")}
        # Released where nothing is in flight; kept (for the settlement) where a job still runs.
        assert queued not in holds and text not in holds and faked not in holds
        assert holds[flying] == 30
        fake_row = await conn.fetchrow(
            "SELECT faulted, generation FROM processing_gens WHERE id = $1", fake_gen
        )
        assert fake_row is not None and (fake_row["faulted"], fake_row["generation"]) == (False, None)
        streamed_row = await conn.fetchrow("SELECT n, cancelled FROM waiting_prompts WHERE id = $1", streamed)
        assert streamed_row is not None and (streamed_row["n"], streamed_row["cancelled"]) == (0, False)
        assert holds[streamed] == 9
        gen_row = await conn.fetchrow(
            "SELECT faulted, generation FROM processing_gens WHERE id = $1", streamed_gen
        )
        assert gen_row is not None and (gen_row["faulted"], gen_row["generation"]) == (False, None)
        # The job in flight is left to settle: not faulted, no result yet.
        gen_row = await conn.fetchrow("SELECT faulted, generation FROM processing_gens WHERE id = $1", gen)
        assert gen_row is not None and (gen_row["faulted"], gen_row["generation"]) == (False, None)
        after = {
            r["id"]: (r["n"], r["cancelled"])
            for r in await conn.fetch(
                "SELECT id, n, cancelled FROM waiting_prompts WHERE id = ANY($1)", list(untouched.values())
            )
        }
        assert after == before
        assert holds[untouched["cancelled"]] == 7

        events: dict[str, Any] = {}
        while len(events) < 4:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
            assert message is not None, f"signals missing: got {events}"
            event = json.loads(message["data"])
            events[event["id"]] = event
        assert events == {
            str(queued): {"id": str(queued), "event": "cancelled", "generations": 0},
            str(flying): {"id": str(flying), "event": "cancelled", "generations": 0},
            str(finished): {"id": str(finished), "event": "cancelled", "generations": 1},
            str(faked): {"id": str(faked), "event": "cancelled", "generations": 0},
        }

        # Already on: a second "on" aborts what was admitted since (nothing here), and switching off aborts
        # nothing.
        assert (await set_maintenance(conn, True, signals)).aborted == []
        off = await set_maintenance(conn, False, signals)
        assert off.to_json() == {"maintenance": False, "aborted": 0, "aborted_ids": [], "signalled": 0}
        assert not (await read_modes(conn)).maintenance
    finally:
        await set_maintenance(conn, False)
        await pubsub.aclose()
        await subscriber.aclose()
        await signals.aclose()
        await pool.close()


# --- IP timeouts -----------------------------------------------------------------------------------------------


def _from(address: str, key: str) -> dict[str, str]:
    """Headers of a request the proxy passkey says comes from ``address``."""
    return {"apikey": key, "Proxy-Authorization": PASSKEY, "Proxied-For": address}


async def test_ip_timeout_refuses_that_address_after_the_concurrency_limit(
    make_client: Any, db: asyncpg.Connection, admission_env: dict[str, str]
) -> None:
    client = await make_client(proxy_passkeys=[PASSKEY])
    cache = redis_client(admission_env["HORDE_REDIS_URL"])
    user_id, key = await new_user(db, concurrency=1)
    model = unique_model()
    await add_chat_worker(db, model)
    address = "203.0.113.77"
    try:
        await set_ip_timeout(cache, address, 600)
        assert 0 < await cache.ttl(ip_timeout_key(address)) <= 600
        text = {"prompt": "hello", "models": [TEXT_MODEL]}
        for path, body in ((TEXT, text), (CHAT, chat_body(model))):
            r = await client.post(path, json=body, headers=_from(address, key))
            assert r.status_code == 403, r.text
            assert r.json()["rc"] == "TimeoutIP"
            seconds = int(r.headers["Retry-After"])
            assert 0 < seconds <= 600 and r.headers["x-should-retry"] == "false"
            assert r.json()["message"] == (
                f"Requests from your address are suspended by the Horde's operators for another {seconds} seconds."
            )
            # Authentication comes first: an unknown key is 401 whatever the address.
            r = await client.post(path, json=body, headers=_from(address, "not-a-key"))
            assert r.status_code == 401 and r.json()["rc"] == "InvalidAPIKey"
        assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0

        # Another address is served; once the user is at its concurrency limit, the limit answers first.
        r = await client.post(TEXT, json=text, headers=_from("203.0.113.78", key))
        assert r.status_code == 202, r.text
        r = await client.post(TEXT, json=text, headers=_from(address, key))
        assert r.status_code == 429 and r.json()["rc"] == "TooManyPrompts"
        await db.execute("UPDATE waiting_prompts SET n = 0 WHERE user_id = $1", user_id)

        assert await clear_ip_timeout(cache, address)
        r = await client.post(TEXT, json=text, headers=_from(address, key))
        assert r.status_code == 202, r.text
    finally:
        await clear_ip_timeout(cache, address)
        await cache.aclose()


async def test_ipv6_timeouts_match_however_the_address_is_written(
    make_client: Any, db: asyncpg.Connection, admission_env: dict[str, str]
) -> None:
    client = await make_client(proxy_passkeys=[PASSKEY])
    cache = redis_client(admission_env["HORDE_REDIS_URL"])
    _, key = await new_user(db)
    try:
        assert await set_ip_timeout(cache, "2001:DB8:0:0::1", 60) == "2001:db8::/64"
        body = {"prompt": "hi", "models": [TEXT_MODEL]}
        # Any spelling, and any address of the /64 (a client picks one at will).
        for seen in ("2001:db8:0000::0001", "[2001:db8::1]:443", "2001:db8::beef", "2001:db8::1%eth0"):
            r = await client.post(TEXT, json=body, headers=_from(seen, key))
            assert r.status_code == 403 and r.json()["rc"] == "TimeoutIP", seen
        # An IPv4 timeout matches the IPv4-mapped IPv6 spelling of the address.
        await set_ip_timeout(cache, "203.0.113.79", 60)
        for seen in ("::ffff:203.0.113.79", "::ffff:cb00:714f", "203.0.113.79:5555"):
            r = await client.post(TEXT, json=body, headers=_from(seen, key))
            assert r.status_code == 403 and r.json()["rc"] == "TimeoutIP", seen
    finally:
        await clear_ip_timeout(cache, "2001:db8::1")
        await clear_ip_timeout(cache, "203.0.113.79")
        await cache.aclose()


async def test_an_unreachable_redis_lets_the_request_through(
    make_client: Any, db: asyncpg.Connection
) -> None:
    client = await make_client(rate_limit_timeout_seconds=0.2)
    app_state = client.horde_app.state.admission  # type: ignore[attr-defined]
    real = app_state.redis
    app_state.redis = redis_client("redis://127.0.0.1:9/0")  # nothing listens on port 9
    _, key = await new_user(db)
    try:
        r = await client.post(TEXT, json={"prompt": "hi", "models": [TEXT_MODEL]}, headers={"apikey": key})
        assert r.status_code == 202, r.text
    finally:
        await app_state.redis.aclose()
        app_state.redis = real


# --- moderation ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nsfw_model() -> str:
    return f"horde-test/nsfw-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def reference_file(tmp_path_factory: pytest.TempPathFactory, nsfw_model: str) -> Path:
    path = tmp_path_factory.mktemp("reference") / "db.json"
    path.write_text(
        json.dumps(
            {
                nsfw_model: {"name": nsfw_model, "parameters": 7e9, "nsfw": True},
                "horde-test/plain-7b": {"name": "horde-test/plain-7b", "parameters": 7e9, "nsfw": False},
            }
        )
    )
    return path


async def _stored(db: asyncpg.Connection, rid: str) -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT prompt, submitted_prompt, messages FROM waiting_prompts WHERE id = $1", uuid.UUID(rid)
    )
    assert row is not None
    return row


async def test_a_flagged_users_text_prompt_goes_through_the_filter(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    user_id, key = await new_user(db, flagged=True)
    r = await client.post(
        TEXT,
        json={"prompt": "Write about a 12 year old child.", "models": [TEXT_MODEL]},
        headers={"apikey": key},
    )
    assert r.status_code == 202, r.text
    row = await _stored(db, r.json()["id"])
    assert row["prompt"] == "Write about a adult adult."
    assert row["submitted_prompt"] == "Write about a 12 year old child."  # as sent, for the operators

    r = await client.post(
        TEXT, json={"prompt": " loli  shota ", "models": [TEXT_MODEL]}, headers={"apikey": key}
    )
    assert r.status_code == 400, r.text
    assert r.json() == {
        "message": CORRUPT_PROMPT_MESSAGE.format(whom="requests from this account"),
        "rc": "CorruptPrompt",
    }
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 1

    # An unflagged user's prompt is not filtered (no nsfw model either).
    _, plain = await new_user(db)
    r = await client.post(
        TEXT, json={"prompt": "a 12 year old child", "models": [TEXT_MODEL]}, headers={"apikey": plain}
    )
    assert r.status_code == 202
    assert (await _stored(db, r.json()["id"]))["prompt"] == "a 12 year old child"


async def test_an_nsfw_model_filters_anyones_prompt(
    make_client: Any, db: asyncpg.Connection, reference_file: Path, nsfw_model: str
) -> None:
    client = await make_client(text_model_reference=str(reference_file))
    _, key = await new_user(db)
    await add_chat_worker(db, nsfw_model)
    body = {"prompt": "the kid", "models": ["horde-test/plain-7b", nsfw_model]}
    r = await client.post(TEXT, json=body, headers={"apikey": key})
    assert r.status_code == 202, r.text
    assert (await _stored(db, r.json()["id"]))["prompt"] == "the adult"
    r = await client.post(TEXT, json={**body, "models": ["horde-test/plain-7b"]}, headers={"apikey": key})
    assert r.status_code == 202
    assert (await _stored(db, r.json()["id"]))["prompt"] == "the kid"

    r = await client.post(CHAT, json=chat_body(nsfw_model, "jailbait"), headers={"apikey": key})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "message": CORRUPT_PROMPT_MESSAGE.format(whom="prompts for the requested NSFW models"),
        "rc": "CorruptPrompt",
    }


async def test_chat_messages_are_filtered_and_flattened_again_before_sizing(
    make_client: Any, db: asyncpg.Connection
) -> None:
    client = await make_client(moderation_replacements=[["secret", ""], ["teen", "adult"]])
    user_id, key = await new_user(db, flagged=True)
    model = unique_model()
    await add_chat_worker(db, model, max_context_length=4096, max_length=512)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You talk to a teen."},
        {"role": "user", "content": [{"type": "text", "text": "secret"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "I am a teen secret"},
    ]
    filtered: list[dict[str, Any]] = [
        {"role": "system", "content": "You talk to a adult."},
        {"role": "user", "content": [{"type": "text", "text": ""}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "I am a adult "},
    ]
    body = {"model": model, "messages": messages, "max_tokens": 64}
    # A dry run sizes the filtered messages.
    r = await client.post(CHAT, json={**body, "horde": {"dry_run": True}}, headers={"apikey": key})
    assert r.status_code == 200, r.text
    assert r.json()["estimated_prompt_tokens"] == estimate_chat_prompt_tokens(filtered)
    assert estimate_chat_prompt_tokens(filtered) != estimate_chat_prompt_tokens(messages)

    r = await client.post(CHAT, json=body, headers={"apikey": key})
    assert r.status_code == 202, r.text
    row = await _stored(db, r.json()["id"])
    assert row["messages"] == filtered  # what the worker receives
    assert row["prompt"] == flatten_messages(filtered)
    assert row["submitted_prompt"] == flatten_messages(messages)

    # Every text emptied: refused, nothing stored.
    emptied = {"model": model, "messages": [{"role": "user", "content": "secret  secret"}]}
    r = await client.post(CHAT, json=emptied, headers={"apikey": key})
    assert r.status_code == 400 and r.json()["rc"] == "CorruptPrompt", r.text
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 1


async def test_a_rule_re2_does_not_take_stops_the_settings() -> None:
    from horde_admission.settings import AdmissionSettings
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="replacement rule 0"):
        AdmissionSettings(moderation_replacements=[["(?<=a)b", "x"]])
    assert AdmissionSettings(moderation_replacements=[["a", "b"]]).moderation_replacements == [("a", "b")]


async def test_a_request_naming_no_model_is_filtered_when_any_model_is_nsfw(
    make_client: Any, db: asyncpg.Connection, reference_file: Path, tmp_path: Path
) -> None:
    # No models: any worker may serve it, an nsfw model's too. Dry runs (nothing is queued) show it.
    client = await make_client(text_model_reference=str(reference_file))
    _, key = await new_user(db)
    body: dict[str, Any] = {"prompt": "loli", "models": [], "dry_run": True}
    for apikey in (key, "0000000000"):
        r = await client.post(TEXT, json=body, headers={"apikey": apikey})
        assert r.status_code == 400, r.text
        assert r.json() == {
            "message": CORRUPT_PROMPT_MESSAGE.format(whom="prompts for the requested NSFW models"),
            "rc": "CorruptPrompt",
        }
    r = await client.post(TEXT, json={**body, "models": ["horde-test/plain-7b"]}, headers={"apikey": key})
    assert r.status_code == 200, r.text

    # A reference that marks no model nsfw leaves such a request alone.
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"horde-test/plain-7b": {"name": "horde-test/plain-7b", "parameters": 7e9}}))
    other = await make_client(text_model_reference=str(plain))
    r = await other.post(TEXT, json=body, headers={"apikey": key})
    assert r.status_code == 200, r.text


async def test_a_large_filtered_prompt_does_not_hold_up_the_event_loop(
    make_client: Any, reference_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from horde_contract.moderation import ReplacementFilter

    events: list[str] = []
    original = ReplacementFilter.apply

    def recording_apply(self: ReplacementFilter, text: str, **kwargs: Any) -> str:
        events.append("filter started")
        try:
            return original(self, text, **kwargs)
        finally:
            events.append("filter finished")

    monkeypatch.setattr(ReplacementFilter, "apply", recording_apply)
    client = await make_client(text_model_reference=str(reference_file))
    # An anonymous dry run naming no model: filtered (an nsfw model could serve it), 1 MiB of matches.
    body = {"prompt": "kid " * (1 << 18), "models": [], "dry_run": True}
    big = asyncio.create_task(client.post(TEXT, json=body, headers={"apikey": "0000000000"}))
    while "filter started" not in events:
        assert not big.done(), big.result().text
        await asyncio.sleep(0.001)
    r = await client.get("/api/v2/status/heartbeat")
    assert r.status_code == 200
    events.append("heartbeat answered")
    # The heartbeat was answered while the filter ran in its thread, before the big request was.
    assert not big.done()
    response = await big
    assert response.status_code == 200, response.text
    assert events == ["filter started", "heartbeat answered", "filter finished"]
