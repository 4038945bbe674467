"""JSON logging for every process (python-json-logger on the stdlib logging tree).

Records are handed to a :class:`logging.handlers.QueueListener` thread that formats and writes them, so a log
line never makes the event loop wait on a full stderr pipe (a slow log collector, or honcho under load), and
its JSON formatting runs off the request path (issue 10: one INFO line per submit was a tenth of submit's CPU).
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys

from pythonjsonlogger.json import JsonFormatter

_listener: logging.handlers.QueueListener | None = None


class _RecordQueueHandler(logging.handlers.QueueHandler):
    """Puts the record itself on the queue: the listener is a thread of this process, so the record needs no
    pickling, and its ``exc_info`` and ``extra`` fields reach the JSON formatter intact."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def _stop_listener() -> None:
    global _listener
    if _listener is not None:
        _listener.stop()  # writes what is still queued
        _listener = None


def configure_logging(service: str, level: str = "INFO", json_output: bool = True) -> None:
    """Route the root logger to stderr, as one JSON object per line carrying ``service``, through a writer
    thread (see the module docstring); what is queued is written at interpreter exit.

    Idempotent: a second call replaces the handler and its thread rather than adding one.
    """
    global _listener
    _stop_listener()
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
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(records, handler, respect_handler_level=True)
    _listener.start()
    root = logging.getLogger()
    root.handlers[:] = [_RecordQueueHandler(records)]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


atexit.register(_stop_listener)
