"""Run the janitor process: ``python -m horde_janitor`` (HTTP on HORDE_JANITOR_HTTP_PORT, 7104: health and
metrics)."""

from __future__ import annotations

from horde_core.runner import serve
from horde_core.tracing import configure_tracing

from horde_janitor.app import SERVICE, create_app
from horde_janitor.settings import JanitorSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM/SIGINT."""
    settings = JanitorSettings()
    configure_tracing(SERVICE)  # before the app is built; off unless OTEL_EXPORTER_OTLP_* is set
    serve(create_app(settings), settings, settings.janitor_http_port, SERVICE)


if __name__ == "__main__":
    main()
