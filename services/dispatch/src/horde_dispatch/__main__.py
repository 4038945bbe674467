"""``python -m horde_dispatch`` / ``horde-dispatch``: serve dispatch on ``HORDE_DISPATCH_HTTP_PORT`` (HTTP)
and ``HORDE_DISPATCH_GRPC_PORT`` (gRPC WorkerPool)."""

from __future__ import annotations

from horde_core.runner import serve

from .app import SERVICE, create_app
from .settings import DispatchSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM/SIGINT."""
    settings = DispatchSettings()
    serve(create_app(settings), settings, settings.dispatch_http_port, SERVICE)


if __name__ == "__main__":
    main()
