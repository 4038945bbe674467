"""Run the admission process: ``python -m horde_admission`` (HTTP on HORDE_ADMISSION_HTTP_PORT, 7101)."""

from __future__ import annotations

from horde_core.runner import serve
from horde_core.tracing import configure_tracing

from horde_admission.app import SERVICE, create_app
from horde_admission.settings import AdmissionSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM/SIGINT."""
    settings = AdmissionSettings()
    configure_tracing(SERVICE)  # before the app is built; off unless OTEL_EXPORTER_OTLP_* is set
    serve(create_app(settings), settings, settings.admission_http_port, SERVICE)


if __name__ == "__main__":
    main()
