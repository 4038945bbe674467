"""The horde-wide read routes existing clients and workers poll: ``GET /v2/status/heartbeat``, ``/v2/status/
performance``, ``/v2/status/modes``, ``/v2/status/news``, ``/v2/stats/text/models`` and ``/v2/stats/text/totals``, in
upstream's shapes (docs/native-api.md#heartbeat, #horde-performance, #horde-modes, #news, #text-model-stats,
#text-totals).

This horde serves text only, so upstream's image and interrogation numbers are present and 0. What each text
number counts is in :data:`_PERFORMANCE_SQL`, :func:`text_model_stats` and :data:`_TEXT_TOTALS_SQL`.

The performance and stats answers are public and unauthenticated, and each is an aggregate over a table, so
each process keeps its answer for :data:`PERFORMANCE_MEMO_SECONDS` and :data:`MODEL_STATS_MEMO_SECONDS` (the
totals too; upstream caches them all), and concurrent misses wait for one query.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from horde_contract import ONLINE_WORKER_SECONDS
from horde_contract.errors import RC, HordeError
from horde_contract.refusals import invalid_api_key_error
from horde_store import users
from horde_store.db import ConnOrPool
from horde_store.modes import read_modes

from horde_admission.state import AdmissionState, get_state

router = APIRouter(tags=["status"])

#: How long a process reuses its performance answer, and its text model stats answer (seconds).
PERFORMANCE_MEMO_SECONDS = 2.0
MODEL_STATS_MEMO_SECONDS = 30.0


class ReadMemo:
    """The recent answers of the aggregate read routes, per process: each key's value and when it expires, with
    one computation at a time per key (single flight)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, key: str, ttl: float, compute: Callable[[], Awaitable[Any]]) -> Any:
        """``key``'s value: the kept one while it is younger than ``ttl`` seconds, else ``compute()``'s."""
        loop = asyncio.get_running_loop()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > loop.time():
            return entry[1]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] > loop.time():
                return entry[1]
            value = await compute()
            self._entries[key] = (loop.time() + ttl, value)
            return value

    def clear(self) -> None:
        """Forget every kept answer (the next read computes afresh)."""
        self._entries.clear()


def read_memo(request: Request) -> ReadMemo:
    """The app's :class:`ReadMemo` (``app.state.horde_status_memo``), made on first use."""
    memo: ReadMemo | None = getattr(request.app.state, "horde_status_memo", None)
    if memo is None:
        memo = ReadMemo()
        request.app.state.horde_status_memo = memo
    return memo


#: Tokens generated in the past minute: the completed, unfaked generations of the last 60 s, each counting its
#: ``completion_tokens`` (chat) or, where none is stored (legacy text), its request's ``max_length``, the
#: "things" upstream counts per fulfilment.
PAST_MINUTE_SECONDS = 60

# queued_text_requests counts jobs, as upstream: each active, unfaulted request's jobs still to hand out (n)
# plus its generations in progress (fakes excepted); queued_tokens weighs each of those jobs by max_length.
_PERFORMANCE_SQL = f"""
WITH queued AS (
    SELECT w.max_length,
           w.n + (SELECT count(*) FROM processing_gens g
                   WHERE g.wp_id = w.id AND g.generation IS NULL AND NOT g.faulted AND NOT g.fake) AS jobs
    FROM waiting_prompts w
    WHERE w.active AND NOT w.faulted
)
SELECT (SELECT coalesce(sum(jobs), 0) FROM queued) AS queued_text_requests,
       (SELECT coalesce(sum(jobs::float8 * max_length), 0) FROM queued) AS queued_tokens,
       (SELECT count(*) FROM workers
         WHERE last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})) AS text_worker_count,
       (SELECT coalesce(sum(threads), 0) FROM workers
         WHERE last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})) AS text_thread_count,
       (SELECT coalesce(sum(coalesce(g.completion_tokens, w.max_length)), 0)
          FROM processing_gens g JOIN waiting_prompts w ON w.id = g.wp_id
         WHERE g.completed_at > now() - make_interval(secs => {PAST_MINUTE_SECONDS})
           AND g.generation IS NOT NULL AND NOT g.faulted AND NOT g.fake) AS past_minute_tokens
"""

# One row per completed, unfaked generation (submit writes a speed sample with each); the janitor keeps an
# hour of them, so each period counts at most the last hour until a longer record is kept.
_MODEL_STATS_SQL = """
SELECT model,
       count(*) FILTER (WHERE created > now() - interval '1 day') AS day,
       count(*) FILTER (WHERE created > now() - interval '30 days') AS month,
       count(*) AS total
FROM model_performances
GROUP BY model
ORDER BY model
"""


#: Upstream's periods of ``StatsTxtTotals`` (month is the past 30 days).
TOTALS_PERIODS = ("minute", "hour", "day", "month", "total")

# Per window (the bounded periods): ``requests`` counts the speed samples (one per completed, unfaked generation,
# those stats/text/models counts; the janitor keeps an hour of them), ``tokens`` sums the completed, unfaked
# replies still stored (past_minute_tokens' rule: a chat reply's completion_tokens, a text reply its request's
# max_length; a reply is kept with its request, which expires 20 minutes after its last reply). ``total`` is the
# workers' lifetime counters (fulfilments; contributions, the tokens each reply or settled cancel was paid for),
# never less than the month's numbers.
_TEXT_TOTALS_SQL = """
WITH samples AS (
    SELECT count(*) FILTER (WHERE created > now() - interval '1 minute') AS minute,
           count(*) FILTER (WHERE created > now() - interval '1 hour') AS hour,
           count(*) FILTER (WHERE created > now() - interval '1 day') AS day,
           count(*) AS month
    FROM model_performances WHERE created > now() - interval '30 days'
), replies AS (
    SELECT coalesce(sum(tokens) FILTER (WHERE completed_at > now() - interval '1 minute'), 0) AS minute,
           coalesce(sum(tokens) FILTER (WHERE completed_at > now() - interval '1 hour'), 0) AS hour,
           coalesce(sum(tokens) FILTER (WHERE completed_at > now() - interval '1 day'), 0) AS day,
           coalesce(sum(tokens), 0) AS month
    FROM (SELECT g.completed_at, coalesce(g.completion_tokens, w.max_length)::bigint AS tokens
            FROM processing_gens g JOIN waiting_prompts w ON w.id = g.wp_id
           WHERE g.completed_at > now() - interval '30 days'
             AND g.generation IS NOT NULL AND NOT g.faulted AND NOT g.fake) r
), lifetime AS (
    SELECT coalesce(sum(fulfilments), 0)::bigint AS requests, coalesce(sum(contributions), 0)::bigint AS tokens
    FROM workers
)
SELECT s.minute AS minute_requests, r.minute AS minute_tokens, s.hour AS hour_requests, r.hour AS hour_tokens,
       s.day AS day_requests, r.day AS day_tokens, s.month AS month_requests, r.month AS month_tokens,
       greatest(l.requests, s.month) AS total_requests, greatest(l.tokens, r.month) AS total_tokens
FROM samples s, replies r, lifetime l
"""


@router.get("/v2/status/heartbeat")
async def heartbeat(request: Request) -> dict[str, Any]:
    """``{"message": "OK", "version": <the service version>}``: this process answers. docs/native-api.md#heartbeat."""
    return {"message": "OK", "version": request.app.version}


async def horde_performance(conn: ConnOrPool) -> dict[str, Any]:
    """Upstream's ``HordePerformance``: the text numbers from the tables (:data:`_PERFORMANCE_SQL`), the image
    and interrogation ones 0. Counts are integers; tokens are floats, as upstream's."""
    row = await conn.fetchrow(_PERFORMANCE_SQL)
    assert row is not None  # a SELECT of scalar subqueries answers one row
    return {
        "queued_requests": 0,
        "queued_text_requests": int(row["queued_text_requests"]),
        "worker_count": 0,
        "text_worker_count": int(row["text_worker_count"]),
        "thread_count": 0,
        "text_thread_count": int(row["text_thread_count"]),
        "queued_megapixelsteps": 0.0,
        "past_minute_megapixelsteps": 0.0,
        "queued_forms": 0.0,
        "interrogator_count": 0,
        "interrogator_thread_count": 0,
        "queued_tokens": float(row["queued_tokens"]),
        "past_minute_tokens": float(row["past_minute_tokens"]),
    }


@router.get("/v2/status/performance")
async def performance(
    request: Request, state: Annotated[AdmissionState, Depends(get_state)]
) -> dict[str, Any]:
    """The horde's load: queued text jobs and tokens, online text workers and threads, the past minute's
    tokens (docs/native-api.md#horde-performance). One query, its answer kept PERFORMANCE_MEMO_SECONDS."""
    answer: dict[str, Any] = await read_memo(request).get(
        "performance", PERFORMANCE_MEMO_SECONDS, lambda: horde_performance(state.pool)
    )
    return answer


@router.get("/v2/status/modes")
async def modes(
    state: Annotated[AdmissionState, Depends(get_state)],
    apikey: Annotated[str | None, Header(description="Optional: a moderator's key, to see raid_mode")] = None,
) -> dict[str, Any]:
    """``{maintenance_mode, invite_only_mode}`` from ``horde_modes``, plus ``raid_mode`` for a moderator's key
    (upstream hides it from everyone else, so an attacker cannot tell).

    401 InvalidAPIKey for an unknown key; 403 NotModerator for a key that is not a moderator's.
    docs/native-api.md#horde-modes.
    """
    async with state.pool.acquire() as conn:
        current = await read_modes(conn)
        moderator = False
        if apikey:
            viewer = await users.authenticate(conn, apikey, state.settings.secret_key, shared_keys=False)
            if viewer is None:
                raise invalid_api_key_error()
            if not viewer.moderator:
                raise HordeError(403, RC.NotModerator, "Only a moderator may read the raid mode.")
            moderator = True
    answer: dict[str, Any] = {
        "maintenance_mode": current.maintenance,
        "invite_only_mode": current.invite_only,
    }
    if moderator:
        answer["raid_mode"] = current.raid
    return answer


@router.get("/v2/status/news")
async def news() -> list[dict[str, Any]]:
    """The horde's news pieces (upstream ``Newspiece``): none are published, so ``[]``.
    docs/native-api.md#news."""
    return []


async def text_model_stats(conn: ConnOrPool) -> dict[str, dict[str, int]]:
    """Upstream's ``TxtModelStats``: ``{day, month, total}``, each ``{model: completed generations}`` (models
    with none in a period are left out), counted from the speed samples submit stores per completed, unfaked
    generation (:data:`_MODEL_STATS_SQL`)."""
    rows = await conn.fetch(_MODEL_STATS_SQL)
    stats: dict[str, dict[str, int]] = {"day": {}, "month": {}, "total": {}}
    for row in rows:
        for period in ("day", "month", "total"):
            if row[period]:
                stats[period][row["model"]] = int(row[period])
    return stats


@router.get("/v2/stats/text/models")
async def stats_text_models(
    request: Request, state: Annotated[AdmissionState, Depends(get_state)]
) -> dict[str, Any]:
    """Completed text generations per model for the past day, month and in total
    (docs/native-api.md#text-model-stats); the answer is kept MODEL_STATS_MEMO_SECONDS."""
    answer: dict[str, Any] = await read_memo(request).get(
        "text_model_stats", MODEL_STATS_MEMO_SECONDS, lambda: text_model_stats(state.pool)
    )
    return answer


async def text_totals(conn: ConnOrPool) -> dict[str, dict[str, int]]:
    """Upstream's ``StatsTxtTotals``: ``{minute, hour, day, month, total}``, each ``{requests, tokens}``, from
    :data:`_TEXT_TOTALS_SQL` (what each period can count, given what the stores keep, is described there)."""
    row = await conn.fetchrow(_TEXT_TOTALS_SQL)
    assert row is not None  # aggregates without GROUP BY answer one row
    return {
        period: {"requests": int(row[f"{period}_requests"]), "tokens": int(row[f"{period}_tokens"])}
        for period in TOTALS_PERIODS
    }


@router.get("/v2/stats/text/totals")
async def stats_text_totals(
    request: Request, state: Annotated[AdmissionState, Depends(get_state)]
) -> dict[str, Any]:
    """Completed text generations and their tokens in the past minute, hour, day, month and in total
    (docs/native-api.md#text-totals); the answer is kept MODEL_STATS_MEMO_SECONDS."""
    answer: dict[str, Any] = await read_memo(request).get(
        "text_totals", MODEL_STATS_MEMO_SECONDS, lambda: text_totals(state.pool)
    )
    return answer
