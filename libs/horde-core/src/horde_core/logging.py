"""JSON logging for every process (python-json-logger on the stdlib logging tree)."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter


def configure_logging(service: str, level: str = "INFO", json_output: bool = True) -> None:
    """Route the root logger to stderr, as one JSON object per line carrying ``service``.

    Idempotent: a second call replaces the handler rather than adding one.
    """
    handler = logging.StreamHandler(sys.stderr)
    if json_output:
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"levelname": "level", "asctime": "time"},
                static_fields={"service": service},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
