"""The front against the real native services (admission, dispatch, submit) on real stores.

Each service runs as its own process; the test plays the worker over the native pop and submit routes and
calls the front with the official OpenAI SDK. Skipped while a service is not runnable yet.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import threading
import time
import unittest.mock
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from horde_store.admin import main as admin_main
from horde_testing.launcher import ServiceProcess, free_port

from .conftest import error_body, start_front

SERVICES = ("horde_admission", "horde_dispatch", "horde_submit")
if not all(importlib.util.find_spec(f"{name}.__main__") for name in SERVICES):  # pragma: no cover
    pytest.skip("the native services are not all runnable yet", allow_module_level=True)

NONSTREAM_TIMEOUT = 5.0
GRACE = 2.0


@dataclass
class Stack:
    admission: str
    dispatch: str
    submit: str
    front: ServiceProcess
    user_key: str
    worker_key: str
    processes: list[ServiceProcess]


def _admin(env: dict[str, str], *args: str) -> dict[str, Any]:
    """Run ``horde-admin`` in-process (the operator CLI) on the stack's database and salt; its JSON output."""
    out = io.StringIO()
    salt = {"HORDE_SECRET_KEY": env["HORDE_SECRET_KEY"]}
    with contextlib.redirect_stdout(out), unittest.mock.patch.dict(os.environ, salt):
        code = admin_main(["--database-url", env["HORDE_DATABASE_URL"], *args])
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def stack(horde_settings_env: dict[str, str]) -> Iterator[Stack]:
    # The fixture's database is migrated already.
    user = _admin(
        horde_settings_env,
        "user",
        "create",
        "--username",
        f"client{uuid.uuid4().hex[:6]}",
        "--kudos",
        "100000",
    )
    owner = _admin(
        horde_settings_env, "user", "create", "--username", f"owner{uuid.uuid4().hex[:6]}", "--trusted"
    )
    ports = {name: free_port() for name in ("adm", "dsp", "dspg", "sub", "subg")}
    common = {
        **horde_settings_env,
        "HORDE_LOG_JSON": "false",
        # Tests call in quick succession from one address and key.
        "HORDE_RATE_LIMITS_ENABLED": "false",
        "HORDE_ADMISSION_HTTP_PORT": str(ports["adm"]),
        "HORDE_DISPATCH_HTTP_PORT": str(ports["dsp"]),
        "HORDE_DISPATCH_GRPC_PORT": str(ports["dspg"]),
        "HORDE_SUBMIT_HTTP_PORT": str(ports["sub"]),
        "HORDE_SUBMIT_GRPC_PORT": str(ports["subg"]),
    }
    processes = []
    try:
        for name, port in (
            ("horde_dispatch", ports["dsp"]),
            ("horde_submit", ports["sub"]),
            ("horde_admission", ports["adm"]),
        ):
            svc = ServiceProcess(
                name, [sys.executable, "-m", name], env=common, health_url=f"http://127.0.0.1:{port}/healthz"
            )
            processes.append(svc.start())
        front = start_front(
            {
                **common,
                "HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{ports['adm']}/api",
                "HORDE_OAI_NONSTREAM_TIMEOUT_SECONDS": str(NONSTREAM_TIMEOUT),
                "HORDE_OAI_STREAM_TIMEOUT_SECONDS": str(NONSTREAM_TIMEOUT),
                "HORDE_OAI_FAIL_FAST_GRACE_SECONDS": str(GRACE),
                "HORDE_OAI_SIGNAL_RECHECK_SECONDS": "1",
                # A dropped client's request waits this long for a retry of the same call before its cancel.
                "HORDE_OAI_RETRY_GRACE_SECONDS": "1",
            },
            wait=False,
        )
        processes.append(front)
        for svc in processes:
            svc.wait_healthy()
        yield Stack(
            admission=f"http://127.0.0.1:{ports['adm']}/api",
            dispatch=f"http://127.0.0.1:{ports['dsp']}/api",
            submit=f"http://127.0.0.1:{ports['sub']}/api",
            front=front,
            user_key=user["api_key"],
            worker_key=owner["api_key"],
            processes=processes,
        )
    finally:
        for svc in reversed(processes):
            svc.stop()


class Worker:
    """A scripted worker over the native routes: declares chat for one model at every pop."""

    def __init__(self, stack: Stack, model: str, features: list[str] | None = None) -> None:
        self.stack = stack
        self.model = model
        self.name = f"w-{uuid.uuid4().hex[:8]}"
        # Every strict request needs prompt_overflow_refused (docs/native-api.md#guarantees).
        self.features = ["prompt_overflow_refused", *(features or [])]
        self.http = httpx.Client(timeout=10, headers={"apikey": stack.worker_key})

    def pop(self) -> dict[str, Any]:
        response = self.http.post(
            f"{self.stack.dispatch}/v2/generate/text/pop",
            json={
                "name": self.name,
                "models": [self.model],
                "max_length": 512,
                "max_context_length": 4096,
                "bridge_agent": "test-worker:1:none",
                "threads": 1,
                "chat_jobs": True,
                "model_id": self.model,
                "chat_limits": {"max_context_length": 4096, "max_length": 512},
                "chat_features": self.features,
            },
        )
        assert response.status_code == 200, response.text
        return response.json()

    def pop_job(self, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.pop()
            if job.get("id"):
                return job
            time.sleep(0.2)
        logs = "\n".join(f"--- {p.name}\n{p.log_tail(30)}" for p in self.stack.processes)
        raise AssertionError(f"no job popped; last pop {job}\n{logs}")

    def submit(self, job: dict[str, Any], **body: Any) -> httpx.Response:
        return self.http.post(
            f"{self.stack.submit}/v2/generate/text/submit",
            json={"id": job["id"], "model_id": self.model, **body},
        )


def sdk(stack: Stack, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.front.url}/v1", api_key=stack.user_key, max_retries=0, timeout=30, **kwargs
    )


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def finished_line(front: ServiceProcess, code: str) -> str:
    def lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if " finished: " in line and f"code={code}" in line]

    log = front.wait_log(lambda text: bool(lines(text)))
    assert lines(log), log[-3000:]
    return lines(log)[-1]


def native_status(stack: Stack, request_id: str) -> dict[str, Any]:
    return httpx.get(f"{stack.admission}/v2/generate/chat/status/{request_id}", timeout=10).json()


def metric_count(stack, name: str, labels: str = "") -> float:
    """The ``<name>_count`` sample of a histogram on the front's /metrics (with ``labels`` inside its braces)."""
    text = httpx.get(f"{stack.front.url}/metrics", timeout=5).text
    match = re.search(rf"^{name}_count{{?{re.escape(labels)}}}? ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_completion_through_a_worker(stack):
    worker = Worker(stack, "e2e/plain")
    worker.pop()  # online before the request
    bodies = metric_count(stack, "horde_oai_request_body_size")
    waits = metric_count(stack, "horde_oai_queue_wait", 'streamed="false"')
    thread, result = in_thread(
        lambda: sdk(stack).chat.completions.create(
            model="e2e/plain", messages=[{"role": "user", "content": "Say hi"}], max_tokens=64
        )
    )
    job = worker.pop_job()
    assert job["chat"] is True
    assert job["payload"]["messages"] == [{"role": "user", "content": "Say hi"}]
    response = worker.submit(
        job, message={"role": "assistant", "content": "Hi there!"}, finish_reason="stop", completion_tokens=4
    )
    assert response.status_code == 200, response.text
    thread.join(30)
    assert "error" not in result, result
    completion = result["value"]
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == "Hi there!"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "e2e/plain"
    assert re.fullmatch(r"fp_[0-9a-f]{10}", completion.system_fingerprint)
    assert completion.usage.completion_tokens == 4
    request_id = completion.id.removeprefix("chatcmpl-")
    assert completion.model_extra["x_horde"]["request_id"] == request_id
    assert completion.model_extra["x_horde"]["estimated_usage"] is True  # the prompt count is an estimate
    status = native_status(stack, request_id)
    assert status["done"] is True and status["finished"] == 1
    line = finished_line(stack.front, "ok")
    assert f"Chat request {request_id} finished: streamed=False" in line
    assert "served_model=e2e/plain" in line
    assert metric_count(stack, "horde_oai_request_body_size") == bodies + 1
    assert metric_count(stack, "horde_oai_queue_wait", 'streamed="false"') == waits + 1


def test_buffered_stream_through_a_worker(stack):
    worker = Worker(stack, "e2e/stream")
    worker.pop()

    def run() -> list[Any]:
        stream = sdk(stack).chat.completions.create(
            model="e2e/stream",
            messages=[{"role": "user", "content": "Stream"}],
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
        return list(stream)

    thread, result = in_thread(run)
    job = worker.pop_job()
    worker.submit(
        job,
        message={"role": "assistant", "content": "Streamed reply", "reasoning_content": "hm"},
        finish_reason="length",
    )
    thread.join(30)
    assert "error" not in result, result
    chunks = result["value"]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streamed reply"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert len({c.id for c in chunks}) == 1


def test_unknown_model_is_404_with_the_native_rc(stack):
    with pytest.raises(openai.NotFoundError) as info:
        sdk(stack).chat.completions.create(
            model="e2e/nobody-serves-this", messages=[{"role": "user", "content": "x"}]
        )
    # The front passes the Horde's rc through as the code (docs/openai-front.md#metrics-and-logs).
    assert error_body(info.value)["code"] == "UnknownChatModel"
    assert error_body(info.value)["type"] == "invalid_request_error"
    assert error_body(info.value)["param"] == "model"
    assert "metadata" not in error_body(info.value)
    worker = Worker(stack, "e2e/listed")
    worker.pop()
    with pytest.raises(openai.NotFoundError) as listed:
        # models replaces model (the SDK always sends model, so it is sent as null).
        sdk(stack).chat.completions.create(
            model="e2e/listed",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"model": None, "models": ["e2e/listed", "e2e/ghost"]},
        )
    assert error_body(listed.value)["param"] == "models[1]"


def test_wrong_key_is_401(stack):
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(
            base_url=f"{stack.front.url}/v1", api_key="not-a-key", max_retries=0
        ).chat.completions.create(model="e2e/plain", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 401


def test_timeout_cancels_the_native_request(stack):
    worker = Worker(stack, "e2e/slow")
    worker.pop()  # online, then never pops again
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        sdk(stack).chat.completions.create(
            model="e2e/slow", messages=[{"role": "user", "content": "x"}], max_tokens=32
        )
    assert info.value.status_code == 408
    assert time.monotonic() - started >= NONSTREAM_TIMEOUT - 1
    body = error_body(info.value)
    assert body["code"] == "ChatRequestTimeout"
    request_id = body["metadata"]["request_id"]
    status = native_status(stack, request_id)
    assert status["waiting"] == 0  # cancelled: nothing left to hand out
    assert worker.pop().get("id") is None


def test_declaration_gap_is_404_and_cancels(stack):
    worker = Worker(stack, "e2e/plain-gap")
    worker.pop()
    with pytest.raises(openai.NotFoundError) as info:
        sdk(stack).chat.completions.create(
            model="e2e/plain-gap", messages=[{"role": "user", "content": "x"}], seed=5, max_tokens=32
        )
    body = error_body(info.value)
    assert body["code"] == "no_worker_supports_features"
    assert body["type"] == "not_found_error"
    assert "seed" in body["message"]
    # Settled: every error says whether a retry helps (the spec left these two without the header).
    assert info.value.response.headers["x-should-retry"] == "false"
    if "metadata" in body:  # accepted and cancelled, rather than refused at submit
        assert native_status(stack, body["metadata"]["request_id"])["waiting"] == 0


def test_client_disconnect_cancels_the_native_request(stack):
    worker = Worker(stack, "e2e/gone")
    worker.pop()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{stack.front.url}/v1/chat/completions",
            timeout=1.5,
            headers={"Authorization": f"Bearer {stack.user_key}"},
            json={"model": "e2e/gone", "messages": [{"role": "user", "content": "x"}], "max_tokens": 32},
        )
    stack.front.wait_log("code=client_disconnected")
    line = finished_line(stack.front, "client_disconnected")
    found = re.search(r"Chat request (\S+) finished", line)
    assert found is not None, line
    request_id = found.group(1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and native_status(stack, request_id)["waiting"] != 0:
        time.sleep(0.2)
    assert native_status(stack, request_id)["waiting"] == 0
    assert worker.pop().get("id") is None


def test_model_list(stack):
    Worker(stack, "e2e/listed-model", features=["seed", "tools"]).pop()
    models = sdk(stack).models.list()
    cards = {m.id: m for m in models.data}
    assert "e2e/listed-model" in cards
    card = cards["e2e/listed-model"].model_dump()
    assert card["object"] == "model"
    assert card["context_length"] == 4096
    assert card["top_provider"]["max_completion_tokens"] == 512
    assert card["supported_parameters"] == [
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "tools",
        "parallel_tool_calls",
    ]
    # models.retrieve: the same card; a model id holds a slash
    retrieved = sdk(stack).models.retrieve("e2e/listed-model").model_dump()
    assert retrieved == card
    with pytest.raises(openai.NotFoundError) as info:
        sdk(stack).models.retrieve("e2e/nobody-serves-this")
    error = error_body(info.value)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["message"] == (
        "The model 'e2e/nobody-serves-this' does not exist or no online worker serves it with chat."
    )


def test_request_no_worker_can_take_gets_503_after_the_grace(stack):
    Worker(stack, "e2e/only").pop()
    other = Worker(stack, "e2e/elsewhere")
    other.pop()
    other_id = httpx.get(f"{stack.dispatch}/v2/workers/name/{other.name}", timeout=10).json()["id"]
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        # Only a worker that does not serve the model: accepted, never eligible, no declaration gap.
        sdk(stack).chat.completions.create(
            model="e2e/only",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=32,
            extra_body={"horde": {"only": [other_id]}},
        )
    assert time.monotonic() - started >= GRACE
    response = info.value.response
    assert response.status_code == 503
    assert response.headers["retry-after"] == "30"
    assert response.headers["x-should-retry"] == "false"
    body = error_body(info.value)
    assert body["code"] == "no_eligible_worker"
    request_id = body["metadata"]["request_id"]
    assert native_status(stack, request_id)["waiting"] == 0
    assert "stage" not in body


def test_request_faulted_by_its_workers_is_502(stack):
    worker = Worker(stack, "e2e/faulty")
    worker.pop()
    thread, result = in_thread(
        lambda: sdk(stack).chat.completions.create(
            model="e2e/faulty", messages=[{"role": "user", "content": "x"}], max_tokens=32
        )
    )
    for _ in range(3):  # FAULTED_GENERATIONS_LIMIT is 2: the third fault faults the request
        job = worker.pop_job()
        response = worker.submit(job, state="faulted", fault_reason="generation_error")
        assert response.status_code == 200, response.text
    thread.join(30)
    error = result.get("error")
    assert isinstance(error, openai.InternalServerError), result
    assert error.status_code == 502
    assert error_body(error)["code"] == "ChatRequestFaulted"
    assert error_body(error)["metadata"]["request_id"]
    assert error_body(error)["metadata"]["fault_reason"] == "The worker's backend failed while generating."
    # The horde restarted the job to its fault limit already: the SDK must not multiply the faults.
    assert error.response.headers["x-should-retry"] == "false"


def test_stream_refused_at_the_first_read_gets_the_json_error(stack):
    Worker(stack, "e2e/stream-gap").pop()
    with pytest.raises(openai.NotFoundError) as info:
        sdk(stack).chat.completions.create(
            model="e2e/stream-gap",
            messages=[{"role": "user", "content": "x"}],
            seed=1,
            max_tokens=32,
            stream=True,
        )
    assert info.value.response.headers["content-type"].startswith("application/json")
    assert error_body(info.value)["code"] == "no_worker_supports_features"


def test_kudos_cap_is_400_max_kudos_exceeded(stack):
    Worker(stack, "e2e/capped").pop()
    with pytest.raises(openai.BadRequestError) as info:
        sdk(stack).chat.completions.create(
            model="e2e/capped",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=512,
            extra_body={"horde": {"max_kudos": 1}},
        )
    body = error_body(info.value)
    assert body["code"] == "max_kudos_exceeded"
    assert body["param"] == "horde.max_kudos"
    assert body["metadata"]["rc"] == "ChatKudosCapExceeded"
    assert body["metadata"]["max_kudos"] == 1
    assert body["metadata"]["kudos_estimate"] > 1
