"""Streaming progress: posting a streamed chat job's deltas to ``POST /v2/generate/text/progress`` and the
job lease that accepted posts renew (docs/native-api.md#progress, #job-lease).

A :class:`ProgressSession` runs beside the backend: the worker :meth:`~ProgressSession.add`\\ s each delta the
backend yields (``<think>`` tags split out incrementally, so reasoning and content are posted apart) and the
session's :meth:`~ProgressSession.run` task posts what accumulated, at most once per ``interval`` (the first
post as soon as there is text), as ``{id, seq, delta: {content?, reasoning_content?}}``. Posting never blocks
the backend: deltas that arrive while a post is in flight are merged into the next post.

Answers:

==========================================  ==============================================================
200 ``{accepted_seq, cancelled: false}``    next seq; the local lease is renewed (:class:`JobLease`)
200 ``{cancelled: true}``                   abort: the generation stops, the job is not submitted
404 ``ChatJobAborted``                      abort, as above
404 ``ChatProgressNotStreaming`` (any 404)  stop posting; the job still submits
409 ``ChatProgressOutOfSequence``           resync to ``expected_seq``; the refused delta goes back in
                                            front of the pending text and is posted at that seq next
413 ``ChatProgressCapReached``              stop posting; the job still submits
403, any other 4xx                          stop posting; the job still submits
503, 5xx, 429, no answer                    resent unchanged (same seq, same delta) up to ``resends``
                                            times, ``resend_delay`` apart; then stop posting
==========================================  ==============================================================

A delta is never empty: a post carries content, reasoning or both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from horde_contract import RC, TEXT_JOB_LEASE_SECONDS, TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS

from horde_worker.jobs import ChatDelta
from horde_worker.metrics import WorkerMetrics
from horde_worker.replies import ThinkSplitter

log = logging.getLogger("horde_worker.progress")

PROGRESS_PATH = "/api/v2/generate/text/progress"
#: 409s in a row (without an accepted post between them) after which posting stops.
MAX_SEQUENCE_CONFLICTS = 3


@dataclass
class JobLease:
    """The local deadline of a held job, in :func:`time.monotonic` seconds.

    It starts at the pop's ``ttl`` plus ``margin`` (a submit inside the stale thread's pass is still
    accepted). Each accepted progress post renews it as the horde renews the job lease: to ``renewal`` seconds
    after the post (the worker passes the pop's ``ttl``: the horde's base lease, 150), never past ``cap``
    seconds from the pop (600, the trusted owner's cap: the worker
    does not know its owner's trust, and an untrusted job whose lease lapses at 200 s is told so by the next
    post's 404 ``ChatJobAborted``), plus ``margin``.
    """

    started: float
    deadline: float
    margin: float
    renewal: float = TEXT_JOB_LEASE_SECONDS
    cap: float = TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS

    @classmethod
    def from_ttl(cls, ttl: float, margin: float, **kw: Any) -> JobLease:
        now = time.monotonic()
        return cls(started=now, deadline=now + ttl + margin, margin=margin, **kw)

    def renew(self, now: float | None = None) -> None:
        """Extend the deadline after an accepted post at ``now`` (default: now)."""
        now = time.monotonic() if now is None else now
        ends = min(now + self.renewal, self.started + self.cap)
        self.deadline = max(self.deadline, ends + self.margin)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


@dataclass
class ProgressPolicy:
    """How a session posts: ``interval`` seconds between posts, ``resends`` resends of an unanswered post
    ``resend_delay`` apart, ``timeout`` seconds per post."""

    interval: float = 1.0
    resends: int = 3
    resend_delay: float = 1.0
    timeout: float = 10.0


class ProgressSession:
    """The progress posts of one streamed job (module docstring).

    ``on_accepted`` is called after each accepted post (the worker renews the local lease there). After the
    run: :attr:`aborted` is set when the horde cancelled or aborted the job (:attr:`abort_reason`
    ``cancelled``/``aborted``); :attr:`stop_reason` says why posting stopped early (``None`` while posting).
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        url: str,
        job_id: str,
        policy: ProgressPolicy,
        metrics: WorkerMetrics,
        on_accepted: Callable[[], None] | None = None,
    ) -> None:
        self.http = http
        self.url = url
        self.job_id = job_id
        self.policy = policy
        self.metrics = metrics
        self.on_accepted = on_accepted
        self.seq = 1
        self.stop_reason: str | None = None
        self.abort_reason: str | None = None
        self.aborted = asyncio.Event()
        self.posts = 0  # posts accepted
        self._splitter = ThinkSplitter()
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._wake = asyncio.Event()
        self._finishing = asyncio.Event()
        self._conflicts = 0

    @property
    def posting(self) -> bool:
        return self.stop_reason is None and self.abort_reason is None

    # -- deltas -------------------------------------------------------------------------------------------

    def add(self, delta: ChatDelta) -> None:
        """Queue a backend delta for the next post (its content's ``<think>`` blocks split out)."""
        reasoning, content = self._splitter.feed(delta.content) if delta.content else ("", "")
        self._queue(delta.reasoning + reasoning, content)

    def finish(self) -> None:
        """The backend is done: release what the splitter holds and post what is pending now."""
        self._queue(*self._splitter.flush())
        self._finishing.set()
        self._wake.set()

    def _queue(self, reasoning: str, content: str) -> None:
        if not self.posting:  # nothing will be posted any more
            return
        if reasoning:
            self._reasoning.append(reasoning)
        if content:
            self._content.append(content)
        if reasoning or content:
            self._wake.set()

    def _take(self) -> dict[str, str]:
        delta: dict[str, str] = {}
        if self._content:
            delta["content"] = "".join(self._content)
        if self._reasoning:
            delta["reasoning_content"] = "".join(self._reasoning)
        self._content.clear()
        self._reasoning.clear()
        return delta

    def _requeue(self, delta: dict[str, str]) -> None:
        """Put a refused delta back in front of what arrived since."""
        if delta.get("content"):
            self._content.insert(0, delta["content"])
        if delta.get("reasoning_content"):
            self._reasoning.insert(0, delta["reasoning_content"])

    # -- posting ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Post until the backend is done and nothing is pending, or posting stops."""
        loop = asyncio.get_running_loop()
        last: float | None = None
        while self.posting:
            if not (self._content or self._reasoning):
                if self._finishing.is_set():
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if last is not None and not self._finishing.is_set():
                delay = last + self.policy.interval - loop.time()
                if delay > 0:
                    try:  # a finished backend's last text goes at once
                        await asyncio.wait_for(self._finishing.wait(), timeout=delay)
                    except TimeoutError:
                        pass
            last = loop.time()
            await self._post(self._take())

    async def _post(self, delta: dict[str, str]) -> None:
        body = {"id": self.job_id, "seq": self.seq, "delta": delta}
        for attempt in range(self.policy.resends + 1):
            if attempt:
                await asyncio.sleep(self.policy.resend_delay)
            try:
                resp = await self.http.post(self.url, json=body, timeout=self.policy.timeout)
            except httpx.HTTPError as exc:
                self._count("error")
                log.info("job %s: progress seq %d got no answer: %r", self.job_id, self.seq, exc)
                continue
            status = resp.status_code
            data = _json(resp)
            rc = data.get("rc")
            if status == 200:
                if data.get("cancelled") is True:
                    self._count("cancelled")
                    self._abort("cancelled")
                    return
                self._count("accepted")
                accepted = data.get("accepted_seq")
                self.seq = (accepted if isinstance(accepted, int) and _is_seq(accepted) else self.seq) + 1
                self.posts += 1
                self._conflicts = 0
                if self.on_accepted is not None:
                    self.on_accepted()
                return
            if status == 503 or status >= 500 or status == 429:
                self._count("unavailable" if status == 503 else "error")
                log.info("job %s: progress seq %d answered %d", self.job_id, self.seq, status)
                continue
            if status == 404 and rc == RC.ChatJobAborted:
                self._count("aborted")
                self._abort("aborted")
                return
            if status == 409 and rc == RC.ChatProgressOutOfSequence and _is_seq(data.get("expected_seq")):
                self._count("out_of_sequence")
                self._conflicts += 1
                if self._conflicts > MAX_SEQUENCE_CONFLICTS:
                    self._stop("out_of_sequence")
                    return
                log.info(
                    "job %s: progress seq %d resynced to %s", self.job_id, self.seq, data["expected_seq"]
                )
                self.seq = int(data["expected_seq"])
                self._requeue(delta)
                return
            outcome = {404: "not_streaming", 413: "cap_reached", 403: "forbidden"}.get(status, "refused")
            self._count(outcome)
            self._stop(f"{outcome} ({status} {rc})")
            return
        self._stop("unanswered")

    def _count(self, outcome: str) -> None:
        self.metrics.progress_posts.labels(outcome).inc()

    def _stop(self, reason: str) -> None:
        log.info(
            "job %s: progress stopped at seq %d: %s; the reply is still submitted",
            self.job_id,
            self.seq,
            reason,
        )
        self.stop_reason = reason

    def _abort(self, reason: str) -> None:
        log.info("job %s: the horde %s the job at progress seq %d", self.job_id, reason, self.seq)
        self.abort_reason = reason
        self.aborted.set()


def _is_seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except (ValueError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
