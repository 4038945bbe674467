"""Status reads and cancels shared by the chat and text route families (text path §2; spec: Routes,
Completion signal, Structured submit, Streaming progress, Pricing)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import grpc
from horde.submit.v1 import settlement_pb2
from horde_contract.limits import CHAT_PROGRESS_STREAM_MAX_ENTRIES, CHAT_PROGRESS_STREAM_TTL_SECONDS
from horde_core.errors import HordeError
from horde_core.redis_keys import progress_stream_key, publish_chat_event, stream_lease_key

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
    """404 RequestNotFound (text path §2 wording)."""
    kind = "Chat Waiting Prompt" if is_chat else "Text Waiting Prompt"
    return HordeError(404, "RequestNotFound", f"{kind} (Status) with ID '{request_id}' not found.")


def parse_request_id(request_id: str, is_chat: bool) -> uuid.UUID:
    """The id as a UUID; a malformed id is 404 RequestNotFound like an unknown one."""
    try:
        return uuid.UUID(request_id)
    except ValueError:
        raise request_not_found(request_id, is_chat) from None


async def request_availability(
    state: AdmissionState, request_id: uuid.UUID, head: Any
) -> Availability | None:
    """The request's availability: the cached copy (60 s) or a fresh GetAvailability. None when dispatch does
    not answer (the status then leaves is_possible true)."""
    cached = await cached_availability(state.redis, str(request_id))
    if cached is not None:
        return cached
    workers = [str(w) for w in (head["workers"] or [])]
    needs = RequestNeeds(
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
        availability = await request_availability(state, rid, head) if is_chat else None
        return await build_status(conn, head, gens, is_chat, availability)


async def settle_streamed(state: AdmissionState, generation_ids: list[uuid.UUID]) -> None:
    """Ask submit to settle each in-flight streamed generation on its posted content (spec: Pricing).

    UNIMPLEMENTED (submit not there yet) and other failures are logged; the cancel stands either way.
    """
    for gen_id in generation_ids:
        try:
            await state.settlement.SettleCancelledGeneration(
                settlement_pb2.SettleCancelledGenerationRequest(generation_id=str(gen_id)),
                timeout=state.settings.settlement_timeout_seconds,
            )
        except grpc.aio.AioRpcError as exc:
            level = logging.INFO if exc.code() == grpc.StatusCode.UNIMPLEMENTED else logging.WARNING
            log.log(level, "SettleCancelledGeneration %s: %s %s", gen_id, exc.code(), exc.details())


# KEYS[1]: the request's progress stream; KEYS[2..]: the leases; ARGV[1..n]: their generation ids,
# ARGV[n+1]: stream max entries, ARGV[n+2]: stream TTL. Only leases that still exist are written; a fake
# generation's lease is flagged without an ended entry. Returns how many leases were flagged.
FLAG_CANCELLED_LEASES_SCRIPT = """
local n = #KEYS - 1
local flagged = 0
for i = 1, n do
  local lease = KEYS[i + 1]
  if redis.call('EXISTS', lease) == 1 then
    redis.call('HSET', lease, 'cancelled', '1')
    if redis.call('HGET', lease, 'fake') ~= '1' then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[n + 1], '*', 'gen', ARGV[i], 'ended', '1')
      redis.call('EXPIRE', KEYS[1], ARGV[n + 2])
    end
    flagged = flagged + 1
  end
end
return flagged
"""


async def flag_cancelled_leases(
    state: AdmissionState, request_id: uuid.UUID, generation_ids: list[uuid.UUID]
) -> int:
    """Tell the workers streaming a cancelled request to stop: ``cancelled`` on each lease still present and
    the generation's ``{gen, ended: 1}`` stream entry, atomically (spec: Streaming progress). The leases are
    kept, so the worker's next post is still answered (with cancelled true). Best effort: returns the count
    flagged, 0 on a Redis failure (logged)."""
    keys = [progress_stream_key(str(request_id)), *(stream_lease_key(str(g)) for g in generation_ids)]
    args: list[str | int] = [
        *(str(g) for g in generation_ids),
        CHAT_PROGRESS_STREAM_MAX_ENTRIES,
        CHAT_PROGRESS_STREAM_TTL_SECONDS,
    ]
    try:
        flagged = await state.signals.eval(FLAG_CANCELLED_LEASES_SCRIPT, len(keys), *keys, *args)
    except Exception:
        log.warning("cancel: lease flagging failed", extra={"request_id": str(request_id)}, exc_info=True)
        return 0
    return int(flagged)


async def cancel_and_report(state: AdmissionState, request_id: str, is_chat: bool) -> dict[str, Any]:
    """Cancel a request and return its status after the cancel; 404 RequestNotFound for another family.

    The cancel sets ``n = 0`` and ``cancelled``; in-flight jobs finish, except streamed chat jobs: each is
    settled on its posted content through submit's SettlementService, then its lease is flagged cancelled
    and its stream gets the ended entry. The claiming call publishes ``cancelled`` on the completion signal
    after its commit.
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
        # Settle on the posted content first, then flag the leases (spec: Streaming progress).
        await settle_streamed(state, streamed)
        await flag_cancelled_leases(state, rid, streamed)
    if claimed and is_chat:
        async with state.pool.acquire() as conn:
            finished = await store.count_results(conn, rid)
        await publish_chat_event(state.signals, str(rid), "cancelled", finished)
    return await read_status_body(state, request_id, is_chat)
