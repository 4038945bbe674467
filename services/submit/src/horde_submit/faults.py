"""Fault rules shared by the faulted submit and ``SettlementService.FaultGeneration`` (see
docs/native-api.md#submit, #job-lease; docs/native-api.md#expiry, #text-route).

A fault and the job's restart commit together; the request faults once more than FAULTED_GENERATIONS_LIMIT (2)
of its real generations faulted, and a chat request then publishes ``faulted`` with its stored fault reason and rc,
after the commit. A restarted job is announced to the waiting pops after the commit (docs/worker-guide.md#long-poll).
A paused worker's fake generation is only marked faulted (no restart, no worker counter, no request fault; see
docs/native-api.md#workers).
"""

from __future__ import annotations

import uuid

import asyncpg
import redis.asyncio as redis
from horde_core import queue_announce
from horde_core.chat_stream import end_stream
from horde_core.metrics import flag, size_bucket
from horde_core.signals import ChatSignal, publish_chat_signals

from horde_submit import generations as gens
from horde_submit.metrics import GATE_SHADOW_OUTCOMES


async def apply_fault(
    pool: asyncpg.Pool, signal: redis.Redis | None, generation_id: uuid.UUID, *, lapsed: bool = False
) -> gens.FaultResult:
    """Fault the pending generation, restart its job unless the request was cancelled, update the worker's
    counters and fault the request past the limit, in one transaction; then announce the restarted job on
    :data:`horde_core.queue_announce.QUEUE_ANNOUNCE_CHANNEL` (best effort, never raises), end a streamed
    generation's progress stream and publish ``faulted`` when this fault faulted a chat request.

    ``lapsed`` (a lapsed lease) counts an over-capacity legacy job as aborted rather than faulted. Returns
    ``faulted=False`` (and writes nothing) when the generation was not pending."""
    async with pool.acquire() as conn, conn.transaction():
        result = await gens.fault_and_restart(conn, generation_id)
    if result.restarted and result.wp_id is not None:
        # The job is back in the queue: a waiting pop may take it now rather than at its next periodic retry.
        await queue_announce.publish(
            signal,
            queue_announce.announcement(
                result.wp_id,
                result.models,
                is_chat=result.is_chat,
                max_length=result.max_length,
                max_context_length=result.max_context_length,
            ),
        )
    if result.over_capacity and not result.is_chat:
        GATE_SHADOW_OUTCOMES.labels(
            flag(result.worker_trusted), size_bucket(result.max_length), "aborted" if lapsed else "faulted"
        ).inc()
    if result.streamed and result.wp_id is not None:
        await end_stream(signal, str(result.wp_id), str(generation_id))
    if result.request_faulted and result.is_chat and result.wp_id is not None:
        await publish_chat_signals(
            signal,
            [
                ChatSignal(
                    str(result.wp_id), "faulted", result.generations, result.fault_reason, result.fault_rc
                )
            ],
        )
    return result
