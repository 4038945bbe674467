"""One request id across the services' JSON logs (horde_core.request_id, docs/operator-guide.md#logs).

A chat completion sent to the front with ``X-Request-ID`` gets it back as a response header, and the same id is
the ``request_id`` of the log lines it caused in the front, in admission (the front's native call carries the
header) and in dispatch (admission's gRPC call carries it as ``x-request-id`` metadata). A hostile header is
replaced by a made id and never written to a log. Every process logs JSON at DEBUG here, so each request and RPC
has its ``request``/``rpc`` line.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from .conftest import MODEL, Stack
from .test_walking_skeleton import GREETING


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    return {"HORDE_LOG_JSON": "true", "HORDE_LOG_LEVEL": "DEBUG"}


def json_lines(text: str) -> list[dict[str, object]]:
    lines = []
    for raw in text.splitlines():
        if raw.startswith("{"):
            try:
                lines.append(json.loads(raw))
            except ValueError:
                continue
    return lines


def lines_with(
    stack: Stack, service: str, request_id: str, message: str = "request", path: str = ""
) -> list[dict[str, object]]:
    """The service's JSON lines with ``request_id``, once one of them is a ``message`` line (whose path starts
    with ``path``): lines are written by a logging thread, a moment after the response they describe."""
    text = stack.processes[service].wait_log(
        lambda log: any(
            line.get("request_id") == request_id
            and line.get("message") == message
            and str(line.get("path", "")).startswith(path)
            for line in json_lines(log)
        ),
        timeout=15,
    )
    return [line for line in json_lines(text) if line.get("request_id") == request_id]


def test_the_request_id_is_echoed_and_on_the_log_lines_of_every_hop(stack: Stack) -> None:
    stack.start_worker("request-id-worker")
    request_id = f"e2e-{uuid.uuid4().hex}"
    r = httpx.post(
        f"{stack.front}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "trace me"}]},
        headers={"Authorization": f"Bearer {stack.client_key}", "X-Request-ID": request_id},
        timeout=90,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == f"{GREETING} trace me"
    assert r.headers["X-Request-ID"] == request_id

    front = lines_with(stack, "oai", request_id, path="/v1/chat/completions")
    assert any(line["message"] == "request" and line["path"] == "/v1/chat/completions" for line in front), (
        front
    )
    assert all(line["service"] == "horde-oai" for line in front)

    lines_with(stack, "admission", request_id, path="/api/v2/generate/chat/async")
    admission = lines_with(stack, "admission", request_id, path="/api/v2/generate/chat/status/")
    assert any(
        line["message"] == "request" and line["path"] == "/api/v2/generate/chat/async" for line in admission
    ), admission
    # The status reads the front made while waiting carry the same id.
    assert any(str(line.get("path", "")).startswith("/api/v2/generate/chat/status/") for line in admission)

    dispatch = lines_with(stack, "dispatch", request_id, "rpc")
    assert any(line["message"] == "rpc" and "GetAvailability" in str(line["method"]) for line in dispatch), (
        dispatch
    )

    # Every JSON line has the field; lines outside any request have it null.
    for service in ("oai", "admission", "dispatch", "submit", "janitor"):
        lines = json_lines(stack.processes[service].log_text())
        assert lines and all("request_id" in line for line in lines), service
    assert any(line["request_id"] is None for line in json_lines(stack.processes["janitor"].log_text()))


@pytest.mark.parametrize(
    "hostile",
    ["x" * 300, "a b c", "id\twith\ttabs", 'abc","request_id":"forged', "caf\u00e9-latin1"],
    ids=["too-long", "spaces", "tabs", "json-injection", "non-ascii"],
)
def test_a_hostile_request_id_is_replaced_not_logged(stack: Stack, hostile: str) -> None:
    r = httpx.get(f"{stack.front}/models", headers=[(b"X-Request-ID", hostile.encode("latin-1"))], timeout=30)
    assert r.status_code == 200
    made = r.headers["X-Request-ID"]
    assert made != hostile and len(made) == 32 and all(c in "0123456789abcdef" for c in made)
    lines = lines_with(stack, "oai", made, path="/v1/models")
    assert any(line["message"] == "request" and line["path"] == "/v1/models" for line in lines)
    log = stack.processes["oai"].log_text()
    assert hostile not in log and "forged" not in log


def test_a_header_with_control_characters_never_reaches_a_log(stack: Stack) -> None:
    """uvicorn refuses the request line itself (400) before any app code; nothing of it is logged."""
    r = httpx.get(f"{stack.front}/models", headers={"X-Request-ID": "evil\x1b[31mred"}, timeout=30)
    assert r.status_code == 400
    assert "evil" not in stack.processes["oai"].log_text()
