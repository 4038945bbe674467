"""Checks the generate routes share: concurrency, listed workers, shared key limits, the hold before images,
headers (docs/native-api.md#text-route processing order, #kudos)."""

from __future__ import annotations

import uuid

from fastapi import Request
from horde_contract.errors import RC, HordeError
from horde_contract.refusals import worker_not_found_error
from horde_contract.requirements import no_eligible_worker_error
from horde_store.db import Conn

from horde_admission import kudos, store
from horde_admission.auth import Requester
from horde_admission.creation import Funding
from horde_admission.state import AdmissionState


def too_many_prompts(count: int, concurrency: int) -> HordeError:
    """429 TooManyPrompts (docs/native-api.md#kudos)."""
    return HordeError(
        429,
        RC.TooManyPrompts,
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


async def count_concurrent(conn: Conn, requester: Requester, models: list[str]) -> int:
    """Σn over the user's unfaulted requests with n ≥ 1 (docs/native-api.md#kudos).

    The anonymous user, whom every anonymous client shares, is counted per model as upstream (its active
    requests listing a requested model), but whatever ``models`` holds: a request without models
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
    conn: Conn | None = None,
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
    """404 WorkerNotFound for a listed worker id that is not a worker (docs/native-api.md#text-route)."""
    if not workers:
        return
    for worker in workers:
        try:
            uuid.UUID(worker)
        except ValueError:
            raise worker_not_found_error(worker) from None
    async with state.pool.acquire() as conn:
        found = {
            str(r["id"])
            for r in await conn.fetch("SELECT id FROM workers WHERE id = ANY($1::uuid[])", workers)
        }
    for worker in workers:
        if worker not in found:
            raise worker_not_found_error(worker)


def client_agent(request: Request) -> str:
    """The Client-Agent header, default ``unknown:0:unknown`` (stored, never validated)."""
    return request.headers.get("Client-Agent") or "unknown:0:unknown"


#: The rcs of :func:`check_shared_key`'s kudos refusal (counted as refused on
#: ``horde.text.free_allowance.decisions``, docs/native-api.md#free-output-allowance).
SHARED_KEY_KUDOS_REFUSALS = frozenset({RC.SharedKeyInsufficientKudos, RC.NoEligibleWorker})


def check_shared_key(
    state: AdmissionState,
    funding: Funding,
    models: list[str],
    max_length: int,
    max_context_length: int,
    n: int,
    tax: float,
) -> float:
    """A shared key's limits for the request ``funding`` pays for; returns what the key must cover
    (:func:`kudos.shared_key_amount` at these sizes: the estimate at the highest multiplier across the list;
    0 without a shared key).

    400 BadRequest above the key's max_text_tokens; 403 SharedKeyInsufficientKudos when the amount exceeds
    its kudos (403 NoEligibleWorker instead when ``funding.availability`` has no eligible worker; the text
    route has none and always gets SharedKeyInsufficientKudos, as upstream). A kudos refusal
    (:data:`SHARED_KEY_KUDOS_REFUSALS`) is counted as refused (:meth:`Funding.record`). The key's expiry and
    emptiness are refused by :func:`horde_admission.auth.admit`. Both generate routes call it."""
    requester = funding.requester
    if requester.shared_key_id is None:
        return 0.0
    amount = float(
        kudos.shared_key_amount(
            models, max_length, max_context_length, n, tax, reference=state.model_reference
        )
    )
    limit = requester.shared_key_max_text_tokens
    if limit is not None and limit != -1 and max_length > limit:
        raise HordeError(
            400,
            RC.BadRequest,
            f"This shared key is limited to {limit} tokens per request; max_tokens is {max_length}.",
        )
    key_kudos = requester.shared_key_kudos
    if key_kudos is not None and key_kudos != -1 and amount > key_kudos:
        funding.record("refused")
        availability = funding.availability
        if availability is not None and availability.eligible_workers == 0:
            raise no_eligible_worker_error(availability.impossible_reason())
        raise HordeError(
            403,
            RC.SharedKeyInsufficientKudos,
            f"This shared key has {key_kudos:g} kudos left; the request needs {amount:g}.",
        )
    return amount


async def check_hold_before_images(state: AdmissionState, funding: Funding) -> None:
    """Refuse a hold the requester cannot cover before the request's images are fetched and decoded (spec:
    Images, "after the other checks"): 403 KudosUpfront, or 403 NoEligibleWorker when no online
    worker can serve, counted as refused, the same refusal the creating transaction gives
    (:meth:`Funding.refusal`). That transaction checks again under the user's row lock; this earlier check
    only spares the fetch."""
    if funding.hold <= 0:
        return
    async with state.pool.acquire() as conn, conn.transaction():
        balance = await store.available_balance(conn, funding.requester.user_id)
    if balance >= funding.hold:
        return
    raise funding.refusal(store.HoldRefused())
