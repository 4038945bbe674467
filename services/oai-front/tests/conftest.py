"""Fixtures: the front as its own process (``python -m horde_oai``) through horde_testing's launcher."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

import openai
import pytest
from horde_testing.launcher import ServiceProcess, free_port


def error_body(error: openai.APIStatusError) -> dict[str, Any]:
    """The JSON body of an SDK error (typed ``object`` by the SDK)."""
    assert isinstance(error.body, dict), error.body
    return error.body


def start_front(env: Mapping[str, str], *, wait: bool = True) -> ServiceProcess:
    """Start ``python -m horde_oai`` on a free port with ``env`` added; returns once /healthz answers
    (at once with ``wait=False``; call ``wait_healthy()``). Its ``url`` is the base URL; read its log with
    ``wait_log``: the front writes its lines from a writer thread (horde_core.logging), so a line may reach
    the file a moment after the response that it describes."""
    port = free_port()
    front = ServiceProcess(
        "oai-front",
        [sys.executable, "-m", "horde_oai"],
        env={"HORDE_OAI_HTTP_PORT": str(port), "HORDE_LOG_JSON": "false", **env},
        health_url=f"http://127.0.0.1:{port}/healthz",
        url=f"http://127.0.0.1:{port}",
    )
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
def lone_front() -> Iterator[ServiceProcess]:
    """A front whose horde does not answer (a closed port) and without Redis."""
    front = start_front(
        {"HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{free_port()}/api", "HORDE_OAI_REDIS_URL": ""}
    )
    try:
        yield front
    finally:
        front.stop()
