"""The upstream read routes existing clients and workers call (docs/native-api.md#find-user, #user-details,
#heartbeat, #horde-performance, #horde-modes, #news, #text-model-stats, #text-totals): status, rc, message and what each
answer holds, against the real stores. Each answer is also checked against its OpenAPI schema, and carries
upstream's field names (horde_sdk is not installed in this workspace, so its models cannot parse them here)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import jsonschema
import pytest
from admission_helpers import new_user
from horde_admission import horde_status
from horde_admission.app import create_app
from horde_admission.horde_status import ReadMemo
from horde_admission.settings import AdmissionSettings
from horde_contract.refusals import INVALID_API_KEY_MESSAGE

HOUR, DAY = 3600.0, 86400.0
INVALID_KEY = {"message": INVALID_API_KEY_MESSAGE, "rc": "InvalidAPIKey"}

# Upstream's field names (horde/apis/models/v2.py): UserDetails' public fields, HordePerformance.
USER_PUBLIC_FIELDS = {
    "username", "id", "kudos", "kudos_details", "usage", "contributions", "records", "concurrency",
    "worker_invited", "moderator", "trusted", "flagged", "pseudonymous", "worker_count", "account_age",
    "service", "deleted", "education", "customizer", "styles",
}  # fmt: skip
USER_OWNER_FIELDS = {"worker_ids", "sharedkey_ids", "vpn", "special", "active_generations"}
USER_MODERATOR_FIELDS = {"evaluating_kudos", "suspicious"}
PERFORMANCE_FIELDS = {
    "queued_requests", "queued_text_requests", "worker_count", "text_worker_count", "thread_count",
    "text_thread_count", "queued_megapixelsteps", "past_minute_megapixelsteps", "queued_forms",
    "interrogator_count", "interrogator_thread_count", "queued_tokens", "past_minute_tokens",
}  # fmt: skip


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    doc: dict[str, Any] = create_app(AdmissionSettings()).openapi()
    return doc


def conforms(document: dict[str, Any], schema: str, value: Any) -> None:
    jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema}", "components": document["components"]}
    ).validate(value)


async def add_worker(
    db: asyncpg.Connection, owner: int, *, online: bool = True, threads: int = 1, **columns: Any
) -> uuid.UUID:
    values = {"user_id": owner, "name": f"w_{uuid.uuid4().hex[:12]}", "threads": threads, **columns}
    names = list(values)
    placeholders = ", ".join(f"${i}" for i in range(1, len(names) + 1))
    when = "now()" if online else "now() - interval '1 hour'"
    worker_id: uuid.UUID = await db.fetchval(
        f"INSERT INTO workers ({', '.join(names)}, last_check_in) VALUES ({placeholders}, {when}) RETURNING id",
        *values.values(),
    )
    return worker_id


# --- GET /v2/find_user ----------------------------------------------------------------------------------


async def test_find_user_answers_the_keys_user_with_its_own_fields(
    client: httpx.AsyncClient, db: asyncpg.Connection, document: dict[str, Any]
) -> None:
    uid, key = await new_user(db, kudos=123.456)
    first = await add_worker(db, uid, kudos=10.5, contributions=300, fulfilments=4)
    second = await add_worker(db, uid, online=False, kudos=2.0, contributions=50, fulfilments=1)
    shared = await db.fetchval(
        "INSERT INTO user_shared_keys (user_id, name) VALUES ($1, 'k') RETURNING id", uid
    )
    wp = await db.fetchval(
        "INSERT INTO waiting_prompts (user_id, active) VALUES ($1, true) RETURNING id", uid
    )
    # Ended requests are not active generations: a finished one (n = 0, nothing in flight), a cancelled and
    # a faulted one.
    for ended in ("n = 0", "cancelled = true", "faulted = true"):
        await db.execute("INSERT INTO waiting_prompts (user_id, active) VALUES ($1, true)", uid)
        await db.execute(
            f"UPDATE waiting_prompts SET {ended} WHERE user_id = $1 AND id <> $2 AND n > 0 AND NOT cancelled "
            "AND NOT faulted",
            uid,
            wp,
        )
    username = await db.fetchval("SELECT username FROM users WHERE id = $1", uid)

    r = await client.get("/api/v2/find_user", headers={"apikey": key})

    assert r.status_code == 200
    body = r.json()
    conforms(document, "UserDetails", body)
    assert set(body) == USER_PUBLIC_FIELDS | USER_OWNER_FIELDS
    assert body["username"] == f"{username}#{uid}"
    assert body["id"] == uid and body["kudos"] == 123.46
    assert body["worker_count"] == 2
    assert body["worker_ids"] == [str(first), str(second)]
    assert body["sharedkey_ids"] == [str(shared)]
    assert body["active_generations"] == {"text": [str(wp)]}
    assert body["kudos_details"]["accumulated"] == 12.5
    assert set(body["kudos_details"]) == {
        "accumulated", "gifted", "donated", "admin", "received", "recurring", "awarded", "styled",
    }  # fmt: skip
    assert body["records"]["contribution"] == {"megapixelsteps": 0.0, "tokens": 350}
    assert body["records"]["fulfillment"] == {"image": 0, "text": 5, "interrogation": 0}
    assert body["records"]["request"] == {"image": 0, "text": 0, "interrogation": 0}
    assert body["usage"] == {} and body["contributions"] == {}
    assert body["pseudonymous"] is True  # created without an OAuth id
    assert body["trusted"] is False and body["moderator"] is False and body["flagged"] is False
    assert body["concurrency"] == 30 and isinstance(body["account_age"], int) and body["account_age"] >= 0
    text = r.text
    assert key not in text and "api_key" not in text and "hash" not in text


async def test_find_user_with_a_shared_key_finds_the_owner_publicly(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    uid, _ = await new_user(db)
    await add_worker(db, uid)
    named = await db.fetchval(
        "INSERT INTO user_shared_keys (user_id, name) VALUES ($1, 'bot') RETURNING id", uid
    )
    unnamed = await db.fetchval("INSERT INTO user_shared_keys (user_id) VALUES ($1) RETURNING id", uid)
    username = await db.fetchval("SELECT username FROM users WHERE id = $1", uid)

    r = await client.get("/api/v2/find_user", headers={"apikey": str(named)})
    assert r.status_code == 200
    assert r.json()["username"] == f"{username}#{uid} (Shared Key: bot)"
    assert set(r.json()) == USER_PUBLIC_FIELDS  # no worker ids, shared keys or generations
    r = await client.get("/api/v2/find_user", headers={"apikey": str(unnamed)})
    assert r.json()["username"] == f"{username}#{uid} (Shared Key)"


async def test_find_user_with_the_anonymous_key_is_the_anonymous_user(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/v2/find_user", headers={"apikey": "0000000000"})
    assert r.status_code == 200
    body = r.json()
    assert (body["username"], body["id"], body["pseudonymous"]) == ("Anonymous#0", 0, False)
    assert body["active_generations"] == {}  # the anonymous user's generations are never listed


@pytest.mark.parametrize(
    "headers",
    [{}, {"apikey": ""}, {"apikey": "not-a-key"}, {"apikey": str(uuid.uuid4())}, {"apikey": "k" * 8000}],
)
async def test_find_user_refuses_a_missing_or_unknown_key(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    r = await client.get("/api/v2/find_user", headers=headers)
    assert (r.status_code, r.json()) == (401, INVALID_KEY)


# --- GET /v2/users/{id} ---------------------------------------------------------------------------------


async def test_user_details_by_privilege(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    uid, key = await new_user(db)
    other, other_key = await new_user(db)
    moderator, moderator_key = await new_user(db)
    await db.execute("UPDATE users SET moderator = true WHERE id = $1", moderator)
    await db.execute("UPDATE users SET evaluating_kudos = 7.25 WHERE id = $1", uid)
    await db.execute("INSERT INTO user_suspicions (user_id, suspicion) VALUES ($1, 'x'), ($1, 'y')", uid)
    worker = await add_worker(db, uid)
    path = f"/api/v2/users/{uid}"

    public = await client.get(path)
    assert public.status_code == 200
    assert set(public.json()) == USER_PUBLIC_FIELDS
    assert public.json()["worker_count"] == 1
    # another user's key sees the public fields only
    assert set((await client.get(path, headers={"apikey": other_key})).json()) == USER_PUBLIC_FIELDS
    own = (await client.get(path, headers={"apikey": key})).json()
    assert set(own) == USER_PUBLIC_FIELDS | USER_OWNER_FIELDS
    assert own["worker_ids"] == [str(worker)]
    moderated = (await client.get(path, headers={"apikey": moderator_key})).json()
    assert set(moderated) == USER_PUBLIC_FIELDS | USER_OWNER_FIELDS | USER_MODERATOR_FIELDS
    assert (moderated["evaluating_kudos"], moderated["suspicious"]) == (7.25, 2)
    assert (await client.get(f"/v2/users/{other}")).json()["id"] == other  # also without the /api prefix


@pytest.mark.parametrize(
    "user_id",
    ["999999999999", "db0#1", "abc", "-1", "1.0", "٣", "9" * 19, "1" * 40, "x" * 300],
)
async def test_an_unknown_or_malformed_user_id_is_user_not_found(
    client: httpx.AsyncClient, user_id: str
) -> None:
    r = await client.get(f"/api/v2/users/{quote(user_id, safe='')}")
    assert r.status_code == 404
    body = r.json()
    assert body["rc"] == "UserNotFound"
    assert body["message"].startswith(f"User with ID '{user_id[:64]}' not found.")


async def test_user_details_refuse_an_unknown_or_shared_key(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    uid, _ = await new_user(db)
    shared = await db.fetchval("INSERT INTO user_shared_keys (user_id) VALUES ($1) RETURNING id", uid)
    for key in ("wrong-key", str(shared)):
        r = await client.get(f"/api/v2/users/{uid}", headers={"apikey": key})
        assert (r.status_code, r.json()) == (401, INVALID_KEY)


# --- status routes --------------------------------------------------------------------------------------


async def test_heartbeat_and_news(client: httpx.AsyncClient, document: dict[str, Any]) -> None:
    r = await client.get("/api/v2/status/heartbeat")
    version = client.horde_app.version  # type: ignore[attr-defined]
    assert (r.status_code, r.json()) == (200, {"message": "OK", "version": version})
    r = await client.get("/api/v2/status/news")
    assert (r.status_code, r.json()) == (200, [])
    conforms(document, "NewsList", r.json())


def forget_kept_answers(client: httpx.AsyncClient) -> None:
    """Drop the process's kept performance and stats answers, so the next read sees the tables now."""
    read_memo_of(client).clear()


def read_memo_of(client: httpx.AsyncClient) -> ReadMemo:
    app = client.horde_app  # type: ignore[attr-defined]
    memo: ReadMemo | None = getattr(app.state, "horde_status_memo", None)
    if memo is None:
        memo = ReadMemo()
        app.state.horde_status_memo = memo
    return memo


async def performance(client: httpx.AsyncClient) -> dict[str, Any]:
    forget_kept_answers(client)
    r = await client.get("/api/v2/status/performance")
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


async def test_performance_counts_text_jobs_workers_and_the_past_minutes_tokens(
    client: httpx.AsyncClient, db: asyncpg.Connection, document: dict[str, Any]
) -> None:
    before = await performance(client)
    assert set(before) == PERFORMANCE_FIELDS
    conforms(document, "HordePerformance", before)
    for name in ("queued_requests", "worker_count", "thread_count", "interrogator_count", "queued_forms"):
        assert before[name] == 0
    uid, _ = await new_user(db)
    worker = await add_worker(db, uid, threads=3)
    await add_worker(db, uid, threads=5, online=False)  # stale: not counted
    waiting = await db.fetchval(
        "INSERT INTO waiting_prompts (user_id, active, n, jobs, max_length) VALUES ($1, true, 2, 3, 100) RETURNING id",
        uid,
    )
    # one job of it in progress, one completed this minute (a text reply: counted at max_length)
    await db.execute(
        "INSERT INTO processing_gens (wp_id, worker_id, user_id, model) VALUES ($1, $2, $3, 'm')",
        waiting,
        worker,
        uid,
    )
    await db.execute(
        """INSERT INTO processing_gens (wp_id, worker_id, user_id, model, generation, completed_at)
           VALUES ($1, $2, $3, 'm', 'done', now())""",
        waiting,
        worker,
        uid,
    )
    # a finished chat request: its reply counts its completion tokens, and it queues nothing
    chat = await db.fetchval(
        "INSERT INTO waiting_prompts (user_id, active, n, max_length, is_chat) VALUES ($1, true, 0, 500, true) RETURNING id",
        uid,
    )
    await db.execute(
        """INSERT INTO processing_gens (wp_id, worker_id, user_id, model, generation, completed_at, completion_tokens)
           VALUES ($1, $2, $3, 'm', 'hi', now(), 7)""",
        chat,
        worker,
        uid,
    )
    # not counted: an inactive request, a faulted one, a fake job, a reply older than a minute
    await db.execute(
        "INSERT INTO waiting_prompts (user_id, active, n, max_length) VALUES ($1, false, 4, 10)", uid
    )
    await db.execute(
        "INSERT INTO waiting_prompts (user_id, active, faulted, n, max_length) VALUES ($1, true, true, 4, 10)",
        uid,
    )
    await db.execute(
        "INSERT INTO processing_gens (wp_id, worker_id, user_id, model, fake) VALUES ($1, $2, $3, 'm', true)",
        waiting,
        worker,
        uid,
    )
    await db.execute(
        """INSERT INTO processing_gens (wp_id, worker_id, user_id, model, generation, completed_at)
           VALUES ($1, $2, $3, 'm', 'old', now() - interval '5 minutes')""",
        waiting,
        worker,
        uid,
    )
    try:
        after = await performance(client)
        assert after["queued_text_requests"] - before["queued_text_requests"] == 3  # n=2 plus 1 in progress
        assert after["queued_tokens"] - before["queued_tokens"] == 300.0
        assert after["text_worker_count"] - before["text_worker_count"] == 1
        assert after["text_thread_count"] - before["text_thread_count"] == 3
        assert after["past_minute_tokens"] - before["past_minute_tokens"] == 107.0
        assert after["queued_requests"] == 0 and after["queued_megapixelsteps"] == 0
    finally:
        await db.execute("DELETE FROM waiting_prompts WHERE user_id = $1", uid)
        await db.execute("DELETE FROM workers WHERE user_id = $1", uid)


async def test_modes_follow_the_stored_row_and_show_raid_to_moderators(
    client: httpx.AsyncClient, db: asyncpg.Connection, document: dict[str, Any]
) -> None:
    moderator, moderator_key = await new_user(db)
    await db.execute("UPDATE users SET moderator = true WHERE id = $1", moderator)
    _, user_key = await new_user(db)
    r = await client.get("/api/v2/status/modes")
    assert (r.status_code, r.json()) == (200, {"maintenance_mode": False, "invite_only_mode": False})
    await db.execute("UPDATE horde_modes SET invite_only = true, raid = true WHERE id = 1")
    try:
        r = await client.get("/api/v2/status/modes")
        assert r.json() == {"maintenance_mode": False, "invite_only_mode": True}
        r = await client.get("/api/v2/status/modes", headers={"apikey": moderator_key})
        assert r.json() == {"maintenance_mode": False, "invite_only_mode": True, "raid_mode": True}
        conforms(document, "HordeModes", r.json())
    finally:
        await db.execute("UPDATE horde_modes SET invite_only = false, raid = false WHERE id = 1")
    r = await client.get("/api/v2/status/modes", headers={"apikey": user_key})
    assert (r.status_code, r.json()) == (
        403,
        {"message": "Only a moderator may read the raid mode.", "rc": "NotModerator"},
    )
    r = await client.get("/api/v2/status/modes", headers={"apikey": "wrong"})
    assert (r.status_code, r.json()) == (401, INVALID_KEY)


async def test_text_model_stats_count_completed_generations_per_period(
    client: httpx.AsyncClient, db: asyncpg.Connection, document: dict[str, Any]
) -> None:
    model, idle = f"stats-{uuid.uuid4().hex[:8]}", f"stats-{uuid.uuid4().hex[:8]}"
    await db.executemany(
        "INSERT INTO model_performances (model, performance, created) VALUES ($1, 10, now() - make_interval(secs => $2))",
        [(model, 60.0), (model, 2 * HOUR), (model, 2 * DAY), (model, 40 * DAY), (idle, 60 * DAY)],
    )
    try:
        forget_kept_answers(client)
        r = await client.get("/api/v2/stats/text/models")
        assert r.status_code == 200
        body = r.json()
        conforms(document, "TextModelStats", body)
        assert set(body) == {"day", "month", "total"}
        assert (body["day"][model], body["month"][model], body["total"][model]) == (2, 3, 4)
        assert idle not in body["day"] and idle not in body["month"] and body["total"][idle] == 1
    finally:
        await db.execute("DELETE FROM model_performances WHERE model = ANY($1::text[])", [model, idle])


TOTALS_PERIODS = ("minute", "hour", "day", "month", "total")


async def text_totals(client: httpx.AsyncClient) -> dict[str, dict[str, int]]:
    forget_kept_answers(client)
    r = await client.get("/api/v2/stats/text/totals")
    assert r.status_code == 200
    body: dict[str, dict[str, int]] = r.json()
    return body


async def test_text_totals_count_requests_and_tokens_per_period(
    client: httpx.AsyncClient, db: asyncpg.Connection, document: dict[str, Any]
) -> None:
    """Upstream's StatsTxtTotals: per window, the speed samples (requests) and the stored completed replies'
    tokens; total, the workers' lifetime counters, never less than the month's."""
    before = await text_totals(client)
    conforms(document, "TextTotals", before)
    assert set(before) == set(TOTALS_PERIODS)
    assert all(
        set(v) == {"requests", "tokens"} and all(type(n) is int for n in v.values()) for v in before.values()
    )
    model = f"totals-{uuid.uuid4().hex[:8]}"
    # speed samples 10 s, 30 min, 2 h, 2 days and 40 days old
    await db.executemany(
        "INSERT INTO model_performances (model, performance, created) VALUES ($1, 10, now() - make_interval(secs => $2))",
        [(model, 10.0), (model, 1800.0), (model, 2 * HOUR), (model, 2 * DAY), (model, 40 * DAY)],
    )
    uid, _ = await new_user(db)
    worker = await add_worker(db, uid, fulfilments=1000, contributions=50000)
    text = await db.fetchval(
        "INSERT INTO waiting_prompts (user_id, active, n, max_length) VALUES ($1, true, 0, 100) RETURNING id",
        uid,
    )
    chat = await db.fetchval(
        "INSERT INTO waiting_prompts (user_id, active, n, max_length, is_chat) VALUES ($1, true, 0, 500, true) RETURNING id",
        uid,
    )
    replies = [
        # (request, generation, completed seconds ago, completion_tokens, faulted, fake)
        (text, "a", 10.0, None, False, False),  # minute: its request's max_length, 100
        (chat, "b", 1800.0, 7, False, False),  # hour: its completion tokens, 7
        (text, "c", 2 * HOUR, None, False, False),  # day
        (text, "d", 10.0, None, False, True),  # a fake job's reply: not counted
        (text, None, None, None, True, False),  # faulted, no reply: not counted
        (text, None, None, None, False, False),  # in progress: not counted
    ]
    await db.executemany(
        """INSERT INTO processing_gens (wp_id, worker_id, user_id, model, generation, completed_at,
                                        completion_tokens, faulted, fake)
           VALUES ($1, $2, $3, $4, $5, now() - make_interval(secs => $6), $7, $8, $9)""",
        [
            (wp, worker, uid, model, gen, ago, tokens, faulted, fake)
            for wp, gen, ago, tokens, faulted, fake in replies
        ],
    )
    try:
        after = await text_totals(client)
        conforms(document, "TextTotals", after)
        delta = {
            p: {k: after[p][k] - before[p][k] for k in ("requests", "tokens")} for p in TOTALS_PERIODS[:4]
        }
        assert delta == {
            "minute": {"requests": 1, "tokens": 100},
            "hour": {"requests": 2, "tokens": 107},
            "day": {"requests": 3, "tokens": 207},
            "month": {"requests": 4, "tokens": 207},
        }
        lifetime = await db.fetchrow(
            "SELECT sum(fulfilments)::bigint AS requests, sum(contributions)::bigint AS tokens FROM workers"
        )
        assert lifetime is not None
        assert after["total"] == {
            "requests": max(lifetime["requests"], after["month"]["requests"]),
            "tokens": max(lifetime["tokens"], after["month"]["tokens"]),
        }
        assert after["total"]["requests"] >= 1000 and after["total"]["tokens"] >= 50000
        # the same answer without /api
        assert (await client.get("/v2/stats/text/totals")).json() == after
    finally:
        await db.execute("DELETE FROM model_performances WHERE model = $1", model)
        await db.execute("DELETE FROM waiting_prompts WHERE user_id = $1", uid)
        await db.execute("DELETE FROM workers WHERE user_id = $1", uid)
    # nothing stored any more: back where it was
    assert await text_totals(client) == before


async def test_the_aggregate_answers_are_kept_for_a_moment(
    client: httpx.AsyncClient, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(horde_status, "PERFORMANCE_MEMO_SECONDS", 3600.0)  # kept throughout the test
    uid, _ = await new_user(db)
    first = await performance(client)  # computed afresh, then kept
    await db.execute(
        "INSERT INTO waiting_prompts (user_id, active, n, max_length) VALUES ($1, true, 1, 10)", uid
    )
    try:
        kept = (await client.get("/api/v2/status/performance")).json()
        assert kept == first  # the kept answer, not a second query
        fresh = await performance(client)
        assert fresh["queued_text_requests"] == first["queued_text_requests"] + 1
    finally:
        await db.execute("DELETE FROM waiting_prompts WHERE user_id = $1", uid)


async def test_concurrent_misses_wait_for_one_computation() -> None:
    memo, calls = ReadMemo(), []

    async def compute() -> int:
        calls.append(1)
        await asyncio.sleep(0)
        return len(calls)

    assert await asyncio.gather(*(memo.get("k", 3600.0, compute) for _ in range(5))) == [1] * 5
    memo.clear()
    assert await memo.get("k", 3600.0, compute) == 2
