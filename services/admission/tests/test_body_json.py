"""Bodies JSON cannot carry to the stores are refused before anything else (the contract's load_json_body)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

SURROGATE = "The request body holds a lone UTF-16 surrogate, which is not valid Unicode."


@pytest.mark.parametrize(
    ("route", "raw", "rc", "message"),
    [
        (
            "chat",
            b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "BadRequest",
            SURROGATE,
        ),
        ("text", b'{"prompt": "\\udfff"}', "BadRequest", SURROGATE),
        (
            "chat",
            b'{"model": "m", "temperature": NaN, "messages": []}',
            "BadRequest",
            "The request body is not valid JSON.",
        ),
        (
            "chat",
            b'{"model": "m", "temperature": 1e400, "messages": []}',
            "BadRequest",
            "The request body is not valid JSON.",
        ),
        (
            "text",
            b'{"prompt": "a\\u0000b"}',
            "NulByteInPayload",
            "The request body contains a NUL character.",
        ),
    ],
)
async def test_unstorable_json_is_400(client: Any, route: str, raw: bytes, rc: str, message: str) -> None:
    r = await client.post(
        f"/api/v2/generate/{route}/async",
        content=raw,
        headers={"apikey": "0000000000", "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json() == {"message": message, "rc": rc}


async def test_a_stalled_body_is_408_request_body_timeout(make_client: Any) -> None:
    slow = await make_client(body_read_timeout_seconds=0.5)

    async def stalls():  # type: ignore[no-untyped-def]
        yield b'{"model": "m", '
        await asyncio.sleep(5)
        yield b'"messages": []}'

    for route in ("chat", "text"):
        r = await slow.post(
            f"/api/v2/generate/{route}/async", content=stalls(), headers={"apikey": "0000000000"}
        )
        assert r.status_code == 408
        assert r.json() == {
            "message": "The request body did not arrive within 0.5 seconds.",
            "rc": "RequestBodyTimeout",
        }
