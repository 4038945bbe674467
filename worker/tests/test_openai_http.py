"""The openai backend's HTTP side against small stand-ins of llama-server and koboldcpp (real sockets).

The real servers are not available in the default suite; these stand-ins answer the discovery and counting
endpoints with the shapes the real servers answer with, so detection, discovery, the prompt pre-count and the
error mapping run over HTTP. ``make test-llm`` drives the backend against a real server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from horde_worker.backends.openai import KOBOLDCPP, LLAMA_SERVER, OLLAMA, VLLM, OpenAIBackend
from horde_worker.jobs import BackendFault, ChatJob

Route = Callable[[dict[str, Any]], tuple[int, Any]]


class FakeServer:
    """Answers ``(method, path)`` routes with JSON; records POST bodies in :attr:`posted`."""

    def __init__(self, routes: dict[tuple[str, str], Route]) -> None:
        self.routes = routes
        self.posted: list[tuple[str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _answer(self, method: str) -> None:
                body: dict[str, Any] = {}
                if method == "POST":
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                    outer.posted.append((self.path, body))
                route = outer.routes.get((method, self.path))
                status, payload = route(body) if route else (404, {"error": "not found"})
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def reply(content: str | None = "ok", **message: Any) -> tuple[int, Any]:
    msg = {"role": "assistant", "content": content, **message}
    return 200, {
        "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }


@pytest.fixture
def server_factory() -> Iterator[Callable[[dict[tuple[str, str], Route]], FakeServer]]:
    servers: list[FakeServer] = []

    def make(routes: dict[tuple[str, str], Route]) -> FakeServer:
        servers.append(FakeServer(routes))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def job(text: str = "hi", **payload: Any) -> ChatJob:
    base = {
        "messages": [{"role": "user", "content": text}],
        "max_length": 100,
        "max_context_length": 1000,
        **payload,
    }
    return ChatJob.from_pop({"id": "j", "chat": True, "payload": base})


def llama_server_routes(prompt_tokens: int, chat: Route | None = None) -> dict[tuple[str, str], Route]:
    return {
        ("GET", "/v1/models"): lambda b: (
            200,
            {"data": [{"id": "/models/Qwen3-8B-Q4_K_M.gguf", "owned_by": "llamacpp"}]},
        ),
        ("GET", "/props"): lambda b: (
            200,
            {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1},
        ),
        ("POST", "/apply-template"): lambda b: (200, {"prompt": "<rendered>" + json.dumps(b["messages"])}),
        ("POST", "/tokenize"): lambda b: (200, {"tokens": list(range(prompt_tokens))}),
        ("POST", "/v1/chat/completions"): chat or (lambda b: reply("<think>r</think>answer")),
    }


async def test_llama_server_discovery_and_reply(server_factory: Any) -> None:
    server = server_factory(llama_server_routes(prompt_tokens=50))
    backend = OpenAIBackend(server.url + "/v1")
    caps = await backend.start()
    assert backend.flavor == LLAMA_SERVER and backend.model == "/models/Qwen3-8B-Q4_K_M.gguf"
    assert caps.max_context_length == 4096 and caps.model_name == "Qwen3-8B-Q4_K_M"
    out = await backend.generate_chat(
        job(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto")
    )
    await backend.close()
    assert out.content == "<think>r</think>answer" and out.prompt_tokens == 3
    sent = dict(server.posted)["/v1/chat/completions"]
    assert sent["parallel_tool_calls"] is True and sent["max_tokens"] == 100


async def test_llama_server_prompt_overflow_is_refused_before_generating(server_factory: Any) -> None:
    server = server_factory(llama_server_routes(prompt_tokens=901))
    backend = OpenAIBackend(server.url)
    await backend.start()
    with pytest.raises(BackendFault) as err:
        await backend.generate_chat(job())  # 901 > 1000 - 100
    await backend.close()
    assert err.value.reason == "prompt_overflow"
    assert "/v1/chat/completions" not in dict(server.posted)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            (400, {"error": {"message": "failed to parse grammar", "type": "invalid_request_error"}}),
            "unbuildable_grammar",
        ),
        (
            (400, {"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}),
            "prompt_overflow",
        ),
        ((500, {"error": {"message": "CUDA out of memory"}}), "generation_error"),
    ],
)
async def test_llama_server_errors_map_to_fault_reasons(
    server_factory: Any, answer: tuple[int, Any], reason: str
) -> None:
    server = server_factory(llama_server_routes(prompt_tokens=10, chat=lambda b: answer))
    backend = OpenAIBackend(server.url)
    await backend.start()
    with pytest.raises(BackendFault) as err:
        await backend.generate_chat(job())
    await backend.close()
    assert err.value.reason == reason


async def test_busy_backend_is_retried(server_factory: Any) -> None:
    answers = iter([(503, {"error": "loading"}), reply("late")])
    routes = llama_server_routes(prompt_tokens=10, chat=lambda b: next(answers))
    backend = OpenAIBackend(server_factory(routes).url, retry_delay=0.01)
    await backend.start()
    out = await backend.generate_chat(job())
    await backend.close()
    assert out.content == "late"


async def test_koboldcpp_discovery_and_count(server_factory: Any) -> None:
    counted: list[str] = []

    def tokencount(body: dict[str, Any]) -> tuple[int, Any]:
        counted.append(body["prompt"])
        return 200, {"value": 700}

    server = server_factory(
        {
            ("GET", "/v1/models"): lambda b: (
                200,
                {"data": [{"id": "koboldcpp/Qwen3-8B", "owned_by": "koboldcpp"}]},
            ),
            ("GET", "/api/extra/version"): lambda b: (200, {"result": "KoboldCpp", "version": "1.102"}),
            ("GET", "/api/v1/model"): lambda b: (200, {"result": "koboldcpp/Qwen3-8B"}),
            ("GET", "/api/extra/true_max_context_length"): lambda b: (200, {"value": 8192}),
            ("GET", "/api/v1/config/max_length"): lambda b: (200, {"value": 1024}),
            ("POST", "/api/extra/tokencount"): tokencount,
            ("POST", "/v1/chat/completions"): lambda b: reply("fine"),
        }
    )
    backend = OpenAIBackend(server.url)
    caps = await backend.start()
    assert backend.flavor == KOBOLDCPP
    assert (caps.model_name, caps.max_context_length, caps.max_length) == ("koboldcpp/Qwen3-8B", 8192, 1024)
    assert caps.tools_max_temperature == 1.0
    # 700 counted + 8 per turn for one message = 708 <= 2000 - 100: generates
    out = await backend.generate_chat(job(max_context_length=2000, response_format={"type": "json_object"}))
    assert out.content == "fine" and counted == ["user: hi"]
    sent = dict(server.posted)["/v1/chat/completions"]
    assert sent["response_format"]["type"] == "json_schema" and "frequency_penalty" not in sent
    with pytest.raises(BackendFault) as err:
        await backend.generate_chat(job(max_context_length=800))  # 708 > 800 - 100
    await backend.close()
    assert err.value.reason == "prompt_overflow"


async def test_ollama_and_vllm_detection(server_factory: Any) -> None:
    ollama = server_factory(
        {
            ("GET", "/v1/models"): lambda b: (200, {"data": [{"id": "llama3.2:3b", "owned_by": "library"}]}),
            ("GET", "/api/version"): lambda b: (200, {"version": "0.12.0"}),
            ("POST", "/api/show"): lambda b: (
                200,
                {"model_info": {"llama.context_length": 131072}, "capabilities": ["completion", "tools"]},
            ),
        }
    )
    backend = OpenAIBackend(ollama.url)
    caps = await backend.start()
    await backend.close()
    assert backend.flavor == OLLAMA and caps.max_context_length == 131072 and "tools" in caps.features
    assert "prompt_overflow_refused" not in caps.guarantees

    vllm = server_factory(
        {
            ("GET", "/v1/models"): lambda b: (
                200,
                {"data": [{"id": "Qwen/Qwen3-8B", "owned_by": "vllm", "max_model_len": 32768}]},
            )
        }
    )
    backend = OpenAIBackend(vllm.url + "/v1/")
    caps = await backend.start()
    await backend.close()
    assert backend.flavor == VLLM and caps.max_context_length == 32768 and caps.model_name == "Qwen/Qwen3-8B"
