"""The gRPC server helper serves the standard health service."""

from __future__ import annotations

import socket

import grpc
import pytest
from horde_core.grpc import check_health, insecure_channel, start_grpc_server
from horde_testing.launcher import free_port


async def test_health_serving_for_named_services() -> None:
    port = free_port()
    server = await start_grpc_server("127.0.0.1", port, lambda _: None, ["horde.test.v1.TestService"])
    try:
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await check_health(channel)
            assert await check_health(channel, "horde.test.v1.TestService")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await check_health(channel, "horde.unknown.v1.Nope")
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(0)


async def test_bind_failure_raises() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError, match="cannot bind"):
            await start_grpc_server("127.0.0.1", port, lambda _: None, [])
