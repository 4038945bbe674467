"""``horde.submit.v1.SettlementService``: settlement rules other stages ask submit to apply.

- ``FaultGeneration``: fault a pending generation (a lapsed lease, from the janitor), restart its job unless its
  request was cancelled, fault the request past FAULTED_GENERATIONS_LIMIT and publish ``faulted`` (see
  docs/native-api.md#job-lease, #submit); a fake generation is only marked faulted (docs/native-api.md#workers). Idempotent: a generation that is no longer pending answers ``faulted=false``.
  A pending generation of a cancelled streamed request is not faulted as a dropped job: it is settled as
  cancelled on its posted content, as the cancel would have settled it, and answers ``faulted=false`` (the
  cancel's settlement call failed, and the lease lapsed after the worker stopped as it was told).
- ``SettleCancelledGeneration``: settle a streamed generation in flight at a cancel on the content its worker
  posted, and fault it as cancelled (docs/native-api.md#pricing). ``settled=false`` when it was no longer pending (or
  is not stored). A pending generation whose request was not cancelled, or that does not stream progress, is
  refused with ``FAILED_PRECONDITION``: this call settles only what a cancel settles, so a caller cannot use it
  to end (and price) a job its requester still waits for.
"""

from __future__ import annotations

import logging

import asyncpg
import grpc
import redis.asyncio as redis
from horde.submit.v1 import settlement_pb2, settlement_pb2_grpc
from horde_contract import TextModelReference
from horde_core.grpc import ServicerRegistrar

from horde_submit import generations as gens
from horde_submit.faults import apply_fault
from horde_submit.settle import settle_cancelled_context

log = logging.getLogger(__name__)

SERVICE_NAME = "horde.submit.v1.SettlementService"


class SettlementServicer(settlement_pb2_grpc.SettlementServiceServicer):
    """Serves the settlement RPCs against the shared pool and signal client."""

    def __init__(
        self, pool: asyncpg.Pool, signal: redis.Redis | None, models: TextModelReference | None = None
    ) -> None:
        self.pool = pool
        self.signal = signal
        self.models = models if models is not None else TextModelReference()

    async def FaultGeneration(
        self,
        request: settlement_pb2.FaultGenerationRequest,
        context: grpc.aio.ServicerContext[
            settlement_pb2.FaultGenerationRequest, settlement_pb2.FaultGenerationResponse
        ],
    ) -> settlement_pb2.FaultGenerationResponse:
        gen_id = gens.parse_uuid(request.generation_id)
        if gen_id is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "generation_id is not a UUID")
        assert gen_id is not None
        lapsed = request.cause == settlement_pb2.FAULT_CAUSE_LEASE_LAPSED
        async with self.pool.acquire() as conn:
            ctx = await gens.load_context(conn, gen_id)
        if ctx is None or not ctx.pending:
            return settlement_pb2.FaultGenerationResponse(faulted=False, request_faulted=False)
        if ctx.cancel_settles:
            await settle_cancelled_context(
                self.pool, self.signal, self.models, ctx, via="lapse" if lapsed else "fault"
            )
            return settlement_pb2.FaultGenerationResponse(faulted=False, request_faulted=False)
        result = await apply_fault(self.pool, self.signal, gen_id, lapsed=lapsed)
        if result.faulted:
            log.info(
                "generation faulted",
                extra={
                    "generation_id": str(gen_id),
                    "cause": settlement_pb2.FaultCause.Name(request.cause),
                    "request_faulted": result.request_faulted,
                },
            )
        return settlement_pb2.FaultGenerationResponse(
            faulted=result.faulted, request_faulted=result.request_faulted
        )

    async def SettleCancelledGeneration(
        self,
        request: settlement_pb2.SettleCancelledGenerationRequest,
        context: grpc.aio.ServicerContext[
            settlement_pb2.SettleCancelledGenerationRequest, settlement_pb2.SettleCancelledGenerationResponse
        ],
    ) -> settlement_pb2.SettleCancelledGenerationResponse:
        gen_id = gens.parse_uuid(request.generation_id)
        if gen_id is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "generation_id is not a UUID")
        assert gen_id is not None
        async with self.pool.acquire() as conn:
            ctx = await gens.load_context(conn, gen_id)
        if ctx is not None and ctx.pending and not ctx.request_cancelled:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Generation {gen_id}: its request was not cancelled, so it is not settled as cancelled.",
            )
        if ctx is not None and ctx.pending and not ctx.streamed:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Generation {gen_id} does not stream progress: a cancel does not settle it.",
            )
        if ctx is None:
            return settlement_pb2.SettleCancelledGenerationResponse(settled=False)
        result = await settle_cancelled_context(self.pool, self.signal, self.models, ctx)
        return settlement_pb2.SettleCancelledGenerationResponse(
            settled=result.settled, character_count=result.character_count, kudos=result.kudos
        )


def registrar(servicer: SettlementServicer) -> ServicerRegistrar:
    """A register callback for :func:`horde_core.grpc.start_grpc_server`."""

    def register(server: grpc.aio.Server) -> None:
        settlement_pb2_grpc.add_SettlementServiceServicer_to_server(servicer, server)

    return register
