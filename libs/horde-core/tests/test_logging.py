"""configure_logging: JSON lines on stderr, written by the listener thread with extra fields and tracebacks."""

from __future__ import annotations

import io
import json
import logging

import pytest
from horde_core import logging as horde_logging


def test_records_reach_stderr_as_json_with_extra_and_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        horde_logging.configure_logging("svc", "INFO", json_output=True)
        horde_logging.configure_logging(
            "svc", "INFO", json_output=True
        )  # idempotent: one handler, one thread
        assert len(root.handlers) == 1
        log = logging.getLogger("horde.test")
        log.info("horde.job_submit.done", extra={"generation_id": "g-1", "kudos": 12.5})
        log.debug("not at INFO")
        try:
            raise ValueError("boom")
        except ValueError:
            log.warning("failed", exc_info=True)
        horde_logging._stop_listener()  # flushes what the thread has queued
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    lines = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert [line["message"] for line in lines] == ["horde.job_submit.done", "failed"]
    done, failed = lines
    assert done["service"] == "svc" and done["level"] == "INFO" and done["name"] == "horde.test"
    assert done["generation_id"] == "g-1" and done["kudos"] == 12.5
    assert failed["level"] == "WARNING" and "ValueError: boom" in failed["exc_info"]


def test_a_stalled_stderr_keeps_a_bounded_backlog_and_counts_what_it_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    release = threading.Event()

    class Stalled(io.StringIO):
        def write(self, text: str) -> int:
            release.wait(10)  # nobody reads the pipe
            return super().write(text)

    stderr = Stalled()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setattr(horde_logging, "LOG_BACKLOG_RECORDS", 50)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    dropped = horde_logging.DROPPED._value.get()
    try:
        horde_logging.configure_logging("svc", "INFO", json_output=True)
        log = logging.getLogger("horde.flood")
        for i in range(1_000):
            log.info("line", extra={"i": i})
        # the writer holds one record, the backlog 50: the rest were dropped, none kept
        assert horde_logging.DROPPED._value.get() - dropped >= 1_000 - 51
        release.set()
        horde_logging._stop_listener()
    finally:
        release.set()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    written = stderr.getvalue().splitlines()
    assert 1 <= len(written) <= 51


def test_opentelemetry_logs_errors_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry's per-input warnings (one per entry of a client's baggage header) never reach the backlog;
    its errors (the exporter's "Failed to export") do."""
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    root = logging.getLogger()
    otel = logging.getLogger("opentelemetry")
    saved_handlers, saved_level, saved_otel = root.handlers[:], root.level, otel.level
    try:
        horde_logging.configure_logging("svc", "DEBUG", json_output=True)
        logging.getLogger("opentelemetry.baggage.propagation").warning("Baggage entry with key `x` ...")
        logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter").error("Failed to export")
        logging.getLogger("horde.test").warning("kept")
        horde_logging._stop_listener()
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        otel.setLevel(saved_otel)
    messages = [json.loads(line)["message"] for line in stderr.getvalue().splitlines()]
    assert messages == ["Failed to export", "kept"]
