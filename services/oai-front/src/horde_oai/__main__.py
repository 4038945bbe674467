"""Run the OpenAI-compatible front: ``python -m horde_oai`` (HTTP on ``HORDE_OAI_HTTP_PORT``, 7002)."""

from __future__ import annotations

from horde_core.runner import serve

from horde_oai.app import create_app
from horde_oai.settings import OaiSettings


def main() -> None:
    settings = OaiSettings()
    serve(create_app(settings), settings, settings.oai_http_port, "horde-oai")


if __name__ == "__main__":
    main()
