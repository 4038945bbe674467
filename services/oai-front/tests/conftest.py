"""Fixtures: the front as its own process (``python -m horde_oai``) through horde_testing's launcher."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping

import pytest
from horde_testing.launcher import ServiceProcess, free_port


class FrontProcess(ServiceProcess):
    """A running front with its base URL."""

    url: str

    def log(self) -> str:
        return self.log_text()

    def wait_log(self, found: Callable[[str], bool] | str, timeout: float = 10.0) -> str:
        """The log once ``found`` (a substring, or a test of the whole log) holds, or as it is after ``timeout``
        seconds: the front writes its log lines from a writer thread (horde_core.logging), so a line may reach
        the file a moment after the response that it describes."""
        test = (lambda text: found in text) if isinstance(found, str) else found
        deadline = time.monotonic() + timeout
        text = self.log()
        while not test(text) and time.monotonic() < deadline:
            time.sleep(0.02)
            text = self.log()
        return text


def start_front(env: Mapping[str, str], *, wait: bool = True) -> FrontProcess:
    """Start ``python -m horde_oai`` on a free port with ``env`` added; returns once /healthz answers
    (at once with ``wait=False``; call ``wait_healthy()``)."""
    port = free_port()
    front = FrontProcess(
        "oai-front",
        [sys.executable, "-m", "horde_oai"],
        env={"HORDE_OAI_HTTP_PORT": str(port), "HORDE_LOG_JSON": "false", **env},
        health_url=f"http://127.0.0.1:{port}/healthz",
    )
    front.url = f"http://127.0.0.1:{port}"
    front.start()
    if not wait:
        return front
    try:
        front.wait_healthy()
    except BaseException:
        front.stop()
        raise
    return front


@pytest.fixture(scope="module")
def lone_front() -> Iterator[FrontProcess]:
    """A front whose horde does not answer (a closed port) and without Redis."""
    front = start_front(
        {"HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{free_port()}/api", "HORDE_OAI_REDIS_URL": ""}
    )
    try:
        yield front
    finally:
        front.stop()
