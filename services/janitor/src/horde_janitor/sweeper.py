"""The janitor's pass: request expiry and lapsed job leases (spec: **Completion signal**, **Job lease**;
text path §7).

Each pass, every ``janitor_interval_seconds``:

1. **Expiry.** Requests past their expiry are deleted in batches (``FOR UPDATE SKIP LOCKED``, so replicas split
   the work and never claim one row twice); their generations cascade away unpaid and their kudos holds are
   released in the same statement. After the delete commits, each deleted chat request gets a ``faulted``
   signal carrying its stored fault reason and rc, so a client woken by it finds the settled state (404).
2. **Lapsed leases.** Pending generations older than their ``job_ttl`` are faulted through submit's
   ``SettlementService.FaultGeneration`` (faults are settlement's rules: restart, worker counters, the request
   fault past FAULTED_GENERATIONS_LIMIT and its signal). The RPC is a compare-and-set, so two replicas that
   find the same generation fault it once; ``horde.text.stale_aborts`` counts only the fault that happened.
3. **Objects.** The images (``horde-r2://`` references in the deleted rows' messages) and offloaded messages of
   the expired chat requests are deleted after the commit; a key that does not delete is queued in
   ``horde:chat:image_delete_retry``, and each pass retries up to 1000 queued keys.
4. **Speed samples.** model_performances older than an hour and worker_performances older than a day are
   deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg
import grpc
import redis.asyncio as redis
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_contract.limits import CHAT_IMAGE_REFERENCE_SCHEME
from horde_core.redis_keys import publish_chat_event
from horde_store.objects import chat_messages_key

from horde_janitor.metrics import EXPIRED_REQUESTS, PASSES, STALE_ABORTS, flag
from horde_janitor.objects import ObjectCleaner

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
), gone AS (
    DELETE FROM waiting_prompts w USING doomed d WHERE w.id = d.id
    RETURNING w.id, w.is_chat, w.chat_fault_reason, w.chat_fault_rc, w.chat_messages_offloaded,
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
       (SELECT count(*) FROM released) AS released_holds
  FROM gone LEFT JOIN finished ON finished.wp_id = gone.id
"""

# Speed samples: model_performances are kept one hour (text path §4); worker_performances a day (workers.speed
# keeps the mean of the newest 20 samples, written at each submit).
_PRUNE_SQL = """
WITH models AS (
    DELETE FROM model_performances WHERE created < now() - interval '1 hour' RETURNING 1
), workers AS (
    DELETE FROM worker_performances WHERE created < now() - interval '1 day' RETURNING 1
)
SELECT (SELECT count(*) FROM models) + (SELECT count(*) FROM workers)
"""

_STALE_SQL = """
SELECT g.id, wp.is_chat, COALESCE(u.trusted, false) AS worker_trusted
  FROM processing_gens g
  JOIN waiting_prompts wp ON wp.id = g.wp_id
  JOIN workers w ON w.id = g.worker_id
  LEFT JOIN users u ON u.id = w.user_id
 WHERE g.generation IS NULL AND NOT g.faulted
   AND g.started_at + make_interval(secs => g.job_ttl) < now()
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
        settlement: settlement_pb2_grpc.SettlementServiceStub,
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
        """Delete expired requests batch by batch; publish ``faulted`` for each chat one after its commit."""
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

    async def prune(self, result: PassResult) -> None:
        """Delete speed samples past their retention."""
        async with self.pool.acquire() as conn:
            result.pruned_samples = int(await conn.fetchval(_PRUNE_SQL) or 0)

    async def fault_stale(self, result: PassResult) -> None:
        """Fault each generation whose lease lapsed through ``FaultGeneration``; a failed call is logged and
        retried on the next pass."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(_STALE_SQL, self.stale_batch)
        result.stale_found = len(rows)
        for row in rows:
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
