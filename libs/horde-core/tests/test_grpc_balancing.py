"""Balanced gRPC: one channel over a list of replicas spreads calls over all of them, an idempotent call fails
over to another replica on UNAVAILABLE (a non-idempotent one is never sent twice), servers recycle connections
at their max age, and every answered RPC counts on ``horde_grpc_server_handled_total``.

Real aio servers from :func:`horde_core.grpc.start_grpc_server` on two loopback ports, each serving raw-bytes
methods under the real idempotent name (WorkerPoolService/GetAvailability) and a name outside the retry policy.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from horde_core.grpc import (
    IDEMPOTENT_METHODS,
    channel_options,
    insecure_channel,
    server_options,
    service_config,
    start_grpc_server,
)
from horde_core.settings import HordeSettings
from horde_testing.launcher import free_port
from prometheus_client import REGISTRY

IDEMPOTENT = "/horde.dispatch.v1.WorkerPoolService/GetAvailability"
NOT_IDEMPOTENT = "/horde.test.v1.PlainService/Call"
#: Bound on the calls a test makes while it waits for a behaviour (no timing: a count).
CALL_BOUND = 2000


@dataclass
class Replica:
    """One server: its port, the calls each of its methods received, the peers (client ports) it saw."""

    name: str
    port: int
    failing: bool = False
    calls: Counter[str] = field(default_factory=Counter)
    peers: set[str] = field(default_factory=set)
    server: grpc.aio.Server | None = None

    def register(self, server: grpc.aio.Server) -> None:
        def method(full: str) -> grpc.RpcMethodHandler[bytes, bytes]:
            async def behaviour(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
                self.calls[full] += 1
                self.peers.add(context.peer())
                if self.failing:
                    # A store outage: the StoreOutageInterceptor answers UNAVAILABLE, as a replica whose
                    # PostgreSQL connection broke would.
                    raise ConnectionRefusedError(111, "Connect call failed")
                return self.name.encode()

            return grpc.unary_unary_rpc_method_handler(behaviour)

        for full in (IDEMPOTENT, NOT_IDEMPOTENT):
            service, name = full.strip("/").split("/")
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {name: method(full)}),)
            )

    async def start(self, settings: HordeSettings | None = None) -> None:
        self.server = await start_grpc_server("127.0.0.1", self.port, self.register, [], settings)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[Replica, Replica]]:
    a, b = Replica("a", free_port()), Replica("b", free_port())
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


def target(*replicas: Replica) -> str:
    """The local list form ``make run REPLICAS=N`` sets HORDE_*_GRPC_TARGET to."""
    return "ipv4:" + ",".join(f"127.0.0.1:{r.port}" for r in replicas)


def served(method: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "horde_grpc_server_handled_total", {"grpc_method": method, "grpc_code": code}
    )
    return value or 0.0


async def call(channel: grpc.aio.Channel, method: str) -> bytes:
    multi: Any = channel.unary_unary(method)  # raw bytes: no serializers
    response: bytes = await multi(b"x", timeout=10)
    return response


async def test_calls_spread_over_every_replica_of_a_target_list(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    ok_before = served(IDEMPOTENT, "OK")
    async with insecure_channel(target(a, b)) as channel:
        answers: Counter[bytes] = Counter()
        # Both subchannels connect in the background; until the second is READY round_robin has one choice.
        for _ in range(CALL_BOUND):
            answers[await call(channel, IDEMPOTENT)] += 1
            if a.calls[IDEMPOTENT] and b.calls[IDEMPOTENT]:
                break
        assert a.calls[IDEMPOTENT] > 0 and b.calls[IDEMPOTENT] > 0, answers
        warmup = sum(answers.values())
        # Both READY: round_robin alternates, call by call.
        a_before, b_before = a.calls[IDEMPOTENT], b.calls[IDEMPOTENT]
        for _ in range(20):
            answers[await call(channel, IDEMPOTENT)] += 1
    assert (a.calls[IDEMPOTENT] - a_before, b.calls[IDEMPOTENT] - b_before) == (10, 10)
    assert answers == Counter({b"a": a.calls[IDEMPOTENT], b"b": b.calls[IDEMPOTENT]})
    assert served(IDEMPOTENT, "OK") - ok_before == warmup + 20


async def test_idempotent_call_fails_over_from_an_unavailable_replica(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    a.failing = True
    unavailable_before = served(IDEMPOTENT, "UNAVAILABLE")
    async with insecure_channel(target(a, b)) as channel:
        # Until b is READY a retry may land on a again; every call still ends on b (3 attempts, a fails each).
        for _ in range(CALL_BOUND):
            assert await call(channel, IDEMPOTENT) == b"b"
            if a.calls[IDEMPOTENT] >= 5:
                break
        assert a.calls[IDEMPOTENT] >= 5
        assert served(IDEMPOTENT, "UNAVAILABLE") - unavailable_before == a.calls[IDEMPOTENT]
        # Outside the retry policy: a call that reaches the failing replica fails, and is sent once.
        failures = 0
        for _ in range(CALL_BOUND):
            sent_to_a = a.calls[NOT_IDEMPOTENT]
            try:
                assert await call(channel, NOT_IDEMPOTENT) == b"b"
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
                assert exc.details() == "store unreachable: ConnectionRefusedError"
                assert a.calls[NOT_IDEMPOTENT] == sent_to_a + 1
                failures += 1
            if failures >= 3:
                break
        assert failures == 3
        assert b.calls[NOT_IDEMPOTENT] + failures == sum(r.calls[NOT_IDEMPOTENT] for r in replicas)


async def test_idempotent_calls_succeed_after_a_replica_stops(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    async with insecure_channel(target(a, b)) as channel:
        for _ in range(CALL_BOUND):
            await call(channel, IDEMPOTENT)
            if a.calls[IDEMPOTENT] and b.calls[IDEMPOTENT]:
                break
        assert a.calls[IDEMPOTENT] and b.calls[IDEMPOTENT]
        await a.stop()
        b_before = b.calls[IDEMPOTENT]
        answers = [await call(channel, IDEMPOTENT) for _ in range(20)]
    assert answers == [b"b"] * 20
    assert b.calls[IDEMPOTENT] - b_before == 20


async def test_server_recycles_connections_at_max_age() -> None:
    """A connection older than the max age is closed (GOAWAY); the client reconnects (a new peer port) and no
    call fails: how a client finds replicas added since it connected."""
    replica = Replica("a", free_port())
    await replica.start(
        HordeSettings.model_construct(
            grpc_max_connection_age_seconds=0.2, grpc_max_connection_age_grace_seconds=0.2
        )
    )
    try:
        async with insecure_channel(target(replica)) as channel:
            for _ in range(100_000):
                assert await call(channel, IDEMPOTENT) == b"a"
                if len(replica.peers) >= 2:
                    break
        assert len(replica.peers) >= 2
    finally:
        await replica.stop()


def test_server_and_channel_options() -> None:
    options = dict(server_options(HordeSettings.model_construct()))
    assert options["grpc.max_connection_age_ms"] == 30_000
    assert options["grpc.max_connection_age_grace_ms"] == 10_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    settings = HordeSettings(grpc_max_connection_age_seconds=5, grpc_max_connection_age_grace_seconds=2)
    options = dict(server_options(settings))
    assert (options["grpc.max_connection_age_ms"], options["grpc.max_connection_age_grace_ms"]) == (
        5000,
        2000,
    )

    config: dict[str, Any] = service_config()
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    [method_config] = config["methodConfig"]
    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    names = {(n["service"], n["method"]) for n in method_config["name"]}
    assert names == set(IDEMPOTENT_METHODS)
    assert json.loads(json.dumps(config)) == config
    client = dict(channel_options())
    assert json.loads(client["grpc.service_config"]) == config
    assert client["grpc.enable_retries"] == 1
    assert client["grpc.keepalive_time_ms"] == 30_000
    assert client["grpc.max_reconnect_backoff_ms"] == 5_000


def test_idempotent_methods_exist_in_the_protos() -> None:
    """Each retried method is a real RPC (a renamed one would silently lose its retries)."""
    from grpc_health.v1 import health_pb2
    from horde.dispatch.v1 import worker_pool_pb2
    from horde.submit.v1 import settlement_pb2

    services = {
        s.full_name: s
        for module in (worker_pool_pb2, settlement_pb2, health_pb2)
        for s in module.DESCRIPTOR.services_by_name.values()
    }
    for service, method in IDEMPOTENT_METHODS:
        assert method in services[service].methods_by_name, (service, method)
