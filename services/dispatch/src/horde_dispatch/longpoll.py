"""Long-poll pop: the waiting pops of one dispatch process, the announcements that wake them, and the
subscriber that receives those (docs/worker-guide.md#long-poll).

A pop with ``wait_seconds`` whose first attempt finds no job gives its pool connection back and waits here as
a :class:`Waiter`, in FIFO order, until one of:

- an announcement (:mod:`horde_core.queue_announce`) that it could plausibly serve wakes it: it runs the pop
  statement again on a freshly acquired connection;
- a periodic recheck (``HORDE_POP_WAIT_RECHECK_SECONDS``, 3 s ±20 %) passes: it runs the statement anyway, the
  safety net for announcements lost while Redis was down, jobs no announcement names and the odd job another
  pop's ``SKIP LOCKED`` hid at the first attempt;
- its deadline: the route answers the empty pop;
- the worker hung up (checked before each retry, so no job is leased to a dead connection);
- the process shuts down (:meth:`LongPoll.close`, on SIGTERM/SIGINT already, not only when uvicorn has drained
  its connections): released at once with the empty answer.

Wake policy, no thundering herd: an announcement wakes one waiter of this process, the first in FIFO order
whose pop could plausibly take it (:func:`plausible`: an in-memory pre-filter on models, chat or prompt job,
lengths; the SQL statement stays the authority), preferring idle waiters to those already about to retry. A
waiter that takes a job of the announced request passes the rest of its ``n`` generations on to the next
plausible waiter, so an announcement of ``n`` wakes at most ``n`` waiters, one after the other: woken together
they would contend for the request's one row, and every pop but one would skip it (``FOR UPDATE SKIP LOCKED``)
and find nothing. A woken waiter that finds nothing passes the wake on to the next plausible waiter that has
not tried this announcement, at most :data:`HANDOFF_LIMIT` (4) times per announcement, so one job nobody here
may take costs at most ``1 + 4`` statements per process, whatever the number of waiters. A waiter that got
another request's job, left or timed out before trying passes the wake on without using up the limit. When the
subscriber (re)subscribes, every waiter is woken once: announcements may have been lost meanwhile.
Announcements that arrive between a pop's first attempt and its registration are caught up from a short ring
of the recent ones (:data:`RECENT_ANNOUNCEMENTS`).

Everything here runs on the event loop of its process, so no locks: each method runs to completion between
awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import threading
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

import redis.asyncio as redis
from horde_core.queue_announce import QUEUE_ANNOUNCE_CHANNEL, Announcement, parse

from .metrics import (
    LONGPOLL_ANNOUNCEMENTS,
    LONGPOLL_SUBSCRIBER,
    LONGPOLL_WAITING,
    LONGPOLL_WAITS,
    LONGPOLL_WAKES,
)
from .queue import PoppedJob, PopWorker

log = logging.getLogger(__name__)

#: How many times one announcement that found no taker is passed on to another waiter of this process.
HANDOFF_LIMIT = 4
#: Announcements kept to catch up a pop that registers after its first attempt (a pop whose first attempt saw
#: more than this many go by retries at once).
RECENT_ANNOUNCEMENTS = 256
#: The most safety-net rechecks (queue scans) the waiters of one process run per second, however many wait.
MAX_RECHECKS_PER_SECOND = 20
#: The recheck interval varies by this fraction either way, so waiters that started together do not retry
#: together.
RECHECK_JITTER = 0.2
#: The subscriber's reconnect backoff: from the first to the last, doubling, seconds.
SUBSCRIBER_BACKOFF_SECONDS = (0.5, 10.0)
#: How long one read of the subscription waits for a message.
SUBSCRIBER_READ_SECONDS = 1.0
#: After this long without a message the subscriber PINGs; without an answer within as long again it
#: reconnects (a Redis that accepts and never answers, a connection dropped silently).
SUBSCRIBER_PING_SECONDS = 5.0


class WaitOutcome(StrEnum):
    """How a wait ended: a job, the deadline, the worker gone, or the process shutting down."""

    job = "job"
    timeout = "timeout"
    gone = "gone"
    closed = "closed"


def plausible(pw: PopWorker, a: Announcement) -> bool:
    """Whether the pop described by ``pw`` could take the announced request's job: a cheap in-memory
    pre-filter of the pop statement's model, kind and length rules (queue.py). Empty announced models match any
    worker. False positives only cost a statement; no false negative for the rules it checks, except that a
    paused worker is never woken: its jobs for others are fake (queue.py), so a wake would be spent on a decoy
    while a real worker waits; it finds jobs at its periodic recheck."""
    if pw.paused:
        return False
    if a.is_chat:
        if not pw.accepts_chat_jobs or pw.chat_model_id is None:
            return False
        if a.models and pw.chat_model_id not in a.models:
            return False
        return a.max_context_length <= (pw.chat_max_context_length or 0) and a.max_length <= min(
            pw.chat_max_length or 0, pw.capacity
        )
    if not pw.accepts_prompt_jobs:
        return False
    if a.models and not any(m in pw.models for m in a.models):
        return False
    return a.max_length <= pw.text_max_length and a.max_context_length <= pw.text_max_context_length


class _Wake:
    """One announcement on its way through this process's waiters (``announcement`` None: a broadcast)."""

    __slots__ = ("announcement", "cause", "handoffs_left", "remaining", "tried", "tried_owners")

    def __init__(self, announcement: Announcement | None, cause: str, handoffs: int) -> None:
        self.announcement = announcement
        self.cause = cause
        self.handoffs_left = handoffs
        #: Generations of the announced request no waiter of this process has taken yet.
        self.remaining = announcement.n if announcement is not None else 0
        self.tried: set[Waiter] = set()
        #: Owners one of whose waiters tried this announcement and found nothing: their other waiters would
        #: not either (same trust, same owner), so one owner's many waiters cannot use up every hand-off.
        self.tried_owners: set[int] = set()


class Waiter:
    """One waiting pop: its :class:`PopWorker`, the wakes it was given, whether its statement runs."""

    __slots__ = ("catch_up", "event", "models", "pw", "running", "wakes")

    def __init__(self, pw: PopWorker) -> None:
        self.pw = pw
        self.event = asyncio.Event()
        self.wakes: list[_Wake] = []
        self.running = False
        self.catch_up = False

    @property
    def tier(self) -> int:
        """Preference when choosing waiters to wake: 0 idle, 1 about to retry anyway, 2 running a statement
        (which may have started before the announced commit, so it retries once more)."""
        if self.running:
            return 2
        return 1 if self.wakes or self.catch_up else 0

    def give(self, wake: _Wake) -> None:
        wake.tried.add(self)
        self.wakes.append(wake)
        self.event.set()

    async def sleep(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a wake (not at all when the time is already up)."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), seconds)

    def cause(self, *, recheck_due: bool) -> str | None:
        """Why this waiter retries now (the metrics' cause), or None: it was woken for nothing new."""
        if self.wakes:
            return self.wakes[0].cause
        if self.catch_up:
            return "announcement"
        return "recheck" if recheck_due else None

    async def attempt(
        self, pop: Callable[[], Awaitable[PoppedJob | None]], wakes: list[_Wake]
    ) -> PoppedJob | None:
        """Run ``pop`` as this waiter's retry for ``wakes``; if it fails they are given back, untried."""
        self.running = True
        try:
            return await pop()
        except BaseException:
            self.wakes = wakes + self.wakes
            raise
        finally:
            self.running = False


class LongPoll:
    """The waiting pops of this process and the wake policy (see the module docstring).

    ``recheck_seconds``: the safety-net retry interval of a waiting pop; ``handoff_limit``: how often one
    announcement is passed on after a retry that found nothing.
    """

    def __init__(self, recheck_seconds: float, handoff_limit: int = HANDOFF_LIMIT) -> None:
        self.recheck_seconds = recheck_seconds
        self.handoff_limit = handoff_limit
        self.closed = False
        # Insertion order is FIFO order.
        self._waiters: dict[Waiter, None] = {}
        self._by_worker: Counter[uuid.UUID] = Counter()
        self._sequence = 0
        self._recent: deque[tuple[int, Announcement | None]] = deque(maxlen=RECENT_ANNOUNCEMENTS)

    @property
    def sequence(self) -> int:
        """How many announcements and broadcasts this process has routed; a pop notes it before its first
        attempt and passes it to :meth:`wait` as ``since``."""
        return self._sequence

    @property
    def waiting(self) -> int:
        """How many pops are waiting now."""
        return len(self._waiters)

    def waiting_for(self, worker_id: uuid.UUID) -> int:
        """How many pops of this worker are waiting now (a pop route lets at most its ``threads`` wait)."""
        return self._by_worker[worker_id]

    # -- wakes -----------------------------------------------------------------------------------------------

    def announce(self, a: Announcement) -> int:
        """Wake the first plausible waiter (FIFO, idle first) for ``a``; returns how many were woken (0 or 1).
        The rest of ``a.n`` is passed on as waiters take jobs of it."""
        self._sequence += 1
        self._recent.append((self._sequence, a))
        return self._route(_Wake(a, "announcement", self.handoff_limit), 1)

    def wake_all(self, cause: str = "reconnect") -> int:
        """Wake every waiter once (after the subscriber (re)subscribed); returns how many were woken."""
        self._sequence += 1
        self._recent.append((self._sequence, None))
        wake = _Wake(None, cause, 0)
        for w in self._waiters:
            w.give(wake)
        return len(self._waiters)

    def close(self) -> None:
        """Release every waiter now (their pops answer empty) and refuse new waits. Idempotent."""
        self.closed = True
        for w in self._waiters:
            w.event.set()

    def _route(self, wake: _Wake, count: int) -> int:
        assert wake.announcement is not None
        chosen = 0
        for tier in (0, 1, 2):
            for w in self._waiters:
                if chosen >= count:
                    return chosen
                if (
                    w.tier == tier
                    and w not in wake.tried
                    and w.pw.owner_id not in wake.tried_owners
                    and plausible(w.pw, wake.announcement)
                ):
                    w.give(wake)
                    chosen += 1
        return chosen

    def _hand_on(self, wake: _Wake, *, tried: bool) -> bool:
        """Pass ``wake`` to the next plausible waiter that has not had it. After a retry that found nothing
        (``tried``) this uses up one of the announcement's hand-offs; a waiter that did not try it (it left,
        or took another job) passes it on freely. Broadcasts are never passed on (everyone had them)."""
        if wake.announcement is None or self.closed:
            return False
        if tried:
            if wake.handoffs_left <= 0:
                return False
            wake.handoffs_left -= 1
        return self._route(wake, 1) > 0

    def _catch_up(self, w: Waiter, since: int) -> None:
        """Give ``w`` an immediate retry when an announcement it could serve (or a broadcast) was routed after
        ``since``, i.e. while its first attempt ran, before it was registered."""
        if since >= self._sequence:
            return
        oldest = self._recent[0][0] if self._recent else self._sequence + 1
        if oldest > since + 1 or any(
            a is None or plausible(w.pw, a) for seq, a in self._recent if seq > since
        ):
            w.catch_up = True
            w.event.set()

    def _recheck_interval(self) -> float:
        # Idle waiters' rechecks are a queue scan each: spread them so the process runs at most
        # MAX_RECHECKS_PER_SECOND of them however many pops wait (announcements still wake them at once).
        base = max(self.recheck_seconds, len(self._waiters) / MAX_RECHECKS_PER_SECOND)
        return base * random.uniform(1 - RECHECK_JITTER, 1 + RECHECK_JITTER)

    # -- waiting ---------------------------------------------------------------------------------------------

    async def wait(
        self,
        pw: PopWorker,
        *,
        since: int,
        deadline: float,
        pop: Callable[[], Awaitable[PoppedJob | None]],
        gone: Callable[[], Awaitable[bool]],
    ) -> tuple[PoppedJob | None, WaitOutcome]:
        """Wait for a job for ``pw`` until ``deadline`` (the event loop's clock).

        ``since``: :attr:`sequence` noted before the pop's first attempt. ``pop`` runs the pop statement on a
        freshly acquired connection (no connection is held in between); ``gone`` says whether the worker hung
        up, and is asked before each retry. Returns the job (outcome ``job``) or None with ``timeout``,
        ``gone`` or ``closed``. An error of ``pop`` propagates (the waiter is removed first).
        """
        if self.closed:
            LONGPOLL_WAITS.labels(WaitOutcome.closed.value).inc()
            return None, WaitOutcome.closed
        loop = asyncio.get_running_loop()
        w = self._register(pw, since)
        outcome = WaitOutcome.timeout
        try:
            next_recheck = loop.time() + self._recheck_interval()
            while True:
                if not w.event.is_set():
                    await w.sleep(min(deadline, next_recheck) - loop.time())
                if self.closed:
                    outcome = WaitOutcome.closed
                    return None, outcome
                now = loop.time()
                if now >= deadline:
                    return None, outcome
                w.event.clear()
                cause = w.cause(recheck_due=now >= next_recheck)
                if cause is None:
                    continue
                wakes, w.wakes, w.catch_up = w.wakes, [], False
                next_recheck = now + self._recheck_interval()
                if await gone():
                    w.wakes = wakes + w.wakes  # untried: passed on when the waiter is removed
                    outcome = WaitOutcome.gone
                    return None, outcome
                job = await w.attempt(pop, wakes)
                if job is not None:
                    LONGPOLL_WAKES.labels(cause, "job").inc()
                    self._settle_served(wakes, job)
                    outcome = WaitOutcome.job
                    return job, outcome
                handed = self._settle_empty(w, wakes)
                LONGPOLL_WAKES.labels(cause, "handed_on" if handed else "empty").inc()
        finally:
            self._unregister(w, outcome)

    def _register(self, pw: PopWorker, since: int) -> Waiter:
        w = Waiter(pw)
        self._waiters[w] = None
        self._by_worker[pw.worker_id] += 1
        LONGPOLL_WAITING.inc()
        self._catch_up(w, since)
        return w

    def _unregister(self, w: Waiter, outcome: WaitOutcome) -> None:
        """Remove ``w``; the wakes it still holds, untried, go on to the next plausible waiters."""
        del self._waiters[w]
        self._by_worker[w.pw.worker_id] -= 1
        if self._by_worker[w.pw.worker_id] <= 0:
            del self._by_worker[w.pw.worker_id]
        LONGPOLL_WAITING.dec()
        for k in w.wakes:
            self._hand_on(k, tried=False)
        LONGPOLL_WAITS.labels(outcome.value).inc()

    def _settle_served(self, wakes: list[_Wake], job: PoppedJob) -> None:
        """After a retry that took ``job``: the wakes it was given move on (broadcasts are done)."""
        served = str(job.wp_id)
        for k in wakes:
            if k.announcement is None:
                continue
            if k.announcement.request_id == served:
                # The next waiter takes the request's next generations, if any are left.
                k.remaining -= max(1, len(job.generation_ids))
                if k.remaining > 0:
                    self._route(k, 1)
            else:
                # Another request's job is still queued: someone else may take it.
                self._hand_on(k, tried=False)

    def _settle_empty(self, w: Waiter, wakes: list[_Wake]) -> bool:
        """After a retry of ``w`` that found nothing: pass its wakes on, each using up a hand-off; returns
        whether any was."""
        handed = False
        for k in wakes:
            k.tried_owners.add(w.pw.owner_id)
            handed = self._hand_on(k, tried=True) or handed
        return handed


class AnnouncementSubscriber:
    """One per process: subscribes to :data:`QUEUE_ANNOUNCE_CHANNEL` on ``client`` and routes each
    announcement to ``longpoll``; every (re)subscription wakes every waiter once. Reconnects with backoff
    (0.5 s doubling to 10 s) after any failure, and notices a silent connection by PING
    (:data:`SUBSCRIBER_PING_SECONDS`). While it is down waiters rely on their periodic recheck."""

    def __init__(self, client: redis.Redis, longpoll: LongPoll) -> None:
        self.client = client
        self.longpoll = longpoll
        self.subscribed = False
        self._task: asyncio.Task[None] | None = None
        self._backoff = SUBSCRIBER_BACKOFF_SECONDS[0]
        self._failing = False

    def start(self) -> None:
        """Start the subscriber task on the running loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="longpoll-subscriber")

    async def stop(self) -> None:
        """Stop the subscriber task and close its connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the store or the connection: reconnect
                LONGPOLL_SUBSCRIBER.labels("failed").inc()
                message = "queue announcement subscriber failed; reconnecting"
                extra = {"error": f"{type(exc).__name__}: {exc}"[:200], "retry_in": self._backoff}
                if self._failing:
                    log.debug(message, extra=extra)
                else:
                    log.warning(message, extra=extra)
                self._failing = True
            delay = self._backoff * random.uniform(0.8, 1.2)
            self._backoff = min(self._backoff * 2, SUBSCRIBER_BACKOFF_SECONDS[1])
            await asyncio.sleep(delay)

    async def _listen(self) -> None:
        """Subscribe and route messages until the connection fails (raises)."""
        pubsub: Any = self.client.pubsub()
        loop = asyncio.get_running_loop()
        try:
            await pubsub.subscribe(QUEUE_ANNOUNCE_CHANNEL)
            heard = loop.time()
            pinged: float | None = None
            while True:
                message = await pubsub.get_message(timeout=SUBSCRIBER_READ_SECONDS)
                now = loop.time()
                if message is None:
                    if pinged is not None:
                        if now - pinged > SUBSCRIBER_PING_SECONDS:
                            raise ConnectionError("no answer to PING on the announcement subscription")
                    elif now - heard > SUBSCRIBER_PING_SECONDS:
                        await pubsub.ping()
                        pinged = now
                    continue
                heard, pinged = now, None
                kind = message.get("type")
                if kind == "subscribe":
                    self._subscribed()
                elif kind == "message":
                    announcement = parse(message["data"])
                    if announcement is None:
                        LONGPOLL_ANNOUNCEMENTS.labels("malformed").inc()
                        log.debug(
                            "malformed queue announcement ignored", extra={"data": str(message["data"])[:200]}
                        )
                        continue
                    LONGPOLL_ANNOUNCEMENTS.labels("routed").inc()
                    self.longpoll.announce(announcement)
        finally:
            self.subscribed = False
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def _subscribed(self) -> None:
        if self._failing:
            log.info("queue announcement subscriber subscribed again")
        self.subscribed = True
        self._failing = False
        self._backoff = SUBSCRIBER_BACKOFF_SECONDS[0]
        LONGPOLL_SUBSCRIBER.labels("subscribed").inc()
        # Announcements published while we were not subscribed are lost: let every waiter look once.
        self.longpoll.wake_all("reconnect")


def on_shutdown_signal(callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` on the running loop when SIGTERM or SIGINT arrives, before the handler installed now
    (uvicorn's, which starts the graceful shutdown); returns a function that removes the hook.

    Why: uvicorn drains open connections for up to ``shutdown_grace_seconds`` before it runs the lifespan
    shutdown, and a long-polling pop is an open connection, so releasing waiters only in the lifespan would
    hold every shutdown for the longest wait. Only a callable handler is chained (a server's, or Python's SIGINT
    handler); the default and ignore dispositions are left alone, and so is a process outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    installed: dict[int, tuple[Any, Any]] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed: nothing waits any more
                loop.call_soon_threadsafe(callback)
            previous(signum, frame)

        signal.signal(sig, handler)
        installed[sig] = (handler, previous)

    def remove() -> None:
        for sig, (handler, previous) in installed.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, previous)

    return remove
