"""The janitor's pass: request expiry and lapsed job leases (docs/native-api.md#completion-signal, #job-lease;
docs/native-api.md#expiry).

Each pass, every ``janitor_interval_seconds``:

1. **Expiry.** Requests past their expiry are deleted in batches (``FOR UPDATE SKIP LOCKED``, so replicas split
   the work and never claim one row twice); their generations cascade away unpaid and their kudos holds are
   released in the same statement. After the delete commits, each deleted chat request gets a ``faulted``
   signal carrying its stored fault reason and rc, so a client woken by it finds the settled state (404), and
   each generation of a deleted streamed request that was still in flight has its progress ended (its ended
   entry on the request's stream, none for a fake one, and its stream lease deleted; best effort), so the
   worker's next progress post finds no lease and no generation and is answered 404 ChatJobAborted (see
   docs/native-api.md#progress).
2. **Lapsed leases and cancels to settle.** Pending generations older than their ``job_ttl`` are faulted through
   submit's ``SettlementService.FaultGeneration`` (faults are settlement's rules: restart, worker counters, the
   request fault past FAULTED_GENERATIONS_LIMIT and its signal). The RPC is a compare-and-set, so two replicas
   that find the same generation fault it once; ``horde.text.stale_aborts`` counts only the fault that happened.
   A request already past its expiry is step 1's (a replica's expiry may be deleting it right now), never faulted
   here.
   A pending, real generation of a cancelled streamed request, lapsed or not, is instead settled through
   ``SettleCancelledGeneration``: the cancel settles those itself, so one still pending means the cancel's call
   to submit failed, and its worker, told to stop, must be paid for what it posted and not counted as having
   dropped the job (docs/native-api.md#pricing, #submit). That call is idempotent too.
3. **Objects.** The images (``horde-r2://`` references in the deleted rows' messages) and offloaded messages of
   the expired chat requests are deleted after the commit; a key that does not delete is queued in
   ``horde:chat:image_delete_retry``, and each pass retries up to 1000 queued keys.
4. **Speed samples.** model_performances older than an hour and worker_performances older than a day are
   deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
import grpc
import redis.asyncio as redis
from horde.submit.v1 import settlement_pb2
from horde_contract.limits import CHAT_IMAGE_REFERENCE_SCHEME
from horde_core.chat_stream import delete_lease, end_stream
from horde_core.metrics import flag
from horde_core.signals import publish_chat_event
from horde_store.objects import chat_messages_key

from horde_janitor.metrics import EXPIRED_REQUESTS, PASSES, STALE_ABORTS
from horde_janitor.objects import ObjectCleaner

if TYPE_CHECKING:  # the aio stub type exists only in the generated type stubs
    from horde.submit.v1.settlement_pb2_grpc import SettlementServiceAsyncStub

log = logging.getLogger(__name__)

_EXPIRE_SQL = """
WITH doomed AS (
    SELECT id FROM waiting_prompts
     WHERE expiry < now()
     ORDER BY expiry
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), finished AS (
    SELECT g.wp_id, count(*) AS n
      FROM processing_gens g JOIN doomed d ON d.id = g.wp_id
     WHERE g.generation IS NOT NULL AND NOT g.faulted AND NOT g.fake
     GROUP BY g.wp_id
), released AS (
    DELETE FROM kudos_holds h USING doomed d WHERE h.wp_id = d.id
    RETURNING h.wp_id
), live AS (
    -- Generations still in flight (read from the snapshot before the cascade): their progress ends.
    SELECT g.wp_id,
           array_agg(g.id) FILTER (WHERE NOT g.fake) AS gens,
           array_agg(g.id) FILTER (WHERE g.fake) AS fakes
      FROM processing_gens g JOIN doomed d ON d.id = g.wp_id
     WHERE g.generation IS NULL AND NOT g.faulted
     GROUP BY g.wp_id
), gone AS (
    DELETE FROM waiting_prompts w USING doomed d WHERE w.id = d.id
    RETURNING w.id, w.is_chat, w.stream_progress, w.chat_fault_reason, w.chat_fault_rc, w.chat_messages_offloaded,
              CASE WHEN w.is_chat AND w.messages IS NOT NULL THEN ARRAY(
                  SELECT substr(p->'image_url'->>'url', length($2) + 1)
                    FROM jsonb_array_elements(w.messages) m,
                         jsonb_array_elements(CASE WHEN jsonb_typeof(m->'content') = 'array'
                                                   THEN m->'content' ELSE '[]'::jsonb END) p
                   WHERE p->>'type' = 'image_url' AND starts_with(p->'image_url'->>'url', $2)
              ) END AS image_keys
)
SELECT gone.id, gone.is_chat, gone.chat_fault_reason, gone.chat_fault_rc, gone.chat_messages_offloaded,
       gone.image_keys,
       COALESCE(finished.n, 0) AS generations,
       CASE WHEN gone.stream_progress THEN live.gens END AS streamed_gens,
       CASE WHEN gone.stream_progress THEN live.fakes END AS streamed_fakes,
       (SELECT count(*) FROM released) AS released_holds
  FROM gone LEFT JOIN finished ON finished.wp_id = gone.id
            LEFT JOIN live ON live.wp_id = gone.id
"""

# Speed samples: model_performances are kept one hour (docs/native-api.md#submit); worker_performances a day (workers.speed
# keeps the mean of the newest 20 samples, written at each submit).
_PRUNE_SQL = """
WITH models AS (
    DELETE FROM model_performances WHERE created < now() - interval '1 hour' RETURNING 1
), workers AS (
    DELETE FROM worker_performances WHERE created < now() - interval '1 day' RETURNING 1
)
SELECT (SELECT count(*) FROM models) + (SELECT count(*) FROM workers)
"""

# Pending generations whose lease lapsed, and pending real generations of cancelled streamed requests (which the
# cancel settles; ``cancel_settles`` marks them, as submit's GenerationContext.cancel_settles does). A request past
# its expiry is left to the expiry, which deletes its generations unpaid: with several replicas one replica's
# expiry statement may hold such a request locked while another replica sweeps, and a FaultGeneration on it would
# lock the generation and then wait on the request row that the expiry holds while the expiry's cascade waits on
# that generation (a deadlock PostgreSQL breaks by failing one of them). One janitor never sees these rows here
# either: its pass expires first.
_STALE_SQL = """
SELECT g.id, wp.is_chat, COALESCE(u.trusted, false) AS worker_trusted,
       (wp.cancelled AND wp.stream_progress AND NOT g.fake) AS cancel_settles
  FROM processing_gens g
  JOIN waiting_prompts wp ON wp.id = g.wp_id
  JOIN workers w ON w.id = g.worker_id
  LEFT JOIN users u ON u.id = w.user_id
 WHERE g.generation IS NULL AND NOT g.faulted AND wp.expiry >= now()
   AND (g.started_at + make_interval(secs => g.job_ttl) < now()
        OR (wp.cancelled AND wp.stream_progress AND NOT g.fake))
 ORDER BY g.started_at
 LIMIT $1
"""


@dataclass
class PassResult:
    """What one pass did."""

    expired: int = 0
    expired_chat: int = 0
    stale_found: int = 0
    stale_faulted: int = 0
    requests_faulted: int = 0
    cancels_settled: int = 0
    leases_ended: int = 0
    pruned_samples: int = 0
    objects_deleted: int = 0
    objects_failed: int = 0
    objects_retried: int = 0


class Janitor:
    """Runs passes against the pool, the signal client and submit's Settlement service."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        signal: redis.Redis | None,
        settlement: SettlementServiceAsyncStub,
        *,
        expiry_batch: int = 1000,
        stale_batch: int = 1000,
        grpc_timeout: float = 10.0,
        objects: ObjectCleaner | None = None,
    ) -> None:
        self.pool = pool
        self.signal = signal
        self.settlement = settlement
        self.expiry_batch = expiry_batch
        self.stale_batch = stale_batch
        self.grpc_timeout = grpc_timeout
        self.objects = objects

    async def run_pass(self) -> PassResult:
        """One pass: expiry first (a deleted request's generations need no fault), then lapsed leases."""
        result = PassResult()
        try:
            await self.expire(result)
            await self.fault_stale(result)
            await self.prune(result)
            if self.objects is not None:
                result.objects_retried = await self.objects.retry()
        except Exception:
            PASSES.labels("error").inc()
            raise
        PASSES.labels("ok").inc()
        return result

    async def expire(self, result: PassResult) -> None:
        """Delete expired requests batch by batch; after each commit delete their objects, end the progress of
        their streamed generations still in flight (:meth:`_end_progress`) and publish ``faulted`` for each
        chat one."""
        while True:
            async with self.pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(_EXPIRE_SQL, self.expiry_batch, CHAT_IMAGE_REFERENCE_SCHEME)
            if self.objects is not None:
                keys = [k for row in rows for k in (row["image_keys"] or ())]
                keys += [chat_messages_key(row["id"]) for row in rows if row["chat_messages_offloaded"]]
                if keys:
                    result.objects_failed += await self.objects.delete(keys)
                    result.objects_deleted += len(keys)
            for row in rows:
                result.leases_ended += await self._end_progress(
                    str(row["id"]), row["streamed_gens"] or (), row["streamed_fakes"] or ()
                )
                EXPIRED_REQUESTS.labels(flag(row["is_chat"])).inc()
                result.expired += 1
                if row["is_chat"] and self.signal is not None:
                    result.expired_chat += 1
                    await publish_chat_event(
                        self.signal,
                        str(row["id"]),
                        "faulted",
                        int(row["generations"]),
                        row["chat_fault_reason"],
                        row["chat_fault_rc"],
                    )
            if len(rows) < self.expiry_batch:
                return

    async def _end_progress(self, request_id: str, gens: Any, fakes: Any) -> int:
        """End the progress of an expired request's generations that were in flight: each real one gets its
        ended entry on the request's stream and its lease deleted, a fake one only its lease deleted (as a
        cancel writes no ended entry for it). Best effort (failures are logged by ``horde_core.chat_stream``);
        returns how many it ended."""
        ended = 0
        for gen in gens:
            ended += bool(await end_stream(self.signal, request_id, str(gen)))
        for gen in fakes:
            ended += bool(await delete_lease(self.signal, str(gen)))
        return ended

    async def prune(self, result: PassResult) -> None:
        """Delete speed samples past their retention."""
        async with self.pool.acquire() as conn:
            result.pruned_samples = int(await conn.fetchval(_PRUNE_SQL) or 0)

    async def fault_stale(self, result: PassResult) -> None:
        """Fault each generation whose lease lapsed through ``FaultGeneration``, and settle each pending real
        generation of a cancelled streamed request through ``SettleCancelledGeneration`` (:meth:`_settle_cancel`);
        a failed call is logged and retried on the next pass."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(_STALE_SQL, self.stale_batch)
        result.stale_found = len(rows)
        for row in rows:
            if row["cancel_settles"]:
                result.cancels_settled += await self._settle_cancel(str(row["id"]))
                continue
            request = settlement_pb2.FaultGenerationRequest(
                generation_id=str(row["id"]), cause=settlement_pb2.FAULT_CAUSE_LEASE_LAPSED
            )
            try:
                response = await self.settlement.FaultGeneration(request, timeout=self.grpc_timeout)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "FaultGeneration failed",
                    extra={"generation_id": str(row["id"]), "code": str(exc.code())},
                )
                continue
            if response.faulted:
                result.stale_faulted += 1
                STALE_ABORTS.labels(flag(row["worker_trusted"]), flag(row["is_chat"])).inc()
            if response.request_faulted:
                result.requests_faulted += 1

    async def _settle_cancel(self, generation_id: str) -> int:
        """Settle one generation of a cancelled streamed request as cancelled on its posted content (submit's
        ``SettleCancelledGeneration``: paid, charged, faulted as cancelled, no worker counter); 1 when this call
        settled it, 0 when it was already settled or the call failed (logged; retried on the next pass)."""
        request = settlement_pb2.SettleCancelledGenerationRequest(generation_id=generation_id)
        try:
            response = await self.settlement.SettleCancelledGeneration(request, timeout=self.grpc_timeout)
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "SettleCancelledGeneration failed",
                extra={"generation_id": generation_id, "code": str(exc.code())},
            )
            return 0
        if not response.settled:
            return 0
        log.info(
            "cancelled generation settled late",
            extra={
                "generation_id": generation_id,
                "character_count": response.character_count,
                "kudos": response.kudos,
            },
        )
        return 1
