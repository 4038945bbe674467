"""gRPC ``horde.dispatch.v1.WorkerPoolService``: worker availability for admission (and anyone else).

Served from the app's lifespan on ``settings.dispatch_grpc_port`` with the standard health service.
"""

from __future__ import annotations

import grpc
from horde.dispatch.v1 import worker_pool_pb2, worker_pool_pb2_grpc
from horde_core.grpc import start_grpc_server
from horde_core.worker_pool import RequestNeeds

from .availability import get_availability, parse_worker_ids
from .state import DispatchState

SERVICE_NAME = "horde.dispatch.v1.WorkerPoolService"


class WorkerPoolServicer(worker_pool_pb2_grpc.WorkerPoolServiceServicer):
    """Answers ``GetAvailability`` from PostgreSQL (see :mod:`horde_dispatch.availability`)."""

    def __init__(self, state: DispatchState) -> None:
        self.state = state

    async def GetAvailability(
        self,
        request: worker_pool_pb2.GetAvailabilityRequest,
        context: grpc.aio.ServicerContext[
            worker_pool_pb2.GetAvailabilityRequest, worker_pool_pb2.GetAvailabilityResponse
        ],
    ) -> worker_pool_pb2.GetAvailabilityResponse:
        """Availability of the request's models. INVALID_ARGUMENT without models, except for a legacy text
        request (``prompt_jobs``: any text worker may serve one without models); UNAVAILABLE when the
        database cannot be reached (:mod:`horde_core.grpc_errors`)."""
        if not request.models and not request.prompt_jobs:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "models must not be empty")
        needs = RequestNeeds.from_proto(request)
        needs.only_worker_ids = parse_worker_ids(needs.only_worker_ids)
        needs.ignore_worker_ids = parse_worker_ids(needs.ignore_worker_ids)
        result = await get_availability(self.state.pool, needs)
        return result.to_proto()


async def start_worker_pool_server(state: DispatchState, host: str, port: int) -> grpc.aio.Server:
    """Start the WorkerPool gRPC server (with grpc.health.v1) on ``host:port``."""

    def register(server: grpc.aio.Server) -> None:
        worker_pool_pb2_grpc.add_WorkerPoolServiceServicer_to_server(WorkerPoolServicer(state), server)

    return await start_grpc_server(host, port, register, [SERVICE_NAME], state.settings)
