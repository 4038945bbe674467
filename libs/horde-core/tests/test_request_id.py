"""Request ids (horde_core.request_id): taken from a sane X-Request-ID or made, echoed on the response, on every
JSON log line of the request (null outside one), and carried over gRPC as x-request-id metadata."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import grpc
import httpx
import pytest
from fastapi import FastAPI
from horde_core import logging as horde_logging
from horde_core.app import create_app
from horde_core.grpc import insecure_channel, start_grpc_server
from horde_core.request_id import (
    MAX_REQUEST_ID_LENGTH,
    current_request_id,
    outgoing_headers,
    sane_request_id,
)
from horde_core.settings import HordeSettings
from starlette.responses import JSONResponse

log = logging.getLogger("horde.test.request_id")


@pytest.mark.parametrize(
    "value",
    [
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "abc",
        "edge/1234-5678:9@lb_01.x+y=",
        "a" * MAX_REQUEST_ID_LENGTH,
    ],
)
def test_sane_ids_are_kept(value: str) -> None:
    assert sane_request_id(value) == value
    assert sane_request_id(value.encode()) == value


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "a" * (MAX_REQUEST_ID_LENGTH + 1),
        "abc\ndef",
        "abc\r\nX-Injected: 1",
        "abc\x1b[31mred",
        "with space",
        'quote"d',
        "{json}",
        "caf\u00e9",
        b"\xff\xfe",
    ],
)
def test_hostile_ids_are_refused(value: str | bytes | None) -> None:
    assert sane_request_id(value) is None


@pytest.fixture
def json_stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        horde_logging.configure_logging("svc", "DEBUG", json_output=True)
        yield stderr
    finally:
        horde_logging._stop_listener()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def _lines(stderr: io.StringIO) -> list[dict[str, object]]:
    horde_logging._stop_listener()  # writes what the thread has queued
    return [json.loads(line) for line in stderr.getvalue().splitlines()]


def _same(value: bytes) -> bytes:
    return value


def _app() -> FastAPI:
    app = create_app("svc", horde_errors=True)

    @app.get("/v2/echo")
    async def echo() -> dict[str, object]:
        log.info("inside the request")
        return {"request_id": current_request_id(), "outgoing": outgoing_headers()}

    @app.get("/v2/boom")
    async def boom() -> JSONResponse:
        log.info("about to fail")
        raise RuntimeError("boom")

    return app


async def test_the_id_is_taken_echoed_and_on_every_line_of_the_request(json_stderr: io.StringIO) -> None:
    app = _app()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        r = await client.get("/v2/echo", headers={"X-Request-ID": "req-123"})
        assert r.headers["X-Request-ID"] == "req-123"
        assert r.json() == {"request_id": "req-123", "outgoing": {"X-Request-ID": "req-123"}}

        hostile = "x" * 500
        r = await client.get("/v2/echo", headers={"X-Request-ID": hostile})
        made = r.headers["X-Request-ID"]
        assert made != hostile and len(made) == 32 and r.json()["request_id"] == made

        r = await client.get("/v2/echo", headers={"X-Request-ID": "evil\x1b[2Jid"})
        replaced = r.headers["X-Request-ID"]
        assert sane_request_id(replaced) == replaced and "evil" not in replaced

        r = await client.get("/v2/echo")  # none given: one is made
        assert len(r.headers["X-Request-ID"]) == 32
        log.info("outside any request")

        # An unhandled error: Starlette's 500 carries the header, the error line the id.
        r = await client.get("/v2/boom", headers={"X-Request-ID": "req-boom"})
        assert r.status_code == 500 and r.headers["X-Request-ID"] == "req-boom"

    lines = _lines(json_stderr)
    inside = [line for line in lines if line["message"] == "inside the request"]
    assert [line["request_id"] for line in inside] == ["req-123", made, replaced, inside[3]["request_id"]]
    finished = [line for line in lines if line["message"] == "request"]
    assert finished and finished[0]["request_id"] == "req-123" and finished[0]["status"] == 200
    assert finished[0]["path"] == "/v2/echo"
    boom_lines = [line for line in lines if line["request_id"] == "req-boom"]
    assert {"about to fail", "unhandled error"} <= {str(line["message"]) for line in boom_lines}
    outside = [line for line in lines if line["message"] == "outside any request"]
    assert outside and outside[0]["request_id"] is None
    # The hostile values were never written.
    text = json_stderr.getvalue()
    assert hostile not in text and "evil" not in text


async def test_grpc_calls_carry_the_id_to_the_server(json_stderr: io.StringIO) -> None:
    """A call made inside a request sends x-request-id; the server's handler (and its log lines) has it; a call
    outside a request gets a fresh id on the server."""
    seen: list[str | None] = []

    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        seen.append(current_request_id())
        log.info("served a call")
        return request

    def register(server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            echo, request_deserializer=_same, response_serializer=_same
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.Echo", {"Call": handler}),)
        )

    from horde_testing.launcher import free_port

    port = free_port()
    server = await start_grpc_server("127.0.0.1", port, register, [], HordeSettings())
    app = create_app("svc", horde_errors=True)
    channel = insecure_channel(f"127.0.0.1:{port}")
    call_echo = channel.unary_unary("/test.Echo/Call", request_serializer=_same, response_deserializer=_same)

    @app.get("/v2/call")
    async def call() -> dict[str, str]:
        await call_echo(b"x", timeout=5)
        return {}

    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
            r = await client.get("/v2/call", headers={"X-Request-ID": "grpc-req-1"})
            assert r.status_code == 200
        await call_echo(b"y", timeout=5)
    finally:
        await channel.close()
        await server.stop(None)
    assert seen[0] == "grpc-req-1"
    assert seen[1] is not None and seen[1] != "grpc-req-1"
    served = [line for line in _lines(json_stderr) if line["message"] == "served a call"]
    assert served[0]["request_id"] == "grpc-req-1"


def test_a_horde_request_id_given_in_extra_is_kept_apart(json_stderr: io.StringIO) -> None:
    log.warning("chat signal publish failed", extra={"request_id": "wp-uuid", "event": "done"})
    (line,) = [line for line in _lines(json_stderr) if line["message"] == "chat signal publish failed"]
    assert line["horde_request_id"] == "wp-uuid" and line["request_id"] is None and line["event"] == "done"
