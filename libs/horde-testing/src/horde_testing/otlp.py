"""An OTLP/HTTP trace receiver for tests: the spans processes export, kept in memory.

Point a process at it with ``OTEL_EXPORTER_OTLP_ENDPOINT=<receiver.endpoint>`` (horde_core.tracing): the
exporter posts protobuf ``ExportTraceServiceRequest`` bodies to ``/v1/traces``, which the receiver decodes
(opentelemetry-proto) into :class:`ReceivedSpan` rows, answered 200 with an empty ``ExportTraceServiceResponse``.

    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        ...  # run processes with env
        spans = receiver.wait_for(lambda spans: [s for s in spans if s.name == "GET /x"], 10, "GET /x")
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["OtlpReceiver", "ReceivedSpan"]

T = TypeVar("T")

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span. Ids are lowercase hex (``parent_id`` ``""`` for a root span); ``kind`` is
    ``SERVER``, ``CLIENT``, ``INTERNAL``, ``PRODUCER`` or ``CONSUMER``; ``scope`` is the instrumentation's name
    (``opentelemetry.instrumentation.httpx``, …); ``links`` are ``(trace_id, span_id)`` pairs."""

    service: str
    scope: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()
    start_ns: int = 0
    end_ns: int = 0


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    pair: KeyValue
    for pair in pairs:
        found[pair.key] = _value(pair.value)
    return found


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one serialized ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        scope=scope_spans.scope.name,
                        name=span.name,
                        kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


class OtlpReceiver:
    """A ThreadingHTTPServer on ``host`` (a free port) serving ``POST /v1/traces``; :meth:`spans` is what it
    received so far, in arrival order. Bodies it cannot decode are answered 400 and counted in
    :attr:`errors`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.errors: list[str] = []
        self.exports = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                try:
                    if self.path != TRACES_PATH:
                        raise ValueError(f"unexpected path {self.path}")
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding == "deflate":
                        body = zlib.decompress(body)
                    spans = decode(body)
                except Exception as exc:  # a test failure to report, whatever the error
                    with receiver._lock:
                        receiver.errors.append(f"{type(exc).__name__}: {exc}")
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver._spans.extend(spans)
                    receiver.exports += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (spans are posted to ``<endpoint>/v1/traces``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far (a copy)."""
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], T | None], timeout: float, what: str, poll: float = 0.05
    ) -> T:
        """Poll :meth:`spans` until ``found(spans)`` returns something truthy, and return it; AssertionError
        naming ``what`` (and the spans so far) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = found(self.spans())
            if result:
                return result
            if time.monotonic() >= deadline:
                names = sorted({f"{s.service}: {s.name}" for s in self.spans()})
                raise AssertionError(
                    f"no {what} within {timeout}s; errors {self.errors}; received {len(names)} span names: {names}"
                )
            time.sleep(poll)
