"""Tracing (horde_core.tracing): off by default with nothing imported, the environment's rules, and when on one
trace across an HTTP server span, its httpx and gRPC client spans and the gRPC server span, flushed at exit.

Turning tracing on sets the process's global tracer provider and patches client libraries, so every test that
does runs in a fresh interpreter (:func:`run_script`); the rules and the sampler are checked in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

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
import asyncio, json, threading
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

    @app.get("/v2/probe")
    async def probe():
        async with httpx.AsyncClient() as client:
            await client.get(upstream_url)
        await echo(b"hi", timeout=5)
        return {"ok": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://probe") as client:
        headers = {"traceparent": "INCOMING_TRACEPARENT", "authorization": "Bearer secret-key"}
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
""".replace("INCOMING_TRACEPARENT", f"00-{INCOMING_TRACE}-{INCOMING_SPAN}-01")


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
