"""Run the submit process: ``python -m horde_submit`` (HTTP on HORDE_SUBMIT_HTTP_PORT, 7103; gRPC Settlement on
HORDE_SUBMIT_GRPC_PORT, 7203)."""

from __future__ import annotations

from horde_core.runner import serve
from horde_core.tracing import configure_tracing

from horde_submit.app import SERVICE, create_app
from horde_submit.settings import SubmitSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM/SIGINT."""
    settings = SubmitSettings()
    configure_tracing(SERVICE)  # before the app is built; off unless OTEL_EXPORTER_OTLP_* is set
    serve(create_app(settings), settings, settings.submit_http_port, SERVICE)


if __name__ == "__main__":
    main()
