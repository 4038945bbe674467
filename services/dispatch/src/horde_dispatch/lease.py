"""Job lease and speed gate at pop (docs/native-api.md#job-lease).

A chat job is offered only to a worker whose speed finishes its max_length inside the base lease after the
preparation allowance: ``speed * (TEXT_JOB_LEASE_SECONDS - TEXT_JOB_PREPARATION_SECONDS) >= max_length``.
A worker without a measured speed counts as UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND (10 tok/s, 1200 tokens).
Legacy text jobs are never gated (docs/native-api.md#eligibility).
"""

from __future__ import annotations

import math

from horde_contract import (
    TEXT_JOB_LEASE_SECONDS,
    TEXT_JOB_PREPARATION_SECONDS,
    UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND,
)
from horde_core.metrics import counter

#: Seconds of the base lease a worker can spend generating.
GENERATION_SECONDS = TEXT_JOB_LEASE_SECONDS - TEXT_JOB_PREPARATION_SECONDS

LEASE_CAPACITY_LIMITED = counter(
    "horde.pop.lease_capacity_limited",
    "Pops by a chat worker whose measured speed caps the chat output it is offered below its declared length",
    ["horde.gentype"],
)


def effective_speed(speed: float | None) -> float:
    """Tokens per second the gate assumes: the measured ``speed``, or 10 when none is recorded (NULL or 0)."""
    if speed is None or speed <= 0:
        return float(UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND)
    return float(speed)


def lease_capacity(speed: float | None) -> int:
    """The largest chat max_length (tokens) the worker may be offered: ``floor(speed * 120)``."""
    return math.floor(effective_speed(speed) * GENERATION_SECONDS + 1e-9)


def record_capacity_limit(accepts_chat_jobs: bool, declared_max_length: int | None, capacity: int) -> bool:
    """Count a pop whose speed caps the chat output below the worker's declared chat max_length.

    Uses only values the pop already holds, so it adds no query. Returns whether it counted.
    """
    if accepts_chat_jobs and declared_max_length is not None and capacity < declared_max_length:
        LEASE_CAPACITY_LIMITED.labels(gentype="text").inc()
        return True
    return False
