"""Run one service process: uvicorn with graceful shutdown on SIGTERM/SIGINT.

uvicorn handles the signals: it stops accepting, lets in-flight requests finish for up to
``shutdown_grace_seconds``, then runs the app's lifespan shutdown (where a service stops its gRPC server,
background loops and pools).

Client addresses: uvicorn rewrites a request's client address from ``X-Forwarded-For`` only when its peer is
one of ``HORDE_FORWARDED_ALLOW_IPS`` (the ingress). Unset, nobody is trusted and the proxy-headers middleware
is off: uvicorn's own default (trust 127.0.0.1, or the ``FORWARDED_ALLOW_IPS`` variable) is never used, so
a process on loopback cannot choose the address its per-address limits count.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI

from horde_core.logging import configure_logging
from horde_core.settings import HordeSettings


def uvicorn_options(settings: HordeSettings) -> dict[str, Any]:
    """The uvicorn options every service runs with, from its settings."""
    trusted = settings.trusted_proxies()
    return {
        "host": settings.bind_host,
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": int(settings.shutdown_grace_seconds),
        "lifespan": "on",
        # Only a configured proxy's X-Forwarded-For (and -Proto) counts; "" is never None, so uvicorn does not
        # fall back to 127.0.0.1 or $FORWARDED_ALLOW_IPS.
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": ",".join(trusted),
        # Our Server header says nothing a client needs.
        "server_header": False,
    }


def serve(app: FastAPI, settings: HordeSettings, port: int, service: str) -> None:
    """Configure logging and serve ``app`` on ``settings.bind_host:port`` until a signal stops it."""
    configure_logging(service, settings.log_level, settings.log_json)
    uvicorn.run(app, port=port, **uvicorn_options(settings))
