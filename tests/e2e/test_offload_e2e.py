"""Messages offload end to end (docs/native-api.md#messages-offload): admission stores a large request's
messages gzipped in the messages bucket, dispatch hands the reference worker (declaring messages_url) a
presigned URL in their place, the worker fetches and decodes the gzip body and answers from it, and the
janitor deletes the object with the request."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import openai
import pytest
from botocore.exceptions import ClientError
from horde_testing.stores import S3Endpoint

from .conftest import MODEL, Stack

GREETING = "Hello from the scripted backend:"
WORKER_CONTEXT = 131072
#: About 75k tokens by admission's estimate: over the default 256 KiB threshold, under the worker's context.
LARGE_TEXT = "context " * 37_500


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    # The default threshold (256 KiB) stays; gzip on, so the worker meets Content-Encoding: gzip.
    return {"HORDE_CHAT_MESSAGES_OFFLOAD_ENABLED": "true", "HORDE_CHAT_MESSAGES_OFFLOAD_GZIP": "true"}


@pytest.fixture(scope="module")
def offload_stack(stack: Stack) -> Stack:
    stack.stop_workers()
    stack.start_worker(
        "e2e-offload",
        ("HORDE_WORKER_MESSAGES_URL", "true"),
        ("HORDE_WORKER_MAX_CONTEXT_LENGTH", str(WORKER_CONTEXT)),
        ("HORDE_WORKER_MAX_LENGTH", "64"),
    )
    return stack


def query(stack: Stack, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(stack.env["HORDE_DATABASE_URL"])
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def head(s3: S3Endpoint, key: str) -> dict[str, Any] | None:
    try:
        answer: dict[str, Any] = s3.client().head_object(Bucket=s3.messages_bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return answer


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout}s")


def messages(marker: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": LARGE_TEXT}, {"role": "user", "content": f"offloaded {marker}"}]


def test_native_request_is_offloaded_fetched_answered_and_deleted(
    offload_stack: Stack, s3_endpoint: S3Endpoint
) -> None:
    stack = offload_stack
    marker = uuid.uuid4().hex[:8]
    r = httpx.post(
        f"{stack.native}/generate/chat/async",
        json={"model": MODEL, "messages": messages(marker), "max_tokens": 32},
        headers={"apikey": stack.client_key},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    key = f"{rid}_chat_messages.json"

    status: dict[str, Any] = {}

    def done() -> bool:
        nonlocal status
        status = httpx.get(f"{stack.native}/generate/chat/status/{rid}", timeout=10).json()
        return bool(status.get("done"))

    wait_for("the chat request's completion", done)
    assert not status["faulted"], status
    # The reply echoes the last user message, which only the fetched object carried.
    assert status["generations"][0]["message"]["content"] == f"{GREETING} offloaded {marker}"

    row = query(
        stack,
        "SELECT w.chat_messages_offloaded, g.image_transport FROM waiting_prompts w "
        "JOIN processing_gens g ON g.wp_id = w.id WHERE w.id = $1",
        uuid.UUID(rid),
    )
    assert row == [{"chat_messages_offloaded": True, "image_transport": "messages_url"}]

    # Stored gzipped, with the spec's headers; the body is the messages array.
    stored = head(s3_endpoint, key)
    assert stored is not None
    assert (stored["ContentType"], stored["CacheControl"], stored["ContentEncoding"]) == (
        "application/json",
        "no-transform",
        "gzip",
    )
    # A presigned GET (what the worker was handed) serves it as stored: gzip, which the worker had to decode.
    url = s3_endpoint.client().generate_presigned_url(
        "get_object", Params={"Bucket": s3_endpoint.messages_bucket, "Key": key}, ExpiresIn=60
    )
    with httpx.stream("GET", url, timeout=30) as served:
        assert served.status_code == 200 and served.headers["content-encoding"] == "gzip"
        raw = b"".join(served.iter_raw())
    assert json.loads(gzip.decompress(raw)) == messages(marker)

    # The object goes with the request: past its expiry, the janitor (every second here) deletes both.
    query(
        stack, "UPDATE waiting_prompts SET expiry = now() - interval '1 second' WHERE id = $1", uuid.UUID(rid)
    )
    wait_for("the messages object's deletion", lambda: head(s3_endpoint, key) is None)
    assert query(stack, "SELECT id FROM waiting_prompts WHERE id = $1", uuid.UUID(rid)) == []


def test_openai_sdk_request_is_offloaded(offload_stack: Stack, s3_endpoint: S3Endpoint) -> None:
    stack = offload_stack
    marker = uuid.uuid4().hex[:8]
    client = openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=90)
    completion = client.chat.completions.create(model=MODEL, messages=messages(marker), max_tokens=32)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == f"{GREETING} offloaded {marker}"
    rows = query(
        stack,
        "SELECT w.id, w.chat_messages_offloaded, g.image_transport FROM waiting_prompts w "
        "JOIN processing_gens g ON g.wp_id = w.id WHERE w.prompt LIKE $1",
        f"%offloaded {marker}%",
    )
    assert [(r["chat_messages_offloaded"], r["image_transport"]) for r in rows] == [(True, "messages_url")]
    stored = head(s3_endpoint, f"{rows[0]['id']}_chat_messages.json")
    assert stored is not None and stored["ContentEncoding"] == "gzip"
