"""Checks the generate routes share: concurrency, listed workers, shared key limits, the hold before images,
headers (text path §1 processing order, §5)."""

from __future__ import annotations

import uuid

from fastapi import Request
from horde_core.errors import HordeError

from horde_admission import kudos, store
from horde_admission.auth import Requester
from horde_admission.availability import Availability
from horde_admission.creation import record_decision
from horde_admission.state import AdmissionState


def too_many_prompts(count: int, concurrency: int) -> HordeError:
    """429 TooManyPrompts (text path §5)."""
    return HordeError(
        429,
        "TooManyPrompts",
        f"Parallel requests ({count}) exceeded user limit ({concurrency}). Please try again later or request "
        "to increase your concurrency.",
    )


#: The anonymous user's waiting jobs that compete with a request for ``$2`` models: those sharing a model with
#: it, where a list without models (any model) shares every model, on either side.
_ANONYMOUS_CONCURRENT = """
SELECT coalesce(sum(n), 0) FROM waiting_prompts
WHERE user_id = $1 AND NOT faulted AND n >= 1 AND active
  AND (cardinality($2::text[]) = 0 OR cardinality(models) = 0 OR models && $2::text[])
"""
_CONCURRENT = "SELECT coalesce(sum(n), 0) FROM waiting_prompts WHERE user_id = $1 AND NOT faulted AND n >= 1"


async def count_concurrent(conn: store.Conn, requester: Requester, models: list[str]) -> int:
    """Σn over the user's unfaulted requests with n ≥ 1 (text path §5).

    The anonymous user, whom every anonymous client shares, is counted per model as upstream (its active
    requests listing a requested model), but whatever ``models`` holds (issue 9): a request without models
    may be served by any model's worker, so it competes with every anonymous request and they all compete
    with it; leaving ``models`` empty no longer counts as zero. A long list is bounded at parse
    (MAX_TEXT_MODEL_COUNT).
    """
    if requester.anonymous:
        value = await conn.fetchval(_ANONYMOUS_CONCURRENT, requester.user_id, models)
    else:
        value = await conn.fetchval(_CONCURRENT, requester.user_id)
    return int(value)


async def check_concurrency(
    state: AdmissionState,
    requester: Requester,
    models: list[str],
    n: int = 1,
    conn: store.Conn | None = None,
) -> None:
    """429 TooManyPrompts when the user's queued jobs plus this request's exceed their concurrency.

    ``conn``: a connection the caller already holds (one acquire per request); else one from the pool.
    """
    if conn is None:
        async with state.pool.acquire() as own:
            count = await count_concurrent(own, requester, models)
    else:
        count = await count_concurrent(conn, requester, models)
    if count + n > requester.concurrency:
        raise too_many_prompts(count + n, requester.concurrency)


async def check_workers_exist(state: AdmissionState, workers: list[str]) -> None:
    """404 WorkerNotFound for a listed worker id that is not a worker (text path §1)."""
    if not workers:
        return
    for worker in workers:
        try:
            uuid.UUID(worker)
        except ValueError:
            raise HordeError(404, "WorkerNotFound", f"Worker with ID '{worker}' not found.") from None
    async with state.pool.acquire() as conn:
        found = {
            str(r["id"])
            for r in await conn.fetch("SELECT id FROM workers WHERE id = ANY($1::uuid[])", workers)
        }
    for worker in workers:
        if worker not in found:
            raise HordeError(404, "WorkerNotFound", f"Worker with ID '{worker}' not found.")


def client_agent(request: Request) -> str:
    """The Client-Agent header, default ``unknown:0:unknown`` (stored, never validated)."""
    return request.headers.get("Client-Agent") or "unknown:0:unknown"


#: The rcs of :func:`check_shared_key`'s kudos refusal (counted as refused on
#: ``horde.text.free_allowance.decisions``, spec: Free output allowance).
SHARED_KEY_KUDOS_REFUSALS = frozenset({"SharedKeyInsufficientKudos", "NoEligibleWorker"})


def check_shared_key(
    requester: Requester, max_length: int, amount: float, availability: Availability | None
) -> None:
    """A shared key's limits (text path §5): 400 BadRequest above its max_text_tokens, 403
    SharedKeyInsufficientKudos when ``amount`` (:func:`kudos.shared_key_amount`: the estimate at the highest
    multiplier across the list) exceeds its kudos (403 NoEligibleWorker instead when no online worker can
    serve; the text route passes no ``availability`` and always gets SharedKeyInsufficientKudos, as upstream).
    Its expiry and emptiness are refused by :func:`horde_admission.auth.admit`. The kudos refusals' rcs are
    :data:`SHARED_KEY_KUDOS_REFUSALS`. Both generate routes call it."""
    if requester.shared_key_id is None:
        return
    limit = requester.shared_key_max_text_tokens
    if limit is not None and limit != -1 and max_length > limit:
        raise HordeError(
            400,
            "BadRequest",
            f"This shared key is limited to {limit} tokens per request; max_tokens is {max_length}.",
        )
    key_kudos = requester.shared_key_kudos
    if key_kudos is not None and key_kudos != -1 and amount > key_kudos:
        if availability is not None and availability.eligible_workers == 0:
            raise kudos.no_eligible_worker_for_kudos(availability.impossible_reason())
        raise HordeError(
            403,
            "SharedKeyInsufficientKudos",
            f"This shared key has {key_kudos:g} kudos left; the request needs {amount:g}.",
        )


async def check_hold_before_images(
    state: AdmissionState,
    requester: Requester,
    hold: float,
    allowance: int,
    availability: Availability,
    requested_length: int,
) -> None:
    """Refuse a hold the requester cannot cover before the request's images are fetched and decoded (spec:
    Images, "after the other checks"; issue 9): 403 KudosUpfront, or 403 NoEligibleWorker when no online
    worker can serve, counted as refused, the same refusal the creating transaction gives. That transaction
    checks again under the user's row lock; this earlier check only spares the fetch."""
    if hold <= 0:
        return
    async with state.pool.acquire() as conn, conn.transaction():
        balance = await store.available_balance(conn, requester.user_id)
    if balance >= hold:
        return
    record_decision(requester, "refused", requested_length, allowance, chat=True)
    if availability.eligible_workers == 0:
        raise kudos.no_eligible_worker_for_kudos(availability.impossible_reason())
    raise kudos.kudos_upfront_error(allowance, hold)
