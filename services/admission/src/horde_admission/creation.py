"""Creating a request: the free output allowance and upfront hold, the horde tax, the row (and its images)
and the kudos refusals (docs/native-api.md#free-output-allowance, Images, Operation key; docs/native-api.md#kudos)."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import horde_contract as contract
from async_lru import alru_cache
from horde_contract.errors import HordeError
from horde_core import queue_announce
from horde_core.metrics import record_kudos, size_bucket

from horde_admission import kudos, offload, store
from horde_admission.auth import Requester
from horde_admission.availability import Availability
from horde_admission.settings import AdmissionSettings
from horde_admission.state import AdmissionState

log = logging.getLogger(__name__)


def horde_tax(settings: AdmissionSettings, image_count: int = 0) -> float:
    """The horde tax at activation: 1, plus 5 per image (docs/native-api.md#images)."""
    tax: float = settings.horde_tax + contract.EXTRA_SOURCE_IMAGE_HORDE_TAX * image_count
    return tax


class CompetingQueueMemo:
    """The competing queue (:func:`store.competing_queue`) by set of eligible workers, kept for ``memo_seconds``
    (HORDE_COMPETING_QUEUE_MEMO_SECONDS, 1 s).

    The statement sums every queued request one of the workers could take, so at the back of a long queue each
    new request cost PostgreSQL a scan of the queue, for an estimate of the wait. async-lru's TTL cache:
    concurrent creations with the same eligible workers share one statement, at most ``max_entries`` worker
    sets are kept (least recently used first out), a failed read is not kept. ``memo_seconds`` 0 reads it
    every time.
    """

    def __init__(self, pool: Any, memo_seconds: float, max_entries: int = 1024) -> None:
        self.memo_seconds = memo_seconds

        async def read(worker_ids: tuple[str, ...]) -> tuple[int, int]:
            async with pool.acquire() as conn:
                return await store.competing_queue(conn, list(worker_ids))

        self._read = read
        self._fetch = alru_cache(maxsize=max_entries, ttl=memo_seconds)(read)

    async def get(self, worker_ids: list[str]) -> tuple[int, int]:
        """``(tokens, jobs)`` queued that the workers ``worker_ids`` could take; ``(0, 0)`` without workers."""
        if not worker_ids:
            return 0, 0
        if self.memo_seconds <= 0:
            return await self.read(worker_ids)
        return await self._fetch(tuple(sorted(worker_ids)))

    async def read(self, worker_ids: list[str]) -> tuple[int, int]:
        """``(tokens, jobs)`` read now, never from the memo."""
        if not worker_ids:
            return 0, 0
        return await self._read(tuple(worker_ids))


async def free_allowance(
    state: AdmissionState,
    models: list[str],
    availability: Availability | None,
    requester: Requester,
    chat: bool,
) -> int:
    """The request's free output allowance from its estimated wait on the eligible workers
    (docs/native-api.md#free-output-allowance); the floor without eligible workers. Competing requests: the
    queued ones an eligible worker could take by its models, chat opt-in and length limits
    (:func:`store.competing_queue`), up to HORDE_COMPETING_QUEUE_MEMO_SECONDS old on the legacy text route."""
    wait: float | None = None
    if availability is not None and availability.eligible_threads > 0:
        ids = availability.eligible_worker_ids
        # The legacy text route reuses the sum as it reuses its availability; the chat routes read it fresh.
        memo = state.competing_queue_memo
        tokens, jobs = await (memo.read(ids) if chat else memo.get(ids))
        wait = kudos.estimated_wait_seconds(
            tokens, jobs, availability.eligible_threads, availability.tokens_per_second
        )
        if wait is not None:
            kudos.FREE_ALLOWANCE_WAIT.labels(str(chat).lower(), requester.kind).observe(wait)
    return kudos.free_output_allowance(state.settings, wait)


def record_decision(
    requester: Requester, outcome: str, requested_length: int, allowance: int, *, chat: bool
) -> None:
    """Count one request creation on ``horde.text.free_allowance.decisions`` (docs/native-api.md#free-output-allowance).

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


@dataclass(frozen=True)
class Funding:
    """How a request about to be created is paid for, decided the same way on both generate routes.

    ``requester`` sends it; ``requested_length`` is the max_length its body asked for (tokens, before any
    lowering or downgrade); ``allowance`` its free output allowance (tokens); ``hold`` the kudos held upfront
    (0: none); ``chat`` its route family (the ``horde.chat`` label). ``availability`` is what turns a kudos
    refusal into 403 NoEligibleWorker when no online worker can serve the request; None never does (the
    text route refuses with KudosUpfront or SharedKeyInsufficientKudos whatever the workers, as upstream).
    """

    requester: Requester
    requested_length: int
    allowance: int
    hold: float
    chat: bool
    availability: Availability | None = None

    def record(self, outcome: str) -> None:
        """Count this creation's ``outcome`` (:func:`record_decision`)."""
        record_decision(self.requester, outcome, self.requested_length, self.allowance, chat=self.chat)

    def refusal(self, refused: store.HoldRefused) -> HordeError:
        """The 403 for a hold or shared key amount the creating transaction refused: NoEligibleWorker (with
        impossible_reason when the declarations are the cause) when no online worker can serve,
        SharedKeyInsufficientKudos for the key, else KudosUpfront. Counts the refusal."""
        self.record("refused")
        if self.availability is not None and self.availability.eligible_workers == 0:
            return contract.no_eligible_worker_error(self.availability.impossible_reason())
        if isinstance(refused, store.SharedKeyHoldRefused):
            return kudos.shared_key_insufficient_error(refused.available, refused.amount)
        return kudos.kudos_upfront_error(self.allowance, self.hold)


def upfront_hold(
    state: AdmissionState,
    models: list[str],
    max_length: int,
    allowance: int,
    slow_workers: bool,
    lists_workers: bool,
    n: int = 1,
) -> float:
    """The kudos held upfront for a request (0: none): :func:`kudos.hold_amount` at ``max_length`` tokens
    when :func:`needs_upfront` asks for a hold."""
    if not needs_upfront(state.settings, max_length, allowance, slow_workers, lists_workers):
        return 0.0
    return kudos.hold_amount(models, max_length, n, reference=state.model_reference)


def _with_shared_key_amount(state: AdmissionState, new: store.NewRequest) -> store.NewRequest:
    """``new`` with what its shared key must cover filled in (:func:`kudos.shared_key_amount` at its sizes)."""
    if new.shared_key_id is None or new.shared_key_amount:
        return new
    amount = kudos.shared_key_amount(
        new.models,
        new.max_length,
        new.max_context_length,
        new.n,
        new.tax,
        reference=state.model_reference,
    )
    return dataclasses.replace(new, shared_key_amount=float(amount))


async def create_or_refuse(
    state: AdmissionState,
    new: store.NewRequest,
    funding: Funding,
    jpegs: list[bytes] | None = None,
    *,
    downgrade: Callable[[], store.NewRequest] | None = None,
    offloaded: offload.OffloadedMessages | None = None,
) -> uuid.UUID:
    """Create the request, count the decision on ``horde.text.free_allowance.decisions`` and announce it;
    both generate routes create their requests here.

    A hold the requester cannot cover, or an amount its shared key cannot, is refused with
    :meth:`Funding.refusal` (403). Both are checked in the creating transaction under the user's and the
    key's row locks (:func:`store.reserve`), so parallel requests never hold more than the balance or the
    key's kudos; a request without a hold or a shared key is one statement (:func:`store.create_request`).

    ``downgrade`` (the text route's allow_downgrade) builds the request to create instead when the user
    cannot cover the hold: it needs no hold, so only its shared key can still refuse it; it is counted as
    downgraded. A shared key's refusal is never downgraded.

    With ``jpegs`` the inactive row is written first, the images are stored under its id (a store failure
    deletes the row: 503 ChatImageStorageUnavailable), then the request is activated; a failed activation
    deletes the row and the images. ``offloaded`` (the messages object, docs/native-api.md#messages-offload) is
    stored the same way, after the images; a failure to store either deletes the row and every object already
    stored. Raises :class:`store.OperationKeyRace` for a lost operation key race.

    After the commit the new request is announced to the waiting pops (:func:`announce_request`); a dry run
    or an operation key's replay never gets here, so it announces nothing.
    """
    new = _with_shared_key_amount(state, new)
    outcome = "funded" if funding.hold > 0 else "free"
    try:
        request_id = await _create(state, new, funding.hold, jpegs, offloaded)
    except store.HoldRefused as refused:
        if downgrade is None or isinstance(refused, store.SharedKeyHoldRefused):
            raise funding.refusal(refused) from None
        outcome = "downgraded"
        new = _with_shared_key_amount(state, downgrade())
        try:
            request_id = await _create(state, new, 0.0, None)
        except store.HoldRefused as refused_again:
            raise funding.refusal(refused_again) from None
    funding.record(outcome)
    # The creating transaction committed: the horde tax it took (horde.kudos.transferred).
    record_kudos("horde_tax", new.tax)
    await announce_request(state, request_id, new)
    return request_id


async def _create(
    state: AdmissionState,
    new: store.NewRequest,
    hold: float,
    jpegs: list[bytes] | None,
    offloaded: offload.OffloadedMessages | None = None,
) -> uuid.UUID:
    if jpegs or offloaded is not None:
        return await _create_with_images(state, new, hold, jpegs or [], offloaded)
    async with state.pool.acquire() as conn:
        return await store.create_request(conn, new, hold)


async def announce_request(state: AdmissionState, request_id: uuid.UUID, new: store.NewRequest) -> bool:
    """Announce a newly created active request to the waiting pops (docs/worker-guide.md#long-poll), after its commit.

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
    state: AdmissionState,
    new: store.NewRequest,
    hold: float,
    jpegs: list[bytes],
    offloaded: offload.OffloadedMessages | None = None,
) -> uuid.UUID:
    async with state.pool.acquire() as conn:
        request_id = await store.create_request(conn, new, 0.0, active=False)
    messages = offload.messages_store(state.images, state.settings) if offloaded is not None else None
    keys: list[str] = []
    try:
        keys = await state.images.put_all(request_id, jpegs)
        if messages is not None and offloaded is not None:
            await messages.put(offloaded)
    except Exception:
        log.warning("chat object store failed", extra={"request_id": str(request_id)}, exc_info=True)
        async with state.pool.acquire() as conn:
            await store.delete_request(conn, request_id)
        # put_all deleted its own keys when it failed; keys is set only once every image stored.
        await state.images.delete(keys)
        if messages is not None and offloaded is not None:
            await messages.delete(offloaded.key)
        raise contract.chat_image_storage_unavailable_error() from None
    try:
        async with state.pool.acquire() as conn:
            await store.activate_request(conn, new, hold)
    except BaseException:
        async with state.pool.acquire() as conn:
            await store.delete_request(conn, request_id)
        await state.images.delete(keys)
        if messages is not None and offloaded is not None:
            await messages.delete(offloaded.key)
        raise
    return request_id
