"""When the wait for a native chat request re-reads, sleeps, times out, cancels, finishes or faults: the pure
decision :func:`next_action` behind :class:`horde_oai.waiter.ChatWait` (docs/openai-front.md#errors,
#no-eligible-worker, #choices; docs/native-api.md#completion-signal). No I/O: the waiter reads, sleeps and
cancels as the returned action says.

The loop feeds :func:`next_action` what it last learned: a status body it read, :data:`GONE` (the Horde no
longer holds the request), :data:`UNANSWERED` (a read the Horde left unanswered), a :class:`Signal` that woke
a sleep, or :data:`NO_SIGNAL` (a sleep ran out). Times are monotonic seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Final, Literal

from horde_oai.completion import finished_generations
from horde_oai.native_errors import declaration_gap_of

# The first status with queue information is awaited this long for the fail-fast wait check.
POSITIONED_READ_WAIT_SECONDS = 2.0
# While a fail-fast check waits for queue information, the status is re-read this often.
FAIL_FAST_RECHECK_SECONDS = 0.25
# The shortest sleep while the no-eligible-worker grace runs out, so its last moments are not a busy loop.
MIN_GRACE_SLEEP_SECONDS = 0.05


class _Marker(Enum):
    UNANSWERED = "unanswered"
    NO_SIGNAL = "no_signal"


UNANSWERED: Final = _Marker.UNANSWERED
"""A status read the Horde left unanswered (transport error, 5xx, 429) and the waiter tolerated."""
NO_SIGNAL: Final = _Marker.NO_SIGNAL
"""A sleep ran out without a signal."""
GONE: Final = None
"""The Horde no longer holds the request (404 on the status read)."""


@dataclass(frozen=True)
class Signal:
    """A signal woke the sleep; ``cancelled`` for a ``cancelled`` event."""

    cancelled: bool = False


Seen = Mapping[str, Any] | _Marker | Signal | None


@dataclass(frozen=True)
class WaitState:
    """What the loop remembers between decisions (times in monotonic seconds).

    ``deadline``, ``recheck_seconds`` and ``grace_seconds`` are fixed for a wait; ``progress_until`` is set
    from outside (a relayed stream's progress) before each decision; the rest is written by :func:`next_action`.
    """

    deadline: float
    recheck_seconds: float
    grace_seconds: float
    fail_fast_pending: bool = False
    progress_until: float = 0.0
    first_read_at: float | None = None
    impossible_since: float | None = None
    saw_done_without_generation: bool = False
    cancelled_signal: bool = False
    after_unanswered: bool = False
    passed: bool = False
    """The first read passed the availability checks: a stream may send its headers."""
    done_without_generation_reads: int = 0


@dataclass(frozen=True)
class Step:
    """An action; ``state`` is what to remember for the next decision."""

    state: WaitState


class Read(Step):
    """Read the status now."""


class Finish(Step):
    """The status read last is done with a reply: return it."""


class TimeOut(Step):
    """The budget ran out: cancel the request, 408."""


@dataclass(frozen=True)
class Sleep(Step):
    """Wait for a signal for at most ``seconds``; then decide again with a :class:`Signal` or ``NO_SIGNAL``."""

    seconds: float


@dataclass(frozen=True)
class Fault(Step):
    """The request faulted (``status`` holds its fault) or is gone (``status`` None): 502, no cancel."""

    status: Mapping[str, Any] | None


CancelReason = Literal[
    "no_generation", "no_eligible_worker", "declaration_gap", "no_eligible_threads", "wait_exceeds_budget"
]


@dataclass(frozen=True)
class Cancel(Step):
    """Cancel the request and refuse it for ``reason``: ``no_generation`` (done without a reply),
    ``no_eligible_worker`` (impossible past the grace), ``declaration_gap`` (``gap`` is the status's
    impossible_reason), or a fail-fast ``no_eligible_threads`` / ``wait_exceeds_budget`` (``threads``,
    ``wait_time`` and the ``remaining`` budget as the status gave them)."""

    reason: CancelReason
    gap: Mapping[str, Any] | None = None
    threads: Any = None
    wait_time: Any = None
    remaining: float = 0.0


Action = Read | Sleep | Finish | Fault | TimeOut | Cancel


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def has_progress(status: Mapping[str, Any]) -> bool:
    """A job of the request is running or finished."""
    return _int(status.get("processing")) > 0 or bool(finished_generations(status))


def positioned(status: Mapping[str, Any], now: float, first_read_at: float) -> bool:
    """The status has queue information (a queue position or wait time), or it is too late to wait for it."""
    has_queue_info = (_int(status.get("queue_position")) > 0) or (
        isinstance(status.get("wait_time"), int | float) and status["wait_time"] > 0
    )
    return has_queue_info or now - first_read_at >= POSITIONED_READ_WAIT_SECONDS


def fail_fast_refusal(status: Mapping[str, Any], state: WaitState, now: float) -> Cancel | None:
    """The fail-fast refusal of a status with no eligible worker thread, or (once positioned) with a wait
    longer than the remaining budget; None when the request may wait."""
    threads = status.get("eligible_worker_threads")
    remaining = state.deadline - now
    if isinstance(threads, int) and not isinstance(threads, bool) and threads == 0:
        wait_time = status.get("wait_time")
        return Cancel(state, "no_eligible_threads", threads=threads, wait_time=wait_time, remaining=remaining)
    first_read_at = now if state.first_read_at is None else state.first_read_at
    if not positioned(status, now, first_read_at):
        return None
    wait_time = status.get("wait_time")
    if isinstance(wait_time, int | float) and not isinstance(wait_time, bool) and wait_time > remaining:
        return Cancel(state, "wait_exceeds_budget", threads=threads, wait_time=wait_time, remaining=remaining)
    return None


def next_action(status: Seen, state: WaitState, now: float) -> Action:
    """What the wait does next, given what it last learned (``status``, see the module), what it remembers
    and the monotonic time. Every returned action carries the state to remember for the next decision."""
    if isinstance(status, Signal):
        if state.after_unanswered:
            return Read(state)
        return Read(replace(state, cancelled_signal=state.cancelled_signal or status.cancelled))
    if status is NO_SIGNAL:
        return _after_quiet_sleep(state, now)
    if status is UNANSWERED:
        remaining = state.deadline - now
        if remaining <= 0:
            return TimeOut(state)
        return Sleep(replace(state, after_unanswered=True), min(state.recheck_seconds, remaining))
    if status is None:
        # Expired or removed: a faulted signal may have said why.
        return Fault(state, None)
    assert isinstance(status, Mapping)
    return _after_read(status, state, now)


def _after_quiet_sleep(state: WaitState, now: float) -> Action:
    if state.after_unanswered:
        return Read(state)
    if not state.fail_fast_pending and state.impossible_since is None:
        # A running request's progress stands in for the periodic read until it stops.
        quiet_until = min(state.progress_until, state.deadline)
        if quiet_until > now:
            return Sleep(state, quiet_until - now)
    if now >= state.deadline:
        return TimeOut(state)
    return Read(state)


def _after_read(status: Mapping[str, Any], state: WaitState, now: float) -> Action:
    first_read_at = now if state.first_read_at is None else state.first_read_at
    state = replace(state, after_unanswered=False, first_read_at=first_read_at)
    if status.get("faulted"):
        return Fault(state, status)
    finished = finished_generations(status)
    waiting, processing = _int(status.get("waiting")), _int(status.get("processing"))
    if finished and (status.get("done") or (waiting == 0 and processing == 0)):
        return Finish(replace(state, passed=True))
    if status.get("done") and not finished and not (waiting or processing):
        # Done without a reply: a second such read (or one after a cancelled signal) is the end.
        state = replace(state, done_without_generation_reads=state.done_without_generation_reads + 1)
        if state.saw_done_without_generation or state.cancelled_signal:
            return Cancel(state, "no_generation")
        state = replace(state, saw_done_without_generation=True)
    progress = has_progress(status)
    # Availability: is_possible false with nothing running.
    if status.get("is_possible") is False and not progress:
        gap = declaration_gap_of(status)
        if gap is not None:
            return Cancel(state, "declaration_gap", gap=gap)
        if state.impossible_since is None:
            state = replace(state, impossible_since=now)
        assert state.impossible_since is not None
        if now - state.impossible_since >= state.grace_seconds:
            return Cancel(state, "no_eligible_worker")
    else:
        state = replace(state, impossible_since=None)
    if state.fail_fast_pending and not progress:
        refusal = fail_fast_refusal(status, state, now)
        if refusal is not None:
            return refusal
        if positioned(status, now, first_read_at):
            state = replace(state, fail_fast_pending=False)
    else:
        state = replace(state, fail_fast_pending=False)
    if not state.fail_fast_pending:
        state = replace(state, passed=True)
    return _sleep_or_time_out(state, now)


def _sleep_or_time_out(state: WaitState, now: float) -> Action:
    """After a read that ended nothing: time out at the deadline, else sleep until the next read is due
    (sooner while fail-fast is pending or an availability grace runs)."""
    remaining = state.deadline - now
    if remaining <= 0:
        return TimeOut(state)
    sleep = min(state.recheck_seconds, remaining)
    if state.fail_fast_pending:
        sleep = min(sleep, FAIL_FAST_RECHECK_SECONDS)
    if state.impossible_since is not None:
        sleep = min(sleep, max(MIN_GRACE_SLEEP_SECONDS, state.impossible_since + state.grace_seconds - now))
    return Sleep(state, sleep)
