"""Checks the generate routes share: concurrency, listed workers, shared key limits, headers (text path
§1 processing order, §5)."""

from __future__ import annotations

import uuid

from fastapi import Request
from horde_core.errors import HordeError

from horde_admission import kudos, store
from horde_admission.auth import Requester
from horde_admission.availability import Availability
from horde_admission.state import AdmissionState


def too_many_prompts(count: int, concurrency: int) -> HordeError:
    """429 TooManyPrompts (text path §5)."""
    return HordeError(
        429,
        "TooManyPrompts",
        f"Parallel requests ({count}) exceeded user limit ({concurrency}). Please try again later or request "
        "to increase your concurrency.",
    )


async def check_concurrency(
    state: AdmissionState, requester: Requester, models: list[str], n: int = 1
) -> None:
    """429 TooManyPrompts when the user's queued jobs plus this request's exceed their concurrency."""
    async with state.pool.acquire() as conn:
        count = await store.count_concurrent(conn, requester.user_id, requester.anonymous, models)
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
    requester: Requester, max_length: int, amount: float, availability: Availability
) -> None:
    """A shared key's limits (text path §5): 400 BadRequest above its max_text_tokens, 403
    SharedKeyInsufficientKudos when ``amount`` (:func:`kudos.shared_key_amount`: the estimate at the highest
    multiplier across the list) exceeds its kudos (403 NoEligibleWorker instead when no online worker can
    serve). The kudos refusals' rcs are :data:`SHARED_KEY_KUDOS_REFUSALS`."""
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
        if availability.eligible_workers == 0:
            raise kudos.no_eligible_worker_for_kudos(availability.impossible_reason())
        raise HordeError(
            403,
            "SharedKeyInsufficientKudos",
            f"This shared key has {key_kudos:g} kudos left; the request needs {amount:g}.",
        )
