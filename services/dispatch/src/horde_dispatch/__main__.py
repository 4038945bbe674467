"""Run the dispatch process: ``python -m horde_dispatch`` / ``horde-dispatch`` (HTTP on HORDE_DISPATCH_HTTP_PORT,
7102; gRPC WorkerPool on HORDE_DISPATCH_GRPC_PORT, 7202)."""

from __future__ import annotations

from horde_core.runner import serve
from horde_core.tracing import configure_tracing

from horde_dispatch.app import SERVICE, create_app
from horde_dispatch.settings import DispatchSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM/SIGINT."""
    settings = DispatchSettings()
    configure_tracing(SERVICE)  # before the app is built; off unless OTEL_EXPORTER_OTLP_* is set
    serve(create_app(settings), settings, settings.dispatch_http_port, SERVICE)


if __name__ == "__main__":
    main()
