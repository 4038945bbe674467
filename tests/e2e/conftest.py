"""Every service as its own process on real PostgreSQL, Redis and S3, for the end-to-end tests.

The ``stack`` fixture starts admission, dispatch, submit, janitor and the OpenAI front on free ports with
``python -m horde_<svc>``, creates a client and a worker owner with ``horde-admin``, and can start reference
workers (``python -m horde_worker``, scripted backend). Processes are stopped at the end of the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from horde_testing.launcher import ServiceProcess, free_port

SERVICES = {
    "admission": "horde_admission",
    "dispatch": "horde_dispatch",
    "submit": "horde_submit",
    "janitor": "horde_janitor",
    "oai": "horde_oai",
}

MODEL = "scripted/echo"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e is marked ``e2e`` (``-m "not e2e"`` leaves them out). The hook sees the whole
    session's items, hence the path test."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class Stack:
    """The running processes and how to reach them."""

    env: dict[str, str]
    ports: dict[str, int]
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    workers: list[ServiceProcess] = field(default_factory=list)
    client_key: str = ""
    worker_key: str = ""

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    @property
    def native(self) -> str:
        return self.url("admission") + "/api/v2"

    @property
    def front(self) -> str:
        return self.url("oai") + "/v1"

    def admin(self, *args: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "horde_store.admin", *args],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        result: dict[str, object] = json.loads(out.stdout)
        return result

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers.clear()

    def start_worker(self, name: str, *extra_env: tuple[str, str], models: str = MODEL) -> ServiceProcess:
        port = free_port()
        env = {
            **self.env,
            "HORDE_WORKER_API_KEY": self.worker_key,
            "HORDE_WORKER_NAME": name,
            "HORDE_WORKER_DISPATCH_URL": self.url("dispatch"),
            "HORDE_WORKER_SUBMIT_URL": self.url("submit"),
            "HORDE_WORKER_BACKEND": "scripted",
            "HORDE_WORKER_MODELS": models,
            "HORDE_WORKER_METRICS_PORT": str(port),
            **dict(extra_env),
        }
        worker = ServiceProcess(
            f"worker-{name}", [sys.executable, "-m", "horde_worker"], env, f"http://127.0.0.1:{port}/healthz"
        )
        worker.start()
        worker.wait_healthy(60)
        self.workers.append(worker)
        self.wait_checked_in(name)
        return worker

    def wait_checked_in(self, name: str, timeout: float = 30) -> None:
        """Wait until dispatch lists the worker: healthy is not yet popped, and admission needs the check-in."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = httpx.get(f"{self.url('dispatch')}/api/v2/workers/name/{name}", timeout=5)
            if r.status_code == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"worker {name} did not check in within {timeout}s")


#: Every e2e client and worker shares 127.0.0.1: the limiter stays on, with room for the suite's pace (upstream's
#: read and worker limits are status 60/minute per request, pop and submit 60/second).
E2E_LIMITS: dict[str, str] = {
    "HORDE_CHAT_REQUEST_2SEC_LIMIT_PER_IP": "50/second",
    "HORDE_CHAT_REQUEST_90MIN_LIMIT_PER_IP": "5000/minute",
    "HORDE_TEXT_REQUEST_2SEC_LIMIT_PER_IP": "50/second",
    "HORDE_TEXT_REQUEST_90MIN_LIMIT_PER_IP": "5000/minute",
    "HORDE_APIKEY_REQUEST_LIMIT": "50/second",
    "HORDE_STATUS_REQUEST_LIMIT_PER_IP": "6000/minute",
    "HORDE_POP_REQUEST_LIMIT_PER_IP": "1000/second",
    "HORDE_SUBMIT_REQUEST_LIMIT_PER_IP": "1000/second",
    "HORDE_READ_REQUEST_LIMIT_PER_IP": "6000/minute",
    "HORDE_MODIFY_REQUEST_LIMIT_PER_IP": "6000/minute",
}


def _service_env(base: dict[str, str], ports: dict[str, int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_")}
    env.update(base)
    env.update(
        {
            "HORDE_ADMISSION_HTTP_PORT": str(ports["admission"]),
            "HORDE_DISPATCH_HTTP_PORT": str(ports["dispatch"]),
            "HORDE_DISPATCH_GRPC_PORT": str(ports["dispatch_grpc"]),
            "HORDE_SUBMIT_HTTP_PORT": str(ports["submit"]),
            "HORDE_SUBMIT_GRPC_PORT": str(ports["submit_grpc"]),
            "HORDE_JANITOR_HTTP_PORT": str(ports["janitor"]),
            "HORDE_OAI_HTTP_PORT": str(ports["oai"]),
            "HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{ports['admission']}/api",
            "HORDE_JANITOR_INTERVAL_SECONDS": "1",
            **E2E_LIMITS,
            "HORDE_LOG_JSON": "false",
        }
    )
    return env


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    """Extra ``HORDE_*`` settings for every process of a module's stack (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
def stack(horde_settings_env: dict[str, str], stack_env_overrides: dict[str, str]) -> Iterator[Stack]:
    ports = {name: free_port() for name in [*SERVICES, "dispatch_grpc", "submit_grpc"]}
    stack = Stack(env={**_service_env(horde_settings_env, ports), **stack_env_overrides}, ports=ports)
    try:
        for name, module in SERVICES.items():
            process = ServiceProcess(
                name, [sys.executable, "-m", module], stack.env, f"{stack.url(name)}/healthz"
            )
            process.start()
            stack.processes[name] = process
        for process in stack.processes.values():
            process.wait_healthy(60)
        stack.client_key = str(
            stack.admin("user", "create", "--username", "e2e-client", "--kudos", "1000")["api_key"]
        )
        stack.worker_key = str(
            stack.admin("user", "create", "--username", "e2e-worker-owner", "--trusted")["api_key"]
        )
        yield stack
    finally:
        for worker in stack.workers:
            worker.stop()
        for process in stack.processes.values():
            process.stop()
