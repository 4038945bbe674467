"""The wait's decision table: what :func:`next_action` does for each thing the loop learned (pure, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest
from horde_oai.wait_rules import (
    FAIL_FAST_RECHECK_SECONDS,
    GONE,
    MIN_GRACE_SLEEP_SECONDS,
    NO_SIGNAL,
    UNANSWERED,
    Cancel,
    Fault,
    Finish,
    Read,
    Seen,
    Signal,
    Sleep,
    TimeOut,
    WaitState,
    next_action,
)

NOW = 100.0
BASE = {"deadline": 200.0, "recheck_seconds": 10.0, "grace_seconds": 5.0}
REPLY = {"state": "ok", "message": {"role": "assistant", "content": "hi"}}
WAITING = {
    "done": False,
    "faulted": False,
    "waiting": 1,
    "processing": 0,
    "is_possible": True,
    "generations": [],
}
RUNNING = {**WAITING, "waiting": 0, "processing": 1}
DONE = {**WAITING, "done": True, "waiting": 0, "generations": [REPLY]}
DONE_EMPTY = {**WAITING, "done": True, "waiting": 0}
IMPOSSIBLE = {**WAITING, "is_possible": False}
GAP = {"kind": "declaration_gap", "missing_declarations": ["tools"]}


def state(**changes: Any) -> WaitState:
    return WaitState(**{**BASE, **changes})


CASES: list[tuple[str, Seen, WaitState, float, type, dict[str, Any]]] = [
    # id, seen, state, now, action type, expected action and state attributes ("state.x" for the state's)
    # --- a signal woke the sleep: read again
    ("signal", Signal(), state(), NOW, Read, {"state.cancelled_signal": False}),
    (
        "cancelled signal is remembered",
        Signal(cancelled=True),
        state(),
        NOW,
        Read,
        {"state.cancelled_signal": True},
    ),
    (
        "an earlier cancel stays",
        Signal(),
        state(cancelled_signal=True),
        NOW,
        Read,
        {"state.cancelled_signal": True},
    ),
    (
        "cancel after an unanswered read is not remembered",
        Signal(cancelled=True),
        state(after_unanswered=True),
        NOW,
        Read,
        {"state.cancelled_signal": False},
    ),
    # --- a sleep ran out without a signal
    (
        "quiet after unanswered: read",
        NO_SIGNAL,
        state(after_unanswered=True, progress_until=150.0),
        NOW,
        Read,
        {},
    ),
    ("quiet: read", NO_SIGNAL, state(), NOW, Read, {}),
    ("quiet with progress: sleep on", NO_SIGNAL, state(progress_until=104.0), NOW, Sleep, {"seconds": 4.0}),
    ("progress past the deadline", NO_SIGNAL, state(progress_until=250.0), NOW, Sleep, {"seconds": 100.0}),
    (
        "progress ignored while fail-fast",
        NO_SIGNAL,
        state(progress_until=104.0, fail_fast_pending=True),
        NOW,
        Read,
        {},
    ),
    (
        "progress ignored in grace",
        NO_SIGNAL,
        state(progress_until=104.0, impossible_since=99.0),
        NOW,
        Read,
        {},
    ),
    ("quiet past the deadline", NO_SIGNAL, state(), 200.0, TimeOut, {}),
    (
        "quiet after unanswered past the deadline: read",
        NO_SIGNAL,
        state(after_unanswered=True),
        201.0,
        Read,
        {},
    ),
    # --- a read the Horde left unanswered
    (
        "unanswered: sleep a recheck",
        UNANSWERED,
        state(),
        NOW,
        Sleep,
        {"seconds": 10.0, "state.after_unanswered": True},
    ),
    ("unanswered near the deadline", UNANSWERED, state(), 197.0, Sleep, {"seconds": 3.0}),
    ("unanswered past the deadline", UNANSWERED, state(), 200.0, TimeOut, {}),
    # --- the request is gone or faulted
    ("gone", GONE, state(), NOW, Fault, {"status": None}),
    ("faulted", {**WAITING, "faulted": True}, state(), NOW, Fault, {"status": {**WAITING, "faulted": True}}),
    # --- done with a reply
    ("done", DONE, state(), NOW, Finish, {"state.passed": True, "state.first_read_at": NOW}),
    ("reply with nothing left", {**DONE, "done": False}, state(), NOW, Finish, {"state.passed": True}),
    ("reply while another job runs", {**DONE, "done": False, "processing": 1}, state(), NOW, Sleep, {}),
    # --- done without a reply
    (
        "done empty but running",
        {**DONE_EMPTY, "processing": 1},
        state(),
        NOW,
        Sleep,
        {"state.done_without_generation_reads": 0},
    ),
    (
        "done empty once: read again",
        DONE_EMPTY,
        state(),
        NOW,
        Sleep,
        {"state.done_without_generation_reads": 1, "state.saw_done_without_generation": True},
    ),
    (
        "done empty twice",
        DONE_EMPTY,
        state(saw_done_without_generation=True, done_without_generation_reads=1),
        NOW,
        Cancel,
        {"reason": "no_generation", "state.done_without_generation_reads": 2},
    ),
    (
        "done empty after a cancel signal",
        DONE_EMPTY,
        state(cancelled_signal=True),
        NOW,
        Cancel,
        {"reason": "no_generation"},
    ),
    # --- availability
    (
        "declaration gap",
        {**IMPOSSIBLE, "impossible_reason": GAP},
        state(),
        NOW,
        Cancel,
        {"reason": "declaration_gap", "gap": GAP},
    ),
    (
        "impossible: the grace starts",
        IMPOSSIBLE,
        state(),
        NOW,
        Sleep,
        {"seconds": 5.0, "state.impossible_since": NOW, "state.passed": True},
    ),
    (
        "impossible in grace",
        IMPOSSIBLE,
        state(impossible_since=97.0),
        NOW,
        Sleep,
        {"seconds": 2.0, "state.impossible_since": 97.0},
    ),
    (
        "impossible at the grace's end: shortest sleep",
        IMPOSSIBLE,
        state(impossible_since=95.01),
        NOW,
        Sleep,
        {"seconds": MIN_GRACE_SLEEP_SECONDS},
    ),
    (
        "impossible past the grace",
        IMPOSSIBLE,
        state(impossible_since=95.0),
        NOW,
        Cancel,
        {"reason": "no_eligible_worker"},
    ),
    (
        "impossible but running",
        {**IMPOSSIBLE, "processing": 1},
        state(impossible_since=90.0),
        NOW,
        Sleep,
        {"state.impossible_since": None},
    ),
    (
        "possible again",
        WAITING,
        state(impossible_since=90.0),
        NOW,
        Sleep,
        {"state.impossible_since": None, "seconds": 10.0},
    ),
    # --- fail-fast
    (
        "fail-fast: no eligible threads",
        {**WAITING, "eligible_worker_threads": 0, "wait_time": 7},
        state(fail_fast_pending=True),
        NOW,
        Cancel,
        {"reason": "no_eligible_threads", "threads": 0, "wait_time": 7, "remaining": 100.0},
    ),
    (
        "fail-fast: the wait exceeds the budget",
        {**WAITING, "eligible_worker_threads": 2, "wait_time": 150},
        state(fail_fast_pending=True),
        NOW,
        Cancel,
        {"reason": "wait_exceeds_budget", "threads": 2, "wait_time": 150, "remaining": 100.0},
    ),
    (
        "fail-fast: not positioned yet",
        {**WAITING, "eligible_worker_threads": 2},
        state(fail_fast_pending=True),
        NOW,
        Sleep,
        {"seconds": FAIL_FAST_RECHECK_SECONDS, "state.fail_fast_pending": True, "state.passed": False},
    ),
    (
        "fail-fast: a long wait is only judged once positioned",
        {**WAITING, "wait_time": 0, "queue_position": 0},
        state(fail_fast_pending=True, first_read_at=99.0),
        NOW,
        Sleep,
        {"state.fail_fast_pending": True},
    ),
    (
        "fail-fast: positioned by the queue, the wait fits",
        {**WAITING, "queue_position": 3, "wait_time": 50},
        state(fail_fast_pending=True),
        NOW,
        Sleep,
        {"seconds": 10.0, "state.fail_fast_pending": False, "state.passed": True},
    ),
    (
        "fail-fast: positioned by time",
        {**WAITING, "eligible_worker_threads": 2},
        state(fail_fast_pending=True, first_read_at=98.0),
        NOW,
        Sleep,
        {"state.fail_fast_pending": False, "state.passed": True},
    ),
    (
        "fail-fast: positioned by time without a wait estimate",
        {**WAITING, "wait_time": 0.0, "queue_position": 0, "eligible_worker_threads": None},
        state(fail_fast_pending=True, first_read_at=98.0, deadline=100.5),
        NOW,
        Sleep,
        {"seconds": 0.5, "state.fail_fast_pending": False},
    ),
    (
        "fail-fast: running",
        RUNNING,
        state(fail_fast_pending=True),
        NOW,
        Sleep,
        {"state.fail_fast_pending": False},
    ),
    # --- the budget
    ("read past the deadline", WAITING, state(), 200.0, TimeOut, {"state.passed": True}),
    ("sleep up to the deadline", WAITING, state(), 195.0, Sleep, {"seconds": 5.0}),
    (
        "the first read is remembered",
        WAITING,
        state(first_read_at=50.0, after_unanswered=True),
        NOW,
        Sleep,
        {"state.first_read_at": 50.0, "state.after_unanswered": False},
    ),
]


def _attr(action: object, name: str) -> Any:
    target = action
    for part in name.split("."):
        target = getattr(target, part)
    return target


@pytest.mark.parametrize(
    ("seen", "before", "now", "kind", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_next_action(seen: Seen, before: WaitState, now: float, kind: type, expected: dict[str, Any]) -> None:
    action = next_action(seen, before, now)
    assert type(action) is kind
    for name, value in expected.items():
        actual = _attr(action, name)
        assert actual == pytest.approx(value) if isinstance(value, float) else actual == value, name


def test_the_decision_does_not_change_the_state_it_is_given() -> None:
    before = state(fail_fast_pending=True)
    next_action(DONE_EMPTY, before, NOW)
    assert before == state(fail_fast_pending=True)
