"""Run the janitor process: ``python -m horde_janitor`` (HTTP ``HORDE_JANITOR_HTTP_PORT``: health and metrics)."""

from __future__ import annotations

from horde_core.runner import serve

from horde_janitor.app import create_app
from horde_janitor.settings import JanitorSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM."""
    settings = JanitorSettings()
    serve(create_app(settings), settings, settings.janitor_http_port, "janitor")


if __name__ == "__main__":
    main()
