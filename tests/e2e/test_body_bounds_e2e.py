"""Bounded parsing on every route that takes a body, each service its own process on real stores.

Every route reads its body with horde_core's one reader (``horde_core.body``): a byte bound per route (413 past
it, declared or chunked), then the JSON structure (elements and depth) checked on the raw bytes before any
object is built (400 in the service's envelope). An amplifying body (``[{},{},…]``, which json would grow about
25 times) is refused fast, and the process's resident memory grows by little more than the body itself:
measured here from ``/proc/<pid>/status`` (VmHWM reset through ``clear_refs`` where the kernel allows it, and
VmRSS sampled every millisecond while the request runs).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from horde_contract.limits import (
    MAX_CHAT_BODY_BYTES,
    MAX_CHAT_BODY_ELEMENTS,
    MAX_JSON_BODY_DEPTH,
    MAX_POP_BODY_BYTES,
    MAX_POP_BODY_ELEMENTS,
    MAX_PROGRESS_BODY_BYTES,
    MAX_PROGRESS_BODY_ELEMENTS,
    MAX_SUBMIT_BODY_BYTES,
    MAX_SUBMIT_BODY_ELEMENTS,
)

from .conftest import Stack

MIB = 1024 * 1024
#: An amplifying body: 12 MB of empty objects, or as much as a route's byte bound lets in.
AMPLIFYING_BYTES = 12_000_000
#: Allowed growth of a process's resident memory while it refuses a body: the body read (its chunks and their
#: join), the scan (a 64 KiB slice at a time) and allocator slack: 3 times the body plus a small constant.
RSS_GROWTH_FACTOR = 3
RSS_GROWTH_CONSTANT = 16 * MIB


@dataclass(frozen=True)
class Route:
    name: str
    service: str
    path: str
    max_bytes: int
    max_elements: int
    #: (status, rc, message) of a refusal, from the body's JSON: the service's own envelope.
    refusal: Callable[[dict[str, Any]], tuple[int, str, str]]
    #: The message of a refusal past the structure bounds, from the bound's own sentence.
    structure_message: Callable[[str], str]
    too_large: tuple[str, str]  # (rc, message) of 413
    key: str = "client"  # whose API key the request carries

    def headers(self, stack: Stack) -> dict[str, str]:
        key = stack.client_key if self.key == "client" else stack.worker_key
        if self.service == "oai":
            return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        return {"apikey": key, "Content-Type": "application/json"}

    def url(self, stack: Stack) -> str:
        return stack.url(self.service) + self.path


def _horde(body: dict[str, Any]) -> tuple[int, str, str]:
    return 0, str(body.get("rc")), str(body.get("message"))


def _openai(body: dict[str, Any]) -> tuple[int, str, str]:
    error = body.get("error") or {}
    return 0, str(error.get("code")), str(error.get("message"))


def _bare(message: str) -> str:
    return message


def _validation(message: str) -> str:
    return f"Input payload validation failed: body: {message}"


ROUTES = [
    Route(
        "front chat/completions",
        "oai",
        "/v1/chat/completions",
        MAX_CHAT_BODY_BYTES,
        MAX_CHAT_BODY_ELEMENTS,
        _openai,
        _bare,
        (
            "RequestTooLarge",
            f"The request body is larger than the {MAX_CHAT_BODY_BYTES} bytes the AI Horde accepts.",
        ),
    ),
    Route(
        "admission chat/async",
        "admission",
        "/api/v2/generate/chat/async",
        MAX_CHAT_BODY_BYTES,
        MAX_CHAT_BODY_ELEMENTS,
        _horde,
        _bare,
        ("RequestTooLarge", ""),
    ),
    Route(
        "admission text/async",
        "admission",
        "/api/v2/generate/text/async",
        MAX_CHAT_BODY_BYTES,
        MAX_CHAT_BODY_ELEMENTS,
        _horde,
        _bare,
        ("RequestTooLarge", ""),
    ),
    Route(
        "dispatch text/pop",
        "dispatch",
        "/api/v2/generate/text/pop",
        MAX_POP_BODY_BYTES,
        MAX_POP_BODY_ELEMENTS,
        _horde,
        _validation,
        ("RequestTooLarge", f"The request body is larger than {MAX_POP_BODY_BYTES} bytes."),
        key="worker",
    ),
    Route(
        "submit text/submit",
        "submit",
        "/api/v2/generate/text/submit",
        MAX_SUBMIT_BODY_BYTES,
        MAX_SUBMIT_BODY_ELEMENTS,
        _horde,
        _validation,
        ("RequestTooLarge", f"The request body is larger than {MAX_SUBMIT_BODY_BYTES} bytes."),
        key="worker",
    ),
    Route(
        "submit text/progress",
        "submit",
        "/api/v2/generate/text/progress",
        MAX_PROGRESS_BODY_BYTES,
        MAX_PROGRESS_BODY_ELEMENTS,
        _horde,
        _validation,
        (
            "ChatProgressCapReached",
            "This post is larger than any generation's progress cap. Stop posting progress; still submit the reply.",
        ),
        key="worker",
    ),
]
ROUTE_IDS = [route.name for route in ROUTES]


def elements_message(limit: int) -> str:
    return f"The JSON body has more than {limit} elements (arrays, objects and their items)."


def depth_message() -> str:
    return f"The JSON body nests deeper than {MAX_JSON_BODY_DEPTH} levels."


def amplifying_body(route: Route) -> bytes:
    """``[{},{},…]`` of 12 MB, or just under the route's byte bound when that is smaller."""
    size = min(AMPLIFYING_BYTES, route.max_bytes - 16)
    return b"[" + b"{}," * ((size - 4) // 3) + b"{}]"


def deep_body() -> bytes:
    """``{"a": [[[…]]]}`` one level past the depth bound, within every route's elements."""
    levels = MAX_JSON_BODY_DEPTH
    return b'{"a": ' + b"[" * levels + b"]" * levels + b"}"


class MemoryWatch:
    """The resident memory of one process while a request runs: VmRSS before, then the peak, from VmHWM reset
    through ``/proc/<pid>/clear_refs`` (where the kernel allows it) and VmRSS sampled every millisecond."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status = Path(f"/proc/{pid}/status")
        self.before = 0
        self.peak = 0
        self.after = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.hwm_reset = False

    def _read(self) -> dict[str, int]:
        values: dict[str, int] = {}
        for line in self.status.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) * 1024
        return values

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._read()["VmRSS"])
            time.sleep(0.001)

    def __enter__(self) -> MemoryWatch:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.before = self._read()["VmRSS"]
        self.peak = self.before
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        values = self._read()
        self.after = values["VmRSS"]
        if self.hwm_reset:
            self.peak = max(self.peak, values["VmHWM"])

    @property
    def growth(self) -> int:
        return self.peak - self.before


def raw_post(
    url: str, headers: dict[str, str], body: bytes, *, declared: int | None = None
) -> tuple[int, bytes]:
    """POST over a plain socket: ``Content-Length: declared`` and only ``body`` sent (a declared size the
    server refuses unread), or chunked when ``declared`` is None; sending stops quietly when the server has
    answered and closed. Returns (status, response body)."""
    parts = urlsplit(url)
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {declared}" if declared is not None else "Transfer-Encoding: chunked")
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            if declared is not None:
                sock.sendall(body)
            else:
                for start in range(0, len(body), 64 * 1024):
                    chunk = body[start : start + 64 * 1024]
                    sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            received += data
    head, _, rest = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        decoded = b""
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            decoded += rest[:size]
            rest = rest[size + 2 :]
        rest = decoded
    return status, rest


def _refusal(route: Route, response: httpx.Response) -> tuple[int, str, str]:
    _, rc, message = route.refusal(response.json())
    return response.status_code, rc, message


@pytest.fixture(scope="module")
def warm(stack: Stack) -> Stack:
    """One small request per route first, so what a route imports and caches on first use is not measured."""
    with httpx.Client(timeout=30) as client:
        for route in ROUTES:
            client.post(route.url(stack), content=b"[[]]", headers=route.headers(stack))
    return stack


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_an_amplifying_body_is_a_fast_400_and_costs_about_its_size(warm: Stack, route: Route) -> None:
    raw = amplifying_body(route)
    process = warm.processes[route.service]
    assert process.pid is not None
    with httpx.Client(timeout=60) as client, MemoryWatch(process.pid) as memory:
        started = time.monotonic()
        response = client.post(route.url(warm), content=raw, headers=route.headers(warm))
        elapsed = time.monotonic() - started
    assert _refusal(route, response) == (
        400,
        "BadRequest",
        route.structure_message(elements_message(route.max_elements)),
    )
    bound = RSS_GROWTH_FACTOR * len(raw) + RSS_GROWTH_CONSTANT
    print(
        f"\n{route.name}: body {len(raw) / MIB:.1f} MiB, refused in {elapsed * 1000:.0f} ms, RSS growth "
        f"peak {memory.growth / MIB:.1f} MiB, after {(memory.after - memory.before) / MIB:.1f} MiB "
        f"(bound {bound / MIB:.1f} MiB, VmHWM reset: {memory.hwm_reset})"
    )
    assert memory.growth < bound
    assert elapsed < 5


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_body_nested_past_the_bound_is_400(warm: Stack, route: Route) -> None:
    response = httpx.post(route.url(warm), content=deep_body(), headers=route.headers(warm), timeout=30)
    assert _refusal(route, response) == (400, "BadRequest", route.structure_message(depth_message()))
    within = b'{"a": ' + b"[" * (MAX_JSON_BODY_DEPTH - 1) + b"]" * (MAX_JSON_BODY_DEPTH - 1) + b"}"
    response = httpx.post(route.url(warm), content=within, headers=route.headers(warm), timeout=30)
    assert response.status_code < 500
    assert route.structure_message(depth_message()) not in response.text


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_body_past_the_byte_bound_is_413_declared_or_chunked(warm: Stack, route: Route) -> None:
    url = route.url(warm)
    headers = route.headers(warm)
    status, body = raw_post(url, headers, b"", declared=route.max_bytes + 1)
    assert status == 413
    refusal = httpx.Response(status, content=body)
    _, rc, message = route.refusal(refusal.json())
    expected_rc, expected_message = route.too_large
    assert rc == expected_rc
    if expected_message:
        assert message == expected_message
    if route.max_bytes < MAX_CHAT_BODY_BYTES:  # the routes whose byte bound is new: chunked too
        status, body = raw_post(url, headers, b" " * (route.max_bytes + 1))
        assert status == 413
        assert route.refusal(httpx.Response(status, content=body).json())[1] == expected_rc
