"""The finished-request log line (docs/openai-front.md#metrics-and-logs): its message, and the same
values bound as the record's fields, which the JSON log and the OpenTelemetry bridge export."""

from __future__ import annotations

import logging

from horde_oai.completions import RequestRecord
from horde_oai.errors import OpenAIError
from horde_oai.waiter import WaitTrace


def test_a_queue_unavailable_line_binds_every_value_it_prints(caplog):
    trace = WaitTrace(
        woke_at=1_700_000_003.5,
        woke_by="generation",
        wakes=2,
        first_read_wait_time=40,
        first_read_eligible_worker_threads=1,
        queue_reason="wait_exceeds_budget",
        wait_time=40,
        eligible_worker_threads=1,
    )
    record = RequestRecord(
        started=1_700_000_000.0,
        streamed=False,
        body={"model": "m", "max_tokens": 600},
        request_id="r-1",
        submitted_at=1_700_000_001.0,
        trace=trace,
    )
    error = OpenAIError(503, "busy", "queue_unavailable", headers={"Retry-After": "30"})
    with caplog.at_level(logging.INFO, logger="horde_oai.requests"):
        record.finish(error)
    (line,) = [r for r in caplog.records if "finished:" in r.getMessage()]
    assert line.getMessage() == (
        "Chat request r-1 finished: streamed=False submitted_at=1700000001.000 woke_at=1700000003.500 "
        "woke_by=generation waited=2.500s status=503 code=queue_unavailable wakes=2 estimated_usage=None "
        "done_without_generation_reads=0 requested_model=m served_model=none retry_after=30 "
        "queue_reason=wait_exceeds_budget wait_time=40 eligible_worker_threads=1 first_read_wait_time=40 "
        "first_read_eligible_worker_threads=1 max_tokens=600 max_tokens_source=client"
    )
    fields = {
        "request_id": "r-1",
        "streamed": False,
        "submitted_at": 1_700_000_001.0,
        "woke_at": 1_700_000_003.5,
        "woke_by": "generation",
        "waited": 2.5,
        "status": 503,
        "code": "queue_unavailable",
        "wakes": 2,
        "estimated_usage": None,
        "done_without_generation_reads": 0,
        "requested_model": "m",
        "served_model": None,
        "retry_after": "30",
        "queue_reason": "wait_exceeds_budget",
        "wait_time": 40,
        "eligible_worker_threads": 1,
        "first_read_wait_time": 40,
        "first_read_eligible_worker_threads": 1,
        "max_tokens": 600,
        "max_tokens_source": "client",
    }
    assert {name: getattr(line, name) for name in fields} == fields


def test_an_unsubmitted_line_has_no_id(caplog):
    record = RequestRecord(started=1_700_000_000.0, streamed=True, body={"models": ["a", "b"]})
    with caplog.at_level(logging.INFO, logger="horde_oai.requests"):
        record.finish(OpenAIError(502, "gone", "HordeUnavailable"))
    (line,) = [r for r in caplog.records if "finished:" in r.getMessage()]
    assert line.getMessage().startswith(
        "Unsubmitted chat request finished: streamed=True submitted_at=none woke_at=none woke_by=None "
        "waited=nones status=502 code=HordeUnavailable"
    )
    assert line.request_id is None and line.requested_model == "a,b" and line.max_tokens_source == "default"


def _errors_count(code: str) -> float:
    from prometheus_client import REGISTRY

    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "horde_oai_requests_errors":
            total += sum(
                s.value for s in metric.samples if s.name.endswith("_total") and s.labels["code"] == code
            )
    return total


def test_an_error_after_the_stream_headers_is_not_a_requests_error():
    before = _errors_count("ChatRequestFaulted")
    record = RequestRecord(started=1_700_000_000.0, streamed=True, body={"model": "m"}, request_id="r-2")
    record.finish(OpenAIError(502, "faulted", "ChatRequestFaulted"), after_headers=True)
    assert _errors_count("ChatRequestFaulted") == before
    record.finish(OpenAIError(502, "faulted", "ChatRequestFaulted"))
    assert _errors_count("ChatRequestFaulted") == before + 1
