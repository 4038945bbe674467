"""gRPC ``horde.dispatch.v1.WorkerPoolService``: worker availability for admission (and anyone else).

Served from the app's lifespan on ``settings.dispatch_grpc_port`` with the standard health service.
"""

from __future__ import annotations

import logging

import grpc
from horde.dispatch.v1 import worker_pool_pb2, worker_pool_pb2_grpc
from horde_core.grpc import start_grpc_server

from .availability import AvailabilityQuery, get_availability, parse_worker_ids
from .state import DispatchState

log = logging.getLogger(__name__)

SERVICE_NAME = "horde.dispatch.v1.WorkerPoolService"


class WorkerPoolServicer(worker_pool_pb2_grpc.WorkerPoolServiceServicer):  # type: ignore[misc]  # generated gRPC base is untyped
    """Answers ``GetAvailability`` from PostgreSQL (see :mod:`horde_dispatch.availability`)."""

    def __init__(self, state: DispatchState) -> None:
        self.state = state

    async def GetAvailability(
        self, request: worker_pool_pb2.GetAvailabilityRequest, context: grpc.aio.ServicerContext
    ) -> worker_pool_pb2.GetAvailabilityResponse:
        """Availability of the request's models. INVALID_ARGUMENT without models; UNAVAILABLE when the
        database cannot be reached."""
        if not request.models:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "models must not be empty")
        query = AvailabilityQuery(
            models=list(request.models),
            required_features=list(request.required_features),
            max_length=max(0, request.max_length),
            max_context_length=max(0, request.max_context_length),
            tools_temperature=request.tools_temperature if request.HasField("tools_temperature") else None,
            has_images=request.has_images,
            only_worker_ids=parse_worker_ids(request.only_worker_ids),
            ignore_worker_ids=parse_worker_ids(request.ignore_worker_ids),
            trusted_workers=request.trusted_workers,
            validated_backends=request.validated_backends,
            slow_workers=request.slow_workers,
            requester_user_id=request.requester_user_id,
        )
        try:
            result = await get_availability(self.state.pool, query)
        except (OSError, ConnectionError) as exc:
            log.warning("GetAvailability: database unreachable", exc_info=True)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"database unreachable: {exc}")
        response = worker_pool_pb2.GetAvailabilityResponse(
            known_workers=result.known_workers,
            serving_workers=result.serving_workers,
            max_chat_context_length=result.max_chat_context_length,
            max_chat_length=result.max_chat_length,
            eligible_workers=result.eligible_workers,
            eligible_threads=result.eligible_threads,
            tokens_per_second=result.tokens_per_second,
        )
        if result.declaration_gap is not None:
            response.declaration_gap.missing_declarations.extend(
                result.declaration_gap["missing_declarations"]
            )
            response.declaration_gap.exceeded_limits.extend(result.declaration_gap["exceeded_limits"])
        return response


async def start_worker_pool_server(state: DispatchState, host: str, port: int) -> grpc.aio.Server:
    """Start the WorkerPool gRPC server (with grpc.health.v1) on ``host:port``."""

    def register(server: grpc.aio.Server) -> None:
        worker_pool_pb2_grpc.add_WorkerPoolServiceServicer_to_server(WorkerPoolServicer(state), server)

    return await start_grpc_server(host, port, register, [SERVICE_NAME])
