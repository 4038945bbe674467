"""The openai backend's streaming: SSE parsing, tool call fragments, errors, and the abort on close, against
the llama-server stand-in (``worker_standin.StandInBackend``) over real sockets; then through the worker loop
with the stand-in horde's progress route."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from horde_worker.backends.openai import (
    LLAMA_SERVER,
    SSE_DONE,
    ChatStreamAccumulator,
    OpenAIBackend,
    build_chat_request,
    iter_sse,
)
from horde_worker.config import WorkerSettings
from horde_worker.jobs import BackendFault, ChatDelta, ChatJob, ChatOutput
from horde_worker.replies import build_chat_submit
from horde_worker.worker import Timings, Worker
from worker_standin import (
    StandInBackend,
    StandInHorde,
    chat_job,
    collect,
    sse_chunk,
    text_events,
    usage_chunk,
)


def job(text: str = "hi", **payload: Any) -> ChatJob:
    return ChatJob.from_pop(chat_job("j", text, **{"max_length": 100, "max_context_length": 1000, **payload}))


async def started(server: StandInBackend) -> OpenAIBackend:
    backend = OpenAIBackend(server.url, retry_delay=0.01)
    await backend.start()
    assert backend.flavor == LLAMA_SERVER
    return backend


# -- pure parsing -----------------------------------------------------------------------------------------------------


async def lines(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


async def test_iter_sse_reads_events_comments_multiline_and_done() -> None:
    got = [
        e
        async for e in iter_sse(
            lines(
                ": keepalive",
                "",
                'data: {"a":',
                "data: 1}",
                "",
                "event: x",
                "data:{}",
                "",
                "data: [DONE]",
                "",
            )
        )
    ]
    assert got == ['{"a":\n1}', "{}", SSE_DONE]
    assert [e async for e in iter_sse(lines('error: {"code": 500, "message": "boom"}', ""))] == [
        '{"error": {"code": 500, "message": "boom"}}'
    ]
    assert [e async for e in iter_sse(lines("data: {}"))] == ["{}"]  # no blank line before the end


def test_accumulator_text_reasoning_finish_and_usage() -> None:
    acc = ChatStreamAccumulator()
    assert acc.feed({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) is None
    assert acc.feed(sse_chunk(reasoning="thinking ")) == ChatDelta(reasoning="thinking ")
    assert acc.feed(sse_chunk(reasoning="more", reasoning_key="reasoning")) == ChatDelta(reasoning="more")
    assert acc.feed(sse_chunk(content="Hel")) == ChatDelta(content="Hel")
    assert acc.feed(sse_chunk(content="lo")) == ChatDelta(content="lo")
    assert acc.feed(sse_chunk(finish="length")) is None
    usage = usage_chunk(7, 3)
    usage["usage"]["completion_tokens_details"] = {"reasoning_tokens": 2}
    assert acc.feed(usage) is None
    out = acc.output()
    assert (out.content, out.reasoning, out.native_finish_reason) == ("Hello", "thinking more", "length")
    assert (out.prompt_tokens, out.completion_tokens, out.reasoning_tokens) == (7, 3, 2)
    assert out.tool_calls == []


def test_accumulator_tool_call_fragments() -> None:
    acc = ChatStreamAccumulator()
    fragments = [
        [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ],
        [{"index": 0, "function": {"arguments": '{"city":'}}],
        [{"index": 1, "id": "call_b", "function": {"name": "get_time", "arguments": "{}"}}],
        [{"index": 0, "function": {"arguments": '"Oslo"}'}}],
    ]
    for f in fragments:
        assert acc.feed(sse_chunk(tool_calls=f)) is None
    acc.feed(sse_chunk(finish="tool_calls"))
    out = acc.output()
    assert out.content is None and out.native_finish_reason == "tool_calls"
    assert out.tool_calls == [
        {
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
            "id": "call_a",
        },
        {"type": "function", "function": {"name": "get_time", "arguments": "{}"}, "id": "call_b"},
    ]
    # calls without index (whole, one chunk each, as some servers send them); object arguments
    acc = ChatStreamAccumulator()
    acc.feed(sse_chunk(tool_calls=[{"id": "x1", "function": {"name": "f", "arguments": {"a": 1}}}]))
    acc.feed(sse_chunk(tool_calls=[{"id": "x2", "function": {"name": "g", "arguments": "{}"}}]))
    assert [(c["id"], c["function"]["arguments"]) for c in acc.output().tool_calls] == [
        ("x1", '{"a":1}'),
        ("x2", "{}"),
    ]


def test_accumulator_refuses_an_empty_stream_and_error_events() -> None:
    with pytest.raises(BackendFault) as err:
        ChatStreamAccumulator().output()
    assert err.value.reason == "generation_error"
    with pytest.raises(BackendFault) as err:
        ChatStreamAccumulator().feed({"error": {"code": 400, "message": "failed to parse grammar"}})
    assert err.value.reason == "unbuildable_grammar"


def test_stream_request_body() -> None:
    body = build_chat_request(LLAMA_SERVER, job(), "m", stream=True)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in build_chat_request("koboldcpp", job(), "m", stream=True)
    assert build_chat_request(LLAMA_SERVER, job(), "m")["stream"] is False


# -- over HTTP --------------------------------------------------------------------------------------------------------


async def test_stream_against_the_standin() -> None:
    events = [
        sse_chunk(reasoning="r1 "),
        sse_chunk(reasoning="r2"),
        *text_events("A streamed answer.", size=4),
    ]
    with StandInBackend(events) as server:
        backend = await started(server)
        deltas, out = await collect(backend, job())
        await backend.close()
    assert "".join(d.content for d in deltas) == out.content == "A streamed answer."
    assert "".join(d.reasoning for d in deltas) == out.reasoning == "r1 r2"
    assert out.native_finish_reason == "stop" and out.prompt_tokens == 5 and out.completion_tokens == 5
    sent = server.requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert server.completed == 1


async def test_closing_the_stream_aborts_the_backend_request_at_once() -> None:
    events = [sse_chunk(content=f"w{i} ") for i in range(200)] + ["data: [DONE]"]
    with StandInBackend(events, delay=0.02) as server:
        backend = await started(server)
        received: list[ChatDelta | ChatOutput] = []
        five = asyncio.Event()

        async def consume() -> None:
            async for item in backend.stream_chat(job()):
                received.append(item)
                if len(received) == 5:
                    five.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(five.wait(), 5)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(server.hung_up.wait, 2.0), "the server never saw the hang-up"
        seen = time.monotonic() - cancelled_at
        await backend.close()
    assert seen < 0.5, seen
    assert server.completed == 0 and server.sent < 50


async def test_stream_errors() -> None:
    with StandInBackend(
        [sse_chunk(content="part"), 'error: {"code": 500, "message": "CUDA out of memory"}']
    ) as s:
        backend = await started(s)
        with pytest.raises(BackendFault) as err:
            await collect(backend, job())
        assert err.value.reason == "generation_error"
        # cut off: neither a finish reason nor [DONE]
        s.events = [sse_chunk(content="part")]
        with pytest.raises(BackendFault) as err:
            await collect(backend, job())
        assert "ended early" in str(err.value)
        # an error answer before the stream is mapped as for a whole reply
        s.answer = (400, {"error": {"type": "exceed_context_size_error", "n_ctx": 4096}})
        with pytest.raises(BackendFault) as err:
            await collect(backend, job())
        assert err.value.reason == "prompt_overflow"
        await backend.close()


async def test_a_json_answer_to_a_streamed_request_is_read_whole() -> None:
    with StandInBackend() as server:
        backend = await started(server)
        server.answer = (
            200,
            {"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}], "usage": {}},
        )
        deltas, out = await collect(backend, job())
        await backend.close()
    assert deltas == [] and out.content == "whole"


async def test_prompt_overflow_is_refused_before_streaming() -> None:
    with StandInBackend(prompt_tokens=950) as server:
        backend = await started(server)
        with pytest.raises(BackendFault) as err:
            await collect(backend, job())
        await backend.close()
    assert err.value.reason == "prompt_overflow" and server.requests == []


# -- through the worker ---------------------------------------------------------------------------------------------


async def test_worker_streams_an_openai_backend_with_inline_think(horde: StandInHorde) -> None:
    text = "<think>Let me see: two and two.</think>\n\nIt is four, as ever."
    with StandInBackend(text_events(text, size=3), delay=0.01) as server:
        horde.add(chat_job("j1", "2+2?", stream_progress=True, max_length=100))
        settings = WorkerSettings(
            horde_url=horde.url, model_id="standin-model", progress_interval=0.05, backend="openai"
        )
        worker = Worker(
            settings,
            OpenAIBackend(server.url, retry_delay=0.01),
            timings=Timings(empty_pop=(0.02, 0.02, 0.02), submit_backoff=(0.02,)),
        )
        task = asyncio.create_task(worker.run())
        try:
            assert await asyncio.to_thread(horde.wait_for, lambda h: h.submits_for("j1"), 10)
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 10)
    message = horde.final("j1")["message"]
    assert message == {
        "role": "assistant",
        "content": "It is four, as ever.",
        "reasoning_content": "Let me see: two and two.",
    }
    sent = horde.progress_for("j1")
    assert len(sent) >= 3 and all(p["status"] == 200 for p in sent)
    assert horde.streamed("j1") == (message["content"], message["reasoning_content"])
    assert not any("<" in p["body"]["delta"].get("content", "") for p in sent)


async def test_streamed_output_builds_the_same_submit_as_the_whole_reply() -> None:
    text = "<think>why</think>answer"
    with StandInBackend(text_events(text, size=2)) as server:
        backend = await started(server)
        _, streamed = await collect(backend, job())
        whole = await backend.generate_chat(job())
        await backend.close()
    declared: frozenset[str] = frozenset()
    a = build_chat_submit(job(), streamed, "m", declared)["message"]
    b = build_chat_submit(job(), whole, "m", declared)["message"]
    assert a == b == {"role": "assistant", "content": "answer", "reasoning_content": "why"}
