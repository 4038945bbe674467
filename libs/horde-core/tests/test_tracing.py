"""Tracing (horde_core.tracing): off by default with nothing imported, the environment's rules, and when on one
trace across an HTTP server span, its httpx and gRPC client spans and the gRPC server span, flushed at exit.

Turning tracing on sets the process's global tracer provider and patches client libraries, so every test that
does runs in a fresh interpreter (:func:`run_script`); the rules and the sampler are checked in-process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from horde_core import tracing
from horde_testing.otlp import OtlpReceiver
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    set_span_in_context,
)

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
#: Where nothing listens: a test that wrongly turns tracing on fails to export, it never reaches a collector.
NOWHERE = "http://127.0.0.1:9"
#: The trace context a caller sends the probe app (W3C traceparent).
INCOMING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING_SPAN = "00f067aa0ba902b7"
#: The proxy passkey the probe apps know: a request carrying it is a horde process's, whose context is honoured.
PASSKEY = "probe-proxy-passkey"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_script(code: str, env: dict[str, str], timeout: float = 60) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with ``env`` on top of this one's environment minus every OTEL_*
    variable; returns the JSON object its last stdout line prints."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- the environment's rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({ENDPOINT: ""}, False),
        ({ENDPOINT: "  "}, False),
        ({ENDPOINT: "http://collector:4318"}, True),
        ({TRACES_ENDPOINT: "http://collector:4318/v1/traces"}, True),
        ({ENDPOINT: "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({ENDPOINT: "http://collector:4318", "OTEL_SDK_DISABLED": " TRUE "}, False),
        ({ENDPOINT: "http://collector:4318", "OTEL_SDK_DISABLED": "false"}, True),
        ({TRACES_ENDPOINT: "http://collector:4318/v1/traces", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({ENDPOINT: "http://collector:4318", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_tracing_is_on_only_with_an_endpoint_and_the_sdk_enabled(env: dict[str, str], enabled: bool) -> None:
    assert tracing.tracing_enabled(env) is enabled


@pytest.mark.parametrize(
    ("service", "env", "name"),
    [
        ("admission", {}, "horde-admission"),
        ("dispatch", {}, "horde-dispatch"),
        ("horde-oai", {}, "horde-oai"),
        ("admission", {"OTEL_SERVICE_NAME": "edge-admission"}, "edge-admission"),
        ("admission", {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=a%20b"}, "a b"),
        (
            "admission",
            {"OTEL_SERVICE_NAME": "wins", "OTEL_RESOURCE_ATTRIBUTES": "service.name=loses"},
            "wins",
        ),
        ("submit", {"OTEL_SERVICE_NAME": " ", "OTEL_RESOURCE_ATTRIBUTES": "team=x"}, "horde-submit"),
    ],
)
def test_service_name(service: str, env: dict[str, str], name: str) -> None:
    assert tracing.service_name(service, env) == name


def test_probes_and_metrics_are_excluded_plus_the_environments_patterns() -> None:
    assert tracing.excluded_urls({}) == "/healthz$,/readyz$,/metrics$"
    assert tracing.excluded_urls({"OTEL_PYTHON_EXCLUDED_URLS": "/docs, /redoc"}) == (
        "/healthz$,/readyz$,/metrics$,/docs,/redoc"
    )
    # The FastAPI-specific variable wins over the generic one, as in the instrumentation.
    assert tracing.excluded_urls(
        {"OTEL_PYTHON_FASTAPI_EXCLUDED_URLS": "/docs", "OTEL_PYTHON_EXCLUDED_URLS": "/x"}
    ).endswith(",/docs")


def _parent(sampled: bool) -> Any:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    span = NonRecordingSpan(SpanContext(int(INCOMING_TRACE, 16), int(INCOMING_SPAN, 16), True, flags))
    return set_span_in_context(span)


def test_the_sampler_drops_client_spans_without_a_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    sampler = tracing.build_sampler()
    assert sampler.get_description().startswith(tracing.BACKGROUND_ROOTS_DROPPED + "{ParentBased")
    trace_id = int(INCOMING_TRACE, 16)

    def decision(kind: SpanKind, parent: Any = None) -> Decision:
        return sampler.should_sample(parent, trace_id, "span", kind).decision

    # A background loop's store or RPC call: no parent, dropped.
    assert decision(SpanKind.CLIENT) is Decision.DROP
    # A request's server span and the front's delta_read root span: kept.
    assert decision(SpanKind.SERVER) is Decision.RECORD_AND_SAMPLE
    assert decision(SpanKind.INTERNAL) is Decision.RECORD_AND_SAMPLE
    # A request's calls follow their parent's decision.
    assert decision(SpanKind.CLIENT, _parent(sampled=True)) is Decision.RECORD_AND_SAMPLE
    assert decision(SpanKind.CLIENT, _parent(sampled=False)) is Decision.DROP
    assert decision(SpanKind.SERVER, _parent(sampled=False)) is Decision.DROP


def test_the_environments_sampler_decides_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    sampler = tracing.build_sampler()
    assert sampler.should_sample(None, 1, "GET /x", SpanKind.SERVER).decision is Decision.DROP


def test_the_hooks_do_nothing_while_tracing_is_off() -> None:
    # This test process never configures tracing (those tests run in their own interpreters).
    assert not tracing.tracing_configured()
    assert tracing.tracer_provider() is None
    assert tracing.grpc_server_interceptors() == []
    assert tracing.grpc_client_interceptors() == []
    app = FastAPI()
    tracing.instrument_app(app)
    assert not getattr(app, "_is_instrumented_by_opentelemetry", False)
    tracing.shutdown_tracing()  # safe while off


# --- off: nothing imported, nothing exported -------------------------------------------------------------------

OFF_SCRIPT = """
import asyncio, importlib.util, json, sys

# redis-py 8 imports the SDK's metrics module (and its resources) itself whenever the SDK is installed
# (redis/observability/providers.py), tracing or not: that much is the baseline, not ours.
import redis
baseline = {m for m in sys.modules if m.startswith("opentelemetry.sdk")}

import httpx
from horde_core.tracing import configure_tracing
on = configure_tracing("probe")

from horde_core.app import create_app
from horde_core.grpc import check_health, insecure_channel, start_grpc_server
from horde_testing.launcher import free_port

# Every service's entry point imports (the front's delta reader uses the API's tracer).
for module in ("horde_admission.__main__", "horde_dispatch.__main__", "horde_submit.__main__",
               "horde_janitor.__main__", "horde_oai.__main__"):
    if importlib.util.find_spec(module.split(".")[0]) is not None:
        __import__(module)

async def main():
    app = create_app("probe")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://probe") as client:
        assert (await client.get("/healthz")).status_code == 200
    port = free_port()
    server = await start_grpc_server("127.0.0.1", port, lambda _: None, [])
    async with insecure_channel(f"127.0.0.1:{port}") as channel:
        assert await check_health(channel)
    await server.stop(0)

asyncio.run(main())
loaded = sorted(
    m for m in sys.modules
    if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.instrumentation"))
    and m not in baseline
)
print(json.dumps({"on": on, "loaded": loaded, "baseline": sorted(baseline)}))
"""


@pytest.mark.parametrize(
    "env",
    [
        {},
        {ENDPOINT: NOWHERE, "OTEL_SDK_DISABLED": "true"},
        {TRACES_ENDPOINT: NOWHERE + "/v1/traces", "OTEL_TRACES_EXPORTER": "none"},
    ],
    ids=["no-endpoint", "sdk-disabled", "exporter-none"],
)
def test_off_imports_no_sdk_exporter_or_instrumentation(env: dict[str, str]) -> None:
    result = run_script(OFF_SCRIPT, env)
    assert result["on"] is False
    # No exporter, no tracing SDK, no instrumentation, no SDK module beyond redis-py's own import.
    assert result["loaded"] == []
    assert not [m for m in result["baseline"] if m.startswith("opentelemetry.sdk.trace")]


# --- on: one trace across HTTP and gRPC ------------------------------------------------------------------------

ON_SCRIPT = """
import asyncio, json, threading, types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc, httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from horde_core.tracing import configure_tracing, tracer_provider

memory = InMemorySpanExporter()
assert configure_tracing("probe", exporter=memory)

from horde_core.app import create_app
from horde_core.grpc import check_health, insecure_channel, start_grpc_server
from horde_testing.launcher import free_port

seen = {"http": [], "grpc": []}

class Upstream(BaseHTTPRequestHandler):
    def do_GET(self):
        seen["http"].append(self.headers.get("traceparent"))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
threading.Thread(target=upstream.serve_forever, daemon=True).start()
upstream_url = f"http://127.0.0.1:{upstream.server_address[1]}/up"

async def say(request, context):
    seen["grpc"].append(dict(context.invocation_metadata()).get("traceparent"))
    return request

def register(server):
    handler = grpc.method_handlers_generic_handler(
        "probe.v1.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
    )
    server.add_generic_rpc_handlers((handler,))

async def main():
    port = free_port()
    server = await start_grpc_server("127.0.0.1", port, register, ["probe.v1.Echo"])
    channel = insecure_channel(f"127.0.0.1:{port}")
    echo = channel.unary_unary("/probe.v1.Echo/Say")
    app = create_app("probe")
    # The caller is a horde process: its proxy passkey is one the service knows (admission's setting).
    app.state.settings = types.SimpleNamespace(proxy_passkeys=["PASSKEY"])

    @app.get("/v2/probe")
    async def probe():
        async with httpx.AsyncClient() as client:
            await client.get(upstream_url)
        await echo(b"hi", timeout=5)
        return {"ok": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://probe") as client:
        headers = {
            "traceparent": "INCOMING_TRACEPARENT",
            "authorization": "Bearer secret-key",
            "proxy-authorization": "PASSKEY",
        }
        assert (await client.get("/v2/probe", headers=headers)).status_code == 200
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status_code == 200
    assert await check_health(channel)
    # A background loop's calls, outside any request.
    async with httpx.AsyncClient() as client:
        await client.get(upstream_url)
    await echo(b"bg", timeout=5)
    await channel.close()
    await server.stop(0)

asyncio.run(main())
tracer_provider().force_flush()
spans = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "scope": s.instrumentation_scope.name,
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "parent_id": format(s.parent.span_id, "016x") if s.parent else "",
        "service": s.resource.attributes.get("service.name"),
        "attributes": sorted(s.attributes or {}),
    }
    for s in memory.get_finished_spans()
]
print(json.dumps({"seen": seen, "spans": spans}))
""".replace("INCOMING_TRACEPARENT", f"00-{INCOMING_TRACE}-{INCOMING_SPAN}-01").replace("PASSKEY", PASSKEY)


def test_one_trace_across_the_server_span_and_its_http_and_grpc_calls() -> None:
    result = run_script(ON_SCRIPT, {})
    spans: list[dict[str, Any]] = result["spans"]
    by_name = {s["name"]: s for s in spans}
    # Only the request's trace: no probe or scrape spans, no ASGI send/receive spans, no health-check RPC, no
    # background root client spans (nor the gRPC server span their unsampled traceparent reaches).
    assert {s["trace_id"] for s in spans} == {INCOMING_TRACE}, spans
    assert len(spans) == 4, [s["name"] for s in spans]
    assert {s["service"] for s in spans} == {"horde-probe"}

    server = by_name["GET /v2/probe"]
    assert (server["kind"], server["parent_id"]) == ("SERVER", INCOMING_SPAN)
    http_client = next(s for s in spans if s["scope"] == "opentelemetry.instrumentation.httpx")
    assert (http_client["kind"], http_client["parent_id"]) == ("CLIENT", server["span_id"])
    rpc_client, rpc_server = (
        next(s for s in spans if s["name"] == "/probe.v1.Echo/Say" and s["kind"] == kind)
        for kind in ("CLIENT", "SERVER")
    )
    assert rpc_client["parent_id"] == server["span_id"]
    assert rpc_server["parent_id"] == rpc_client["span_id"]

    # The W3C context went out on both calls: the request's trace, the client span as parent, sampled.
    seen = result["seen"]
    assert seen["http"][0] == f"00-{INCOMING_TRACE}-{http_client['span_id']}-01"
    assert seen["grpc"][0] == f"00-{INCOMING_TRACE}-{rpc_client['span_id']}-01"
    # The background calls carried an unsampled context: their spans were neither recorded nor exported.
    # (The flags' sampled bit is clear; the SDK may set the random-trace-id bit, 0x02.)
    assert [int(tp.rsplit("-", 1)[1], 16) & 1 for tp in (seen["http"][1], seen["grpc"][1])] == [0, 0]

    # No headers (the Authorization header above included) or bodies among the attributes.
    keys = {key for s in spans for key in s["attributes"]}
    assert not {k for k in keys if "header" in k or "body" in k}, keys


# --- the OTLP exporter, the resource's service name, the flush at exit -----------------------------------------

AT_EXIT_SCRIPT = """
import json
from horde_core.tracing import configure_tracing
from opentelemetry import trace

on = configure_tracing("admission")
with trace.get_tracer("probe").start_as_current_span("horde.test.at_exit"):
    pass
print(json.dumps({"on": on}))
# No flush here: the provider's atexit shutdown exports the span.
"""


@pytest.mark.parametrize(
    ("env", "service"),
    [
        ({}, "horde-admission"),
        ({"OTEL_SERVICE_NAME": "edge-admission"}, "edge-admission"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes,deployment.environment=test"}, None),
    ],
    ids=["default", "otel-service-name", "resource-attributes"],
)
def test_spans_reach_the_otlp_endpoint_at_exit(env: dict[str, str], service: str | None) -> None:
    with OtlpReceiver() as receiver:
        # A schedule far past the script's life: only the exit's flush can send the span.
        result = run_script(
            AT_EXIT_SCRIPT, {ENDPOINT: receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "600000", **env}
        )
        assert result["on"] is True
        spans = receiver.wait_for(
            lambda got: [s for s in got if s.name == "horde.test.at_exit"], 10, "the span flushed at exit"
        )
    assert receiver.errors == []
    assert [s.service for s in spans] == [service or "from-attributes"]


#: A service process as the runner serves it (``horde_core.runner.serve``: uvicorn, which re-raises SIGTERM after
#: its graceful shutdown, so ``atexit`` never runs): one traced request, then the test's SIGTERM.
SERVED_SCRIPT = """
import os
from horde_core.app import create_app
from horde_core.runner import serve
from horde_core.settings import HordeSettings
from horde_core.tracing import configure_tracing

configure_tracing("admission")
app = create_app("admission")

@app.get("/probe")
async def probe() -> dict[str, str]:
    return {"ok": "yes"}

serve(app, HordeSettings(), int(os.environ["PROBE_PORT"]), "admission")
"""


def test_spans_queued_when_sigterm_stops_a_served_process_are_exported() -> None:
    """The way Kubernetes and make run stop a service: its request's span, queued with a schedule far past the
    process's life, reaches the collector before the process dies by the signal."""
    port = free_port()
    with OtlpReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env |= {ENDPOINT: receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "600000", "PROBE_PORT": str(port)}
        proc = subprocess.Popen([sys.executable, "-c", SERVED_SCRIPT], env=env, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/probe", timeout=2, trust_env=False)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the served process did not answer within 60 s"
                    time.sleep(0.1)
            assert answer.status_code == 200
            assert receiver.spans() == []  # queued, not yet exported
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == -signal.SIGTERM  # died by the re-raised signal: no atexit
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stderr is not None:
                proc.stderr.close()
        spans = receiver.wait_for(
            lambda got: [s for s in got if s.name == "GET /probe"],
            10,
            "the request's span, flushed at shutdown",
        )
    assert [s.service for s in spans] == ["horde-admission"]


# --- the public edge: untrusted context, baggage, URLs, attribute lengths ---------------------------------------

#: A probe app with tracing on (an in-memory exporter): each request of ``PROBE_REQUESTS`` (a JSON list of
#: ``{"path", "headers"}``, header values sent as latin-1 bytes) is served by a route that calls an HTTP
#: upstream and a gRPC service, which record the trace headers they receive. Every WARNING or worse any logger
#: emits is caught (no logging configuration: what OpenTelemetry itself logs).
EDGE_SCRIPT = """
import asyncio, json, logging, os, threading, types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc, httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from horde_core.tracing import configure_tracing, tracer_provider

records = []

class Catch(logging.Handler):
    def emit(self, record):
        records.append(f"{record.name} {record.levelname}: {record.getMessage()[:120]}")

logging.getLogger().addHandler(Catch(logging.WARNING))

memory = InMemorySpanExporter()
assert configure_tracing("probe", exporter=memory)

from horde_core.app import create_app
from horde_core.grpc import insecure_channel, start_grpc_server
from horde_testing.launcher import free_port

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
seen = {"http": [], "grpc": []}

class Upstream(BaseHTTPRequestHandler):
    def do_GET(self):
        seen["http"].append({h: self.headers.get(h) for h in TRACE_HEADERS})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
threading.Thread(target=upstream.serve_forever, daemon=True).start()
upstream_url = f"http://127.0.0.1:{upstream.server_address[1]}"

async def say(request, context):
    metadata = dict(context.invocation_metadata())
    seen["grpc"].append({h: metadata.get(h) for h in TRACE_HEADERS})
    return request

def register(server):
    handler = grpc.method_handlers_generic_handler(
        "probe.v1.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
    )
    server.add_generic_rpc_handlers((handler,))

async def main():
    port = free_port()
    server = await start_grpc_server("127.0.0.1", port, register, ["probe.v1.Echo"])
    channel = insecure_channel(f"127.0.0.1:{port}")
    echo = channel.unary_unary("/probe.v1.Echo/Say")
    app = create_app("probe")
    app.state.settings = types.SimpleNamespace(proxy_passkeys=[os.environ["PROBE_PASSKEY"]])

    async def calls(path):
        async with httpx.AsyncClient() as client:
            await client.get(upstream_url + path)
        await echo(b"hi", timeout=5)
        return {"ok": True}

    @app.get("/v2/probe")
    async def probe():
        return await calls("/up")

    @app.get("/v2/generate/chat/status/{request_id}")
    async def status(request_id: str):
        return await calls(f"/api/v2/generate/chat/status/{request_id}?id={request_id}")

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://probe") as client:
        for request in json.loads(os.environ["PROBE_REQUESTS"]):
            headers = {k: v.encode("latin-1") for k, v in request["headers"].items()}
            assert (await client.get(request["path"], headers=headers)).status_code == 200
    await channel.close()
    await server.stop(0)

asyncio.run(main())
tracer_provider().force_flush()
spans = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "parent_id": format(s.parent.span_id, "016x") if s.parent else "",
        "trace_state": s.context.trace_state.to_header(),
        "attributes": {k: v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in (s.attributes or {}).items()},
    }
    for s in memory.get_finished_spans()
]
print(json.dumps({"seen": seen, "spans": spans, "records": records}))
"""

#: ~2,700 non-ASCII baggage entries in under 8 KB (W3CBaggagePropagator warned once per entry) and one valid
#: entry, which the propagator would have sent on.
HOSTILE_BAGGAGE = "user=alice," + "\xe9," * 2700
HOSTILE_TRACESTATE = ",".join(f"k{i}=" + "v" * 200 for i in range(30))
OTHER_TRACE = "0af7651916cd43dd8448eb211c80319c"


def _traceparent(trace_id: str = INCOMING_TRACE, flags: str = "01") -> str:
    return f"00-{trace_id}-{INCOMING_SPAN}-{flags}"


def run_edge(requests: list[dict[str, Any]], env: dict[str, str] | None = None) -> dict[str, Any]:
    return run_script(
        EDGE_SCRIPT,
        {"PROBE_REQUESTS": json.dumps(requests), "PROBE_PASSKEY": PASSKEY, **(env or {})},
    )


def _servers(result: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The server spans of the requests to ``path`` (with its query: the end of their ``http.url``)."""
    return [
        s
        for s in result["spans"]
        if s["kind"] == "SERVER" and str(s["attributes"].get("http.url", "")).endswith(path)
    ]


def test_a_clients_trace_context_and_baggage_are_dropped_at_the_edge() -> None:
    hostile = {"traceparent": _traceparent(), "tracestate": HOSTILE_TRACESTATE, "baggage": HOSTILE_BAGGAGE}
    result = run_edge(
        [
            {"path": "/v2/probe?case=sampled", "headers": hostile},
            {"path": "/v2/probe?case=hidden", "headers": {"traceparent": _traceparent(OTHER_TRACE, "00")}},
        ]
    )
    # The baggage made no log line (not parsed at all) and went nowhere.
    assert result["records"] == []
    assert [s["baggage"] for s in result["seen"]["http"] + result["seen"]["grpc"]] == [None] * 4
    (sampled,) = _servers(result, "/v2/probe?case=sampled")
    # Not the client's trace: a root of a trace of our own, without its tracestate on any span.
    assert (sampled["parent_id"], sampled["trace_id"] != INCOMING_TRACE) == ("", True)
    assert {s["trace_state"] for s in result["spans"]} == {""}
    assert INCOMING_TRACE not in {s["trace_id"] for s in result["spans"]}
    assert not [s for s in result["seen"]["http"] + result["seen"]["grpc"] if s["tracestate"]]
    # A client's "-00" cannot hide its request: the root sampler (always on here) decides.
    (hidden,) = _servers(result, "/v2/probe?case=hidden")
    assert (hidden["parent_id"], hidden["trace_id"] != OTHER_TRACE) == ("", True)
    assert len({s["trace_id"] for s in result["spans"]}) == 2


def test_a_horde_processs_context_is_honoured_but_not_its_baggage() -> None:
    headers = {"traceparent": _traceparent(), "baggage": HOSTILE_BAGGAGE, "Proxy-Authorization": PASSKEY}
    wrong = {"traceparent": _traceparent(OTHER_TRACE), "Proxy-Authorization": PASSKEY + "x"}
    result = run_edge(
        [
            {"path": "/v2/probe?case=trusted", "headers": headers},
            {"path": "/v2/probe?case=guess", "headers": wrong},
        ]
    )
    (trusted,) = _servers(result, "/v2/probe?case=trusted")
    assert (trusted["trace_id"], trusted["parent_id"]) == (INCOMING_TRACE, INCOMING_SPAN)
    # W3C tracecontext only: the baggage is neither parsed (no log line) nor sent on.
    assert result["records"] == []
    assert [s["baggage"] for s in result["seen"]["http"] + result["seen"]["grpc"]] == [None] * 4
    assert result["seen"]["http"][0]["traceparent"].startswith(f"00-{INCOMING_TRACE}-")
    # A guessed passkey is a client's.
    (guess,) = _servers(result, "/v2/probe?case=guess")
    assert (guess["parent_id"], guess["trace_id"] != OTHER_TRACE) == ("", True)


def test_a_client_cannot_force_sampling_under_a_ratio_zero_sampler() -> None:
    sampler = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    forced = run_edge([{"path": "/v2/probe", "headers": {"traceparent": _traceparent()}}], sampler)
    assert forced["spans"] == []
    # Sampled traceparent headers still go out unsampled: nothing downstream records either.
    assert [int(s["traceparent"][-2:], 16) & 1 for s in forced["seen"]["http"] + forced["seen"]["grpc"]] == [
        0,
        0,
    ]
    # A horde process's sampled context is followed (parent-based), as before.
    trusted = {"traceparent": _traceparent(), "Proxy-Authorization": PASSKEY}
    followed = run_edge([{"path": "/v2/probe", "headers": trusted}], sampler)
    assert {s["trace_id"] for s in followed["spans"]} == {INCOMING_TRACE}


REQUEST_ID = "5f0c1a0e-3b7d-4c51-9d38-2f4b8e6a7c10"


def test_request_ids_are_redacted_from_every_span() -> None:
    result = run_edge([{"path": f"/v2/generate/chat/status/{REQUEST_ID}", "headers": {}}])
    spans = result["spans"]
    assert len(spans) == 4, [s["name"] for s in spans]
    assert not [(s["name"], k, v) for s in spans for k, v in s["attributes"].items() if REQUEST_ID in str(v)]
    assert not [s for s in spans if REQUEST_ID in s["name"]]
    (server,) = (s for s in spans if s["kind"] == "SERVER" and s["attributes"].get("http.route"))
    assert server["attributes"]["http.route"] == "/v2/generate/chat/status/{request_id}"
    assert server["attributes"]["http.target"] == "/v2/generate/chat/status/{id}"
    urls = [v for s in spans for k, v in s["attributes"].items() if k in ("http.url", "url.full")]
    assert "/api/v2/generate/chat/status/{id}?id={id}" in "".join(urls), urls


@pytest.mark.parametrize(
    ("env", "limit"),
    [({}, tracing.MAX_ATTRIBUTE_LENGTH), ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "4096"}, 4096)],
    ids=["default", "environment"],
)
def test_attribute_values_are_capped(env: dict[str, str], limit: int) -> None:
    long = "x" * 9000
    result = run_edge([{"path": f"/v2/probe?q={long}", "headers": {"User-Agent": long}}], env)
    lengths = {k: len(v) for s in result["spans"] for k, v in s["attributes"].items() if isinstance(v, str)}
    assert max(lengths.values()) == limit, lengths


@pytest.mark.parametrize(
    ("attribute", "value", "redacted"),
    [
        ("http.target", f"/api/v2/generate/chat/status/{REQUEST_ID}", "/api/v2/generate/chat/status/{id}"),
        ("url.path", f"/v2/generate/text/status/{REQUEST_ID}", "/v2/generate/text/status/{id}"),
        # Every spelling uuid.UUID (the route's parser) accepts, and whatever follows status/.
        (
            "url.path",
            f"/v2/generate/chat/status/{REQUEST_ID.replace('-', '')}",
            "/v2/generate/chat/status/{id}",
        ),
        ("url.path", f"/v2/generate/chat/status/%7B{REQUEST_ID}%7D", "/v2/generate/chat/status/{id}"),
        ("url.path", "/v2/generate/chat/status/not-a-uuid", "/v2/generate/chat/status/{id}"),
        ("url.path", f"/v2/workers/urn:uuid:{REQUEST_ID.upper()}", "/v2/workers/{id}"),
        ("http.target", f"/v2/x?id={REQUEST_ID}&n=1", "/v2/x?id={id}&n=1"),
        ("url.query", f"a=1&id={REQUEST_ID}", "a=1&id={id}"),
        (
            "url.full",
            f"http://admission:8001/api/v2/generate/chat/status/{REQUEST_ID}?x={REQUEST_ID}",
            "http://admission:8001/api/v2/generate/chat/status/{id}?x={id}",
        ),
        ("http.url", "http://front/v1/chat/completions", "http://front/v1/chat/completions"),
        ("http.target", "/v2/users/42", "/v2/users/42"),
    ],
)
def test_redact_url(attribute: str, value: str, redacted: str) -> None:
    assert tracing.redact_url(value, attribute) == redacted


def test_propagators_and_length_limit_follow_the_environment() -> None:
    assert tracing.attribute_length_limit({}) == 1024
    assert tracing.attribute_length_limit({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "64"}) is None
    assert tracing.attribute_length_limit({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "64"}) is None
    code = """
    import json
    from opentelemetry.propagate import get_global_textmap
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from horde_core.tracing import configure_tracing
    configure_tracing("probe", exporter=InMemorySpanExporter())
    print(json.dumps({"fields": sorted(get_global_textmap().fields)}))
    """
    assert run_script(code, {})["fields"] == ["traceparent", "tracestate"]
    # The operator's choice stands.
    chosen = run_script(code, {"OTEL_PROPAGATORS": "tracecontext,baggage"})
    assert chosen["fields"] == ["baggage", "traceparent", "tracestate"]
