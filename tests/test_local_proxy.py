"""The local reverse proxy of ``make run`` (horde_testing.local_proxy: Caddy on one port, generated from the
routing table horde_testing.routes) in front of four stand-in services: every table row and the tricky paths
reach the service the Ingress's rules (:func:`horde_testing.routes.route_for`) name, unmatched paths are 404,
streams are not buffered, and client addresses reach the services the way admission reads them."""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from horde_testing._proc import port_is_free
from horde_testing.launcher import ServiceProcess, free_port
from horde_testing.local_proxy import (
    caddy_binary,
    local_upstreams,
    main,
    path_pattern,
    render_caddyfile,
)
from horde_testing.routes import ROUTES, SERVICES, Route, by_precedence, problems, route_for

PASSKEY = "test-passkey"

# A stand-in service: uvicorn trusting X-Forwarded-For from 127.0.0.1 (as a service behind a trusted proxy
# does), the client address as admission computes it (horde_core.ratelimit.client_address), and two streams
# that send their first part, then wait for /__release (asked directly, not through the proxy).
STANDIN = r"""
import asyncio, os, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route
from horde_core.ratelimit import client_address

name, port, passkey = sys.argv[1], int(sys.argv[2]), sys.argv[3]
release = asyncio.Event()

async def parts(first, second):
    yield first
    await asyncio.wait_for(release.wait(), 20)
    yield second

async def handle(request):
    path = request.url.path
    if path == "/__release":
        release.set()
        return PlainTextResponse("released")
    if path.endswith("/sse-test"):
        release.clear()
        return StreamingResponse(parts(b"data: one\n\n", b"data: two\n\n"), media_type="text/event-stream")
    if path.endswith("/die-test") and name == "admission-1":
        os._exit(1)  # a crash after the request was sent, before any answer
    if path.endswith("/fixed-length-test"):
        release.clear()
        return StreamingResponse(parts(b"one\n", b"two\n"), media_type="application/json",
                                 headers={"Content-Length": "8"})
    return JSONResponse({
        "backend": name,
        "method": request.method,
        "path": path,
        "query": request.url.query,
        "x_forwarded_for": request.headers.get("x-forwarded-for"),
        "proxy_authorization": request.headers.get("proxy-authorization"),
        "client": client_address(request, [passkey]),
    })

app = Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST", "PUT", "DELETE"])])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning",
            proxy_headers=True, forwarded_allow_ips="127.0.0.1")
"""

PORT_SETTINGS = {
    "admission": "HORDE_ADMISSION_HTTP_PORT",
    "dispatch": "HORDE_DISPATCH_HTTP_PORT",
    "submit": "HORDE_SUBMIT_HTTP_PORT",
    "oai-front": "HORDE_OAI_HTTP_PORT",
}


class Stack:
    def __init__(self, proxy: str, backends: dict[str, str], config: Path) -> None:
        self.proxy = proxy
        self.backends = backends
        self.config = config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Four stand-ins and the proxy, started as make run starts it (python -m horde_testing.local_proxy)."""
    config = tmp_path_factory.mktemp("local-proxy") / "Caddyfile"
    ports = {service: free_port() for service in SERVICES}
    proxy_port = free_port()
    with contextlib.ExitStack() as stack:
        for service, port in ports.items():
            stack.enter_context(
                ServiceProcess(
                    f"standin-{service}",
                    [sys.executable, "-c", STANDIN, service, str(port), PASSKEY],
                    health_url=f"http://127.0.0.1:{port}/healthz",
                )
            )
        env = {PORT_SETTINGS[s]: str(p) for s, p in ports.items()}
        proxy = f"http://127.0.0.1:{proxy_port}"
        stack.enter_context(
            ServiceProcess(
                "local-proxy",
                [
                    *(sys.executable, "-m", "horde_testing.local_proxy"),
                    *("--config", str(config), "--listen", f"127.0.0.1:{proxy_port}"),
                ],
                env=env,
                # Any routed path answers once Caddy is up (the admission stand-in answers everything).
                health_url=f"{proxy}/api/ready",
                stop_timeout=5,
            )
        )
        yield Stack(proxy, {s: f"http://127.0.0.1:{p}" for s, p in ports.items()}, config)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[ServiceProcess]]]:
    """The proxy with two replicas of admission (REPLICAS_ADMISSION=2: stand-ins ``admission-0`` on the base
    port and ``admission-1`` on base + 10); the other Services' ports are free and unused."""
    config = tmp_path_factory.mktemp("local-proxy-replicas") / "Caddyfile"
    base = free_port()
    while not port_is_free(base + 10):
        base = free_port()
    proxy_port = free_port()
    env = {PORT_SETTINGS[s]: str(free_port()) for s in SERVICES if s != "admission"}
    env |= {"HORDE_ADMISSION_HTTP_PORT": str(base), "REPLICAS_ADMISSION": "2"}
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(
                ServiceProcess(
                    f"standin-admission-{i}",
                    [sys.executable, "-c", STANDIN, f"admission-{i}", str(base + 10 * i), PASSKEY],
                    health_url=f"http://127.0.0.1:{base + 10 * i}/healthz",
                )
            )
            for i in range(2)
        ]
        proxy = f"http://127.0.0.1:{proxy_port}"
        stack.enter_context(
            ServiceProcess(
                "local-proxy-replicas",
                [
                    *(sys.executable, "-m", "horde_testing.local_proxy"),
                    *("--config", str(config), "--listen", f"127.0.0.1:{proxy_port}"),
                ],
                env=env,
                health_url=f"{proxy}/api/ready",
                stop_timeout=5,
            )
        )
        yield proxy, replicas


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.proxy, timeout=10, trust_env=False) as c:
        yield c


# -- routing ----------------------------------------------------------------------------------------------

TRICKY = [
    "/api/v2/workers/abc",
    "/api/v2/workers",
    "/api/v2/workersx",
    "/api/v2/generate/text/pop",
    "/api/v2/generate/text/pop/",
    "/api/v2/generate/text/popx",
    "/api/v2/generate/text/submit",
    "/api/v2/generate/text/progress",
    "/api/v2/generate/text/status/x",
    "/api/v2/generate/text/async",
    "/api/v2/generate/chat/async",
    "/api/v2/generate/chat/status/x",
    "/api/v2/status/models",
    "/api/v2/status/models/koboldcpp/some-model",
    "/api/v2/stats/text/models",
    "/api/v2/stats/text/totals",
    "/api",
    "/apix",
    "/API/v2/generate/text/pop",
    "/api/V2/generate/text/pop",
    "/v1/chat/completions",
    "/v1/models",
    "/v1",
    "/v1x",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/redoc/x",
    "/openapi.json",
    "/openapiXjson",
    "/openapi.json/x",
    "/",
    "/healthz",
    "/metrics",
]


def _probes() -> list[str]:
    """Each row's path, a path below it and a path that merely starts with it, then the tricky ones."""
    probes = [p for r in ROUTES for p in (r.path, f"{r.path}/x", f"{r.path}x")]
    return list(dict.fromkeys(probes + TRICKY))


@pytest.mark.parametrize("path", _probes())
def test_each_path_reaches_the_service_the_ingress_rules_name(client: httpx.Client, path: str) -> None:
    expected = route_for(path)
    response = client.get(path)
    if expected is None:
        assert response.status_code == 404, response.text
        assert response.text == "no horde service answers this path"
        return
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["backend"] == expected.service, f"{path} went to {body['backend']}, expected {expected}"
    assert body["path"] == path  # passed on as it came, never rewritten


def test_the_tricky_paths_by_name(client: httpx.Client) -> None:
    """The cases the brief names, spelled out rather than through route_for."""
    backend = {p: client.get(p).json()["backend"] for p in TRICKY if route_for(p) is not None}
    assert backend["/api/v2/workers/abc"] == "dispatch"
    assert backend["/api/v2/generate/text/pop"] == "dispatch"
    assert backend["/api/v2/generate/text/popx"] == "admission"
    assert backend["/api/v2/generate/text/status/x"] == "admission"
    assert backend["/api/v2/status/models/koboldcpp/some-model"] == "admission"
    assert backend["/api/v2/stats/text/totals"] == "admission"
    assert backend["/api/v2/generate/text/submit"] == "submit"
    assert backend["/api/v2/generate/text/progress"] == "submit"
    assert backend["/v1/chat/completions"] == "oai-front"
    assert client.get("/API/v2/generate/text/pop").status_code == 404  # case-sensitive, as the Ingress
    assert client.get("/redoc/x").status_code == 404  # Exact


def test_methods_bodies_and_queries_pass_through(client: httpx.Client) -> None:
    pop = client.post("/api/v2/generate/text/pop", json={"name": "w"}).json()
    assert (pop["backend"], pop["method"]) == ("dispatch", "POST")
    status = client.get("/api/v2/generate/text/status/abc", params={"x": "1"}).json()
    assert (status["backend"], status["query"]) == ("admission", "x=1")
    assert client.request("DELETE", "/api/v2/generate/text/status/abc").json()["method"] == "DELETE"


# -- streaming --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "first", "rest"),
    [
        ("/v1/sse-test", b"data: one\n\n", b"data: two\n\n"),  # the front's server-sent events
        ("/v1/fixed-length-test", b"one\n", b"two\n"),  # a known length: flushed only by flush_interval -1
    ],
)
def test_streams_are_not_buffered(
    stack: Stack, client: httpx.Client, path: str, first: bytes, rest: bytes
) -> None:
    """The first part reaches the client while the stand-in still holds the rest back."""
    with client.stream("GET", path, timeout=httpx.Timeout(10, read=5)) as response:
        assert response.status_code == 200
        chunks = response.iter_raw()
        got = b""
        while len(got) < len(first):
            got += next(chunks)  # a buffering proxy would time out here (read=5 s; the stand-in waits 20 s)
        assert got == first
        httpx.post(f"{stack.backends['oai-front']}/__release", trust_env=False)
        assert got + b"".join(chunks) == first + rest


# -- client addresses -------------------------------------------------------------------------------------


def test_x_forwarded_for_is_the_peer_and_a_forged_one_is_replaced(client: httpx.Client) -> None:
    """Caddy sets X-Forwarded-For to its peer, replacing (not appending to) what the client sent: a service
    trusting the proxy reads the real address, never one the client chose."""
    body = client.get("/api/v2/status/models", headers={"X-Forwarded-For": "6.6.6.6"}).json()
    assert body["x_forwarded_for"] == "127.0.0.1"
    assert body["client"] == "127.0.0.1"


def test_a_proxy_passkey_passes_through(client: httpx.Client) -> None:
    """A front holding a passkey may use the one URL: Proxy-Authorization (hop-by-hop to Caddy) and
    Proxied-For reach admission, which then counts the proxied client; without one nothing is added."""
    headers = {"Proxy-Authorization": PASSKEY, "Proxied-For": "203.0.113.7"}
    body = client.post("/api/v2/generate/chat/async", headers=headers).json()
    assert (body["proxy_authorization"], body["client"]) == (PASSKEY, "203.0.113.7")
    wrong = client.post("/api/v2/generate/chat/async", headers={**headers, "Proxy-Authorization": "x"}).json()
    assert wrong["client"] == "127.0.0.1"
    plain = client.post("/api/v2/generate/chat/async").json()
    assert plain["proxy_authorization"] is None


# -- replicas ---------------------------------------------------------------------------------------------


def test_replicas_share_the_traffic_and_a_dead_one_is_skipped(
    replicated: tuple[str, list[ServiceProcess]],
) -> None:
    """round_robin: both replicas answer, in turn. After admission-1 is killed, every request is still answered
    (by admission-0): its connection to the dead replica failed, so nothing was sent and Caddy tries the other,
    whatever the method."""
    proxy, replicas = replicated
    with httpx.Client(base_url=proxy, timeout=30, trust_env=False) as client:
        seen = [client.get("/api/v2/status/models").json()["backend"] for _ in range(10)]
        assert sorted(seen) == ["admission-0"] * 5 + ["admission-1"] * 5
        assert all(a != b for a, b in itertools.pairwise(seen))  # in turn
        replicas[1].kill()
        for _ in range(6):
            got = client.get("/api/v2/status/models")
            assert (got.status_code, got.json()["backend"]) == (200, "admission-0")
        posted = client.post("/api/v2/generate/chat/async", json={"x": 1})
        assert (posted.status_code, posted.json()["backend"], posted.json()["method"]) == (
            200,
            "admission-0",
            "POST",
        )


def test_a_get_is_retried_after_a_replica_dies_mid_request_and_a_post_is_not(
    replicated: tuple[str, list[ServiceProcess]],
) -> None:
    """admission-1 dies on ``/die-test`` after the request reached it. A GET is retried on admission-0 (200);
    a POST is not sent twice: its client gets 502 (the front's native submit retries such an answer itself,
    deduplicated by its operation key)."""
    proxy, replicas = replicated
    with httpx.Client(base_url=proxy, timeout=30, trust_env=False) as client:
        for method in ("GET", "POST"):
            replicas[1].stop()  # reaped (the test before killed it, the GET below kills it), then alive again
            replicas[1].start()
            replicas[1].wait_healthy()
            answers = []
            deadline = time.monotonic() + 30
            # Until a request reaches admission-1 (benched for fail_duration after a failure): it dies then.
            while replicas[1].running and time.monotonic() < deadline:
                got = client.request(method, "/api/die-test")
                answers.append((got.status_code, got.json()["backend"] if got.status_code == 200 else None))
            assert not replicas[1].running, f"{method}: no request reached admission-1 in 30 s"
            if method == "GET":
                assert answers and set(answers) == {(200, "admission-0")}, answers
            else:
                assert answers[-1] == (502, None), answers
                assert set(answers[:-1]) <= {(200, "admission-0")}, answers


# -- the generator ----------------------------------------------------------------------------------------


def test_the_written_config_is_the_table_rendered(stack: Stack, tmp_path: Path) -> None:
    text = stack.config.read_text()
    assert text.count("reverse_proxy @route") == 2 * len(ROUTES)
    assert text.count("flush_interval -1") == 2 * len(ROUTES)
    for route in ROUTES:
        assert f"`{path_pattern(route)}`" in text
    assert main(["--config", str(tmp_path / "Caddyfile"), "--no-exec"]) == 0
    assert (tmp_path / "Caddyfile").read_text() == render_caddyfile(local_upstreams())


def test_local_upstreams_follow_the_port_settings() -> None:
    assert local_upstreams({}) == {
        "admission": ["127.0.0.1:7101"],
        "dispatch": ["127.0.0.1:7102"],
        "submit": ["127.0.0.1:7103"],
        "oai-front": ["127.0.0.1:7002"],
    }
    assert local_upstreams({"HORDE_OAI_HTTP_PORT": "9000"})["oai-front"] == ["127.0.0.1:9000"]


def test_local_upstreams_list_every_replica() -> None:
    """REPLICAS=N: replica i of a service is on its base port + 10·i; REPLICAS_<SERVICE> wins for that one."""
    upstreams = local_upstreams({"REPLICAS": "2", "REPLICAS_DISPATCH": "3", "HORDE_OAI_HTTP_PORT": "9000"})
    assert upstreams == {
        "admission": ["127.0.0.1:7101", "127.0.0.1:7111"],
        "dispatch": ["127.0.0.1:7102", "127.0.0.1:7112", "127.0.0.1:7122"],
        "submit": ["127.0.0.1:7103", "127.0.0.1:7113"],
        "oai-front": ["127.0.0.1:9000", "127.0.0.1:9010"],
    }
    text = render_caddyfile(upstreams)
    assert text.count("127.0.0.1:7102 127.0.0.1:7112 127.0.0.1:7122 {") == 2 * sum(
        r.service == "dispatch" for r in ROUTES
    )
    for option in ("lb_policy round_robin", "lb_try_duration 10s", "fail_duration 2s", "max_fails 1"):
        assert text.count(option) == 2 * len(ROUTES)
    with pytest.raises(ValueError, match="REPLICAS_ADMISSION / REPLICAS=0"):
        local_upstreams({"REPLICAS": "0"})
    with pytest.raises(ValueError, match="HORDE_ADMISSION_HTTP_PORT='x' is not a port number"):
        local_upstreams({"HORDE_ADMISSION_HTTP_PORT": "x"})


def test_path_patterns() -> None:
    assert path_pattern(Route("/api", "Prefix", "admission")) == "(?s)^/api(/.*)?$"
    assert path_pattern(Route("/docs/", "Prefix", "oai-front")) == "(?s)^/docs(/.*)?$"
    assert path_pattern(Route("/openapi.json", "Exact", "oai-front")) == r"^/openapi\.json$"


def test_a_broken_table_or_listen_address_is_refused() -> None:
    upstreams = local_upstreams({})
    with pytest.raises(ValueError, match="unknown service 'nobody'"):
        render_caddyfile(upstreams, routes=(Route("/x", "Prefix", "nobody"),))
    with pytest.raises(ValueError, match="not a plain path"):
        render_caddyfile(upstreams, routes=(Route("/x y`", "Prefix", "admission"),))
    with pytest.raises(ValueError, match="no upstream for submit"):
        render_caddyfile({"admission": "127.0.0.1:1"}, routes=(Route("/x", "Prefix", "submit"),))
    with pytest.raises(ValueError, match="no upstream for submit"):
        render_caddyfile({"submit": []}, routes=(Route("/x", "Prefix", "submit"),))
    with pytest.raises(ValueError, match="not HOST:PORT"):
        render_caddyfile(upstreams, listen="7000")


def test_caddy_is_the_wheels() -> None:
    assert Path(caddy_binary()).parent == Path(sys.executable).parent


# -- the table's own rules (the Ingress's) ----------------------------------------------------------------


def test_the_table_is_well_formed() -> None:
    assert problems() == []
    assert problems((Route("/a", "Prefix", "admission"), Route("/a", "Prefix", "submit"))) == [
        "/a (Prefix) is listed twice"
    ]


def test_route_for_follows_the_ingress_rules() -> None:
    """The examples of the Kubernetes Ingress documentation's path-matching table."""
    table = (
        Route("/foo", "Prefix", "admission"),
        Route("/foo/", "Prefix", "dispatch"),
        Route("/aaa/bbb", "Prefix", "submit"),
        Route("/aaa/bbb", "Exact", "oai-front"),
        Route("/aaa/bbb/ccc", "Prefix", "dispatch"),
    )

    def service(path: str) -> str | None:
        r = route_for(path, table)
        return r.service if r else None

    assert service("/foo") in ("admission", "dispatch")  # both match; equal length after the slash
    assert service("/foo/bar") in ("admission", "dispatch")
    assert service("/foobar") is None
    assert service("/aaa/bbb") == "oai-front"  # Exact over Prefix
    assert service("/aaa/bbb/") == "submit"
    assert service("/aaa/bbbxyz") is None
    assert service("/aaa/bbb/ccc/d") == "dispatch"  # the longest match
    assert [r.path for r in by_precedence(table)][:1] == ["/aaa/bbb/ccc"]
    assert route_for("/anything", (Route("/", "Prefix", "admission"),)) is not None


def test_probe_urls_are_paths() -> None:
    """The probes carry no query or fragment that route_for would misread."""
    assert all(urlsplit(p).path == p for p in _probes())
