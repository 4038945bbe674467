"""No 5xx from input: whatever a client or worker sends, the answer is never a server error.

Every service runs as its own process on real stores (the ``stack`` fixture), with a scripted reference
worker serving ``scripted/echo`` and a hand-driven worker holding live generations (chat, streamed chat, tool
and structured-output chat, and text jobs) so submits and progress posts reach past the id lookup.

- **Schemathesis** loads each service's OpenAPI document from the running process (``/openapi.json`` of
  admission, dispatch, submit and the front) and runs its examples, coverage and fuzzing phases, positive and
  negative, over every operation, checking ``not_a_server_error`` and that the answer's status, content type
  and body conform to the document.
- **A hypothesis fuzz of each route's body**: arbitrary JSON values (recursive strategies, lone surrogates,
  NaN and huge numbers included), mutations of valid bodies (a value replaced by an edge value or another JSON
  value, a key dropped or added, a value wrapped), and raw bytes that are not JSON or not UTF-8, each posted
  with a valid, anonymous, unknown or missing key.

A 5xx, or an internal error inside a 200 (a relayed stream's error event), fails the test with the request and
the traceback the service logged for it. Two answers of the front report what its workers did rather than the
horde failing on the input, and are not judged: 502 ``ChatRequestFaulted`` (the workers faulted an accepted
request; the scripted backend faults a forced tool choice without its marker), counted and printed; and 503
``no_eligible_worker`` once those faults put the scripted worker in maintenance, which is then lifted and the
request sent again, the second answer being judged. An input the horde should refuse before any worker sees it
is kept in ``FOUND``, judged strictly.

``HORDE_FUZZ_EXAMPLES`` sets the examples per operation (schemathesis' fuzzing phase) and, times 12, per route
(the body fuzz): 16 by default, about 35 s with the stack's start; ``make test-fuzz`` runs 500.
``HORDE_FUZZ_SEED`` sets the schemathesis seed. Generation is derandomized, so a run is repeatable.

Outgoing image fetches never leave the machine: every http(s) URL in a generated body has its host replaced by
a loopback address (which admission refuses without connecting), keeping the port and the rest of the URL as
generated, so malformed URLs still reach the parser.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import load_all_checks, not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup, as_reported_failure
from schemathesis.core.result import Ok
from schemathesis.pytest.lazy import get_all_tests
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import MODEL, Stack

# Minutes even at the default 16 examples: -m "not slow" leaves the module out.
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("HORDE_FUZZ_EXAMPLES", "16"))
SEED = int(os.environ.get("HORDE_FUZZ_SEED", "20261101"))
# The body fuzz runs this many examples per route for every schemathesis fuzzing example.
BODY_FUZZ_FACTOR = 12
TARGET_MODEL = "fuzz/target"
REFERENCE_WORKER = "fuzz-reference-worker"
TARGET_WORKER = "fuzz-target-worker"
# Generations older than this are held anew before the progress and submit fuzz (the job lease is 150 s).
HELD_FOR_SECONDS = 60.0
POP_MODEL = "fuzz/popped"
REQUEST_TIMEOUT = 60.0
ALL_FEATURES = [
    "seed",
    "reasoning_effort",
    "presence_penalty",
    "frequency_penalty",
    "vision",
    "tools",
    "json_object",
    "json_schema",
    "tools_with_response_format",
    "tool_choice_enforced",
    "single_tool_call_enforced",
    "structured_output_enforced",
    "prompt_overflow_refused",
]
# A 2x2 PNG.
PNG_DATA_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGM8ISfHwMDAxMDAwMDAAAANBAEIfXHKZgAAAABJRU5ErkJggg=="
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
COLOUR_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "colour",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"shade": {"type": "string", "pattern": "^[a-z]+$"}},
            "required": ["shade"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    """Limits out of the fuzz's way (a 429 stops a request before the code under test), and short front waits:
    a fuzzed completion nobody can serve answers 408 after 5 s instead of 540."""
    high = "1000000/second"
    limits = (
        "CHAT_REQUEST_2SEC_LIMIT_PER_IP",
        "CHAT_REQUEST_90MIN_LIMIT_PER_IP",
        "TEXT_REQUEST_2SEC_LIMIT_PER_IP",
        "TEXT_REQUEST_90MIN_LIMIT_PER_IP",
        "APIKEY_REQUEST_LIMIT",
        "APIKEY_WHITELISTED_REQUEST_LIMIT",
        "WHITELISTED_REQUEST_LIMITS",
        "STATUS_REQUEST_LIMIT_PER_IP",
        "POP_REQUEST_LIMIT_PER_IP",
        "SUBMIT_REQUEST_LIMIT_PER_IP",
        "READ_REQUEST_LIMIT_PER_IP",
    )
    return {
        **{f"HORDE_{name}": high for name in limits},
        "HORDE_OAI_NONSTREAM_TIMEOUT_SECONDS": "5",
        "HORDE_OAI_STREAM_TIMEOUT_SECONDS": "5",
        "HORDE_OAI_RETRY_GRACE_SECONDS": "0",
        "HORDE_OAI_STREAM_RESUME_GRACE_SECONDS": "0",
    }


# -- the world the fuzz runs in ------------------------------------------------------------------------------


@dataclass
class Generation:
    id: str
    model: str
    chat: bool
    stream: bool
    plain: bool = False  # a chat job without tools or a response format


@dataclass
class FuzzWorld:
    stack: Stack
    generations: list[Generation] = field(default_factory=list)
    reference_worker_id: str = ""
    target_key: str = ""
    held_at: float = 0.0
    worker_faults: int = 0
    client: httpx.Client = field(
        default_factory=lambda: httpx.Client(timeout=REQUEST_TIMEOUT, trust_env=False)
    )

    def hold_generations(self, *, older_than: float = 0.0) -> None:
        """Hold fresh generations when the held ones are older than ``older_than`` seconds (a long run outlives
        the 150 s job lease, past which a post is ChatJobAborted and a reply AbortedGen)."""
        if not self.generations or time.monotonic() - self.held_at > older_than:
            if self.generations:
                # Held generations whose lease lapsed count as jobs the worker dropped: enough of them put it in
                # maintenance, where it is offered none of these requests.
                self.stack.admin("worker", "set", "--name", TARGET_WORKER, "--no-maintenance")
            self.generations = _hold_generations(self.stack, self.client, self.target_key)
            self.held_at = time.monotonic()

    def send(self, method: str, url: str, body: bytes | None, headers: dict[str, str]) -> httpx.Response:
        """Send a request; sent again once on a fresh connection when the pooled one was dropped (uvicorn closes
        a keep-alive connection after an unhandled error, which the request before has then already shown)."""
        try:
            return self.client.request(method, url, content=body, headers=headers)
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
            return self.client.request(method, url, content=body, headers={**headers, "connection": "close"})

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return self.send("POST", url, body, headers)

    def gens(self, *, chat: bool, stream: bool | None = None) -> list[Generation]:
        return [g for g in self.generations if g.chat == chat and (stream is None or g.stream == stream)]

    def revived(self, response: httpx.Response) -> bool:
        """Whether ``response`` is the front's 503 no_eligible_worker for a reference worker the fuzz drove into
        maintenance (the scripted backend faults a forced tool choice without its marker, and 20 dropped jobs
        put a worker in maintenance); the worker is then taken out of maintenance, for the request to be sent
        again. That answer is the spec's for the horde's state, not for the input: the resent request's answer
        is what the check judges."""
        if response.status_code != 503:
            return False
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return False
        if code != "no_eligible_worker":
            return False
        self.stack.admin("worker", "set", "--name", REFERENCE_WORKER, "--no-maintenance")
        return True

    def workers_failed(self, response: httpx.Response) -> bool:
        """Whether ``response`` is the front's 502 ChatRequestFaulted: the request was accepted and its workers
        failed it (the scripted backend cannot follow a forced tool choice without its marker, and faults the
        job, as a model that cannot follow one does). That answer reports what the workers did, not the horde
        failing on the input, so it is counted (``worker_faults``) and not judged; an input the horde should
        have refused before any worker saw it is listed in ``FOUND`` instead."""
        if response.status_code != 502:
            return False
        try:
            failed = response.json()["error"]["code"] == "ChatRequestFaulted"
        except (ValueError, KeyError, TypeError):
            return False
        self.worker_faults += failed
        return bool(failed)


def _target_pop_body(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "models": [TARGET_MODEL],
        "max_length": 4096,
        "max_context_length": 8192,
        "bridge_agent": "horde-fuzz:1:local",
        "chat_jobs": True,
        "model_id": TARGET_MODEL,
        "chat_limits": {"max_context_length": 8192, "max_length": 4096},
        "chat_features": ALL_FEATURES,
        "image_transports": ["url", "base64"],
    }


def _hold_generations(stack: Stack, client: httpx.Client, target_key: str) -> list[Generation]:
    """Queue chat (plain, streamed, tools, structured output) and text requests for TARGET_MODEL and pop them
    with a hand-driven worker, so the submit and progress fuzz has live generations to aim at."""
    pop_url = f"{stack.url('dispatch')}/api/v2/generate/text/pop"
    worker_headers = {"apikey": stack.worker_key}
    body = _target_pop_body(TARGET_WORKER)
    assert client.post(pop_url, json=body, headers=worker_headers).status_code == 200  # check in
    # Earlier cases submit generations they held for minutes, which measures this hand-driven worker as slow;
    # the speed gate (docs/native-api.md#job-lease) would then keep every chat job from it. Back to unmeasured (10 tok/s).
    asyncio.run(_reset_speed(stack, TARGET_WORKER))
    chat = {"model": TARGET_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}
    requests: list[dict[str, Any]] = []
    for _ in range(3):
        requests += [
            chat,
            {**chat, "stream": True},
            {**chat, "tools": [WEATHER_TOOL], "tool_choice": "required"},
            {**chat, "response_format": COLOUR_FORMAT, "stream": True},
        ]
    for request in requests:
        r = client.post(f"{stack.native}/generate/chat/async", json=request, headers={"apikey": target_key})
        assert r.status_code == 202, r.text
    for _ in range(3):
        text = {"prompt": "hello", "models": [TARGET_MODEL], "params": {"max_length": 32}}
        r = client.post(f"{stack.native}/generate/text/async", json=text, headers={"apikey": target_key})
        assert r.status_code == 202, r.text
    held: list[Generation] = []
    last: dict[str, Any] = {}
    for _ in range(40):
        r = client.post(pop_url, json=body, headers=worker_headers)
        assert r.status_code == 200, r.text
        job = last = r.json()
        if job["id"] is None:
            break
        chat_job = bool(job.get("chat"))
        stream = bool(job.get("payload", {}).get("stream_progress"))
        payload = job.get("payload", {})
        plain = chat_job and not ({"tools", "response_format"} & set(payload))
        held += [Generation(gid, job["model"], chat_job, stream, plain) for gid in job["ids"]]
    # Generations of earlier holds whose lease lapsed are restarted and popped again with these.
    assert len(held) >= len(requests) + 3, (held, last)
    return held


async def _reset_speed(stack: Stack, name: str) -> None:
    conn = await asyncpg.connect(stack.env["HORDE_DATABASE_URL"])
    try:
        await conn.execute("UPDATE workers SET speed = NULL WHERE name = $1", name)
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def world(stack: Stack) -> Iterator[FuzzWorld]:
    stack.admin("user", "set", "--username", "e2e-client", "--kudos", "100000000", "--concurrency", "100000")
    target = stack.admin("user", "create", "--username", "fuzz-target-client", "--kudos", "100000000")
    stack.admin("user", "set", "--username", "fuzz-target-client", "--concurrency", "100000")
    stack.start_worker(REFERENCE_WORKER)
    fuzz = FuzzWorld(stack, target_key=str(target["api_key"]))
    fuzz.hold_generations()
    found = fuzz.client.get(f"{stack.url('dispatch')}/api/v2/workers/name/{REFERENCE_WORKER}")
    fuzz.reference_worker_id = found.json()["id"]
    try:
        yield fuzz
    finally:
        fuzz.client.close()


# -- keeping fetches on the machine --------------------------------------------------------------------------

_URL = re.compile(r"^(?P<scheme>https?://)(?P<authority>[^/?#]*)(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)


def _safe_authority(authority: str) -> str:
    """The authority with its host replaced by a loopback literal; userinfo and the port text are kept, and so
    is a host that cannot be resolved at all (an unclosed IPv6 bracket, a host IDNA cannot encode)."""
    userinfo, at, hostport = authority.rpartition("@")
    prefix = userinfo + at
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            return authority
        return f"{prefix}[::1]{hostport[close + 1 :]}"
    host, colon, port = hostport.partition(":")
    if not host:
        return authority
    try:
        host.encode("idna")
    except UnicodeError:
        return authority
    return f"{prefix}127.0.0.1{colon}{port}"


def keep_local(value: Any) -> Any:
    """``value`` with the host of every http(s) URL string replaced by a loopback address."""
    if isinstance(value, str):
        match = _URL.match(value)
        if match is None:
            return value
        return match["scheme"] + _safe_authority(match["authority"]) + match["rest"]
    if isinstance(value, list):
        return [keep_local(v) for v in value]
    if isinstance(value, dict):
        return {keep_local(k): keep_local(v) for k, v in value.items()}
    return value


def test_urls_are_kept_on_the_machine() -> None:
    assert keep_local({"u": "https://example.com:8443/a.png?x#y"}) == {
        "u": "https://127.0.0.1:8443/a.png?x#y"
    }
    assert keep_local(["HTTP://user@evil.test/a"]) == ["HTTP://user@127.0.0.1/a"]
    assert keep_local("http://[2001:db8::1]:99999/a") == "http://[::1]:99999/a"
    assert keep_local("http://[::1/a.png") == "http://[::1/a.png"
    assert keep_local("http://example.com:99999/a.png") == "http://127.0.0.1:99999/a.png"
    assert keep_local("data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"


# -- reporting a 5xx with the service's traceback ------------------------------------------------------------

SERVICE_OF_PREFIX = {"admission": "admission", "dispatch": "dispatch", "submit": "submit", "oai": "oai"}


class LogMark:
    """Where each service's log ended before a request, to show what it logged for that request."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.offsets = {
            name: process.log_path.stat().st_size if process.log_path.exists() else 0
            for name, process in stack.processes.items()
        }

    def since(self) -> str:
        time.sleep(0.2)  # the traceback is written before the answer; leave room for a slow flush
        parts = []
        for name, offset in self.offsets.items():
            path = self.stack.processes[name].log_path
            if not path.exists():
                continue
            with open(path, "rb") as log:
                log.seek(offset)
                text = log.read().decode("utf-8", "replace")
            at = text.find("Traceback (most recent call last)")
            if at >= 0:
                # From the log line that introduces the first traceback, to the end of that traceback.
                start = text.rfind("\n", 0, text.rfind("\n", 0, at)) + 1
                end = text.find("\n20", at)  # the next timestamped log line
                parts.append(
                    f"--- {name} log for this request ---\n{text[start : end if end > 0 else None][-6000:]}"
                )
            elif " ERROR " in text:
                parts.append(f"--- {name} log for this request ---\n{text[-3000:]}")
        return "\n".join(parts) or "(no service logged a traceback)"


def _shown(data: bytes, limit: int = 2000) -> str:
    text = data.decode("utf-8", "backslashreplace")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(data)} bytes)"


def server_error_report(
    method: str, url: str, headers: dict[str, str], body: bytes, response: httpx.Response, mark: LogMark
) -> str:
    return (
        f"{response.status_code} from {method} {url}\n"
        f"headers: {json.dumps(headers)}\n"
        f"body: {_shown(body)}\n"
        f"answer: {_shown(response.content, 1000)}\n"
        f"{mark.since()}"
    )


# -- schemathesis over the four documents --------------------------------------------------------------------

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _config() -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "generation": {"max-examples": EXAMPLES, "deterministic": True, "database": "none"},
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            "request-timeout": REQUEST_TIMEOUT,
        }
    )


def _load(base: str) -> Any:
    return schemathesis.openapi.from_url(f"{base}/openapi.json", config=_config())


def _pick(case: Any, choices: list[str | None]) -> str | None:
    """A deterministic choice per case (half the cases keep what schemathesis generated)."""
    seed = zlib.crc32(repr((case.method, case.path, case.body, case.query, case.path_parameters)).encode())
    return choices[seed % len(choices)]


def run_case(world: FuzzWorld, case: Any, key: str, *, bearer: bool = False) -> int:
    """Send a schemathesis case (its http(s) URLs kept local, a valid key on some cases) and check the answer;
    a failure carries the traceback the services logged for it. Returns the status."""
    if case.body is not None and not isinstance(case.body, bytes):
        case.body = keep_local(case.body)
    chosen = _pick(case, [None, key])
    if chosen is not None:
        case.headers = dict(case.headers or {})
        if bearer:
            case.headers["Authorization"] = f"Bearer {chosen}"
        else:
            case.headers["apikey"] = chosen
    mark = LogMark(world.stack)
    response = case.call()
    if bearer and world.revived(response):
        mark = LogMark(world.stack)
        response = case.call()
    if bearer and world.workers_failed(response):
        return int(response.status_code)
    try:
        case.validate_response(response, checks=CHECKS)
        assert b"InternalServerError" not in response.content, (
            "an internal error inside a 200 (a stream's error event)"
        )
    except BaseException as exc:
        if response.status_code >= 500 or b"InternalServerError" in response.content:
            exc.add_note(mark.since())
        raise
    return int(response.status_code)


def run_schemathesis(world: FuzzWorld, service: str, key: str, *, bearer: bool = False) -> None:
    """Every phase of every operation of ``service``'s document; fails listing each failing operation.

    schemathesis' own pytest integration (``from_fixture(...).parametrize()``) renames the pytest node through
    ``request.node._nodeid``, which pytest 9 no longer has, so the per-operation tests it builds
    (``get_all_tests``, the same builder and configuration) are run here, each operation on its own.
    """
    load_all_checks()
    schema = _load(world.stack.url(service))
    calls = 0
    failures: list[str] = []

    statuses: Counter[int] = Counter()

    def test(case: Any) -> None:
        nonlocal calls
        calls += 1
        statuses[run_case(world, case, key, bearer=bearer)] += 1

    started = time.monotonic()
    operations = 0
    for result in get_all_tests(schema=schema, test_func=test, settings=None, given_kwargs={}):
        if not isinstance(result, Ok):
            failures.append(f"schema error: {result.err()}")
            continue
        operation, sub_test = result.ok()
        operations += 1
        try:
            sub_test()
        except (Exception, FailureGroup) as exc:  # FailureGroup is a BaseExceptionGroup
            shown = as_reported_failure(exc) if isinstance(exc, FailureGroup) else exc
            notes = "\n".join(getattr(exc, "__notes__", []))
            failures.append(f"{operation.label}: {type(shown).__name__}: {shown}\n{notes}")
    elapsed = time.monotonic() - started
    print(
        f"schemathesis {service}: {operations} operations, {calls} cases, {elapsed:.1f} s; "
        f"statuses {dict(sorted(statuses.items()))}"
    )
    assert operations > 0
    assert not failures, (
        f"{len(failures)} failing operations of {operations}, {calls} cases:\n\n" + "\n\n".join(failures)
    )


def test_schemathesis_admission(world: FuzzWorld) -> None:
    run_schemathesis(world, "admission", world.stack.client_key)


def test_schemathesis_dispatch(world: FuzzWorld) -> None:
    run_schemathesis(world, "dispatch", world.stack.worker_key)


def test_schemathesis_submit(world: FuzzWorld) -> None:
    run_schemathesis(world, "submit", world.stack.worker_key)


def test_schemathesis_front(world: FuzzWorld) -> None:
    run_schemathesis(world, "oai", world.stack.client_key, bearer=True)


# -- the body fuzz -------------------------------------------------------------------------------------------

ANY_CHARACTER = st.characters(exclude_categories=())  # lone surrogates included
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(ANY_CHARACTER, max_size=20)
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, max_size=4) | st.dictionaries(
        st.text(ANY_CHARACTER, max_size=12), children, max_size=4
    )


JSON_VALUES = st.recursive(SCALARS, _containers, max_leaves=16)
EDGE_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63,
    10**20,
    -(10**20),
    1.5,
    -0.0,
    1e308,
    float("nan"),
    float("inf"),
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff tail",
    "é" * 3,
    "😀",
    "x" * 5000,
    "0000000000",
    "00000000-0000-0000-0000-000000000000",
    "alias#1",
    "alias",
    "http://[::1/a.png",
    "http://127.0.0.1:99999/a.png",
    "http://127.0.0.1:notaport/a.png",
    "https://127.0.0.1/a.png",
    "http:///a.png",
    "data:image/png;base64,!!!!",
    "data:image/png;base64,AAAA",
    PNG_DATA_URL,
    "data:image/png,notbase64",
    [],
    {},
    [None],
    {"": None},
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
]
RAW_BODIES: list[bytes] = [
    b"",
    b"{",
    b"}",
    b"null",
    b"[]",
    b"[{}]",
    b"0",
    b'"text"',
    b"{}",
    b'{"a":1,"a":2}',
    b"\xff\xfe\x00{}",
    b'{"prompt": "\xc3\x28"}',
    b"1e999999",
    b"-" * 100,
    b"NaN",
    b'{"messages": NaN}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a":' * 2000 + b"1" + b"}" * 2000,
    b'{"model": "\\ud800"}',
    b"\x00",
]
API_KEYS = ["valid", "valid", "valid", "valid", "valid", "anonymous", "unknown", "missing", "uuid"]


def _paths(value: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*here, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*here, index))


def _replace(value: Any, path: tuple[Any, ...], new: Callable[[Any], Any]) -> Any:
    if not path:
        return new(value)
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


_DROP = object()


def _drop(value: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != path[0]}
        return [v for i, v in enumerate(value) if i != path[0]]
    head = path[0]
    if isinstance(value, dict):
        return {**value, head: _drop(value[head], path[1:])}
    copy = list(value)
    copy[head] = _drop(copy[head], path[1:])
    return copy


INT_EDGES = [
    0,
    -1,
    1,
    15,
    16,
    80,
    16384,
    16385,
    1048577,
    2**31 - 1,
    2**31,
    2**63 - 1,
    2**63,
    10**20,
    -(10**20),
]
FLOAT_EDGES = [0.0, -0.0, 5e-324, 0.5, -2.0000001, 2.0000001, 5.0000001, 1e308, float("nan"), float("inf")]
STRING_EDGES = [e for e in EDGE_VALUES if isinstance(e, str)]


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def tweaked(value: Any) -> st.SearchStrategy[Any]:
    """A value of the same JSON type near the edges a parser or a store column has (type-preserving, so the
    body stays one step from valid and reaches the range checks and the stores)."""
    if isinstance(value, bool):
        return st.just(not value)
    if isinstance(value, int):
        return st.sampled_from(INT_EDGES) | st.integers()
    if isinstance(value, float):
        return st.sampled_from(FLOAT_EDGES) | st.floats()
    if isinstance(value, str):
        return st.sampled_from(STRING_EDGES) | st.text(ANY_CHARACTER, max_size=40) | st.just(value * 1000)
    if isinstance(value, list):
        return st.sampled_from([[], value[:1], value + value[:1], value * 200])
    if isinstance(value, dict):
        return st.just({})
    return JSON_VALUES


@st.composite
def mutated(draw: st.DrawFn, valid: list[dict[str, Any]]) -> Any:
    """A valid body with zero to three mutations at random places (mostly one, so most bodies are one step from
    valid and reach past the first check)."""
    body: Any = draw(st.sampled_from(valid))
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 1, 2, 2, 3]))):
        path = draw(st.sampled_from(list(_paths(body))))
        kind = draw(
            st.sampled_from(
                [
                    "tweak",
                    "tweak",
                    "tweak",
                    "edge",
                    "json",
                    "drop",
                    "add",
                    "wrap_list",
                    "wrap_object",
                    "repeat",
                ]
            )
        )
        if kind == "tweak":
            new = draw(tweaked(_at(body, path)))
            body = _replace(body, path, lambda _: new)  # noqa: B023 - applied at once
        elif kind == "edge":
            edge = draw(st.sampled_from(EDGE_VALUES))
            body = _replace(body, path, lambda _: edge)  # noqa: B023 - applied at once
        elif kind == "json":
            other = draw(JSON_VALUES)
            body = _replace(body, path, lambda _: other)  # noqa: B023 - applied at once
        elif kind == "drop" and path:
            body = _drop(body, path)
        elif kind == "add":
            key = draw(
                st.text(ANY_CHARACTER, max_size=12)
                | st.sampled_from(
                    [
                        "horde",
                        "stream",
                        "extra",
                        "n",
                        "id",
                        "seq",
                        "message",
                        "generation",
                        "model_id",
                        "fault_reason",
                        "chat_jobs",
                        "image_transports",
                    ]
                )
            )
            extra = draw(st.sampled_from(EDGE_VALUES) | JSON_VALUES)

            def add(v: Any, key: str = key, extra: Any = extra) -> Any:
                if isinstance(v, dict):
                    return {**v, key: extra}
                if isinstance(v, list):
                    return [*v, extra]
                return v

            body = _replace(body, path, add)
        elif kind == "wrap_list":
            body = _replace(body, path, lambda v: [v])
        elif kind == "wrap_object":
            body = _replace(body, path, lambda v: {"value": v})
        elif kind == "repeat":
            count = draw(st.sampled_from([2, 50, 300]))
            body = _replace(
                body,
                path,
                lambda v: [v] * count if not isinstance(v, list) else v * count,  # noqa: B023 - applied at once
            )
    return body


def encode(body: Any, ascii_only: bool) -> bytes:
    text = json.dumps(body, ensure_ascii=ascii_only, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


def bodies(valid: list[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    as_json = st.builds(encode, mutated(valid).map(keep_local), st.booleans())
    anything = st.builds(encode, JSON_VALUES.map(keep_local), st.booleans())
    raw = st.sampled_from(RAW_BODIES) | st.binary(max_size=64)
    return st.one_of(as_json, as_json, as_json, as_json, as_json, as_json, anything, raw)


@dataclass(frozen=True)
class Route:
    service: str
    path: str
    key: str  # client | worker
    bearer: bool = False


def chat_bodies(world: FuzzWorld) -> list[dict[str, Any]]:
    base = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 32,
    }
    return [
        base,
        {**base, "horde": {"dry_run": True, "context_fit": "grow", "max_kudos": 1000}},
        {
            **base,
            "stream": True,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": ["\n"],
            "seed": 3,
            "reasoning_effort": "low",
        },
        {
            "models": [MODEL, TARGET_MODEL],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": PNG_DATA_URL, "detail": "low"}},
                    ],
                }
            ],
            "max_completion_tokens": 32,
        },
        {
            **base,
            "messages": [
                {"role": "user", "content": "see"},
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://images.invalid/a.png"}}],
                },
            ],
        },
        {
            **base,
            "messages": [{"role": "user", "content": "[[tool:get_weather]] weather?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
        },
        {
            **base,
            "messages": [
                {"role": "user", "content": "w?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            "tools": [WEATHER_TOOL],
        },
        {
            **base,
            "response_format": COLOUR_FORMAT,
            "horde": {
                "operation_key": str(uuid.uuid4()),
                "conformance": "best_effort",
                "only": [world.reference_worker_id],
            },
        },
        {
            **base,
            "model": TARGET_MODEL,
            "horde": {
                "trusted_workers": True,
                "slow_workers": False,
                "max_context_length": 4096,
                "context_fit": "truncate_oldest",
                "availability_mode": "fail_fast",
                "ignore": [world.reference_worker_id],
            },
        },
    ]


def text_bodies(world: FuzzWorld) -> list[dict[str, Any]]:
    return [
        {
            "prompt": "hello",
            "models": [MODEL],
            "params": {
                "max_length": 32,
                "max_context_length": 1024,
                "n": 1,
                "stop_sequence": ["\n"],
                "sampler_order": [0, 1, 2, 3, 4, 5, 6],
            },
        },
        {"prompt": "hello", "dry_run": True, "params": {"n": 3, "temperature": 0.7}},
        {
            "prompt": "hello",
            "models": [TARGET_MODEL],
            "workers": [world.reference_worker_id],
            "worker_blacklist": True,
            "slow_workers": False,
            "allow_downgrade": True,
        },
    ]


def pop_bodies(world: FuzzWorld) -> list[dict[str, Any]]:
    chat = {
        **_target_pop_body("fuzz-pop-worker"),
        "models": [POP_MODEL, "other/model"],
        "model_id": POP_MODEL,
    }
    return [
        chat,
        {
            **chat,
            "threads": 2,
            "amount": 3,
            "priority_usernames": ["alias#1"],
            "softprompts": ["a"],
            "nsfw": True,
        },
        {"name": "fuzz-text-worker", "models": [POP_MODEL], "max_length": 80, "max_context_length": 1024},
        {
            **chat,
            "prompt_jobs": False,
            "chat_limits": {"max_context_length": 2048, "max_length": 512, "tools_max_temperature": 0.5},
        },
    ]


def submit_bodies(world: FuzzWorld) -> list[dict[str, Any]]:
    chats = world.gens(chat=True)
    texts = world.gens(chat=False)
    out: list[dict[str, Any]] = []
    for gen in chats:
        out += [
            {
                "id": gen.id,
                "model_id": gen.model,
                "message": {"role": "assistant", "content": '{"shade": "red"}', "reasoning_content": "hm"},
                "finish_reason": "stop",
                "prompt_tokens": 3,
                "completion_tokens": 2,
                "native_finish_reason": "eos",
            },
            {
                "id": gen.id,
                "model_id": gen.model,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            },
            {"id": gen.id, "model_id": gen.model, "state": "faulted", "fault_reason": "generation_error"},
        ]
    for gen in texts:
        out += [
            {
                "id": gen.id,
                "generation": "hello",
                "state": "ok",
                "seed": 1,
                "gen_metadata": [{"type": "censorship", "value": "csam", "ref": "x"}],
            },
            {"id": gen.id, "generation": "Faulted", "state": "faulted"},
        ]
    return out


def progress_bodies(world: FuzzWorld) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    streamed = world.gens(chat=True, stream=True)
    assert streamed, world.generations
    for gen in streamed:
        for seq in (1, 2, 3):
            out.append(
                {"id": gen.id, "seq": seq, "delta": {"content": "partial ", "reasoning_content": "think"}}
            )
    return out


def front_bodies(world: FuzzWorld) -> list[dict[str, Any]]:
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
    return [
        base,
        {**base, "stream": True, "stream_options": {"include_usage": True}},
        {**base, "tools": [WEATHER_TOOL], "tool_choice": "auto", "n": 1, "user": "u"},
        {
            **base,
            "response_format": {"type": "json_object"},
            "messages": [
                {"role": "developer", "content": "json"},
                {"role": "user", "content": "json please"},
            ],
        },
        {
            **base,
            "messages": [{"role": "user", "content": "[[tool:get_weather]] weather?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "horde": {"include_reasoning": False},
        },
    ]


ROUTES: dict[str, tuple[Route, Callable[[FuzzWorld], list[dict[str, Any]]]]] = {
    "chat_async": (Route("admission", "/api/v2/generate/chat/async", "client"), chat_bodies),
    "text_async": (Route("admission", "/api/v2/generate/text/async", "client"), text_bodies),
    "pop": (Route("dispatch", "/api/v2/generate/text/pop", "worker"), pop_bodies),
    # Progress first: the submit fuzz stores and faults the held generations.
    "progress": (Route("submit", "/api/v2/generate/text/progress", "worker"), progress_bodies),
    "submit": (Route("submit", "/api/v2/generate/text/submit", "worker"), submit_bodies),
    "completions": (Route("oai", "/v1/chat/completions", "client", bearer=True), front_bodies),
}


def _key(world: FuzzWorld, route: Route, choice: str) -> dict[str, str]:
    valid = world.stack.client_key if route.key == "client" else world.stack.worker_key
    key = {
        "valid": valid,
        "anonymous": "0000000000",
        "unknown": "not-a-key-at-all",
        "uuid": str(uuid.UUID(int=7)),
        "missing": None,
    }[choice]
    if key is None:
        return {}
    return {"Authorization": f"Bearer {key}"} if route.bearer else {"apikey": key}


@pytest.mark.parametrize("name", list(ROUTES))
def test_fuzzed_bodies_get_no_server_error(world: FuzzWorld, name: str) -> None:
    route, valid_bodies = ROUTES[name]
    url = world.stack.url(route.service) + route.path
    if route.service == "submit":
        world.hold_generations(older_than=HELD_FOR_SECONDS)
    valid = valid_bodies(world)
    assert valid

    @settings(
        max_examples=EXAMPLES * BODY_FUZZ_FACTOR,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=bodies(valid), key=st.sampled_from(API_KEYS))
    def post(body: bytes, key: str) -> None:
        headers = {"content-type": "application/json", **_key(world, route, key)}
        mark = LogMark(world.stack)
        response = world.post(url, body, headers)
        if route.bearer and world.revived(response):
            mark = LogMark(world.stack)
            response = world.post(url, body, headers)
        statuses[response.status_code] += 1
        if route.bearer and world.workers_failed(response):
            return
        assert response.status_code < 500, server_error_report("POST", url, headers, body, response, mark)
        # A relayed stream answers 200 before its end: an internal error after that is an error event.
        assert b"InternalServerError" not in response.content, server_error_report(
            "POST", url, headers, body, response, mark
        )

    statuses: Counter[int] = Counter()
    started = time.monotonic()
    try:
        post()
    finally:
        print(
            f"body fuzz {name}: {sum(statuses.values())} requests, {time.monotonic() - started:.1f} s; "
            f"statuses {dict(sorted(statuses.items()))}; requests the workers failed so far: {world.worker_faults}"
        )


# -- every 5xx the fuzz found, kept as a fixed example -------------------------------------------------------


def _strict_tool_with_list_properties() -> dict[str, Any]:
    schema = {"type": "object", "properties": [{"city": {"type": "string"}}], "required": ["city"]}
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {**schema, "additionalProperties": False},
            "strict": True,
        },
    }


@dataclass(frozen=True)
class Found:
    """A request the fuzz once answered with a 5xx: ``body`` is built from the world (a held generation's id)."""

    service: str
    method: str
    path: str
    key: str  # client | worker
    body: Callable[[FuzzWorld], Any] | None = None
    bearer: bool = False


def _held_text(world: FuzzWorld) -> str:
    """A pending text generation nothing has answered yet."""
    world.hold_generations()
    return world.gens(chat=False)[-1].id


def _held_chat(world: FuzzWorld) -> str:
    """A pending chat generation without tools or a response format nothing has answered yet."""
    world.hold_generations()
    return next(g.id for g in world.generations if g.plain)


_POP = {"name": "fuzz-found-worker", "models": [POP_MODEL]}
_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
FOUND: dict[str, Found] = {
    # front schema.py: an unhashable role or part type was looked up in a dict.
    "front-role-list": Found(
        "oai",
        "POST",
        "/v1/chat/completions",
        "client",
        lambda w: {**_CHAT, "messages": [{"role": ["user"], "content": "hi"}]},
        bearer=True,
    ),
    "front-part-type-list": Found(
        "oai",
        "POST",
        "/v1/chat/completions",
        "client",
        lambda w: {**_CHAT, "messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]},
        bearer=True,
    ),
    # dispatch pop_body.py: values past the PostgreSQL columns, and int("²").
    "pop-max-length-1e20": Found(
        "dispatch", "POST", "/api/v2/generate/text/pop", "worker", lambda w: {**_POP, "max_length": 10**20}
    ),
    "pop-max-context-length-1e20": Found(
        "dispatch",
        "POST",
        "/api/v2/generate/text/pop",
        "worker",
        lambda w: {**_POP, "max_context_length": 10**20},
    ),
    "pop-chat-limits-1e20": Found(
        "dispatch",
        "POST",
        "/api/v2/generate/text/pop",
        "worker",
        lambda w: {
            **_POP,
            "chat_jobs": True,
            "model_id": POP_MODEL,
            "chat_limits": {"max_context_length": 10**20, "max_length": 10**20},
        },
    ),
    "pop-priority-id-past-int64": Found(
        "dispatch",
        "POST",
        "/api/v2/generate/text/pop",
        "worker",
        lambda w: {**_POP, "priority_usernames": ["a#" + "9" * 30]},
    ),
    "pop-priority-id-superscript-digit": Found(
        "dispatch",
        "POST",
        "/api/v2/generate/text/pop",
        "worker",
        lambda w: {**_POP, "priority_usernames": ["a#\u00b2"]},
    ),
    # admission chat.py: past the availability query's int32 field.
    "chat-max-context-length-1e20": Found(
        "admission",
        "POST",
        "/api/v2/generate/chat/async",
        "client",
        lambda w: {**_CHAT, "horde": {"max_context_length": 10**20}},
    ),
    # admission text.py and the contract's cross-field check: an explicit null param.
    "text-params-n-null": Found(
        "admission",
        "POST",
        "/api/v2/generate/text/async",
        "client",
        lambda w: {"prompt": "x", "params": {"n": None}},
    ),
    "text-params-max-length-null": Found(
        "admission",
        "POST",
        "/api/v2/generate/text/async",
        "client",
        lambda w: {"prompt": "x", "params": {"max_length": None}},
    ),
    "text-params-max-context-length-null": Found(
        "admission",
        "POST",
        "/api/v2/generate/text/async",
        "client",
        lambda w: {"prompt": "x", "params": {"max_context_length": None}},
    ),
    # submit: a seed past int64 reaches the compare-and-set.
    "submit-text-seed-1e20": Found(
        "submit",
        "POST",
        "/api/v2/generate/text/submit",
        "worker",
        lambda w: {"id": _held_text(w), "generation": "x", "seed": 10**20},
    ),
    # submit: a NUL in native_finish_reason reaches PostgreSQL (the reply's strings have theirs replaced).
    "submit-chat-native-finish-reason-nul": Found(
        "submit",
        "POST",
        "/api/v2/generate/text/submit",
        "worker",
        lambda w: {
            "id": _held_chat(w),
            "model_id": TARGET_MODEL,
            "message": {"role": "assistant", "content": "hi"},
            "finish_reason": "stop",
            "native_finish_reason": "\u0000",
        },
    ),
    # dispatch workers.py: a NUL in a looked-up name reaches PostgreSQL.
    "workers-name-query-nul": Found("dispatch", "GET", "/api/v2/workers?name=a%00b", "worker"),
    "workers-by-name-nul": Found("dispatch", "GET", "/api/v2/workers/name/a%00b", "worker"),
    # horde_contract: a strict tool schema whose properties is not an object was accepted; every worker then
    # failed the job and the request faulted (502 ChatRequestFaulted).
    "front-strict-tool-list-properties": Found(
        "oai",
        "POST",
        "/v1/chat/completions",
        "client",
        lambda w: {
            **_CHAT,
            "messages": [{"role": "user", "content": "[[tool:get_weather]] weather?"}],
            "tools": [_strict_tool_with_list_properties()],
            "tool_choice": "required",
        },
        bearer=True,
    ),
}


@pytest.mark.parametrize("name", list(FOUND))
def test_inputs_the_fuzz_found_get_no_server_error(world: FuzzWorld, name: str) -> None:
    found = FOUND[name]
    url = world.stack.url(found.service) + found.path
    key = world.stack.client_key if found.key == "client" else world.stack.worker_key
    headers = {"Authorization": f"Bearer {key}"} if found.bearer else {"apikey": key}
    body = b"" if found.body is None else encode(found.body(world), True)
    if body:
        headers["content-type"] = "application/json"
    mark = LogMark(world.stack)
    response = world.send(found.method, url, body or None, headers)
    if found.bearer and world.revived(response):
        mark = LogMark(world.stack)
        response = world.send(found.method, url, body or None, headers)
    assert response.status_code < 500, server_error_report(found.method, url, headers, body, response, mark)
