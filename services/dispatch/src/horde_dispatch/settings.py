"""Dispatch settings: the shared ``HORDE_*`` settings plus the few knobs only dispatch reads."""

from __future__ import annotations

from horde_core.settings import HordeSettings
from pydantic import Field


class DispatchSettings(HordeSettings):
    """Settings of the dispatch process (env ``HORDE_*``).

    ``dispatch_grpc_enabled`` lets a test or a pop-only replica run without the WorkerPool gRPC server.
    ``pop_skipped_scan_limit`` bounds how many queued requests an empty pop inspects to count ``skipped``.
    """

    dispatch_grpc_enabled: bool = True
    pop_skipped_scan_limit: int = Field(default=500, ge=0)
