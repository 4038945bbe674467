"""The process-wide handles a request handler needs, built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from horde_admission.operator_controls import OperatorControls

if TYPE_CHECKING:
    import asyncpg
    import grpc
    from horde.dispatch.v1.worker_pool_pb2_grpc import WorkerPoolServiceAsyncStub
    from horde.submit.v1.settlement_pb2_grpc import SettlementServiceAsyncStub
    from horde_contract import TextModelReference
    from redis.asyncio import Redis

    from horde_admission.availability import AvailabilityMemo
    from horde_admission.creation import CompetingQueueMemo
    from horde_admission.images import ImageFetcher, ImageStore
    from horde_admission.ratelimit import RateLimiter
    from horde_admission.settings import AdmissionSettings
    from horde_admission.status import QueueAheadMemo


@dataclass
class AdmissionState:
    """Stores and clients shared by every handler of one process (no request state lives here)."""

    settings: AdmissionSettings
    pool: asyncpg.Pool
    redis: Redis
    signals: Redis
    dispatch_channel: grpc.aio.Channel
    worker_pool: WorkerPoolServiceAsyncStub
    submit_channel: grpc.aio.Channel
    settlement: SettlementServiceAsyncStub
    limiter: RateLimiter
    fetcher: ImageFetcher
    images: ImageStore
    #: The text model reference (HORDE_TEXT_MODEL_REFERENCE), loaded once when the app is built.
    model_reference: TextModelReference
    #: The legacy text route's recent availability answers (HORDE_TEXT_AVAILABILITY_MEMO_SECONDS).
    availability_memo: AvailabilityMemo
    #: Each request's queue position and the work ahead, for its status reads (HORDE_STATUS_QUEUE_MEMO_SECONDS).
    queue_ahead_memo: QueueAheadMemo
    #: The free allowance's competing queue by eligible workers (HORDE_COMPETING_QUEUE_MEMO_SECONDS).
    competing_queue_memo: CompetingQueueMemo
    #: Maintenance mode's cached read and the moderation filter (docs/native-api.md#operator-controls).
    operator_controls: OperatorControls = field(default_factory=OperatorControls)


def get_state(request: Request) -> AdmissionState:
    """The :class:`AdmissionState` of the app serving ``request``."""
    state: AdmissionState = request.app.state.admission
    return state
