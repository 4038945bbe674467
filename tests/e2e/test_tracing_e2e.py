"""Tracing end to end: every service its own process, exporting OTLP/HTTP to an in-test receiver.

One chat completion through the front (the official OpenAI SDK, answered by the scripted worker) is one trace:
the front's server span is its only root, and every other span's parent is in the trace — the front's httpx
call, admission's server span under it, admission's gRPC call to dispatch and dispatch's server span under
that, and the asyncpg and redis-py spans of the stages. A streamed completion's progress reads are
``horde.oai.delta_read`` root spans linked to the request's trace. Probes and scrapes make no spans.

The receiver (:class:`horde_testing.otlp.OtlpReceiver`) keeps what the processes export every 100 ms
(``OTEL_BSP_SCHEDULE_DELAY``); the tests wait for the spans with a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
from horde_testing.otlp import OtlpReceiver, ReceivedSpan

from .conftest import MODEL, Stack

GREETING = "Hello from the scripted backend:"
FRONT, ADMISSION, DISPATCH = "horde-oai", "horde-admission", "horde-dispatch"
COMPLETIONS_SPAN = "POST /v1/chat/completions"
STATUS_ROUTE = "/generate/chat/status/{request_id}"
HTTPX = "opentelemetry.instrumentation.httpx"
GRPC = "opentelemetry.instrumentation.grpc"
ASYNCPG = "opentelemetry.instrumentation.asyncpg"
REDIS = "opentelemetry.instrumentation.redis"
SPANS_TIMEOUT_SECONDS = 30.0
PASSKEY = "e2e-tracing-passkey"
#: A client's W3C context, sampled: the front must not continue it.
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def stack_env_overrides(otlp: OtlpReceiver) -> dict[str, str]:
    """Tracing on for this module's processes only, whatever the caller's environment sets."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
        "OTEL_SDK_DISABLED": "false",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_SERVICE_NAME": "",
        "OTEL_RESOURCE_ATTRIBUTES": "",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        # The front's calls carry the proxy passkey admission knows, as `make run` configures it: admission
        # continues their trace context (a client's is dropped at the edge).
        "HORDE_PROXY_PASSKEYS": f'["{PASSKEY}"]',
        "HORDE_OAI_PROXY_PASSKEY": PASSKEY,
    }


@pytest.fixture(scope="module")
def traced_stack(stack: Stack) -> Stack:
    if not stack.workers:
        stack.start_worker("trace-worker")
    return stack


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=120)


def front_roots(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    """The front's completion server spans by trace id."""
    return {
        s.trace_id: s
        for s in spans
        if s.service == FRONT and s.kind == "SERVER" and s.name == COMPLETIONS_SPAN
    }


def new_front_root(otlp: OtlpReceiver, before: set[str]) -> ReceivedSpan:
    """The one completion server span of a trace not in ``before`` (the request just made)."""
    found = otlp.wait_for(
        lambda spans: [s for t, s in front_roots(spans).items() if t not in before],
        SPANS_TIMEOUT_SECONDS,
        "front server span of the completion",
    )
    assert len(found) == 1, found
    return found[0]


def trace_problems(trace: list[ReceivedSpan], root: ReceivedSpan) -> list[str]:
    """What the completion's trace still lacks (empty: complete and connected)."""
    problems: list[str] = []
    ids = {s.span_id for s in trace}
    roots = [s for s in trace if s.parent_id not in ids]
    if [s.span_id for s in roots] != [root.span_id]:
        problems.append(f"roots {[(s.service, s.name, s.parent_id) for s in roots]}, not only the front's")
    if root.parent_id:
        problems.append(f"the front's server span has a parent {root.parent_id}")
    services = {s.service for s in trace}
    if not {FRONT, ADMISSION, DISPATCH} <= services:
        problems.append(f"services {sorted(services)}")

    def spans(service: str, kind: str, scope: str | None = None) -> list[ReceivedSpan]:
        return [
            s
            for s in trace
            if s.service == service and s.kind == kind and (scope is None or s.scope == scope)
        ]

    front_calls = {s.span_id for s in spans(FRONT, "CLIENT", HTTPX)}
    if not any(s.parent_id in front_calls for s in spans(ADMISSION, "SERVER")):
        problems.append("no admission server span under the front's httpx client span")
    if not any(s.name.endswith(STATUS_ROUTE) for s in spans(ADMISSION, "SERVER")):
        problems.append("no admission status span (the front's result read)")
    admission_rpcs = {s.span_id for s in spans(ADMISSION, "CLIENT", GRPC)}
    if not any(s.parent_id in admission_rpcs for s in spans(DISPATCH, "SERVER", GRPC)):
        problems.append("no dispatch gRPC server span under an admission gRPC client span")
    if not [s for s in trace if s.scope == ASYNCPG]:
        problems.append("no asyncpg span")
    if not [s for s in trace if s.scope == REDIS]:
        problems.append("no redis span")
    return problems


def render(trace: list[ReceivedSpan], root: ReceivedSpan) -> str:
    """The trace as an indented tree, children in start order (printed: pytest shows it with -s or on failure)."""
    children: dict[str, list[ReceivedSpan]] = {}
    for span in sorted(trace, key=lambda s: s.start_ns):
        children.setdefault(span.parent_id, []).append(span)
    lines: list[str] = []

    def walk(span: ReceivedSpan, depth: int) -> None:
        ms = (span.end_ns - span.start_ns) / 1e6
        lines.append(f"{'  ' * depth}{span.service} {span.kind} {span.name} [{span.scope}] {ms:.1f} ms")
        for child in children.get(span.span_id, []):
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines)


def wait_for_complete_trace(otlp: OtlpReceiver, root: ReceivedSpan) -> list[ReceivedSpan]:
    """The spans of ``root``'s trace once :func:`trace_problems` finds none (spans arrive in per-process
    batches, a parent usually after its children); AssertionError with the problems after the deadline."""
    deadline = time.monotonic() + SPANS_TIMEOUT_SECONDS
    while True:
        trace = [s for s in otlp.spans() if s.trace_id == root.trace_id]
        problems = trace_problems(trace, root)
        if not problems:
            return trace
        if time.monotonic() >= deadline:
            listing = "\n".join(f"  {s.service} {s.kind} {s.name} ({s.scope})" for s in trace)
            raise AssertionError(f"trace {root.trace_id} incomplete: {problems}\n{listing}")
        time.sleep(0.1)


def test_one_completion_is_one_connected_trace_across_the_services(
    traced_stack: Stack, otlp: OtlpReceiver
) -> None:
    before = set(front_roots(otlp.spans()))
    # A client's sampled traceparent: ignored at the public edge (the front trusts no caller).
    completion = client(traced_stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "trace this completion"}],
        extra_headers={"traceparent": CLIENT_TRACEPARENT, "tracestate": "evil=1", "baggage": "user=evil"},
    )
    assert completion.choices[0].message.content == f"{GREETING} trace this completion"

    root = new_front_root(otlp, before)
    assert root.trace_id != CLIENT_TRACE
    trace = wait_for_complete_trace(otlp, root)
    print(render(trace, root))
    assert not [s for s in otlp.spans() if s.trace_id == CLIENT_TRACE]

    # The native request id is a credential (its status returns the completion, DELETE cancels it): no span
    # of any service holds it, in any attribute (the URLs read "{id}"), though the status was read.
    request_id = completion.id.removeprefix("chatcmpl-")
    spellings = {request_id, request_id.replace("-", "")}
    leaks = [
        (s.service, s.name, key, value)
        for s in otlp.spans()
        for key, value in s.attributes.items()
        if any(spelling in str(value) for spelling in spellings)
    ]
    assert leaks == []
    assert not [s for s in otlp.spans() if any(spelling in s.name for spelling in spellings)]
    status_spans = [s for s in trace if s.service == ADMISSION and s.name.endswith(STATUS_ROUTE)]
    assert {str(s.attributes.get("http.target")) for s in status_spans} == {
        "/api/v2/generate/chat/status/{id}"
    }
    front_status_calls = [
        s for s in trace if s.scope == HTTPX and "/status/" in str(s.attributes.get("http.url", ""))
    ]
    assert front_status_calls, render(trace, root)
    assert all(
        str(s.attributes["http.url"]).endswith("/generate/chat/status/{id}") for s in front_status_calls
    )

    # The front's call carried the trace to admission, and admission's to dispatch (W3C traceparent): the
    # server spans' parents are the callers' client spans, in another process.
    by_id = {s.span_id: s for s in trace}
    admission_servers = [s for s in trace if s.service == ADMISSION and s.kind == "SERVER"]
    assert {by_id[s.parent_id].scope for s in admission_servers} == {HTTPX}
    assert {by_id[s.parent_id].service for s in admission_servers} == {FRONT}
    dispatch_servers = [s for s in trace if s.service == DISPATCH and s.kind == "SERVER"]
    assert {by_id[s.parent_id].service for s in dispatch_servers} == {ADMISSION}
    assert "/horde.dispatch.v1.WorkerPoolService/GetAvailability" in {s.name for s in dispatch_servers}
    assert any(s.name.endswith("/generate/chat/async") for s in admission_servers), admission_servers
    # Statements and commands, not values: asyncpg without parameters, redis arguments as "?".
    for span in trace:
        assert not {k for k in span.attributes if "header" in k or "body" in k or "parameters" in k}, span
        if span.scope == REDIS:
            statement = str(span.attributes.get("db.statement", span.attributes.get("db.query.text", "")))
            assert set(statement.split()[1:]) <= {"?"}, statement

    # Nothing else shares the trace (the worker's pop and submit are their own traces, untraced client).
    assert {s.service for s in trace} <= {FRONT, ADMISSION, DISPATCH, "horde-submit"}


def test_probes_and_scrapes_make_no_spans(traced_stack: Stack, otlp: OtlpReceiver) -> None:
    # The stack polled every /healthz at start; the worker's check-ins and pops are traced meanwhile.
    otlp.wait_for(lambda spans: [s for s in spans if s.service == DISPATCH], SPANS_TIMEOUT_SECONDS, "a span")
    paths = ("/healthz", "/readyz", "/metrics")
    assert not [
        s for s in otlp.spans() if s.name.endswith(paths) or s.name.endswith(("http send", "http receive"))
    ]
    assert otlp.errors == []


def test_a_streamed_completions_reads_are_linked_root_spans(traced_stack: Stack, otlp: OtlpReceiver) -> None:
    before = set(front_roots(otlp.spans()))
    stream = client(traced_stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "[[pace:2]] [[words:12]] stream and trace"}],
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.startswith(f"{GREETING} stream and trace")

    root = new_front_root(otlp, before)

    def reads(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [
            s
            for s in spans
            if s.service == FRONT
            and s.name == "horde.oai.delta_read"
            and any(trace_id == root.trace_id for trace_id, _ in s.links)
        ]

    linked = otlp.wait_for(reads, SPANS_TIMEOUT_SECONDS, "a delta_read span linked to the streamed request")
    request_spans = {s.span_id for s in otlp.spans() if s.trace_id == root.trace_id}
    for span in linked:
        assert (span.kind, span.parent_id) == ("INTERNAL", "")  # a root span, in a trace of its own
        assert span.trace_id != root.trace_id
        assert span.attributes["horde.oai.delta_read.entries"] >= 1
        assert span.attributes["horde.oai.delta_read.streams_with_entries"] >= 1
        assert (
            span.attributes["horde.oai.delta_read.streams"]
            >= span.attributes["horde.oai.delta_read.streams_with_entries"]
        )
        assert {span_id for trace_id, span_id in span.links if trace_id == root.trace_id} <= request_spans
    # Every delta_read span is a root and carries entries (an empty read makes none).
    every_read = [s for s in otlp.spans() if s.name == "horde.oai.delta_read"]
    assert all(s.parent_id == "" and s.attributes["horde.oai.delta_read.entries"] >= 1 for s in every_read)
