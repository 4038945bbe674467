"""``GET /v2/status/models``: the text model list, and with ``chat=true`` each model's chat offer;
``GET /v2/status/models/{model_name}``: one model's entry of that list (docs/native-api.md#single-model-status).

docs/native-api.md#model-list (fields, 2 s cache); see docs/native-api.md#model-list. Simplified: the list is
computed from the workers table on a miss of the 2 s cache (no models_cache rebuild loop), and only type=text
has entries (this horde serves no image models).

The cache is keyed by the normalised parameters that shape the computed list (only ``chat``), not by the query
string as upstream's is: ``model_state``, ``min_count`` and ``max_count`` filter the cached list, and an unknown
parameter or a reordered query hits the same entry, so a client cannot make every request miss the cache and
run the query. Concurrent misses in one process wait for one query (single flight).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from horde_contract import TextModelReference
from horde_contract.errors import RC, HordeError
from horde_core.redis_keys import models_cache_key

from horde_admission.state import get_state

log = logging.getLogger(__name__)

router = APIRouter()

ROUTE_CACHE_SECONDS = 2
ONLINE_SECONDS = 300

# One row per (model, worker) for online workers not in maintenance, whose owner is neither flagged nor
# deleted (their pops are refused): the text models a worker pops with, and its chat model_id. The chat
# object comes from the same pass.
_MODELS_SQL = """
WITH online AS (
    SELECT w.id, w.threads, w.accepts_prompt_jobs, w.accepts_chat_jobs, w.chat_model_id,
           w.chat_max_context_length, w.chat_max_length, w.chat_features, w.created, w.models
    FROM workers w JOIN users u ON u.id = w.user_id
    WHERE w.last_check_in > now() - make_interval(secs => $1) AND NOT w.maintenance
      AND NOT u.flagged AND NOT u.deleted
), text_models AS (
    SELECT m AS name,
           sum(CASE WHEN o.accepts_prompt_jobs THEN o.threads ELSE 0 END) AS count
    FROM online o, unnest(o.models) AS m
    GROUP BY m
), chat_models AS (
    SELECT o.chat_model_id AS name, count(*) AS workers,
           max(o.chat_max_context_length) AS max_context_length, max(o.chat_max_length) AS max_length,
           coalesce((SELECT array_agg(DISTINCT f ORDER BY f) FROM online o2, unnest(o2.chat_features) f
                     WHERE o2.accepts_chat_jobs AND o2.chat_model_id = o.chat_model_id), '{}') AS features,
           min(extract(epoch FROM o.created))::bigint AS created
    FROM online o WHERE o.accepts_chat_jobs AND o.chat_model_id IS NOT NULL
    GROUP BY o.chat_model_id
), queue AS (
    SELECT m AS name, sum(w.max_length) AS queued, sum(w.n) AS waiting
    FROM waiting_prompts w, unnest(w.models) AS m
    WHERE w.active AND NOT w.faulted AND w.n >= 1
    GROUP BY m
), processing AS (
    SELECT p.model AS name, count(*) AS processing
    FROM processing_gens p
    WHERE NOT p.faulted AND NOT p.fake AND p.generation IS NULL
    GROUP BY p.model
), perf AS (
    SELECT p.model AS name, avg(p.performance) AS performance
    FROM model_performances p
    WHERE p.created > now() - interval '1 hour'
    GROUP BY p.model
)
SELECT names.name, coalesce(t.count, 0) AS count, c.workers AS chat_workers,
       c.max_context_length AS chat_max_context_length, c.max_length AS chat_max_length,
       c.features AS chat_features, c.created AS chat_created,
       coalesce(q.queued, 0) AS queued, coalesce(q.waiting, 0) + coalesce(pr.processing, 0) AS jobs,
       coalesce(pf.performance, 0) AS performance
FROM (SELECT name FROM text_models UNION SELECT name FROM chat_models) names
LEFT JOIN text_models t ON t.name = names.name
LEFT JOIN chat_models c ON c.name = names.name
LEFT JOIN queue q ON q.name = names.name
LEFT JOIN processing pr ON pr.name = names.name
LEFT JOIN perf pf ON pf.name = names.name
ORDER BY names.name
"""


def _entry(row: Any, chat: bool) -> dict[str, Any]:
    count = int(row["count"])
    performance = round(float(row["performance"] or 0), 1)
    queued = int(row["queued"])
    eta = int(queued / (count * performance)) if count * performance > 0 else 10000
    entry: dict[str, Any] = {
        "name": row["name"],
        "count": count,
        "performance": performance,
        "queued": queued,
        "jobs": int(row["jobs"]),
        "eta": eta,
        "type": "text",
    }
    if chat:
        entry["chat"] = {
            "workers": int(row["chat_workers"]),
            "max_context_length": row["chat_max_context_length"],
            "max_length": row["chat_max_length"],
            "features": list(row["chat_features"] or []),
            "created": row["chat_created"],
        }
    return entry


def _state_filter(name: str, model_state: str, reference: TextModelReference) -> bool:
    """``model_state``: known lists what the text model reference lists, custom the rest, all everything."""
    if model_state == "known":
        return reference.is_known(name)
    if model_state == "custom":
        return not reference.is_known(name)
    return True


@router.get("/v2/status/models")
async def status_models(
    request: Request,
    type: str = "image",
    chat: bool = False,
    min_count: int | None = None,
    max_count: int | None = None,
    model_state: str = "all",
) -> JSONResponse:
    """Active models: ``[{name, count, performance, queued, jobs, eta, type[, chat]}]``.

    ``chat=true`` (only with ``type=text``, else 400 BadRequest) lists only models an online chat worker
    serves, each with ``chat: {workers, max_context_length, max_length, features, created}``. ``count``
    leaves out workers with prompt_jobs false. ``model_state`` is known, custom or all (else 400).
    """
    if model_state not in ("known", "custom", "all"):
        raise HordeError(400, RC.BadRequest, "model_state has to be one of 'known', 'custom' or 'all'.")
    if chat and type != "text":
        raise HordeError(400, RC.BadRequest, "chat=true is only available with type=text.")
    if type != "text":
        return JSONResponse([])
    state = get_state(request)
    entries = await _cached_entries(request, chat)
    filtered = []
    for entry in entries:
        if not _state_filter(entry["name"], model_state, state.model_reference):
            continue
        if min_count is not None and entry["count"] < min_count:
            continue
        if max_count is not None and entry["count"] > max_count:
            continue
        filtered.append(entry)
    return JSONResponse(filtered)


async def _compute_entries(request: Request, chat: bool) -> list[dict[str, Any]]:
    state = get_state(request)
    async with state.pool.acquire() as conn:
        rows = await conn.fetch(_MODELS_SQL, float(ONLINE_SECONDS))
    return [_entry(row, chat) for row in rows if not (chat and row["chat_workers"] is None)]


async def _read_cache(request: Request, key: str) -> list[dict[str, Any]] | None:
    try:
        cached = await get_state(request).redis.get(key)
    except Exception:
        return None
    if not cached:
        return None
    try:
        value = json.loads(cached)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


async def _cached_entries(request: Request, chat: bool) -> list[dict[str, Any]]:
    """Every entry of the list (unfiltered), from the 2 s cache or computed once per process on a miss."""
    key = models_cache_key(chat)
    cached = await _read_cache(request, key)
    if cached is not None:
        return cached
    locks: dict[str, asyncio.Lock] | None = getattr(request.app.state, "models_cache_locks", None)
    if locks is None:
        locks = request.app.state.models_cache_locks = {}
    lock = locks.setdefault(key, asyncio.Lock())
    async with lock:
        cached = await _read_cache(request, key)
        if cached is not None:
            return cached
        entries = await _compute_entries(request, chat)
        try:
            await get_state(request).redis.set(key, json.dumps(entries), ex=ROUTE_CACHE_SECONDS)
        except Exception:
            log.warning("models cache write failed", exc_info=True)
    return entries


@router.get("/v2/status/models/{model_name:path}")
async def status_model(request: Request, model_name: str) -> JSONResponse:
    """One model's statistics, as upstream's ``ModelSingle``: a list holding the model's entry of
    ``GET /v2/status/models?type=text`` (``[{name, count, performance, queued, jobs, eta, type}]``), or ``[]``
    (200, as upstream) when no online worker serves it.

    The name is matched exactly, ``::user#id`` suffix and all; it may hold ``/`` (sent as is or as ``%2F``).
    The entry comes from the same 2 s cache as the list, so a look-up runs no query of its own; there is no
    ``type`` parameter (upstream has none; this horde's models are text models).
    """
    entries = await _cached_entries(request, False)
    return JSONResponse([entry for entry in entries if entry["name"] == model_name])
