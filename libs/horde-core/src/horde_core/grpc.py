"""gRPC aio server and client helpers with the standard health service (grpc.health.v1)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from horde_core.grpc_errors import StoreOutageInterceptor

ServicerRegistrar = Callable[[grpc.aio.Server], None]


async def start_grpc_server(
    host: str, port: int, register: ServicerRegistrar, service_names: Iterable[str]
) -> grpc.aio.Server:
    """Start an aio server on ``host:port`` serving ``register``'s servicers and grpc.health.v1.

    Every name in ``service_names`` (full names such as ``horde.dispatch.v1.WorkerPoolService``) and the
    overall ``""`` service report SERVING. A store outage raised by a servicer is answered UNAVAILABLE
    (:class:`horde_core.grpc_errors.StoreOutageInterceptor`). Stop it with ``await server.stop(grace_seconds)``.
    Raises ``RuntimeError`` when the port cannot be bound.
    """
    server = grpc.aio.server(interceptors=[StoreOutageInterceptor()])
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
    """An aio channel to ``target`` (``host:port``) with keepalive suited to in-cluster calls."""
    return grpc.aio.insecure_channel(
        target,
        options=[
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.enable_retries", 1),
        ],
    )


async def check_health(channel: grpc.aio.Channel, service: str = "", rpc_timeout: float = 2.0) -> bool:
    """True when the peer's health service reports ``service`` SERVING."""
    stub = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=rpc_timeout)
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)
