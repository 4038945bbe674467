"""Shared fixtures for horde_contract tests."""

from __future__ import annotations

from collections.abc import Callable

import horde_contract as hc
import pytest


def assert_refusal(exc: hc.HordeError, status: int, rc: str, param: str | None, message: str) -> None:
    assert (exc.status, exc.rc, exc.param, exc.message) == (status, rc, param, message)
    body = exc.to_body()
    assert body["message"] == message and body["rc"] == rc


@pytest.fixture
def refusal() -> Callable[..., None]:
    return assert_refusal
