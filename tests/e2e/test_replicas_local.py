"""``make run REPLICAS=2`` as a Kubernetes Deployment would run it: the local stack started through make run's
own entry point (``python -m horde_testing.local_stack run``, :class:`horde_testing.local_stack.LocalStack`)
with two processes of every service behind the one URL, on this module's stores. A replica killed with
SIGKILL is restarted by supervisord and answers again while the proxy keeps answering; Ctrl-C (SIGINT to
supervisord) stops every process and leaves none behind."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from horde_testing.local_stack import LocalStack
from horde_testing.replicas import SERVICE_PORTS

# Whole stacks with two replicas of everything: make test-replicas (CI runs it after make test).
pytestmark = pytest.mark.replicas

ROOT = Path(__file__).resolve().parents[2]
MODEL = "scripted/echo"


@pytest.fixture(scope="module")
def local_stack(
    horde_settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    stack = LocalStack(2, directory=tmp_path_factory.mktemp("ls"), env=horde_settings_env, root=ROOT)
    with stack:
        yield stack


def _wait(probe: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)


def _models(stack: LocalStack) -> list[str]:
    got = httpx.get(f"{stack.urls.front}/models", timeout=10, trust_env=False)
    return [m["id"] for m in got.json().get("data", [])] if got.status_code == 200 else []


def test_two_of_each_behind_the_one_url(local_stack: LocalStack) -> None:
    """Every replica runs on its own port and is healthy; the one URL answers the native API and the front, and
    the reference worker's model is listed through it (the worker reached dispatch through the proxy)."""
    running = {name for name, state in local_stack.processes().items() if state == "RUNNING"}
    assert running == {f"{s}-{i}" for s in SERVICE_PORTS for i in range(2)} | {
        "stores",
        "setup",
        "proxy",
        "worker",
        "logs",
    }
    # The console: each process's lines prefixed with its name, replicas told apart (horde_testing.local_logs).
    log = local_stack.log_text()
    assert (
        " admission-1  | " in log
        and " oai-0        | " in log
        and " setup        |   Horde Chat is up." in log
    )
    for service, urls in local_stack.urls.replicas.items():
        assert len(urls) == 2, service
        for url in urls:
            assert httpx.get(f"{url}/healthz", timeout=5, trust_env=False).status_code == 200, url
    heartbeat = httpx.get(f"{local_stack.urls.horde}/api/v2/status/heartbeat", timeout=10, trust_env=False)
    assert heartbeat.status_code == 200, heartbeat.text
    _wait(lambda: MODEL in _models(local_stack), "the worker's model listed at /v1/models")


@pytest.mark.parametrize("service", list(SERVICE_PORTS))
def test_a_killed_replica_is_restarted_and_the_one_url_keeps_answering(
    local_stack: LocalStack, service: str
) -> None:
    old = local_stack.kill(service, 1)
    # The other replica answers meanwhile: the proxy skips the dead one (connection refused, then benched).
    for _ in range(4):
        heartbeat = httpx.get(
            f"{local_stack.urls.horde}/api/v2/status/heartbeat", timeout=15, trust_env=False
        )
        assert heartbeat.status_code == 200, heartbeat.text
    new = local_stack.wait_replica(service, 1, not_pid=old, timeout=120)
    assert new != old and not psutil.pid_exists(old)
    log = local_stack.log_text()
    assert f"exited: {service}-1 (terminated by SIGKILL; not expected)" in log
    assert f"spawned: '{service}-1' with pid {new}" in log
    url = local_stack.urls.replicas[service][1]
    assert httpx.get(f"{url}/healthz", timeout=5, trust_env=False).status_code == 200
    # Replica 0 was never touched.
    assert local_stack.info(service, 0)["statename"] == "RUNNING"


def test_ctrl_c_stops_every_process_and_leaves_none(local_stack: LocalStack) -> None:
    """SIGINT to supervisord, as a terminal's Ctrl-C: exit 0, no process of the stack's session alive, no
    process it ever had alive (stores' servers, Caddy, the worker included), every port closed."""
    assert local_stack.proc is not None
    supervisord = psutil.Process(local_stack.proc.pid)
    every = [supervisord, *supervisord.children(recursive=True)]
    names = {p.name() for p in every}
    assert {"caddy", "sleep"} <= names, names  # the proxy and the setup step among them
    assert local_stack.stop(signal.SIGINT) == 0
    assert local_stack.leftovers() == []
    alive = [p for p in every if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    ports = [int(u.rpartition(":")[2]) for urls in local_stack.urls.replicas.values() for u in urls]
    for port in [*ports, int(local_stack.listen.rpartition(":")[2])]:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers"
    log = local_stack.log_text()
    assert "received SIGINT indicating exit request" in log
    # The console kept up to the end (Caddy's goodbye has an emoji: the listener counts characters, as
    # supervisor does) and never fell out of the event protocol.
    assert "has entered the UNKNOWN state" not in log
    assert "proxy        | " in log[log.index("received SIGINT") :]
    assert log.index("stopped: worker") < log.index("stopped: admission-0") < log.index("stopped: stores")
