"""Real client libraries against the local stack (``make test-clients``).

One ``make run`` stack (:class:`horde_testing.local_stack.LocalStack`, embedded stores, the scripted
reference worker) serves the whole session; every client test talks to it through the one URL, as that
client's users would. The tests run only under ``make test-clients``, which installs the clients first
(``HORDE_CLIENT_TESTS=1``); ``make test`` does not collect them, since the clients are not installed there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from horde_testing.local_stack import LocalStack

ROOT = Path(__file__).resolve().parents[2]
#: The model the local stack's scripted worker serves (scripts/local-setup.sh).
MODEL = "scripted/echo"

#: Settings of every process of the clients' stack.
CLIENT_ENV = {"HORDE_RATE_LIMITS_ENABLED": "false"}

collect_ignore_glob = [] if os.environ.get("HORDE_CLIENT_TESTS") == "1" else ["test_*.py", "*/test_*.py"]


@dataclass(frozen=True)
class Horde:
    """The running stack as a client sees it: ``url`` the one horde URL (native API under ``/api/v2``),
    ``front`` the OpenAI-compatible base URL (``…/v1``), ``api_key`` the demo user's key (5,000 kudos),
    ``worker_key`` the worker owner's key, ``model`` the scripted worker's model."""

    url: str
    front: str
    api_key: str
    worker_key: str
    model: str
    stack: LocalStack


@pytest.fixture(scope="session")
def horde(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Horde]:
    directory = tmp_path_factory.mktemp("clients")
    # Every client test comes from one address with one key, back to back: the AI Horde's per-address and
    # per-key limits (2/s) would answer some of them 429, whichever runs next, so they are off here.
    with LocalStack(1, directory=directory, root=ROOT, env=CLIENT_ENV) as stack:

        def key(name: str) -> str:
            return str(json.loads((directory / name).read_text())["api_key"])

        _wait_for_model(stack.urls.front)
        yield Horde(
            url=stack.urls.horde,
            front=stack.urls.front,
            api_key=key("demo-user.json"),
            worker_key=key("worker-user.json"),
            model=MODEL,
            stack=stack,
        )


def _wait_for_model(front: str, timeout: float = 120.0) -> None:
    """Until the scripted worker has checked in and its model is listed at ``/v1/models``."""
    deadline = time.monotonic() + timeout
    while True:
        got = httpx.get(f"{front}/models", timeout=10, trust_env=False)
        if got.status_code == 200 and MODEL in [m["id"] for m in got.json().get("data", [])]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{MODEL} not listed at {front}/models within {timeout}s: {got.text[:300]}")
        time.sleep(0.3)
