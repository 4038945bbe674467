"""The front's contract gaps, to the letter of docs/openai-front.md: native_finish_reason on every choice, null content on a
tool-call reply, schema_ as an unknown key, CORS on a 500, the native Retry-After and rc passed through, the role
message's article, and the native call latency histogram.

Each is checked where it is decided (the pure mapping) and end to end: the front as its own process against the
real native services (admission, dispatch, submit on real stores), or against a scripted native answer where
the real services never give it (a 503 with Retry-After).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from horde_core.metrics import BUCKETS_REQUEST_LIFECYCLE_SECONDS, BUCKETS_SECONDS
from horde_oai import metrics
from horde_oai.app import create_app
from horde_oai.completion import build_assistant_message, build_completion
from horde_oai.errors import OpenAIError
from horde_oai.horde_client import HordeClient
from horde_oai.native_errors import map_native_error
from horde_oai.relay import DeltaRelay
from horde_oai.schema import validate_request
from horde_oai.server_errors import UnhandledErrorMiddleware
from horde_oai.settings import OaiSettings
from horde_oai.streaming import buffered_stream_events
from horde_testing.launcher import ServiceProcess, free_port
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client import REGISTRY

from .conftest import error_body, start_front
from .test_e2e_native import Worker, in_thread, sdk, stack  # noqa: F401 (stack: the real native services)

REQUEST_ID = "7b3f8e9a-1111-4222-8333-944455556666"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
ORIGIN = {"Origin": "https://lite.koboldai.net"}


def status_with(message: dict[str, Any], **generation: Any) -> dict[str, Any]:
    return {
        "done": True,
        "faulted": False,
        "finished": 1,
        "processing": 0,
        "waiting": 0,
        "kudos": 3,
        "generations": [
            {
                "id": "g1",
                "worker_id": "w-1",
                "worker_name": "one",
                "model": "org/m",
                "state": "ok",
                "message": message,
                "finish_reason": "stop",
                **generation,
            }
        ],
    }


def completion_of(message: dict[str, Any], **generation: Any) -> dict[str, Any]:
    return build_completion(
        request_id=REQUEST_ID,
        created=1,
        body={"model": "org/m", "messages": MESSAGES},
        status=status_with(message, **generation),
        prompt_estimate=2,
    )


def sse_events(events: list[str]) -> list[Any]:
    out: list[Any] = []
    for event in events:
        for line in event.strip("\n").split("\n"):
            if line.startswith("data: "):
                raw = line[6:]
                out.append(raw if raw == "[DONE]" else json.loads(raw))
    return out


def finish_chunk(events: list[Any]) -> dict[str, Any]:
    finishes = [
        e for e in events if isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"]
    ]
    assert len(finishes) == 1, events
    return finishes[0]


def lone_headers(key: str = "0000000000") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **ORIGIN}


def assert_cors(response: httpx.Response) -> None:
    assert response.headers["access-control-allow-origin"] == "*"
    exposed = {h.strip().lower() for h in response.headers["access-control-expose-headers"].split(",")}
    assert {"retry-after", "x-should-retry"} <= exposed


# --- 1. native_finish_reason on every choice ------------------------------------------------------------------


def test_every_choice_carries_native_finish_reason_null_when_the_worker_gave_none():
    given = completion_of({"role": "assistant", "content": "hi"}, native_finish_reason="eos_token")
    none = completion_of({"role": "assistant", "content": "hi"})
    empty = completion_of({"role": "assistant", "content": "hi"}, native_finish_reason="")
    assert given["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "hi"},
        "logprobs": None,
        "finish_reason": "stop",
        "native_finish_reason": "eos_token",
    }
    for completion in (none, empty):
        choice = completion["choices"][0]
        assert "native_finish_reason" in choice and choice["native_finish_reason"] is None


@pytest.mark.parametrize("native", ["max_tokens", None])
def test_the_buffered_and_relayed_finish_chunks_carry_native_finish_reason(native):
    completion = completion_of({"role": "assistant", "content": "hi"}, native_finish_reason=native)
    relay = DeltaRelay(
        request_id=REQUEST_ID,
        created=1,
        default_model="org/m",
        include_reasoning=True,
        max_window=0.0,
        max_pieces_per_second=20.0,
    )
    for events in (
        sse_events(list(buffered_stream_events(completion, include_usage=True))),
        sse_events(relay.finish(completion, include_usage=True)),
    ):
        finish = finish_chunk(events)
        assert finish["object"] == "chat.completion.chunk"
        (choice,) = finish["choices"]
        assert choice == {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": "stop",
            "native_finish_reason": native,
        }
        assert finish["x_horde"]["request_id"] == REQUEST_ID
        assert finish["usage"] is None
        assert events[-1] == "[DONE]"


# --- 2. content null on a tool-call reply without text -----------------------------------------------------------

CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}


@pytest.mark.parametrize("content", [None, ""])
def test_a_tool_call_reply_without_text_has_null_content(content):
    message = build_assistant_message({"role": "assistant", "content": content, "tool_calls": [CALL]}, True)
    assert message == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    # Without tool calls, content is always a string.
    assert build_assistant_message({"role": "assistant", "content": None}, True)["content"] == ""
    with_text = build_assistant_message(
        {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]}, True
    )
    assert with_text["content"] == "Let me look."


def test_the_buffered_tool_call_chunk_has_no_content():
    completion = completion_of(
        {"role": "assistant", "content": None, "tool_calls": [CALL]}, finish_reason="tool_calls"
    )
    assert completion["choices"][0]["message"]["content"] is None
    events = sse_events(list(buffered_stream_events(completion, include_usage=False)))
    deltas = [e["choices"][0]["delta"] for e in events if isinstance(e, dict)]
    # role, the tool-call chunk (each call whole with its index, no content), the finish chunk; no content chunk
    assert deltas == [{"role": "assistant"}, {"tool_calls": [{"index": 0, **CALL}]}, {}]
    assert finish_chunk(events)["choices"][0]["finish_reason"] == "tool_calls"


# --- 3. schema_ is an unknown key at its own path ------------------------------------------------------------------


@pytest.mark.parametrize(
    "json_schema",
    [
        {"name": "reply", "schema_": {"type": "object"}},
        {"name": "reply", "schema": {"type": "object"}, "schema_": {"type": "object"}},
    ],
)
def test_schema_underscore_is_an_unknown_key_at_its_own_path(lone_front, json_schema):
    body = {
        "model": "m",
        "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": json_schema},
    }
    response = httpx.post(f"{lone_front.url}/v1/chat/completions", json=body, headers=lone_headers())
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert "retry-after" not in response.headers
    assert response.headers.get("x-should-retry") != "true"  # a client error: never worth a retry
    assert_cors(response)
    assert response.json() == {
        "error": {
            "message": "Unrecognized request argument supplied: response_format.json_schema.schema_",
            "type": "invalid_request_error",
            "param": "response_format.json_schema.schema_",
            "code": "UnsupportedChatParameter",
        }
    }
    line = (
        "Refused unsupported chat parameter: path='response_format.json_schema.schema_' label=response_format"
    )
    assert line in lone_front.wait_log(line)


def test_the_schema_key_is_still_required():
    format_ = {"type": "json_schema", "json_schema": {"name": "r"}}
    with pytest.raises(OpenAIError) as info:
        validate_request({"model": "m", "messages": MESSAGES, "response_format": format_})
    error = info.value
    assert (error.status, error.code, error.param) == (
        400,
        "BadRequest",
        "response_format.json_schema.schema",
    )
    assert error.message == "Missing required parameter: 'response_format.json_schema.schema'."


# --- 4. CORS headers on every response, a 500 included ---------------------------------------------------------------


def _app_with_failing_routes() -> Any:
    app = create_app(OaiSettings(oai_horde_url=f"http://127.0.0.1:{free_port()}/api", oai_redis_url=""))

    async def boom() -> None:
        raise RuntimeError("a bug")

    def broken_dependency() -> None:
        raise KeyError("a bug in a dependency")

    from fastapi import Depends

    async def uses_dependency(_: None = Depends(broken_dependency)) -> dict[str, str]:
        return {"never": "sent"}

    app.add_api_route("/v1/boom", boom, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/broken", uses_dependency, methods=["GET"], include_in_schema=False)
    return app


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/boom"), ("GET", "/v1/broken")])
async def test_an_unhandled_exception_is_the_openai_500_with_cors_headers(method, path, caplog):
    app = _app_with_failing_routes()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        response = await client.request(method, path, headers=ORIGIN)
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert "retry-after" not in response.headers
    assert_cors(response)
    assert response.json() == {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "api_error",
            "param": None,
            "code": "InternalServerError",
        }
    }
    assert any(r.getMessage() == "unhandled error" and r.exc_info for r in caplog.records)


async def test_an_exception_after_the_response_started_is_not_answered_twice():
    sent: list[dict[str, Any]] = []

    async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        raise RuntimeError("mid-stream")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    middleware = UnhandledErrorMiddleware(streaming_app)
    with pytest.raises(RuntimeError, match="mid-stream"):
        await middleware({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200


def test_the_front_process_answers_errors_with_cors_headers(lone_front):
    # A 404 of an unknown path and a 502 of a horde that does not answer, as a browser client sees them.
    for response in (
        httpx.get(f"{lone_front.url}/v1/nothing-here", headers=ORIGIN),
        httpx.get(f"{lone_front.url}/v1/models", headers=ORIGIN),
    ):
        assert response.status_code in (404, 502)
        assert "error" in response.json()
        assert_cors(response)


# --- 5. the native Retry-After and rc reach the client -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["Retry-After", "retry-after"])
def test_a_native_503_passes_its_retry_after_through(name):
    with_rc = map_native_error(
        503, {"message": "Chat is off.", "rc": "ChatAdmissionDisabled"}, headers={name: "7"}
    )
    assert (with_rc.status, with_rc.code, with_rc.message, with_rc.param) == (
        503,
        "ChatAdmissionDisabled",
        "Chat is off.",
        None,
    )
    assert with_rc.headers["Retry-After"] == "7"
    without_rc = map_native_error(503, {}, headers={name: "9"})
    assert (without_rc.status, without_rc.code) == (502, "HordeUnavailable")
    assert without_rc.message == "The Horde did not answer the request (HTTP 503)."
    assert without_rc.headers["Retry-After"] == "9"
    limited = map_native_error(429, {"message": "slow down", "rc": "TooManyPrompts"}, headers={name: "2"})
    assert (limited.status, limited.code, limited.headers["Retry-After"]) == (429, "TooManyPrompts", "2")
    # Nothing invented when the native answer has none; a 500 never passes one.
    assert (
        "Retry-After" not in map_native_error(503, {"message": "off", "rc": "ChatAdmissionDisabled"}).headers
    )
    assert "Retry-After" not in map_native_error(500, {}, headers={name: "5"}).headers


def test_the_spec_mappings_of_native_refusals_stay():
    assert map_native_error(429, {"message": "slow"}).code == "rate_limit_exceeded"
    refused = map_native_error(403, {"message": "No worker serves 'm'.", "rc": "NoEligibleWorker"})
    assert (refused.status, refused.code, refused.headers["Retry-After"]) == (503, "no_eligible_worker", "30")
    capped = map_native_error(
        400,
        {
            "message": "The request's kudos estimate at current pricing is 215, above its horde.max_kudos of 1.",
            "rc": "ChatKudosCapExceeded",
        },
    )
    assert (capped.code, capped.param) == ("max_kudos_exceeded", "horde.max_kudos")
    unknown = map_native_error(404, {"message": "The model 'x' is not known.", "rc": "UnknownChatModel"})
    assert unknown.body() == {
        "error": {
            "message": "The model 'x' is not known.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "UnknownChatModel",
        }
    }
    assert metrics.outcome_class_for("UnknownChatModel") == "unservable"
    assert "model_not_found" not in metrics.OUTCOME_CLASS_BY_CODE


class ScriptedHorde:
    """A native horde answering every submit with one scripted status, body and headers (the real services never
    send a 503 with Retry-After, which a proxy or a future admission may)."""

    def __init__(self) -> None:
        self.answer: tuple[int, dict[str, Any], dict[str, str]] = (200, {}, {})
        self.submits = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.submits += 1
                status, body, headers = owner.answer
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                # The model list: the connection closes without an answer (a transport error at the front).
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedHorde, ServiceProcess]]:
    horde = ScriptedHorde()
    front = start_front({"HORDE_OAI_HORDE_URL": horde.url, "HORDE_OAI_REDIS_URL": ""})
    try:
        yield horde, front
    finally:
        front.stop()
        horde.close()


def test_a_native_503_with_rc_reaches_the_client_with_its_retry_after(scripted):
    horde, front = scripted
    horde.answer = (
        503,
        {"message": "Chat requests are disabled.", "rc": "ChatAdmissionDisabled"},
        {"Retry-After": "7"},
    )
    response = httpx.post(
        f"{front.url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES}, headers=lone_headers()
    )
    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"
    assert_cors(response)
    assert response.json() == {
        "error": {
            "message": "Chat requests are disabled.",
            "type": "api_error",
            "param": None,
            "code": "ChatAdmissionDisabled",
        }
    }


def test_a_native_503_without_rc_is_502_with_its_retry_after(scripted):
    horde, front = scripted
    horde.answer = (503, {}, {"Retry-After": "11"})
    response = httpx.post(
        f"{front.url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES}, headers=lone_headers()
    )
    assert response.status_code == 502
    assert response.headers["retry-after"] == "11"
    assert_cors(response)
    assert response.json() == {
        "error": {
            "message": "The Horde did not answer the request (HTTP 503).",
            "type": "api_error",
            "param": None,
            "code": "HordeUnavailable",
        }
    }


def test_the_sdk_sees_the_native_retry_after_and_rc(scripted):
    horde, front = scripted
    horde.answer = (
        503,
        {"message": "Chat requests are disabled.", "rc": "ChatAdmissionDisabled"},
        {"Retry-After": "7"},
    )
    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key="0000000000", max_retries=0, timeout=20)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.status_code == 503
    assert info.value.response.headers["retry-after"] == "7"
    assert error_body(info.value)["code"] == "ChatAdmissionDisabled"


def test_an_unknown_model_is_404_unknown_chat_model_end_to_end(stack):  # noqa: F811
    with pytest.raises(openai.NotFoundError) as info:
        sdk(stack).chat.completions.create(
            model="e2e/gaps-nobody", messages=[{"role": "user", "content": "x"}]
        )
    response = info.value.response
    assert response.status_code == 404
    assert response.headers.get("x-should-retry") != "true"  # a client error: never worth a retry
    assert "retry-after" not in response.headers
    body = response.json()["error"]
    assert (body["type"], body["param"], body["code"]) == (
        "invalid_request_error",
        "model",
        "UnknownChatModel",
    )
    assert "e2e/gaps-nobody" in body["message"]
    assert set(body) == {"message", "type", "param", "code"}

    def finished(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if "code=UnknownChatModel" in ln and " finished: " in ln]

    log = stack.front.wait_log(lambda text: bool(finished(text)))
    assert finished(log), log[-2000:]


# --- 6. the article of the role message -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "allowed", "phrase"),
    [
        ("user", "'text' and 'image_url'", "a user message"),
        ("assistant", "'text'", "an assistant message"),
        ("system", "'text'", "a system message"),
        ("developer", "'text'", "a developer message"),
        ("tool", "'text'", "a tool message"),
    ],
)
def test_the_role_message_takes_the_right_article(lone_front, role, allowed, phrase):
    message: dict[str, Any] = {"role": role, "content": [{"type": "input_audio", "input_audio": {}}]}
    if role == "tool":
        message["tool_call_id"] = "c1"
    response = httpx.post(
        f"{lone_front.url}/v1/chat/completions",
        json={"model": "m", "messages": [message]},
        headers=lone_headers(),
    )
    assert response.status_code == 400
    assert response.headers.get("x-should-retry") != "true"  # a client error: never worth a retry
    assert_cors(response)
    assert response.json() == {
        "error": {
            "message": f"Invalid value: 'input_audio'. Supported values are: {allowed} on {phrase}.",
            "type": "invalid_request_error",
            "param": "messages[0].content[0].type=input_audio",
            "code": "UnsupportedChatParameter",
        }
    }


# --- 1 and 2 end to end, through a worker ------------------------------------------------------------------------------


def test_a_completion_carries_the_workers_native_finish_reason_or_null(stack):  # noqa: F811
    worker = Worker(stack, "e2e/gaps-native")
    worker.pop()
    for native in ("eos_token", None):
        thread, result = in_thread(
            lambda: sdk(stack).chat.completions.with_raw_response.create(
                model="e2e/gaps-native", messages=[{"role": "user", "content": "hi"}], max_tokens=32
            )
        )
        job = worker.pop_job()
        extra = {"native_finish_reason": native} if native else {}
        submitted = worker.submit(
            job, message={"role": "assistant", "content": "Hi."}, finish_reason="stop", **extra
        )
        assert submitted.status_code == 200, submitted.text
        thread.join(30)
        assert "error" not in result, result
        raw = result["value"]
        assert raw.http_response.status_code == 200
        body = raw.http_response.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0] == {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi."},
            "logprobs": None,
            "finish_reason": "stop",
            "native_finish_reason": native,
        }


def test_a_streamed_tool_call_reply_without_text(stack):  # noqa: F811
    worker = Worker(stack, "e2e/gaps-tools", features=["tools"])
    worker.pop()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]

    def run(stream: bool) -> Any:
        create = sdk(stack).chat.completions.create
        kwargs: dict[str, Any] = {
            "model": "e2e/gaps-tools",
            "messages": MESSAGES,
            "max_tokens": 32,
            "tools": tools,
        }
        if stream:
            return [c.model_dump() for c in create(stream=True, **kwargs)]
        return sdk(stack).chat.completions.with_raw_response.create(**kwargs).http_response.json()

    for stream in (False, True):
        thread, result = in_thread(lambda stream=stream: run(stream))
        job = worker.pop_job()
        submitted = worker.submit(
            job,
            message={"role": "assistant", "content": "", "tool_calls": [CALL]},
            finish_reason="tool_calls",
        )
        assert submitted.status_code == 200, submitted.text
        thread.join(30)
        assert "error" not in result, result
        if not stream:
            message = result["value"]["choices"][0]["message"]
            assert message == {"role": "assistant", "content": None, "tool_calls": [CALL]}
            assert result["value"]["choices"][0]["finish_reason"] == "tool_calls"
            assert result["value"]["choices"][0]["native_finish_reason"] is None
            continue
        chunks = result["value"]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert not any(d.get("content") for d in deltas)
        calls = [d for d in deltas if d.get("tool_calls")]
        assert len(calls) == 1
        assert calls[0]["content"] is None  # the SDK's model fills absent keys with None
        assert calls[0]["tool_calls"][0]["id"] == "call_1"
        finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finish[0]["choices"][0]["finish_reason"] == "tool_calls"


# --- 8. histograms ----------------------------------------------------------------------------------------------------


def test_the_histograms_use_the_spec_bucket_sets():
    def bounds(histogram: Any) -> list[float]:
        return [float(b) for b in histogram._upper_bounds if b != float("inf")]

    assert bounds(metrics.NATIVE_CALL_DURATION) == [float(b) for b in BUCKETS_SECONDS]
    assert bounds(metrics.QUEUE_WAIT) == [float(b) for b in BUCKETS_REQUEST_LIFECYCLE_SECONDS]
    assert bounds(metrics.REQUEST_DURATION) == [float(b) for b in BUCKETS_REQUEST_LIFECYCLE_SECONDS]
    assert bounds(metrics.STREAM_FIRST_CONTENT) == [float(b) for b in BUCKETS_REQUEST_LIFECYCLE_SECONDS]
    assert bounds(metrics.REQUEST_BODY_SIZE) == [float(b) for b in metrics.BUCKETS_BODY_BYTES]
    assert metrics.BUCKETS_BODY_BYTES[-1] == 36 * 1024 * 1024
    assert list(metrics.BUCKETS_BODY_BYTES) == sorted(set(metrics.BUCKETS_BODY_BYTES))
    assert metrics.NATIVE_CALL_DURATION._labelnames == ("route", "status_class")
    assert metrics.QUEUE_WAIT._labelnames == ("streamed",)
    assert metrics.REQUEST_BODY_SIZE._labelnames == ()


def _native_count(route: str, status_class: str) -> float:
    value = REGISTRY.get_sample_value(
        "horde_oai_native_duration_count", {"route": route, "status_class": status_class}
    )
    return value or 0.0


async def test_every_native_call_is_timed_by_route_and_status_class():
    def native(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(503, json={"message": "off", "rc": "ChatAdmissionDisabled"})
        if request.method == "DELETE":
            return httpx.Response(200, json={})
        if request.url.path.endswith("/status/models"):
            raise httpx.ConnectError("refused")
        return httpx.Response(404, json={"message": "gone", "rc": "RequestNotFound"})

    before = {
        key: _native_count(*key)
        for key in (("submit", "5xx"), ("status", "4xx"), ("cancel", "2xx"), ("models", "error"))
    }
    client = HordeClient("http://horde.test/api", transport=httpx.MockTransport(native))
    try:
        assert (await client.submit("k", {"model": "m"})).status == 503
        assert (await client.status("r")).status == 404
        assert (await client.cancel("r")).status == 200
        with pytest.raises(Exception, match="could not be reached"):
            await client.chat_models()
    finally:
        await client.aclose()
    for key, count in before.items():
        assert _native_count(*key) == count + 1, key


def test_the_front_process_exposes_the_native_call_latency(lone_front):
    assert httpx.get(f"{lone_front.url}/v1/models").status_code == 502  # the horde does not answer
    deadline = time.monotonic() + 5
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(f"{lone_front.url}/metrics").text
        if 'horde_oai_native_duration_count{route="models",status_class="error"}' in text:
            break
        time.sleep(0.1)
    assert 'horde_oai_native_duration_count{route="models",status_class="error"}' in text
    assert 'horde_oai_native_duration_bucket{le="0.001",route="models",status_class="error"}' in text


def test_a_size_gap_at_submit_keeps_its_message_when_the_model_list_fails(scripted):
    horde, front = scripted
    gap = {"kind": "declaration_gap", "missing_declarations": [], "exceeded_limits": ["max_length"]}
    horde.answer = (
        403,
        {"message": "No worker can serve this request.", "rc": "NoEligibleWorker", "impossible_reason": gap},
        {},
    )
    response = httpx.post(
        f"{front.url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES}, headers=lone_headers()
    )
    assert response.status_code == 400, response.text
    assert response.headers["x-should-retry"] == "false"
    assert response.json() == {
        "error": {
            "message": "No worker eligible for this request currently declares a completion limit that high "
            "(max_length).",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "no_worker_supports_limit",
        }
    }
