"""Creating a request: the free output allowance and upfront hold, the horde tax, the row (and its images)
and the kudos refusals (spec: Free output allowance, Images, Operation key; text path §5)."""

from __future__ import annotations

import dataclasses
import logging
import uuid

from horde_core import queue_announce

from horde_admission import contract, kudos, store
from horde_admission.auth import Requester
from horde_admission.availability import Availability
from horde_admission.settings import AdmissionSettings
from horde_admission.sizing import size_bucket
from horde_admission.state import AdmissionState

log = logging.getLogger(__name__)


def horde_tax(settings: AdmissionSettings, image_count: int = 0) -> float:
    """The horde tax at activation: 1, plus 5 per image (spec: Images)."""
    tax: float = settings.horde_tax + contract.EXTRA_SOURCE_IMAGE_HORDE_TAX * image_count
    return tax


async def free_allowance(
    state: AdmissionState,
    models: list[str],
    availability: Availability | None,
    requester: Requester,
    chat: bool,
) -> int:
    """The request's free output allowance from its estimated wait on the eligible workers (spec: Free output
    allowance); the floor without eligible workers. Competing requests: those sharing a model (simplified)."""
    wait: float | None = None
    if availability is not None and availability.eligible_threads > 0:
        async with state.pool.acquire() as conn:
            tokens, jobs = await store.competing_queue(conn, models)
        wait = kudos.estimated_wait_seconds(
            tokens, jobs, availability.eligible_threads, availability.tokens_per_second
        )
        if wait is not None:
            kudos.FREE_ALLOWANCE_WAIT.labels(str(chat).lower(), requester.kind).observe(wait)
    return kudos.free_output_allowance(state.settings, wait)


def record_decision(
    requester: Requester, outcome: str, requested_length: int, allowance: int, *, chat: bool
) -> None:
    """Count one request creation on ``horde.text.free_allowance.decisions`` (spec: Free output allowance).

    ``outcome`` is free, funded, refused (KudosUpfront, SharedKeyInsufficientKudos, or NoEligibleWorker in
    their place) or downgraded; ``requested_length`` the max_length the request asked for (tokens, before
    any lowering or downgrade) and ``allowance`` its free output allowance (tokens). Not for dry runs.
    """
    kudos.FREE_ALLOWANCE_DECISIONS.labels(
        requester.kind,
        outcome,
        size_bucket(requested_length),
        size_bucket(allowance),
        "true" if chat else "false",
    ).inc()


def needs_upfront(
    settings: AdmissionSettings, max_length: int, allowance: int, slow_workers: bool, lists_workers: bool
) -> bool:
    """Whether the kudos are held upfront: above the allowance, always without slow workers, and with a
    worker list under HORDE_UPFRONT_KUDOS_ON_WORKERLIST."""
    return (
        max_length > allowance or not slow_workers or (settings.upfront_kudos_on_workerlist and lists_workers)
    )


async def create_or_refuse(
    state: AdmissionState,
    new: store.NewRequest,
    hold: float,
    allowance: int,
    availability: Availability,
    requester: Requester,
    requested_length: int,
    jpegs: list[bytes] | None = None,
) -> uuid.UUID:
    """Create the request; a hold the requester cannot cover is 403 KudosUpfront, what its shared key cannot
    cover 403 SharedKeyInsufficientKudos, either 403 NoEligibleWorker (with impossible_reason when the
    declarations are the cause) when no online worker can serve it. Both are checked in the creating
    transaction under the user's and the key's row locks (:func:`store.reserve`), so parallel requests never
    hold more than the balance or the key's kudos.

    With ``jpegs`` the inactive row is written first, the images are stored under its id (a store failure
    deletes the row: 503 ChatImageStorageUnavailable), then the request is activated; a failed activation
    deletes the row and the images. Raises :class:`store.OperationKeyRace` for a lost operation key race.

    After the commit the new request is announced to the waiting pops (:func:`announce_request`); a dry run
    or an operation key's replay never gets here, so it announces nothing.
    """
    if new.shared_key_id is not None and not new.shared_key_amount:
        amount = kudos.shared_key_amount(
            new.models,
            new.max_length,
            new.max_context_length,
            new.n,
            new.tax,
            reference=state.model_reference,
        )
        new = dataclasses.replace(new, shared_key_amount=float(amount))
    try:
        if not jpegs:
            async with state.pool.acquire() as conn:
                request_id = await store.create_request(conn, new, hold)
        else:
            request_id = await _create_with_images(state, new, hold, jpegs)
    except store.HoldRefused as refused:
        record_decision(requester, "refused", requested_length, allowance, chat=new.is_chat)
        if availability.eligible_workers == 0:
            raise kudos.no_eligible_worker_for_kudos(availability.impossible_reason()) from None
        if isinstance(refused, store.SharedKeyHoldRefused):
            raise kudos.shared_key_insufficient_error(refused.available, refused.amount) from None
        raise kudos.kudos_upfront_error(allowance, hold) from None
    outcome = "funded" if hold > 0 else "free"
    record_decision(requester, outcome, requested_length, allowance, chat=new.is_chat)
    await announce_request(state, request_id, new)
    return request_id


async def announce_request(state: AdmissionState, request_id: uuid.UUID, new: store.NewRequest) -> bool:
    """Announce a newly created active request to the waiting pops (README: Long-poll pop), after its commit.

    Fails open: True when Redis took the announcement; a Redis error or timeout is logged and counted by
    :func:`horde_core.queue_announce.publish` and the request stands (waiting pops find it on their periodic
    retry). Every route that creates a request calls this once its creating transaction committed.
    """
    message = queue_announce.announcement(
        request_id,
        new.models,
        is_chat=new.is_chat,
        max_length=new.max_length,
        max_context_length=new.max_context_length,
        n=new.n,
    )
    return await queue_announce.publish(state.signals, message)


async def _create_with_images(
    state: AdmissionState, new: store.NewRequest, hold: float, jpegs: list[bytes]
) -> uuid.UUID:
    async with state.pool.acquire() as conn:
        request_id = await store.create_request(conn, new, 0.0, active=False)
    try:
        keys = await state.images.put_all(request_id, jpegs)
    except Exception:
        log.warning("chat image store failed", extra={"request_id": str(request_id)}, exc_info=True)
        async with state.pool.acquire() as conn:
            await store.delete_request(conn, request_id)
        raise contract.chat_image_storage_unavailable_error() from None
    try:
        async with state.pool.acquire() as conn:
            await store.activate_request(conn, new, hold)
    except BaseException:
        async with state.pool.acquire() as conn:
            await store.delete_request(conn, request_id)
        await state.images.delete(keys)
        raise
    return request_id
