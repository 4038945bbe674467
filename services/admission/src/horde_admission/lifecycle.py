"""Status reads and cancels shared by the chat and text route families (docs/native-api.md#status-and-cancel; see docs/native-api.md#routes,
Completion signal, Structured submit, Streaming progress, Pricing)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import grpc
from horde.submit.v1 import settlement_pb2
from horde_contract.errors import RC, HordeError
from horde_core.chat_stream import flag_cancelled_leases
from horde_core.signals import publish_chat_event

from horde_admission import store
from horde_admission.availability import (
    Availability,
    RequestNeeds,
    cache_availability,
    cached_availability,
    get_availability,
)
from horde_admission.state import AdmissionState
from horde_admission.status import build_status

log = logging.getLogger(__name__)


def request_not_found(request_id: str, is_chat: bool) -> HordeError:
    """404 RequestNotFound (docs/native-api.md#status-and-cancel wording)."""
    kind = "Chat Waiting Prompt" if is_chat else "Text Waiting Prompt"
    return HordeError(404, RC.RequestNotFound, f"{kind} (Status) with ID '{request_id}' not found.")


def parse_request_id(request_id: str, is_chat: bool) -> uuid.UUID:
    """The id as a UUID; a malformed id is 404 RequestNotFound like an unknown one."""
    try:
        return uuid.UUID(request_id)
    except ValueError:
        raise request_not_found(request_id, is_chat) from None


async def request_availability(
    state: AdmissionState, request_id: uuid.UUID, head: Any, is_chat: bool = True
) -> Availability | None:
    """The request's availability: the cached copy (60 s) or a fresh GetAvailability (a text request's: the
    text workers', ``prompt_jobs``). None when dispatch does not answer (the status then leaves is_possible
    true)."""
    cached = await cached_availability(state.redis, str(request_id))
    if cached is not None:
        return cached
    workers = [str(w) for w in (head["workers"] or [])]
    needs = RequestNeeds(
        prompt_jobs=not is_chat,
        models=list(head["models"] or []),
        required_features=list(head["chat_required_features"] or []),
        max_length=int(head["max_length"] or 0),
        max_context_length=int(head["max_context_length"] or 0),
        tools_temperature=head["chat_tools_temperature"],
        has_images=bool(head["has_images"]),
        only_worker_ids=[] if head["worker_blacklist"] else workers,
        ignore_worker_ids=workers if head["worker_blacklist"] else [],
        trusted_workers=bool(head["trusted_workers"]),
        validated_backends=bool(head["validated_backends"]),
        slow_workers=bool(head["slow_workers"]),
        requester_user_id=int(head["user_id"]),
    )
    try:
        found = await get_availability(state.worker_pool, needs, state.settings.availability_timeout_seconds)
    except HordeError:
        return None
    await cache_availability(state.redis, str(request_id), found, state.settings.availability_cache_seconds)
    return found


async def read_status_body(state: AdmissionState, request_id: str, is_chat: bool) -> dict[str, Any]:
    """The status body of a request of this family; 404 RequestNotFound otherwise."""
    rid = parse_request_id(request_id, is_chat)
    async with state.pool.acquire() as conn:
        found = await store.read_status(conn, rid, is_chat)
    if found is None:
        raise request_not_found(request_id, is_chat)
    head, gens = found
    availability = await request_availability(state, rid, head, is_chat)
    return await build_status(head, gens, is_chat, availability, state.queue_ahead_memo)


async def settle_streamed(state: AdmissionState, generation_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Ask submit to settle each in-flight streamed generation on its posted content (docs/native-api.md#pricing; one
    ``SettlementService.SettleCancelledGeneration`` call each, ``settlement_timeout_seconds`` apiece).

    Returns the generations whose call failed (any error: a gRPC status, a timeout, a broken channel; each
    logged at WARNING). The cancel stands either way and is never failed by this: a generation whose call
    failed stays pending, and its settlement is left to submit's rules, which settle a pending generation of
    a cancelled streamed request as cancelled (paid on its posted content, faulted as cancelled, not counted
    against its worker) at whichever comes first of the janitor's next pass, the lapse of its lease, the
    worker's reply (answered 400 AbortedGen) or its faulted submit. So a failed call delays the settlement by at
    most one janitor pass and never leaves the worker penalised for the job it was told to drop.
    """
    failed: list[uuid.UUID] = []
    for gen_id in generation_ids:
        try:
            await state.settlement.SettleCancelledGeneration(
                settlement_pb2.SettleCancelledGenerationRequest(generation_id=str(gen_id)),
                timeout=state.settings.settlement_timeout_seconds,
            )
        except grpc.aio.AioRpcError as exc:
            failed.append(gen_id)
            log.warning(
                "cancel: SettleCancelledGeneration failed; the janitor settles the generation",
                extra={"generation_id": str(gen_id), "code": str(exc.code()), "details": exc.details()},
            )
        except Exception:
            failed.append(gen_id)
            log.warning(
                "cancel: SettleCancelledGeneration failed; the janitor settles the generation",
                extra={"generation_id": str(gen_id)},
                exc_info=True,
            )
    return failed


async def cancel_and_report(state: AdmissionState, request_id: str, is_chat: bool) -> dict[str, Any]:
    """Cancel a request and return its status after the cancel; 404 RequestNotFound for another family.

    The cancel sets ``n = 0`` and ``cancelled``; in-flight jobs finish, except streamed chat jobs: each is
    settled on its posted content through submit's SettlementService (:func:`settle_streamed`; a failed call
    is settled later by submit's rules, never charged to the worker as a dropped job), then its lease is
    flagged cancelled and its stream gets the ended entry (``horde_core.chat_stream.flag_cancelled_leases``,
    on the signal database; best effort), whether or not the settlement got through, so the worker stops.
    The claiming call publishes ``cancelled`` on the completion signal after its commit. The body is the
    status after the cancel: a generation whose settlement is still to come is reported as processing.
    """
    rid = parse_request_id(request_id, is_chat)
    async with state.pool.acquire() as conn:
        claimed = await store.cancel_request(conn, rid, is_chat)
        if claimed is None:
            raise request_not_found(request_id, is_chat)
        streamed: list[uuid.UUID] = []
        if claimed and is_chat:
            streamed = await store.streamed_in_flight(conn, rid)
    if streamed:
        # Settle on the posted content first, then flag the leases (docs/native-api.md#progress).
        await settle_streamed(state, streamed)
        await flag_cancelled_leases(state.signals, str(rid), [str(g) for g in streamed])
    if claimed and is_chat:
        async with state.pool.acquire() as conn:
            finished = await store.count_results(conn, rid)
        await publish_chat_event(state.signals, str(rid), "cancelled", finished)
    return await read_status_body(state, request_id, is_chat)
