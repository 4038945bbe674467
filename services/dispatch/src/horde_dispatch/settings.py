"""Dispatch settings: the shared ``HORDE_*`` settings plus the few knobs only dispatch reads."""

from __future__ import annotations

from horde_contract.bridges import UPTIME_REWARD_SECONDS
from horde_contract.limits import MAX_POP_WAIT_SECONDS
from horde_core.settings import HordeSettings
from pydantic import Field


class DispatchSettings(HordeSettings):
    """Settings of the dispatch process (env ``HORDE_*``).

    ``dispatch_grpc_enabled`` lets a test or a pop-only replica run without the WorkerPool gRPC server.
    ``pop_skipped_scan_limit`` bounds how many queued requests an empty pop inspects to count ``skipped``.
    ``pop_wait_recheck_seconds`` (HORDE_POP_WAIT_RECHECK_SECONDS, 3 s): a long-polling pop retries the queue
    at least this often (±20 %) even when no announcement woke it, the safety net for announcements lost
    while Redis was unreachable and for jobs no announcement names (docs/worker-guide.md#long-poll).
    ``pop_wait_max_seconds`` (HORDE_POP_WAIT_MAX_SECONDS, 20 s): the longest this process holds a pop, whatever
    its ``wait_seconds`` asks (0 turns long polls off); lower it below the idle timeout of a proxy in front.
    ``worker_uptime_reward_seconds`` (HORDE_WORKER_UPTIME_REWARD_SECONDS, 600 s as upstream): a worker earns its
    uptime reward each time its uptime since the last reward passes this many seconds
    (docs/native-api.md#uptime-kudos); tests shorten it.
    ``queue_depth_refresh_seconds`` (HORDE_QUEUE_DEPTH_REFRESH_SECONDS, 15 s): how often this process reads the
    queue depth into ``horde_text_queue_jobs`` (horde_dispatch.queue_depth; 0 turns the reads off).
    ``pop_head_pool_size`` (HORDE_POP_HEAD_POOL_SIZE, 4): connections this process keeps for the pop
    statement's head variant (horde_dispatch.queue.HeadPool), beside the main pool; 0 turns the variant off,
    and so does HORDE_DATABASE_STATEMENT_CACHE_SIZE=0 (behind PgBouncer in transaction mode a session setting
    and a prepared plan would not stay with the connection).
    """

    dispatch_grpc_enabled: bool = True
    pop_skipped_scan_limit: int = Field(default=500, ge=0)
    pop_wait_recheck_seconds: float = Field(default=3.0, gt=0)
    pop_wait_max_seconds: float = Field(default=MAX_POP_WAIT_SECONDS, ge=0, le=MAX_POP_WAIT_SECONDS)
    worker_uptime_reward_seconds: int = Field(default=UPTIME_REWARD_SECONDS, ge=1)
    queue_depth_refresh_seconds: float = Field(default=15.0, ge=0)
    pop_head_pool_size: int = Field(default=4, ge=0)
