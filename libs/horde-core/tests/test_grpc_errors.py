"""Store outages raised inside a servicer reach the caller as UNAVAILABLE; everything else is unchanged.

A real aio server from :func:`horde_core.grpc.start_grpc_server` (which installs the interceptor) with one
raw-bytes unary method whose behaviour each request names.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import grpc
import pytest
import redis.exceptions
from horde_core.grpc import insecure_channel, start_grpc_server
from horde_testing.launcher import free_port

METHOD = "/horde.test.v1.OutageService/Raise"

RAISED: dict[bytes, BaseException] = {
    b"refused": ConnectionRefusedError(111, "Connect call failed"),
    b"timeout": TimeoutError(),
    b"unresolved": socket.gaierror(-2, "Name or service not known"),
    b"postgres": asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    b"redis": redis.exceptions.ConnectionError("Error 111 connecting to localhost:6379"),
    b"redis-timeout": redis.exceptions.TimeoutError("Timeout reading from socket"),
    b"bug": ValueError("not an outage"),
}


async def behaviour(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    if request == b"abort":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the servicer's own refusal")
    if request in RAISED:
        raise RAISED[request]
    return b"ok:" + request


def register(server: grpc.aio.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        "horde.test.v1.OutageService", {"Raise": grpc.unary_unary_rpc_method_handler(behaviour)}
    )
    server.add_generic_rpc_handlers((handler,))


@pytest.fixture
async def call() -> AsyncIterator[Any]:
    port = free_port()
    server = await start_grpc_server("127.0.0.1", port, register, ["horde.test.v1.OutageService"])
    try:
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel.unary_unary(METHOD)
    finally:
        await server.stop(0)


async def status_of(call: Any, request: bytes) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(request, timeout=5)
    return info.value.code(), info.value.details() or ""


@pytest.mark.parametrize(
    ("request_name", "detail"),
    [
        (b"refused", "store unreachable: ConnectionRefusedError"),
        (b"timeout", "store unreachable: TimeoutError"),
        (b"unresolved", "store unreachable: gaierror"),
        (b"postgres", "store unreachable: CannotConnectNowError"),
        (b"redis", "store unreachable: ConnectionError"),
        (b"redis-timeout", "store unreachable: TimeoutError"),
    ],
)
async def test_store_outage_is_unavailable(call: Any, request_name: bytes, detail: str) -> None:
    assert await status_of(call, request_name) == (grpc.StatusCode.UNAVAILABLE, detail)


async def test_other_errors_and_answers_are_unchanged(call: Any) -> None:
    assert await call(b"hello", timeout=5) == b"ok:hello"
    code, _ = await status_of(call, b"bug")
    assert code == grpc.StatusCode.UNKNOWN
    assert await status_of(call, b"abort") == (grpc.StatusCode.INVALID_ARGUMENT, "the servicer's own refusal")
