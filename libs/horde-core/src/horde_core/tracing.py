"""OpenTelemetry tracing of every service process: off unless an OTLP endpoint is configured.

Each service's ``__main__`` calls :func:`configure_tracing` before it builds its app; :func:`horde_core.app.create_app`
calls :func:`instrument_app`, and :mod:`horde_core.grpc` adds :func:`grpc_server_interceptors` and
:func:`grpc_client_interceptors` to every server and channel it makes. All three do nothing while tracing is off.

Settings (the standard OpenTelemetry variables, read once at process start):

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL: spans go to ``<base>/v1/traces``) or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the full URL, which wins): tracing is on when either is set and
  non-empty. Spans are exported as OTLP/HTTP protobuf (``OTEL_EXPORTER_OTLP_PROTOCOL`` is not read), with
  ``OTEL_EXPORTER_OTLP[_TRACES]_HEADERS``, ``_TIMEOUT``, ``_COMPRESSION`` and ``_CERTIFICATE`` as usual.
- ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``: off, whatever else is set.
- ``OTEL_SERVICE_NAME``: the resource's ``service.name``; else a ``service.name`` in
  ``OTEL_RESOURCE_ATTRIBUTES``; else ``horde-<service>`` (:func:`service_name`: horde-oai, horde-admission,
  horde-dispatch, horde-submit, horde-janitor). ``OTEL_RESOURCE_ATTRIBUTES`` adds attributes.
- ``OTEL_BSP_SCHEDULE_DELAY`` (ms, default 5000), ``OTEL_BSP_MAX_QUEUE_SIZE``, ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``,
  ``OTEL_BSP_EXPORT_TIMEOUT``: the batch span processor's.
- ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``: the sampler (default ``parentbased_always_on``), with
  one rule before it (:data:`BACKGROUND_ROOTS_DROPPED`): a client span without a parent (a Redis, PostgreSQL,
  HTTP or gRPC call made by a background loop, outside any request: the front's progress-stream reads, the
  janitor's sweeps) is not recorded, so idle processes export nothing.
- ``OTEL_PROPAGATORS``: the propagators; unset, W3C ``tracecontext`` only (:func:`configure_propagators`): no
  ``baggage`` is read or sent (a client's baggage header cost CPU and log lines per entry, and re-sent up to
  8 KB into the gRPC metadata).
- ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` / ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``: the longest attribute
  value; unset, :data:`MAX_ATTRIBUTE_LENGTH` (a client's 9 KB query string or User-Agent is cut there).
- ``OTEL_PYTHON_FASTAPI_EXCLUDED_URLS`` / ``OTEL_PYTHON_EXCLUDED_URLS``: more URL patterns without server spans,
  besides :data:`EXCLUDED_URLS`; ``OTEL_PYTHON_GRPC_EXCLUDED_SERVICES``: gRPC services without spans, besides
  ``grpc.health.v1.Health``.

What is traced: one server span per HTTP request (FastAPI, except ``/healthz``, ``/readyz`` and ``/metrics``;
no ASGI send/receive spans; no headers or bodies, unless ``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_*`` asks
for headers) and per gRPC call (server and client, aio), one client span per httpx request, per asyncpg
query (the statement, not its parameters) and per redis-py command (the command name, arguments as ``?``).
The W3C ``traceparent`` goes out on every httpx request and gRPC call and is continued by the server spans, so
one chat completion is one trace: front → admission (HTTP) → dispatch / submit (gRPC). Spans are flushed when
the process exits (``atexit``).

Untrusted context is dropped (the horde is public and anonymous): an HTTP request's ``traceparent``,
``tracestate`` and ``baggage`` headers are removed before the server span reads them
(:class:`UntrustedContextDropped`) unless the request carries a known proxy passkey in ``Proxy-Authorization``
(:func:`horde_core.ratelimit.known_proxy_passkey` against the service's ``proxy_passkeys``: admission's
``HORDE_PROXY_PASSKEYS``, which the front's calls carry). So a client cannot choose trace ids, force or hide
sampling, or fill spans with its ``tracestate``: its request starts a trace the root sampler decides. The
front's own public requests are never trusted (it has no passkeys to check), nor are dispatch's and submit's
HTTP routes (workers; no passkeys either). gRPC is internal and its context is always continued.

URLs are redacted (:func:`redact_url`, :func:`redaction_processor`): a request id is a credential (GET of its
status returns the completion, DELETE cancels it), so every UUID path segment and the id of a
``/generate/{chat,text}/status/<id>`` path become ``{id}`` in ``http.target``, ``http.url``, ``url.path``,
``url.full`` and ``url.query`` of every span (the ``http.route`` templates stay).

While tracing is off no exporter, SDK or instrumentation module is imported (only ``opentelemetry-api``, whose
tracers then make non-recording spans), and nothing is exported.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

if TYPE_CHECKING:
    import grpc
    from fastapi import FastAPI
    from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

#: URL patterns (regular expressions searched in the request's URL) whose requests get no server span: the
#: probes and the Prometheus scrape, which would otherwise be most of every process's traces.
EXCLUDED_URLS: tuple[str, ...] = ("/healthz$", "/readyz$", "/metrics$")
#: gRPC services whose calls get no span (the health checks of probes and readiness).
EXCLUDED_GRPC_SERVICES: tuple[str, ...] = ("grpc.health.v1.Health",)
#: The sampler's description prefix (see :func:`build_sampler`): root client spans are dropped.
BACKGROUND_ROOTS_DROPPED = "HordeBackgroundRootsDropped"
#: The longest attribute value (characters) unless ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` or
#: ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` says otherwise.
MAX_ATTRIBUTE_LENGTH = 1024
#: The incoming trace context headers (lower case, as in an ASGI scope) dropped from untrusted requests.
TRACE_CONTEXT_HEADERS: frozenset[bytes] = frozenset({b"traceparent", b"tracestate", b"baggage"})
#: The span attributes holding a URL or a part of one (old and new HTTP semantic conventions), redacted.
URL_ATTRIBUTES: tuple[str, ...] = ("http.target", "http.url", "url.path", "url.full", "url.query")
#: What a redacted id becomes.
REDACTED_ID = "{id}"

_provider: TracerProvider | None = None
_shut_down = False


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def tracing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment (``os.environ`` when None) turns tracing on: an OTLP endpoint
    (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, non-empty), and neither
    ``OTEL_SDK_DISABLED=true`` (any case) nor ``OTEL_TRACES_EXPORTER=none``."""
    env = _environ(environ)
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(
        env.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _resource_attribute(environ: Mapping[str, str], key: str) -> str | None:
    """``key``'s value in ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``, values percent-encoded), or None."""
    for pair in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip() == key and value.strip():
            return unquote(value.strip())
    return None


def default_service_name(service: str) -> str:
    """``horde-<service>`` (``"admission"`` → ``"horde-admission"``); a name already ``horde-…`` is kept."""
    return service if service.startswith("horde-") else f"horde-{service}"


def service_name(service: str, environ: Mapping[str, str] | None = None) -> str:
    """The ``service.name`` a process of ``service`` reports: ``OTEL_SERVICE_NAME``, else ``service.name`` from
    ``OTEL_RESOURCE_ATTRIBUTES``, else :func:`default_service_name`."""
    return _configured_service_name(_environ(environ)) or default_service_name(service)


def _configured_service_name(environ: Mapping[str, str]) -> str | None:
    return environ.get("OTEL_SERVICE_NAME", "").strip() or _resource_attribute(environ, "service.name")


def excluded_urls(environ: Mapping[str, str] | None = None) -> str:
    """The FastAPI instrumentation's ``excluded_urls``: :data:`EXCLUDED_URLS` and the patterns of
    ``OTEL_PYTHON_FASTAPI_EXCLUDED_URLS`` (else ``OTEL_PYTHON_EXCLUDED_URLS``), comma-separated."""
    env = _environ(environ)
    extra = env.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", env.get("OTEL_PYTHON_EXCLUDED_URLS", ""))
    patterns = [*EXCLUDED_URLS, *(p.strip() for p in extra.split(",") if p.strip())]
    return ",".join(patterns)


def tracing_configured() -> bool:
    """True once :func:`configure_tracing` turned tracing on in this process."""
    return _provider is not None


def tracer_provider() -> TracerProvider | None:
    """The process's SDK tracer provider, or None while tracing is off."""
    return _provider


def configure_tracing(service: str, *, exporter: SpanExporter | None = None) -> bool:
    """Turn tracing on for this process when the environment asks for it (:func:`tracing_enabled`); returns
    whether it is on. Call it once, before the app is built (a second call changes nothing).

    On: a global SDK ``TracerProvider`` with the resource's ``service.name`` (:func:`service_name`), the
    environment's sampler behind the background-roots rule (:func:`build_sampler`), the attribute length cap
    (:func:`build_span_limits`), the URL redaction (:func:`redaction_processor`), W3C tracecontext as the only
    propagator unless ``OTEL_PROPAGATORS`` is set (:func:`configure_propagators`), a ``BatchSpanProcessor``
    feeding an OTLP/HTTP exporter (or ``exporter``, which tests pass, e.g. an ``InMemorySpanExporter``: it
    turns tracing on without an endpoint, though not under ``OTEL_SDK_DISABLED=true``), the httpx, redis-py
    and asyncpg (when installed) instrumentations, and a flush at process exit. Off: nothing is imported or
    changed.
    """
    global _provider
    if _provider is not None:
        return True
    if exporter is None and not tracing_enabled():
        return False
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False

    # The on-branch's imports: none of these modules is loaded while tracing is off.
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    attributes: dict[str, str] = {}
    if _configured_service_name(os.environ) is None:
        attributes[SERVICE_NAME] = default_service_name(service)
    # Resource.create adds OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (ours is only set without them).
    provider = TracerProvider(
        resource=Resource.create(attributes),
        sampler=build_sampler(),
        span_limits=build_span_limits(),
        shutdown_on_exit=False,
    )
    # Redaction first: the batch processor queues the span it is handed at its end, URLs already rewritten.
    provider.add_span_processor(redaction_processor())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    configure_propagators()
    _provider = provider
    atexit.register(shutdown_tracing)
    _instrument_clients(provider)
    return True


def _instrument_clients(provider: TracerProvider) -> None:
    """The client libraries' instrumentations (class-level patches: clients made before count too)."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    RedisInstrumentor().instrument(tracer_provider=provider)
    # The front has no asyncpg in its image; the instrumentation would log a dependency conflict.
    if importlib.util.find_spec("asyncpg") is not None:
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

        AsyncPGInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]  # untyped


def configure_propagators(environ: Mapping[str, str] | None = None) -> None:
    """The global propagator: W3C ``tracecontext`` only, unless ``OTEL_PROPAGATORS`` is set (non-empty), whose
    choice the API already made at import. The API's default adds W3C ``baggage``, which no horde code reads:
    a client's baggage header cost a WARNING per malformed entry and was sent on to every gRPC call."""
    if _environ(environ).get("OTEL_PROPAGATORS", "").strip():
        return
    from opentelemetry.propagate import set_global_textmap
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    set_global_textmap(TraceContextTextMapPropagator())


def attribute_length_limit(environ: Mapping[str, str] | None = None) -> int | None:
    """:data:`MAX_ATTRIBUTE_LENGTH`, or None when ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` or
    ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` is set (the SDK then reads it)."""
    env = _environ(environ)
    names = ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT")
    if any(env.get(name, "").strip() for name in names):
        return None
    return MAX_ATTRIBUTE_LENGTH


def build_span_limits() -> SpanLimits:
    """The SDK's ``SpanLimits`` with :func:`attribute_length_limit` (the other limits the SDK's defaults)."""
    from opentelemetry.sdk.trace import SpanLimits

    return SpanLimits(max_attribute_length=attribute_length_limit())


def _is_uuid(text: str) -> bool:
    """Whether ``text`` is an id ``uuid.UUID`` accepts, as the native routes parse their request ids (hex with
    or without dashes, braces, ``urn:uuid:``, percent-encoded or not)."""
    if len(text) < 32:
        return False
    try:
        uuid.UUID(unquote(text))
    except ValueError:
        return False
    return True


def _redact_path(path: str) -> str:
    segments = path.split("/")
    for i, segment in enumerate(segments):
        # A status route's id whatever its shape (a malformed one is somebody's typo of a real one).
        after_status = i >= 3 and segments[i - 1] == "status" and segments[i - 3] == "generate"
        if segment and (after_status or _is_uuid(segment)):
            segments[i] = REDACTED_ID
    return "/".join(segments)


def _redact_query(query: str) -> str:
    parts = query.split("&")
    for i, part in enumerate(parts):
        name, sep, value = part.partition("=")
        if sep and _is_uuid(value):
            parts[i] = f"{name}={REDACTED_ID}"
        elif not sep and _is_uuid(name):
            parts[i] = REDACTED_ID
    return "&".join(parts)


def redact_url(value: str, attribute: str = "url.full") -> str:
    """``value`` (the ``attribute`` of :data:`URL_ATTRIBUTES` holding it) with its request ids replaced by
    :data:`REDACTED_ID`: every path segment that is a UUID (:func:`_is_uuid`) and the segment after
    ``/generate/<kind>/status/``; in the query, every value that is a UUID."""
    if attribute == "url.query":
        return _redact_query(value)
    if attribute == "url.path":
        return _redact_path(value)
    if attribute == "http.target":
        path, sep, query = value.partition("?")
        return _redact_path(path) + (sep + _redact_query(query) if sep else "")
    try:
        parts = urlsplit(value)
    except ValueError:
        return _redact_path(value)
    return urlunsplit(parts._replace(path=_redact_path(parts.path), query=_redact_query(parts.query)))


def redaction_processor() -> SpanProcessor:
    """A span processor whose ``on_start`` rewrites the :data:`URL_ATTRIBUTES` of every span with
    :func:`redact_url` (the instrumentations set them when they start the span; the route templates,
    ``http.route``, stay)."""
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import Span, SpanProcessor

    class UrlRedaction(SpanProcessor):
        def on_start(self, span: Span, parent_context: Context | None = None) -> None:
            redact_span_urls(span)

    return UrlRedaction()


def redact_span_urls(span: Any) -> None:
    """Rewrite the :data:`URL_ATTRIBUTES` a recording span holds now with :func:`redact_url` (the processor's
    ``on_start``, and the FastAPI server span's request hook: the ASGI middleware sets its attributes once more
    after the span started)."""
    attributes = getattr(span, "attributes", None)
    if not attributes:
        return
    for key in URL_ATTRIBUTES:
        value = attributes.get(key)
        if isinstance(value, str):
            redacted = redact_url(value, key)
            if redacted != value:
                span.set_attribute(key, redacted)


def build_sampler() -> Sampler:
    """The environment's sampler (``OTEL_TRACES_SAMPLER``, default ``parentbased_always_on``) behind one rule:
    a CLIENT span without a valid parent is dropped. Such a span is a store or RPC call of a background loop,
    outside any request (the front's ``XREAD BLOCK`` four times a second, the janitor's sweeps, the signal
    hub); a request's calls have its server span as parent and are kept whenever it is."""
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        Sampler,
        SamplingResult,
        _get_from_env_or_default,  # the SDK's own OTEL_TRACES_SAMPLER reader (no public equivalent)
    )
    from opentelemetry.trace import Link, SpanKind, TraceState, get_current_span
    from opentelemetry.util.types import Attributes

    class BackgroundRootsDropped(Sampler):
        def __init__(self, delegate: Sampler) -> None:
            self.delegate = delegate

        def should_sample(
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Attributes = None,
            links: Sequence[Link] | None = None,
            trace_state: TraceState | None = None,
        ) -> SamplingResult:
            if kind is SpanKind.CLIENT and not get_current_span(parent_context).get_span_context().is_valid:
                return SamplingResult(Decision.DROP)
            return self.delegate.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"{BACKGROUND_ROOTS_DROPPED}{{{self.delegate.get_description()}}}"

    return BackgroundRootsDropped(_get_from_env_or_default())


def instrument_app(app: FastAPI) -> None:
    """Add the FastAPI server spans to ``app`` (no-op while tracing is off): one span per request, named
    ``"<METHOD> <route>"`` (e.g. ``POST /v1/chat/completions``), continuing the caller's ``traceparent`` only
    when the request is trusted (a known proxy passkey; :class:`UntrustedContextDropped`, outside the span),
    except the :func:`excluded_urls`; no ASGI send/receive spans; a streamed response's span lasts until the
    stream ends. The middleware wraps the whole stack, so middlewares added later run inside the span."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    from horde_core.ratelimit import PROXY_PASSKEY_HEADER, known_proxy_passkey

    def server_request_hook(span: Any, scope: Any) -> None:
        # The ASGI middleware sets the request's attributes again after the span started (and the processor
        # redacted them): once more here, where that is done.
        if span is not None and span.is_recording():
            redact_span_urls(span)

    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=_provider,
        excluded_urls=excluded_urls(),
        exclude_spans=["receive", "send"],
        server_request_hook=server_request_hook,
    )
    state = app.state
    header = PROXY_PASSKEY_HEADER.lower().encode("latin-1")

    def trusted(headers: Iterable[tuple[bytes, bytes]]) -> bool:
        # The service's passkeys (admission's HORDE_PROXY_PASSKEYS; none elsewhere), read per request.
        passkeys = getattr(getattr(state, "settings", None), "proxy_passkeys", None) or ()
        if not passkeys:
            return False
        passkey = next((value for key, value in headers if key == header), None)
        return passkey is not None and known_proxy_passkey(passkey.decode("latin-1"), passkeys)

    # Around the instrumentation's middleware (installed above), so its server span never sees the headers.
    build: Callable[[], Any] = app.build_middleware_stack

    def build_with_untrusted_context_dropped() -> Any:
        return UntrustedContextDropped(build(), trusted)

    app.build_middleware_stack = build_with_untrusted_context_dropped  # type: ignore[method-assign]

    # uvicorn re-raises SIGTERM/SIGINT once its graceful shutdown is done, so the process dies by the signal and
    # the atexit hook never runs: the spans still queued are flushed when the app's lifespan ends instead.
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan_flushing_spans(lifespan_app: Any) -> AsyncIterator[Any]:
        async with inner(lifespan_app) as lifespan_state:
            yield lifespan_state
        await asyncio.to_thread(flush_tracing)

    app.router.lifespan_context = lifespan_flushing_spans


class UntrustedContextDropped:
    """ASGI middleware: removes the :data:`TRACE_CONTEXT_HEADERS` from an HTTP or WebSocket request's scope
    unless ``trusted(headers)`` (a known proxy passkey, see :func:`instrument_app`), so the server span inside
    starts a trace of its own, sampled by the root sampler. The scope is changed in place (the middlewares
    outside keep reading the same dict)."""

    def __init__(self, app: Any, trusted: Callable[[Iterable[tuple[bytes, bytes]]], bool]) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = scope.get("headers") or ()
            if any(key in TRACE_CONTEXT_HEADERS for key, _ in headers) and not self.trusted(headers):
                scope["headers"] = [(k, v) for k, v in headers if k not in TRACE_CONTEXT_HEADERS]
        await self.app(scope, receive, send)


def _grpc_filter() -> Any:
    """The gRPC instrumentation's filter: every call but those of :data:`EXCLUDED_GRPC_SERVICES` (the
    instrumentation adds ``OTEL_PYTHON_GRPC_EXCLUDED_SERVICES`` itself only in its global instrumentors)."""
    from opentelemetry.instrumentation.grpc import filters

    extra = os.environ.get("OTEL_PYTHON_GRPC_EXCLUDED_SERVICES", "")
    names = [*EXCLUDED_GRPC_SERVICES, *(s.strip() for s in extra.split(",") if s.strip())]
    return filters.negate(filters.any_of(*(filters.service_name(n) for n in names)))


def grpc_server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The interceptors that give every served RPC a SERVER span continuing the caller's ``traceparent``
    (to be placed first, so the span covers the others); ``[]`` while tracing is off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    interceptor: grpc.aio.ServerInterceptor = aio_server_interceptor(  # type: ignore[no-untyped-call]  # untyped
        tracer_provider=_provider, filter_=_grpc_filter()
    )
    return [interceptor]


def grpc_client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The interceptors that give every RPC a channel sends a CLIENT span and send its ``traceparent``
    (unary and streaming, aio); ``[]`` while tracing is off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    interceptors: list[grpc.aio.ClientInterceptor] = aio_client_interceptors(  # type: ignore[no-untyped-call]  # untyped
        tracer_provider=_provider, filter_=_grpc_filter()
    )
    return interceptors


def flush_tracing(timeout_millis: int = 10_000) -> None:
    """Export the spans still queued, waiting at most ``timeout_millis``; the provider stays usable (no-op while
    tracing is off). Called when an app's lifespan ends (:func:`instrument_app`)."""
    if _provider is not None and not _shut_down:
        _provider.force_flush(timeout_millis)


def shutdown_tracing() -> None:
    """Export the spans still queued and stop the provider (registered with ``atexit`` when tracing is on;
    safe to call again or while off)."""
    global _shut_down
    if _provider is not None and not _shut_down:
        _shut_down = True
        _provider.shutdown()
