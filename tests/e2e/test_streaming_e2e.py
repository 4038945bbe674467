"""Streaming end to end, every service its own process, the official OpenAI SDK.

The scripted worker paces its reply (``[[pace:SECONDS]]``, ``[[words:N]]``) and posts progress about once a
second; the front relays it chunk by chunk. Also: tools and structured output still arrive whole; a client
that drops a relayed stream cancels it (the worker stops without submitting and the streamed part is
settled); a restart after exposure ends the stream with ChatStreamDiverged; a generation that outlasts its
first lease finishes through progress renewals; Last-Event-ID resumes the same completion.

The stack runs a 4 s job lease (``HORDE_TEXT_JOB_LEASE_SECONDS``) and a 1.5 s resume and retry grace, so the lease and
cancel paths take seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import openai
import pytest

from .conftest import MODEL, Stack

LEASE_SECONDS = 4
RESUME_GRACE_SECONDS = 1.5


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    return {
        "HORDE_TEXT_JOB_LEASE_SECONDS": str(LEASE_SECONDS),
        "HORDE_OAI_STREAM_RESUME_GRACE_SECONDS": str(RESUME_GRACE_SECONDS),
        "HORDE_OAI_RETRY_GRACE_SECONDS": str(RESUME_GRACE_SECONDS),
    }


@pytest.fixture(scope="module")
def streaming_stack(stack: Stack) -> Stack:
    stack.stop_workers()
    stack.start_worker("e2e-streamer", ("HORDE_WORKER_THREADS", "2"))
    return stack


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=120)


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 400, **extra}


def native_status(stack: Stack, request_id: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.native}/generate/chat/status/{request_id}", timeout=10)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def request_id_of(completion_id: str) -> str:
    assert completion_id.startswith("chatcmpl-")
    return completion_id.removeprefix("chatcmpl-")


def query(stack: Stack, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(stack.env["HORDE_DATABASE_URL"])
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def reasoning_of(delta: Any) -> str | None:
    extra = delta.model_extra or {}
    value = extra.get("reasoning_content")
    return value if isinstance(value, str) else None


def sse_events(response: httpx.Response) -> Iterator[tuple[str | None, Any]]:
    """``(event id, data)`` of each SSE event of a raw streamed response (comments skipped)."""
    event_id: str | None = None
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            raw = line[6:]
            yield event_id, raw if raw == "[DONE]" else json.loads(raw)
            event_id = None


def worker_jobs(stack: Stack, outcome: str) -> float:
    """The scripted worker's ``jobs`` counter for ``outcome`` (its /metrics)."""
    worker = stack.workers[0]
    url = str(worker.health_url).replace("/healthz", "/metrics")
    text = httpx.get(url, timeout=5).text
    total = 0.0
    for match in re.finditer(r"^horde_worker_jobs_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        if f'outcome="{outcome}"' in match.group(1):
            total += float(match.group(2))
    return total


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_a_paced_reply_arrives_chunk_by_chunk(streaming_stack: Stack) -> None:
    started = time.monotonic()
    stream = client(streaming_stack).chat.completions.create(
        **ask("[[think]] [[pace:3]] [[words:60]] tell me a story"),
        stream=True,
        stream_options={"include_usage": True},
    )
    arrivals: list[tuple[float, Any]] = [(time.monotonic() - started, chunk) for chunk in stream]
    chunks = [chunk for _, chunk in arrivals]
    content_at = [t for t, c in arrivals if c.choices and c.choices[0].delta.content]
    kinds = [
        "reasoning"
        if reasoning_of(c.choices[0].delta)
        else "content"
        if c.choices[0].delta.content
        else "other"
        for c in chunks
        if c.choices
    ]
    assert len(content_at) >= 8, kinds
    # The first words arrive while the worker is still writing: well before the last ones, and the rest
    # keeps coming through the reply's 3 s rather than in one burst at the end.
    assert content_at[-1] - content_at[0] >= 1.5, content_at
    spread = {int(t * 2) for t in content_at}  # half-second slots that saw content
    assert len(spread) >= 4, content_at
    assert "reasoning" in kinds and kinds.index("content") > max(
        i for i, k in enumerate(kinds) if k == "reasoning"
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    # One completion id, model and fingerprint on every chunk; the fingerprint comes from the worker.
    assert len({c.id for c in chunks}) == 1 and {c.model for c in chunks} == {MODEL}
    fingerprints = {c.system_fingerprint for c in chunks}
    assert len(fingerprints) == 1 and next(iter(fingerprints)) is not None
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None and usage.usage.completion_tokens > 0
    # The streamed text is the stored reply, reasoning and content alike.
    status = native_status(streaming_stack, request_id_of(chunks[0].id))
    stored = status["generations"][0]["message"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == stored["content"]
    streamed_reasoning = "".join(reasoning_of(c.choices[0].delta) or "" for c in chunks if c.choices)
    assert streamed_reasoning == stored["reasoning_content"]
    assert len(stored["content"].split()) >= 60


def test_tools_and_structured_output_are_still_delivered_whole(streaming_stack: Stack) -> None:
    tool: Any = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    chunks: list[Any] = list(
        client(streaming_stack).chat.completions.create(
            **ask("[[tool]] [[pace:2]] weather?"),
            tools=[tool],
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d for d in deltas if d.tool_calls]
    assert len(calls) == 1 and calls[0].tool_calls[0].function.name == "get_weather"  # type: ignore[index]
    assert not any(d.content for d in deltas)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    chunks = list(
        client(streaming_stack).chat.completions.create(
            **ask("[[pace:2]] structured please"),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema, "strict": True},
            },
            stream=True,
        )
    )
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) == 1 and "answer" in json.loads(contents[0])


def test_a_client_that_disconnects_cancels_and_the_worker_stops_without_submitting(
    streaming_stack: Stack,
) -> None:
    cancelled_before = worker_jobs(streaming_stack, "cancelled")
    body = {**ask("[[pace:30]] [[words:300]] a long one"), "stream": True}
    headers = {"Authorization": f"Bearer {streaming_stack.client_key}"}
    request_id, last_id = None, None
    with httpx.stream(
        "POST", f"{streaming_stack.front}/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        for event_id, data in sse_events(r):
            if isinstance(data, dict) and data["choices"] and data["choices"][0]["delta"].get("content"):
                request_id, last_id = request_id_of(data["id"]), event_id
                break
    assert request_id is not None and last_id is not None
    # After the resume grace the front cancels; the worker sees `cancelled` on its next post and stops (the
    # reply would take 30 s more: a stop within the wait proves the abort).
    wait_for(lambda: worker_jobs(streaming_stack, "cancelled") > cancelled_before, 20, "the worker to stop")
    wait_for(lambda: native_status(streaming_stack, request_id)["done"], 10, "the request to end")
    status = native_status(streaming_stack, request_id)
    assert not [g for g in status["generations"] if g.get("message") or g.get("text")]
    (wp,) = query(
        streaming_stack, "SELECT cancelled FROM waiting_prompts WHERE id = $1", uuid.UUID(request_id)
    )
    assert wp["cancelled"] is True
    (gen,) = query(
        streaming_stack,
        "SELECT faulted, cancelled, generation, settled_character_count, kudos FROM processing_gens WHERE wp_id = $1",
        uuid.UUID(request_id),
    )
    # Settled on what was streamed: priced characters recorded, the generation closed without a reply.
    assert gen["faulted"] is True and gen["generation"] is None
    assert gen["settled_character_count"] is not None and gen["settled_character_count"] > 0
    assert gen["kudos"] > 0
    # Past the grace the stream is closed: a late resume is refused, not re-attached to a cancelled request.
    late = httpx.post(
        f"{streaming_stack.front}/chat/completions",
        json=body,
        headers={**headers, "Last-Event-ID": last_id},
        timeout=30,
    )
    assert late.status_code == 404 and late.json()["error"]["code"] == "stream_not_found"


def test_a_restart_after_exposure_ends_the_stream_with_chat_stream_diverged(streaming_stack: Stack) -> None:
    body = {**ask("[[random]] [[pace:6]] [[words:60]] once more"), "stream": True}
    headers = {"Authorization": f"Bearer {streaming_stack.client_key}"}
    events: list[Any] = []
    worker = streaming_stack.workers[0]
    killed = False
    with httpx.stream(
        "POST", f"{streaming_stack.front}/chat/completions", json=body, headers=headers, timeout=90
    ) as r:
        assert r.status_code == 200
        for _, data in sse_events(r):
            events.append(data)
            if (
                not killed
                and isinstance(data, dict)
                and data.get("choices")
                and data["choices"][0]["delta"].get("content")
            ):
                worker.kill()  # mid-reply: its lease lapses and the job restarts on the restarted worker
                worker.restart()
                killed = True
    assert killed
    error, done = events[-2], events[-1]
    assert done == "[DONE]"
    assert error["error"]["code"] == "ChatStreamDiverged" and error["error"]["type"] == "api_error"
    request_id = error["error"]["metadata"]["request_id"]
    status = native_status(streaming_stack, request_id)
    assert status["done"] and len(status["generations"]) >= 1
    streaming_stack.wait_checked_in("e2e-streamer")


def test_a_generation_that_outlasts_its_first_lease_finishes(streaming_stack: Stack) -> None:
    started = time.monotonic()
    chunks = list(
        client(streaming_stack).chat.completions.create(**ask("[[pace:9]] [[words:40]] slow"), stream=True)
    )
    assert time.monotonic() - started > 2 * LEASE_SECONDS
    request_id = request_id_of(chunks[0].id)
    status = native_status(streaming_stack, request_id)
    assert status["done"] and not status["faulted"]
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == (status["generations"][0]["message"]["content"])
    )
    (gen,) = query(
        streaming_stack,
        "SELECT faulted, job_ttl FROM processing_gens WHERE wp_id = $1",
        uuid.UUID(request_id),
    )
    # One attempt, never faulted: progress renewed its lease past the first 4 s.
    assert gen["faulted"] is False and gen["job_ttl"] > LEASE_SECONDS


def test_last_event_id_resumes_the_same_completion(streaming_stack: Stack) -> None:
    body = ask("[[pace:5]] [[words:50]] resume me")
    headers = {"Authorization": f"Bearer {streaming_stack.client_key}"}
    (before,) = query(streaming_stack, "SELECT count(*) AS n FROM waiting_prompts")
    first_part, last_id, request_id = "", None, None
    with httpx.stream(
        "POST",
        f"{streaming_stack.front}/chat/completions",
        json={**body, "stream": True},
        headers=headers,
        timeout=60,
    ) as r:
        seen = 0
        for event_id, data in sse_events(r):
            if isinstance(data, dict) and data.get("choices"):
                first_part += data["choices"][0]["delta"].get("content") or ""
                last_id, request_id = event_id, request_id_of(data["id"])
                seen += 1 if data["choices"][0]["delta"].get("content") else 0
                if seen >= 3:
                    break
    assert last_id is not None and last_id.startswith(f"{request_id}:")
    resumed = client(streaming_stack).chat.completions.create(
        **body, stream=True, extra_headers={"Last-Event-ID": last_id}
    )
    rest = list(resumed)
    assert {c.id for c in rest} == {f"chatcmpl-{request_id}"}
    assert request_id is not None
    status = native_status(streaming_stack, request_id)
    assert status["done"] and not status["faulted"]
    full = status["generations"][0]["message"]["content"]
    assert first_part + "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == full
    (after,) = query(streaming_stack, "SELECT count(*) AS n FROM waiting_prompts")
    assert after["n"] == before["n"] + 1  # no second request row, so no second charge
    (wp,) = query(
        streaming_stack, "SELECT cancelled FROM waiting_prompts WHERE id = $1", uuid.UUID(request_id)
    )
    assert wp["cancelled"] is False  # the drop was resumed within the grace, so the front did not cancel
    # Another key, or another body, cannot take the stream over.
    other = openai.OpenAI(base_url=streaming_stack.front, api_key=streaming_stack.worker_key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        list(other.chat.completions.create(**body, stream=True, extra_headers={"Last-Event-ID": last_id}))
    assert refused.value.code == "stream_not_found"
    assert refused.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.NotFoundError):
        list(
            client(streaming_stack).chat.completions.create(
                **ask("[[pace:5]] [[words:50]] another body"),
                stream=True,
                extra_headers={"Last-Event-ID": last_id},
            )
        )


def test_a_second_connection_that_drops_does_not_cancel_the_first(streaming_stack: Stack) -> None:
    body = {**ask("[[pace:5]] [[words:50]] two readers"), "stream": True}
    headers = {"Authorization": f"Bearer {streaming_stack.client_key}"}
    text, request_id, resumed = "", None, False
    with httpx.stream(
        "POST", f"{streaming_stack.front}/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        for event_id, data in sse_events(r):
            if not isinstance(data, dict) or not data.get("choices"):
                continue
            text += data["choices"][0]["delta"].get("content") or ""
            request_id = request_id_of(data["id"])
            if not resumed and text:
                resumed = True
                assert event_id is not None
                # A fake generation id is refused rather than replayed from the start.
                request_id_part = event_id.split(":")[0]
                fake = httpx.post(
                    f"{streaming_stack.front}/chat/completions",
                    json=body,
                    headers={**headers, "Last-Event-ID": f"{request_id_part}:not-a-gen:0:0"},
                    timeout=30,
                )
                assert fake.status_code == 404 and fake.json()["error"]["code"] == "stream_not_found"
                # A second reader attaches, reads a little and drops while the first goes on reading.
                with httpx.stream(
                    "POST",
                    f"{streaming_stack.front}/chat/completions",
                    json=body,
                    headers={**headers, "Last-Event-ID": event_id},
                    timeout=60,
                ) as second:
                    assert second.status_code == 200
                    for _, more in sse_events(second):
                        if isinstance(more, dict) and more.get("choices"):
                            break
    assert request_id is not None
    time.sleep(RESUME_GRACE_SECONDS + 1)  # past the second reader's grace
    status = native_status(streaming_stack, request_id)
    assert status["done"] and not status["faulted"]
    assert text == status["generations"][0]["message"]["content"]
    (wp,) = query(
        streaming_stack, "SELECT cancelled FROM waiting_prompts WHERE id = $1", uuid.UUID(request_id)
    )
    assert wp["cancelled"] is False
