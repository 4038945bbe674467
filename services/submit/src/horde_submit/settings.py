"""Submit settings: the shared ``HORDE_*`` settings plus the few knobs only submit reads."""

from __future__ import annotations

from horde_core.settings import HordeSettings


class SubmitSettings(HordeSettings):
    """Settings of the submit process (env ``HORDE_*``).

    ``submit_grpc_enabled`` lets a test or an HTTP-only replica run without the Settlement gRPC server.
    """

    submit_grpc_enabled: bool = True
