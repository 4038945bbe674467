"""Fixtures of the worker's tests: the stand-in horde (a real HTTP server) and fast loop timings."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib does not put test directories on sys.path; the stand-in is a plain module here.
sys.path.insert(0, str(Path(__file__).parent))

from horde_worker.worker import Timings
from worker_standin import StandInHorde


@pytest.fixture
def horde() -> Iterator[StandInHorde]:
    """A running stand-in horde on a loopback port."""
    with StandInHorde() as server:
        yield server


@pytest.fixture
def fast() -> Timings:
    """Loop waits shrunk to tens of milliseconds."""
    return Timings(
        empty_pop=(0.02, 0.02, 0.02),
        pop_error=0.02,
        connect_error=0.02,
        submit_backoff=(0.02, 0.05),
        submit_attempts=5,
        lease_margin=5.0,
    )
