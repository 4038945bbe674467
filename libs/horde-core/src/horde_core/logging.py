"""JSON logging for every process (python-json-logger on the stdlib logging tree).

Records are handed to a :class:`logging.handlers.QueueListener` thread that formats and writes them, so a log
line never makes the event loop wait on a full stderr pipe (a slow log collector, or honcho under load), and
its JSON formatting runs off the request path (one INFO line per submit was a tenth of submit's CPU).
The backlog is bounded (:data:`LOG_BACKLOG_RECORDS`): while stderr is stalled, records past it are dropped and
counted (``horde_log_records_dropped_total``), so a flood of log lines cannot grow the process's memory.

Every line carries ``request_id``: the id of the HTTP request (or gRPC call) whose task logged it
(:mod:`horde_core.request_id`), null outside one; a horde request's own id given in ``extra`` as ``request_id``
is written as ``horde_request_id``. It is read where the record is made (:class:`RequestIdFilter` on
the queueing handler), not in the writer thread, which sees no request's context.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys
from typing import Any

from prometheus_client import Counter
from pythonjsonlogger.json import JsonFormatter

from horde_core.request_id import current_request_id

#: Records waiting for the writer thread at most; past it a record is dropped (and counted).
LOG_BACKLOG_RECORDS = 10_000
DROPPED = Counter(
    "horde_log_records_dropped_total", "Log records dropped because the writer's backlog was full"
)

#: The logger tree of the OpenTelemetry API, SDK, exporters and instrumentations: ERROR and above only.
OPENTELEMETRY_LOGGER = "opentelemetry"

#: How long stopping waits for room for its sentinel in a full backlog, then for the backlog to be written.
STOP_WAIT_SECONDS = 2.0
STOP_JOIN_SECONDS = 10.0

_listener: logging.handlers.QueueListener | None = None


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` to the current request id (None outside a request).

    A ``request_id`` a call site gave in ``extra`` is a horde request's id (a waiting prompt's uuid: the chat
    request a line is about), not the correlation id: it is kept as ``horde_request_id``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        given = record.__dict__.get("request_id")
        if given is not None and not hasattr(record, "horde_request_id"):
            record.horde_request_id = given
        record.request_id = current_request_id()
        return True


class _RecordQueueHandler(logging.handlers.QueueHandler):
    """Puts the record itself on the queue: the listener is a thread of this process, so the record needs no
    pickling, and its ``exc_info`` and ``extra`` fields reach the JSON formatter intact."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            DROPPED.inc()


class _Listener(logging.handlers.QueueListener):
    """Stops without hanging on a stalled stderr: the stop sentinel waits for room in the full backlog at most
    :data:`STOP_WAIT_SECONDS` and the writing of the backlog at most :data:`STOP_JOIN_SECONDS`; past that the
    (daemon) writer thread is left behind."""

    def __init__(self, records: queue.Queue[Any], handler: logging.Handler) -> None:
        super().__init__(records, handler, respect_handler_level=True)
        self.records = records

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            self.records.put(None, timeout=STOP_WAIT_SECONDS)  # None is the listener's sentinel
        except queue.Full:
            self._thread = None
            return
        self._thread.join(STOP_JOIN_SECONDS)  # writes what is still queued (a stalled stderr: gives up)
        self._thread = None


def _stop_listener() -> None:
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None


def configure_logging(service: str, level: str = "INFO", json_output: bool = True) -> None:
    """Route the root logger to stderr, as one JSON object per line carrying ``service`` and ``request_id``,
    through a writer thread (see the module docstring); what is queued is written at interpreter exit.

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
    records: queue.Queue[logging.LogRecord] = queue.Queue(maxsize=LOG_BACKLOG_RECORDS)
    _listener = _Listener(records, handler)
    _listener.start()
    root = logging.getLogger()
    queued = _RecordQueueHandler(records)
    queued.addFilter(RequestIdFilter())
    root.handlers[:] = [queued]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # OpenTelemetry (horde_core.tracing) warns once per malformed input it parses (e.g. each entry of a
    # client's baggage header, or an attribute value of a type it drops): a client could flood the backlog.
    # Its errors stay (the exporter's "Failed to export").
    logging.getLogger(OPENTELEMETRY_LOGGER).setLevel(logging.ERROR)


atexit.register(_stop_listener)
