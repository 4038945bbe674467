"""Janitor settings: the shared ``HORDE_*`` settings plus the janitor's batch sizes."""

from __future__ import annotations

from horde_core.settings import HordeSettings
from pydantic import Field


class JanitorSettings(HordeSettings):
    """Settings of the janitor process (env ``HORDE_*``).

    ``janitor_interval_seconds`` (shared, default 60) is the pass period; ``janitor_expiry_batch`` bounds the
    expired requests one statement deletes, ``janitor_stale_batch`` the lapsed leases one pass faults.
    """

    janitor_expiry_batch: int = Field(default=1000, ge=1)
    janitor_stale_batch: int = Field(default=1000, ge=1)
    janitor_grpc_timeout_seconds: float = Field(default=10.0, gt=0)
