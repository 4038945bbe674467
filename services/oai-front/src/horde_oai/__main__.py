"""Run the OpenAI-compatible front: ``python -m horde_oai`` (HTTP on HORDE_OAI_HTTP_PORT, 7002)."""

from __future__ import annotations

from horde_core.runner import serve
from horde_core.tracing import configure_tracing

from horde_oai.app import SERVICE, create_app
from horde_oai.settings import OaiSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM/SIGINT."""
    settings = OaiSettings()
    configure_tracing(SERVICE)  # before the app is built; off unless OTEL_EXPORTER_OTLP_* is set
    serve(create_app(settings), settings, settings.oai_http_port, SERVICE)


if __name__ == "__main__":
    main()
