"""The front as a process, through the official OpenAI SDK, before any native call is needed.

Refusals that happen before the native submit, and a horde that does not answer.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest
from horde_contract.refusals import INVALID_API_KEY_MESSAGE
from horde_testing.launcher import free_port
from openai.types.chat import ChatCompletionMessageParam

from .conftest import error_body, start_front

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


def client(front, key: str = "0000000000") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{front.url}/v1", api_key=key, max_retries=0, timeout=20)


def test_unknown_parameter_is_400_with_param(lone_front):
    with pytest.raises(openai.BadRequestError) as info:
        client(lone_front).chat.completions.create(model="m", messages=MESSAGES, extra_body={"top_k": 40})
    err = info.value
    assert err.status_code == 400
    assert err.body == {
        "message": "Unrecognized request argument supplied: top_k",
        "type": "invalid_request_error",
        "param": "top_k",
        "code": "UnsupportedChatParameter",
    }
    line = "Refused unsupported chat parameter: path='top_k' label=top_k"
    assert line in lone_front.wait_log(line)


def test_out_of_range_temperature(lone_front):
    with pytest.raises(openai.BadRequestError) as info:
        client(lone_front).chat.completions.create(model="m", messages=MESSAGES, temperature=2.5)
    assert error_body(info.value)["param"] == "temperature"
    assert error_body(info.value)["code"] == "UnsupportedChatParameter"


def test_non_json_and_nan_bodies_are_bad_request(lone_front):
    headers = {"Authorization": "Bearer 0000000000", "Content-Type": "application/json"}
    for raw in (b"{not json", b'{"model": "m", "messages": [], "temperature": NaN}', b'{"x": Infinity}'):
        response = httpx.post(f"{lone_front.url}/v1/chat/completions", content=raw, headers=headers)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "BadRequest"
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_missing_key_is_401(lone_front):
    response = httpx.post(f"{lone_front.url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    "raw_key", [b"\xd0\xba\xd0\xbb", b"\xe9t\xe9", b"ke\ty"], ids=["utf8", "latin1", "tab"]
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_key_outside_printable_ascii_is_401_invalid_api_key(lone_front, raw_key: bytes, stream: bool):
    # httpx refuses to send such a header itself: a raw request, as a hostile client sends it.
    body = json.dumps({"model": "m", "messages": MESSAGES, "stream": stream}).encode()
    host, port = lone_front.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
            + raw_key
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 "), head
    error = json.loads(payload)["error"]
    assert (error["code"], error["type"], error["param"]) == ("InvalidAPIKey", "authentication_error", None)
    assert error["message"] == INVALID_API_KEY_MESSAGE


def test_body_over_the_bound_is_413(lone_front):
    # A declared length over 36 MiB is refused before the body is read (raw socket: no client sends a lie).
    host, port = lone_front.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(37 * 1024 * 1024).encode()
            + b"\r\n\r\n{"
        )
        reply = b""
        while b"RequestTooLarge" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert reply.decode().startswith("HTTP/1.1 413")
    assert b'"code":"RequestTooLarge"' in reply


def test_unreachable_horde_is_502_horde_unavailable(lone_front):
    with pytest.raises(openai.InternalServerError) as info:
        client(lone_front).chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.status_code == 502
    assert error_body(info.value)["code"] == "HordeUnavailable"
    with pytest.raises(openai.InternalServerError):
        client(lone_front).models.list()


def test_docs_redirect_and_cors(lone_front):
    root = httpx.get(f"{lone_front.url}/", follow_redirects=False)
    assert root.status_code in (302, 307)
    assert root.headers["location"] == "/docs"
    doc = httpx.get(f"{lone_front.url}/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/models", "/v1/models/{model_id}"}
    assert "422" not in doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "logprobs" in doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert httpx.get(f"{lone_front.url}/docs").status_code == 200
    assert httpx.get(f"{lone_front.url}/redoc").status_code == 200
    preflight = httpx.options(
        f"{lone_front.url}/v1/chat/completions",
        headers={
            "Origin": "https://lite.koboldai.net",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] in ("*", "https://lite.koboldai.net")
    refused = httpx.post(
        f"{lone_front.url}/v1/chat/completions", json={}, headers={"Origin": "https://x.example"}
    )
    assert refused.headers["access-control-allow-origin"] == "*"
    assert "retry-after" in refused.headers["access-control-expose-headers"].lower()
    assert "x-should-retry" in refused.headers["access-control-expose-headers"].lower()
    assert "x-request-id" in refused.headers["access-control-expose-headers"].lower()  # browsers may read it


def test_lone_surrogate_is_400_not_500(lone_front):
    r = httpx.post(
        f"{lone_front.url}/v1/chat/completions",
        content=b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        headers={"Authorization": "Bearer k", "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "BadRequest"
    assert error["message"].endswith(
        "The request body holds a lone UTF-16 surrogate, which is not valid Unicode."
    )


def test_stream_of_the_wrong_type_is_400_not_a_silent_non_stream(lone_front):
    headers = {"Authorization": "Bearer 0000000000", "Content-Type": "application/json"}
    for key, value in (("stream", "yes"), ("stream", 1), ("stream_options", {"include_usage": "yes"})):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, key: value}
        response = httpx.post(f"{lone_front.url}/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 400, (key, value, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] in {"stream", "stream_options.include_usage"}, error


def _read_response(conn: socket.socket) -> str:
    """The whole response: the head and body may come in separate segments."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _content_length(data):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _content_length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def test_a_stalled_body_is_408_request_body_timeout():
    front = start_front(
        {
            "HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{free_port()}/api",
            "HORDE_OAI_REDIS_URL": "",
            "HORDE_BODY_READ_TIMEOUT_SECONDS": "1",
        }
    )
    try:
        port = int(front.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model": '
            )
            answer = _read_response(conn)
        assert answer.startswith("HTTP/1.1 408"), answer
        assert '"code":"RequestBodyTimeout"' in answer.replace(" ", "")
    finally:
        front.stop()


def test_in_flight_cap_per_address_is_503_front_at_capacity():
    # A native horde that accepts a connection and answers nothing keeps the first request in flight.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.settimeout(20)
        front = start_front(
            {
                "HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{silent.getsockname()[1]}/api",
                "HORDE_OAI_REDIS_URL": "",
                "HORDE_OAI_SUBMIT_RETRIES": "0",
                "HORDE_OAI_MAX_IN_FLIGHT_PER_ADDRESS": "1",
            }
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": "Bearer k"}
        held: dict[str, httpx.Response] = {}
        first = threading.Thread(
            target=lambda: held.setdefault(
                "r", httpx.post(f"{front.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
            )
        )
        try:
            first.start()
            native, _ = silent.accept()  # the first request passed the cap and is calling the horde
            with native:
                refused = httpx.post(
                    f"{front.url}/v1/chat/completions", json=body, headers=headers, timeout=10
                )
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"] == {
                    "message": "The front has too many requests in flight right now; retry shortly.",
                    "type": "api_error",
                    "param": None,
                    "code": "FrontAtCapacity",
                }
            first.join(30)  # the horde hung up: the first request ends (502) and frees its slot
            assert held["r"].status_code == 502, held["r"].text
            again = httpx.post(f"{front.url}/v1/chat/completions", json={"model": "m"}, headers=headers)
            assert again.status_code == 400
        finally:
            front.stop()
