"""The front's native submit carries the proxy passkey and the client's address when configured, so the
horde's per-address rate limits count each client of the front rather than the front (docs/native-api.md#rate-limits)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from horde_oai.horde_client import HordeClient
from horde_testing.launcher import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@pytest.fixture
async def native_peer() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A real HTTP server on loopback recording the headers of each native submit it answers."""
    seen: list[dict[str, str]] = []

    async def submit(request: Request) -> JSONResponse:
        seen.append(dict(request.headers))
        return JSONResponse({"id": "r1", "kudos": 1, "warnings": []}, status_code=202)

    app = Starlette(routes=[Route("/api/v2/generate/chat/async", submit, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    for _ in range(500):  # uvicorn exposes no start event; poll its flag for up to 5 s
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/api", seen
    finally:
        server.should_exit = True
        await task


@pytest.mark.parametrize(
    ("passkey", "address", "expected"),
    [
        (
            "front-passkey",
            "203.0.113.7",
            {"proxy-authorization": "front-passkey", "proxied-for": "203.0.113.7"},
        ),
        (None, "203.0.113.7", {}),
        # The passkey goes on every call (a horde process's: admission continues its trace context).
        ("front-passkey", None, {"proxy-authorization": "front-passkey"}),
    ],
)
async def test_submit_forwards_the_client_address_with_the_passkey(
    native_peer: tuple[str, list[dict[str, Any]]],
    passkey: str | None,
    address: str | None,
    expected: dict[str, str],
) -> None:
    url, seen = native_peer
    client = HordeClient(url, proxy_passkey=passkey)
    try:
        response = await client.submit("key", {"model": "m", "messages": []}, client_address=address)
    finally:
        await client.aclose()
    assert response.status == 202
    headers = seen[-1]
    assert headers["apikey"] == "key"
    assert {k: v for k, v in headers.items() if k in ("proxy-authorization", "proxied-for")} == expected
