"""The llamacpp backend's streaming plumbing (thread → event loop, stop at the next token) with a stand-in for
``llama_cpp.Llama``, so it runs without the llamacpp extra. ``test_llm.py`` (``make test-llm``) runs the same
path on the real model."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
from horde_worker.backends.llamacpp import LlamaCppBackend
from horde_worker.backends.scripted import stream_pieces
from horde_worker.jobs import BackendFault, ChatDelta, ChatJob, ChatOutput
from worker_standin import chat_job, collect


class StoppingCriteriaList(list[Any]):
    """llama_cpp.StoppingCriteriaList: stop when any criterion says so."""

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        return any(c(input_ids, logits) for c in self)


class FakeLlama:
    """Generates ``text`` word by word, ``delay`` seconds a token, checking the stopping criteria before each
    token as llama.cpp's generate loop does. Records the tokens generated."""

    def __init__(self, text: str, delay: float = 0.0, fail: bool = False) -> None:
        self.text = text
        self.delay = delay
        self.fail = fail
        self.generated = 0
        self.stopped = threading.Event()

    def tokenize(self, data: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return list(range(len(data.split()) + int(add_bos)))

    def create_completion(
        self,
        prompt: list[int],
        max_tokens: int,
        grammar: Any = None,
        stream: bool = False,
        stopping_criteria: Any = None,
        **params: Any,
    ) -> Any:
        if self.fail:
            raise RuntimeError("llama_decode returned -1")
        if not stream:
            return {
                "choices": [{"text": self.text, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(self.text.split())},
            }
        return self._chunks(max_tokens, stopping_criteria)

    def _chunks(self, max_tokens: int, stopping_criteria: Any) -> Iterator[dict[str, Any]]:
        finish = "stop"
        for n, piece in enumerate(stream_pieces(self.text)):
            if n >= max_tokens:
                finish = "length"
                break
            time.sleep(self.delay)
            if stopping_criteria is not None and stopping_criteria(None, None):
                self.stopped.set()
                return
            self.generated += 1
            yield {"choices": [{"text": piece, "index": 0, "finish_reason": None}]}
        yield {"choices": [{"text": "", "index": 0, "finish_reason": finish}]}

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fake_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("llama_cpp")
    module.StoppingCriteriaList = StoppingCriteriaList  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", module)


def backend_with(llm: FakeLlama) -> LlamaCppBackend:
    backend = LlamaCppBackend(model_path="/nowhere.gguf", n_ctx=2048, model_name="fake")
    backend.llm = llm
    return backend


def job(text: str = "hi", **payload: Any) -> ChatJob:
    return ChatJob.from_pop(chat_job("j", text, **{"max_length": 64, "max_context_length": 2048, **payload}))


async def test_pieces_then_the_output() -> None:
    text = "<think>pondering it</think>\n\nThe sea is wide."
    deltas, out = await collect(backend_with(FakeLlama(text)), job())
    assert "".join(d.content for d in deltas) == text and len(deltas) == len(stream_pieces(text))
    assert (out.content, out.reasoning) == ("The sea is wide.", "pondering it")
    assert out.native_finish_reason == "stop" and out.completion_tokens == 6 and out.reasoning_tokens == 2
    assert out.prompt_tokens is not None and out.prompt_tokens > 0


async def test_length_finish() -> None:
    deltas, out = await collect(backend_with(FakeLlama("one two three four")), job(max_length=2))
    assert out.content == "one two" and out.native_finish_reason == "length" and len(deltas) == 2


async def test_closing_the_stream_stops_the_generation_at_the_next_token() -> None:
    llm = FakeLlama(" ".join(f"w{i}" for i in range(200)), delay=0.02)
    backend = backend_with(llm)
    stream = backend.stream_chat(job(max_length=500))
    async for item in stream:
        assert isinstance(item, ChatDelta)
        if llm.generated >= 3:
            break
    await stream.aclose()
    assert await asyncio.to_thread(llm.stopped.wait, 1.0)
    assert llm.generated < 10
    # the model is free for the next job
    assert await asyncio.to_thread(backend._mutex.acquire, True, 1.0)
    backend._mutex.release()


async def test_cancelling_the_consumer_stops_the_generation() -> None:
    llm = FakeLlama(" ".join(f"w{i}" for i in range(200)), delay=0.02)
    backend = backend_with(llm)

    async def consume() -> None:
        async for _ in backend.stream_chat(job(max_length=500)):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(llm.stopped.wait, 1.0)
    assert llm.generated < 15


async def test_errors_and_overflow_reach_the_worker_as_faults() -> None:
    with pytest.raises(BackendFault) as err:
        await collect(backend_with(FakeLlama("x", fail=True)), job())
    assert err.value.reason == "generation_error"
    with pytest.raises(BackendFault) as err:
        await collect(backend_with(FakeLlama("x")), job("word " * 2000, max_length=64))
    assert err.value.reason == "prompt_overflow"


async def test_a_tool_job_is_generated_whole() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    llm = FakeLlama('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    items = [i async for i in backend_with(llm).stream_chat(job(tools=tools, tool_choice="auto"))]
    assert len(items) == 1 and isinstance(items[0], ChatOutput)
    assert items[0].tool_calls[0]["function"]["name"] == "get_weather"
