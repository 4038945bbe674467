"""Model tests (``make test-llm``): the llamacpp backend on gemma3-270m, and the openai backend against
``python -m llama_cpp.server`` on the same model, both driven through the worker loop and the stand-in horde.

Needs the llamacpp extra; skipped when it is not installed. The model is a pretrained base model: replies are
grammatical, not helpful, so the tests check plumbing, grammars, counts and determinism, not answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from horde_testing.launcher import ServiceProcess, free_port
from horde_worker.backends import gemma
from horde_worker.backends.base import Backend
from horde_worker.backends.llamacpp import LlamaCppBackend, default_model_path
from horde_worker.backends.openai import LLAMA_CPP_PYTHON, OpenAIBackend
from horde_worker.config import WorkerSettings
from horde_worker.jobs import BackendFault, ChatDelta, ChatJob, ChatOutput
from horde_worker.worker import Timings, Worker
from worker_standin import StandInHorde, chat_job, text_job

pytestmark = pytest.mark.llm

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},  # no bounds: the Python grammar converter does not apply them
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
STRICT = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
FAST = Timings(empty_pop=(0.05, 0.05, 0.05), pop_error=0.1, connect_error=0.1, submit_backoff=(0.1,))
GREEDY = {"temperature": 0.0, "seed": 7}


@pytest.fixture(scope="module")
def model_path() -> Path:
    """The assembled gemma3-270m GGUF; skips when the llamacpp extra is not installed."""
    pytest.importorskip("llama_cpp", reason="needs the llamacpp extra (make test-llm)")
    return default_model_path()


@pytest.fixture(scope="module")
def llama_backend(model_path: Path) -> Iterator[LlamaCppBackend]:
    backend = LlamaCppBackend(model_path=str(model_path), n_ctx=2048, n_threads=2, model_name="gemma-3-270m")
    asyncio.run(backend.start())
    yield backend
    asyncio.run(backend.close())


def job(text: str, **payload: Any) -> ChatJob:
    return ChatJob.from_pop(
        chat_job("j", text, **{**GREEDY, "max_length": 32, "max_context_length": 2048, **payload})
    )


# -- llamacpp backend, directly -------------------------------------------------------------------------------------


async def test_llamacpp_declares_everything_but_vision_and_reasoning_effort(
    llama_backend: LlamaCppBackend,
) -> None:
    caps = await llama_backend.start()
    assert "vision" not in caps.features and "reasoning_effort" not in caps.features
    assert {"tools", "json_schema", "json_object", "seed", "tools_with_response_format"} <= set(caps.features)
    assert set(caps.guarantees) == {
        "tool_choice_enforced",
        "single_tool_call_enforced",
        "structured_output_enforced",
        "prompt_overflow_refused",
    }
    assert caps.max_context_length == 2048 and caps.model_name == "gemma-3-270m"


async def test_llamacpp_reply_is_deterministic_with_exact_counts(llama_backend: LlamaCppBackend) -> None:
    j = job("Write one sentence about the sea.")
    first = await llama_backend.generate_chat(j)
    second = await llama_backend.generate_chat(j)
    assert first.content and first.content == second.content
    assert "<end_of_turn>" not in first.content
    assert first.prompt_tokens == len(llama_backend.tokenize(gemma.render(j.messages)))
    assert first.completion_tokens is not None and 0 < first.completion_tokens <= 32
    assert first.native_finish_reason in ("stop", "length")


async def test_llamacpp_strict_json_schema(llama_backend: LlamaCppBackend) -> None:
    out = await llama_backend.generate_chat(
        job("Describe a person as JSON.", response_format=STRICT, max_length=96)
    )
    jsonschema.validate(json.loads(out.content or ""), PERSON)


async def test_llamacpp_forced_tool_call(llama_backend: LlamaCppBackend) -> None:
    out = await llama_backend.generate_chat(
        job("What is the weather in Paris?", tools=[WEATHER], tool_choice="required", max_length=64)
    )
    assert out.content is None and len(out.tool_calls) == 1
    assert out.tool_calls[0]["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(out.tool_calls[0]["function"]["arguments"]), WEATHER["function"]["parameters"]
    )


async def test_llamacpp_prompt_overflow_before_generating(llama_backend: LlamaCppBackend) -> None:
    with pytest.raises(BackendFault) as err:
        await llama_backend.generate_chat(job("word " * 3000, max_length=64))
    assert err.value.reason == "prompt_overflow"


async def test_llamacpp_unbuildable_grammar(llama_backend: LlamaCppBackend) -> None:
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "x", "strict": True, "schema": {"$ref": "#/$defs/nope"}},
    }
    with pytest.raises(BackendFault) as err:
        await llama_backend.generate_chat(job("json", response_format=bad))
    assert err.value.reason == "unbuildable_grammar"


async def test_llamacpp_streams_the_reply_it_generates_whole(llama_backend: LlamaCppBackend) -> None:
    j = job("Write one sentence about the sea.", max_length=48)
    whole = await llama_backend.generate_chat(j)
    deltas: list[ChatDelta] = []
    out: ChatOutput | None = None
    async for item in llama_backend.stream_chat(j):
        if isinstance(item, ChatOutput):
            out = item
        else:
            assert out is None
            deltas.append(item)
    assert out is not None and len(deltas) > 1
    assert "".join(d.content for d in deltas) == out.content
    assert out.content == whole.content  # greedy: the same text streamed or not
    assert out.prompt_tokens == whole.prompt_tokens and out.completion_tokens
    assert "<end_of_turn>" not in (out.content or "")


async def test_llamacpp_stream_stops_at_the_next_token_when_closed(llama_backend: LlamaCppBackend) -> None:
    j = job("Tell a very long story about the sea, the ships and the sailors.", max_length=1500)
    stream = llama_backend.stream_chat(j)
    pieces = 0
    async for item in stream:
        assert isinstance(item, ChatDelta)
        pieces += 1
        if pieces == 3:
            break
    await stream.aclose()
    # the generation thread lets go of the model at its next token, long before 1500 tokens
    free = await asyncio.to_thread(llama_backend._mutex.acquire, True, 2.0)
    assert free, "the generation did not stop"
    llama_backend._mutex.release()


async def test_llamacpp_streamed_tool_job_is_generated_whole(llama_backend: LlamaCppBackend) -> None:
    j = job("What is the weather in Paris?", tools=[WEATHER], tool_choice="required", max_length=64)
    items = [item async for item in llama_backend.stream_chat(j)]
    assert len(items) == 1 and isinstance(items[0], ChatOutput) and items[0].tool_calls


# -- through the worker loop ----------------------------------------------------------------------------------------


async def run_jobs(horde: StandInHorde, backend: Backend, job_ids: list[str], within: float = 240) -> Worker:
    settings = WorkerSettings(
        horde_url=horde.url, model_id="gemma-3-270m", max_length=256, max_context_length=2048
    )
    worker = Worker(settings, backend, timings=FAST)
    task = asyncio.create_task(worker.run())
    try:
        ok = await asyncio.to_thread(horde.wait_for, lambda h: all(h.submits_for(j) for j in job_ids), within)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 60)
    assert ok, [s["body"] for s in horde.submits]
    return worker


async def test_worker_with_llamacpp(horde: StandInHorde, model_path: Path) -> None:
    horde.add(
        chat_job("plain", "Say hello.", **GREEDY, max_length=24),
        chat_job("json", "A person as JSON.", **GREEDY, max_length=96, response_format=STRICT),
        chat_job(
            "tool", "Weather in Oslo?", **GREEDY, max_length=64, tools=[WEATHER], tool_choice="required"
        ),
        text_job("text", "The capital of France is", max_length=8, temperature=0),
    )
    backend = LlamaCppBackend(model_path=str(model_path), n_ctx=2048, n_threads=2)
    worker = await run_jobs(horde, backend, ["plain", "json", "tool", "text"])
    assert "json_schema" in worker.declaration["chat_features"]
    plain = horde.final("plain")
    assert plain["message"]["content"] and plain["model_id"] == "gemma-3-270m"
    assert plain["prompt_tokens"] > 0 and plain["completion_tokens"] > 0
    jsonschema.validate(json.loads(horde.final("json")["message"]["content"]), PERSON)
    assert horde.final("tool")["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert horde.final("text")["state"] == "ok" and horde.final("text")["generation"]
    assert all(s["status"] == 200 for s in horde.submits)


async def test_worker_streams_progress_with_llamacpp(horde: StandInHorde, model_path: Path) -> None:
    horde.add(
        chat_job("stream", "Write two sentences about rain.", **GREEDY, max_length=64, stream_progress=True)
    )
    backend = LlamaCppBackend(model_path=str(model_path), n_ctx=2048, n_threads=2)
    settings = WorkerSettings(
        horde_url=horde.url,
        model_id="gemma-3-270m",
        max_length=256,
        max_context_length=2048,
        progress_interval=0.2,
    )
    worker = Worker(settings, backend, timings=FAST)
    task = asyncio.create_task(worker.run())
    try:
        ok = await asyncio.to_thread(horde.wait_for, lambda h: h.submits_for("stream"), 240)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 60)
    assert ok
    message = horde.final("stream")["message"]
    posts = horde.progress_for("stream")
    assert posts and all(p["status"] == 200 for p in posts)
    assert horde.streamed("stream") == (message["content"], message.get("reasoning_content") or "")


# -- openai backend against llama_cpp.server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server(model_path: Path) -> Iterator[str]:
    """``python -m llama_cpp.server`` on the gemma model (Gemma turn format), as a real OpenAI-compatible server."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model_path), "--model_alias", "gemma-3-270m",
        "--chat_format", "gemma", "--n_ctx", "2048", "--n_threads", "2", "--seed", "7",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    # llama.cpp logs ~150 kB at load: the launcher's log file takes it (an unread pipe would block the server).
    with ServiceProcess(
        "llama-server", cmd, health_url=f"{url}/v1/models", url=url, startup_timeout=120, stop_timeout=20
    ):
        yield url


async def test_openai_backend_discovers_llama_cpp_python(llama_server: str) -> None:
    backend = OpenAIBackend(llama_server + "/v1")
    caps = await backend.start()
    await backend.close()
    assert backend.flavor == LLAMA_CPP_PYTHON
    assert caps.model_name == "gemma-3-270m"
    assert {"tools", "json_schema", "structured_output_enforced", "tool_choice_enforced"} <= (
        set(caps.features) | set(caps.guarantees)
    )


async def test_worker_with_openai_backend(horde: StandInHorde, llama_server: str) -> None:
    horde.add(
        chat_job("plain", "Say hello.", **GREEDY, max_length=24),
        chat_job(
            "tool", "Weather in Oslo?", **GREEDY, max_length=64, tools=[WEATHER], tool_choice="required"
        ),
        chat_job("json", "A person as JSON.", **GREEDY, max_length=96, response_format=STRICT),
        chat_job("overflow", "word " * 3000, **GREEDY, max_length=64),
        text_job("text", "The capital of France is", max_length=8, temperature=0),
    )
    worker = await run_jobs(horde, OpenAIBackend(llama_server), ["plain", "tool", "json", "overflow", "text"])
    assert worker.model_id == "gemma-3-270m"
    plain = horde.final("plain")
    assert plain["message"]["content"] and plain["prompt_tokens"] > 0
    tool = horde.final("tool")
    assert tool["finish_reason"] == "tool_calls"
    call = tool["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    jsonschema.validate(json.loads(horde.final("json")["message"]["content"]), PERSON)
    assert horde.final("overflow") == {
        "id": "overflow",
        "state": "faulted",
        "model_id": "gemma-3-270m",
        "fault_reason": "prompt_overflow",
    }
    assert horde.final("text")["generation"]


async def test_openai_backend_streams_from_llama_cpp_python(llama_server: str) -> None:
    backend = OpenAIBackend(llama_server)
    await backend.start()
    j = job("Say hello.", max_length=24)
    deltas: list[ChatDelta] = []
    out: ChatOutput | None = None
    async for item in backend.stream_chat(j):
        if isinstance(item, ChatOutput):
            out = item
        else:
            deltas.append(item)
    await backend.close()
    assert out is not None and out.content and len(deltas) >= 1
    assert "".join(d.content for d in deltas) == out.content
    assert out.native_finish_reason in ("stop", "length")
