"""Run the submit process: ``python -m horde_submit`` (HTTP ``HORDE_SUBMIT_HTTP_PORT``, gRPC
``HORDE_SUBMIT_GRPC_PORT``)."""

from __future__ import annotations

from horde_core.runner import serve

from horde_submit.app import create_app
from horde_submit.settings import SubmitSettings


def main() -> None:
    """Build the settings and the app, then serve until SIGTERM."""
    settings = SubmitSettings()
    serve(create_app(settings), settings, settings.submit_http_port, "submit")


if __name__ == "__main__":
    main()
