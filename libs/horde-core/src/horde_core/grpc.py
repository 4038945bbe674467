"""gRPC aio servers and balanced client channels, with the standard health service (grpc.health.v1).

Clients (:func:`insecure_channel`) resolve every replica behind a target and balance per call with grpcio's own
``round_robin`` policy, set in the channel's service config, so one connection never pins a caller to one pod:

- ``dns:///dispatch-grpc.horde.svc:7202``: every address of a headless Service (``clusterIP: None``), one
  connection per pod; re-resolved when a connection closes (a pod gone, a server's max connection age);
- ``ipv4:127.0.0.1:7202,127.0.0.1:7212``: a fixed list of local replicas (``make run REPLICAS=N`` sets
  ``HORDE_DISPATCH_GRPC_TARGET`` / ``HORDE_SUBMIT_GRPC_TARGET`` to such a list);
- ``host:port``: what DNS answers for the name (one address behind a ClusterIP Service: no spread).

The same service config retries the idempotent RPCs (:data:`IDEMPOTENT_METHODS`) on ``UNAVAILABLE`` only, up to
:data:`RETRY_MAX_ATTEMPTS` attempts, each picked anew (so a retry usually reaches another replica); every other
RPC is never retried. Clients send keepalive pings (:data:`CLIENT_KEEPALIVE_TIME_MS`), which the servers permit.

Servers (:func:`start_grpc_server`) close each connection after ``grpc_max_connection_age_seconds`` (plus
``grpc_max_connection_age_grace_seconds`` for its calls in flight, settings of
:class:`horde_core.settings.HordeSettings`): clients then reconnect and re-resolve, so replicas added by a
scale-up get their share of calls within one age (docs/operator-guide.md#scaling). Every unary RPC a server
answers counts on ``horde_grpc_server_handled_total{grpc_method, grpc_code}`` (:data:`SERVED`), so each
replica's ``/metrics`` shows what it served.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from horde_core.grpc_errors import StoreOutageInterceptor
from horde_core.grpc_handlers import rewrap_unary
from horde_core.metrics import counter
from horde_core.request_id import RequestIdClientInterceptor, RequestIdServerInterceptor
from horde_core.settings import HordeSettings
from horde_core.tracing import grpc_client_interceptors, grpc_server_interceptors

ServicerRegistrar = Callable[[grpc.aio.Server], None]

#: RPCs safe to send again after an ``UNAVAILABLE`` answer, as (full service name, method). Reads, and the
#: settlement calls that are compare-and-set on a pending generation (a repeat of an applied call answers
#: ``faulted=false`` / ``settled=false`` and changes nothing: services/submit/.../grpc_server.py).
IDEMPOTENT_METHODS: tuple[tuple[str, str], ...] = (
    ("horde.dispatch.v1.WorkerPoolService", "GetAvailability"),
    ("horde.submit.v1.SettlementService", "FaultGeneration"),
    ("horde.submit.v1.SettlementService", "SettleCancelledGeneration"),
    ("grpc.health.v1.Health", "Check"),
)
#: Attempts of an idempotent RPC (the first included); backoff 50 ms doubling to 1 s, jittered by grpcio.
RETRY_MAX_ATTEMPTS = 3
#: Client keepalive: a ping after this long without traffic, the connection dropped when its answer takes
#: longer than the timeout (a pod gone without a FIN, a node lost).
CLIENT_KEEPALIVE_TIME_MS = 30_000
CLIENT_KEEPALIVE_TIMEOUT_MS = 10_000
#: The longest wait between two attempts to reconnect to an unreachable replica.
CLIENT_MAX_RECONNECT_BACKOFF_MS = 5_000
#: Servers accept pings this often without data (below the clients' keepalive time, so no ping is a strike).
SERVER_MIN_PING_INTERVAL_MS = 10_000


def service_config() -> dict[str, Any]:
    """The clients' service config: ``round_robin`` over every resolved address, and the retry policy of
    :data:`IDEMPOTENT_METHODS` (``UNAVAILABLE`` only)."""
    return {
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [
            {
                "name": [{"service": service, "method": method} for service, method in IDEMPOTENT_METHODS],
                "retryPolicy": {
                    "maxAttempts": RETRY_MAX_ATTEMPTS,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    }


def channel_options() -> list[tuple[str, Any]]:
    """The options of every client channel (:func:`insecure_channel`)."""
    return [
        ("grpc.service_config", json.dumps(service_config())),
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", CLIENT_KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", CLIENT_KEEPALIVE_TIMEOUT_MS),
        # Ping idle connections too: round_robin keeps one to every replica, most of them idle at times.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # A replica that died is redialled at most this far apart (grpcio's default grows to 120 s), so one
        # restarted in place (a supervisor, a container restart keeping the pod's address) is used again soon.
        ("grpc.max_reconnect_backoff_ms", CLIENT_MAX_RECONNECT_BACKOFF_MS),
    ]


def server_options(settings: HordeSettings | None = None) -> list[tuple[str, Any]]:
    """The options of every server (:func:`start_grpc_server`): connection age from ``settings`` (None: the
    defaults), and keepalive enforcement that permits the clients' pings."""
    s = settings or HordeSettings.model_construct()
    return [
        ("grpc.max_connection_age_ms", int(s.grpc_max_connection_age_seconds * 1000)),
        ("grpc.max_connection_age_grace_ms", int(s.grpc_max_connection_age_grace_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 2),
    ]


SERVED = counter(
    "horde.grpc.server.handled",
    "Unary RPCs this process's gRPC server answered, by full method and status code",
    ["horde.grpc_method", "horde.grpc_code"],
)


def _code_name(context: grpc.aio.ServicerContext[Any, Any], default: str) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return default


class ServedCounterInterceptor(grpc.aio.ServerInterceptor):
    """Counts every unary-unary RPC on :data:`SERVED` once it is answered (the status the caller gets)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        # An aio handler: (request, context) -> awaitable response (grpc's stubs type handlers as sync).
        behavior: Callable[..., Any] = handler.unary_unary
        method = handler_call_details.method

        async def counted(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                response = await behavior(request, context)
            except asyncio.CancelledError:
                SERVED.labels(method, "CANCELLED").inc()
                raise
            except BaseException:
                # context.abort (ours or the store-outage interceptor's) set the code before raising.
                SERVED.labels(method, _code_name(context, "UNKNOWN")).inc()
                raise
            SERVED.labels(method, _code_name(context, "OK")).inc()
            return response

        return rewrap_unary(handler, counted)


async def start_grpc_server(
    host: str,
    port: int,
    register: ServicerRegistrar,
    service_names: Iterable[str],
    settings: HordeSettings | None = None,
) -> grpc.aio.Server:
    """Start an aio server on ``host:port`` serving ``register``'s servicers and grpc.health.v1.

    Every name in ``service_names`` (full names such as ``horde.dispatch.v1.WorkerPoolService``) and the
    overall ``""`` service report SERVING. A store outage raised by a servicer is answered UNAVAILABLE
    (:class:`horde_core.grpc_errors.StoreOutageInterceptor`); every unary RPC counts on :data:`SERVED`.
    Connections live at most ``settings.grpc_max_connection_age_seconds`` (None: the default settings; see
    :func:`server_options`). Stop it with ``await server.stop(grace_seconds)``. Raises ``RuntimeError`` when
    the port cannot be bound.
    """
    # The counter is outermost, so it sees the UNAVAILABLE the outage interceptor answers.
    server = grpc.aio.server(
        # Tracing's server span (none while off) first, so it covers the others.
        interceptors=[
            *grpc_server_interceptors(),
            RequestIdServerInterceptor(),  # the caller's x-request-id, for every log line of the call
            ServedCounterInterceptor(),
            StoreOutageInterceptor(),
        ],
        options=server_options(settings),
    )
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # grpcio raises on a taken port; older releases return 0
        raise RuntimeError(f"cannot bind gRPC port {host}:{port}") from exc
    if bound == 0:
        raise RuntimeError(f"cannot bind gRPC port {host}:{port}")
    await server.start()
    for name in [*service_names, ""]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server


def insecure_channel(target: str) -> grpc.aio.Channel:
    """An aio channel to ``target`` that balances per call over every address it resolves (see the module:
    ``dns:///name:port``, ``ipv4:a:p1,b:p2`` or ``host:port``), retries the idempotent RPCs on UNAVAILABLE and
    keeps its connections alive."""
    # Tracing's client spans and traceparent (no interceptor while tracing is off).
    return grpc.aio.insecure_channel(
        target,
        options=channel_options(),
        # The request id as x-request-id metadata (horde_core.request_id).
        interceptors=[*grpc_client_interceptors(), RequestIdClientInterceptor()],
    )


async def check_health(channel: grpc.aio.Channel, service: str = "", rpc_timeout: float = 2.0) -> bool:
    """True when the peer's health service reports ``service`` SERVING."""
    stub = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=rpc_timeout)
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)
