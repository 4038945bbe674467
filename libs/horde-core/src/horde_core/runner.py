"""Run one service process: uvicorn with graceful shutdown on SIGTERM/SIGINT.

uvicorn handles the signals: it stops accepting, lets in-flight requests finish for up to
``shutdown_grace_seconds``, then runs the app's lifespan shutdown (where a service stops its gRPC server,
background loops and pools).
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from horde_core.logging import configure_logging
from horde_core.settings import HordeSettings


def serve(app: FastAPI, settings: HordeSettings, port: int, service: str) -> None:
    """Configure logging and serve ``app`` on ``settings.bind_host:port`` until a signal stops it."""
    configure_logging(service, settings.log_level, settings.log_json)
    uvicorn.run(
        app,
        host=settings.bind_host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        lifespan="on",
    )
