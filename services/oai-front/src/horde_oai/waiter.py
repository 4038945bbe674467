"""Waiting for a native chat request to end (docs/openai-front.md#errors,
#no-eligible-worker, #choices; docs/native-api.md#completion-signal).

:class:`ChatWait` subscribes to the request's signal channel, reads the status once after subscribing, then
re-reads it at every signal and every ``signal_recheck_seconds`` until the request is done with a reply,
faulted, impossible, or out of budget. Every refusal cancels the native request first. When to read, sleep,
time out, cancel, finish or fault is decided by :func:`horde_oai.wait_rules.next_action`; this module does
the I/O and builds the errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from horde_contract.errors import RC
from horde_core.signals import SignalHub

from horde_oai import wait_rules as rules
from horde_oai.cancels import CancelManager
from horde_oai.errors import OpenAIError, no_eligible_worker
from horde_oai.horde_client import HordeClient
from horde_oai.native_errors import declaration_gap_error, is_size_only_gap, map_native_error

log = logging.getLogger(__name__)

# Retry-After of a queue_unavailable refusal never exceeds this: the online pool changes minute to minute.
QUEUE_UNAVAILABLE_RETRY_AFTER_CAP_SECONDS = 60
# Status reads the Horde may leave unanswered in a row before the wait gives up with 502 HordeUnavailable.
MAX_UNANSWERED_READS = 3


@dataclass
class WaitTrace:
    """What the wait saw, for the finished-request log line and metrics."""

    woke_at: float | None = None
    woke_by: str | None = None
    wakes: int = 0
    done_without_generation_reads: int = 0
    first_read_wait_time: Any = None
    first_read_eligible_worker_threads: Any = None
    queue_reason: str | None = None
    wait_time: Any = None
    eligible_worker_threads: Any = None
    context_adjustments: list[Any] | None = None
    fault_signal: dict[str, Any] = field(default_factory=dict)


def faulted_error(
    request_id: str, status: Mapping[str, Any] | None, signal: Mapping[str, Any]
) -> OpenAIError:
    """502 ChatRequestFaulted, with the Horde's fault reason (message and ``metadata.fault_reason``) and rc
    when it gave them. ``x-should-retry: false``: the horde already restarted the job up to its fault limit, so
    an SDK's own retries would only fault more jobs and push the model's workers into maintenance."""
    reason = (status or {}).get("fault_reason") or signal.get("fault_reason")
    rc = (status or {}).get("fault_rc") or signal.get("fault_rc")
    message = "The AI Horde faulted the request: its workers could not complete it."
    if reason:
        message = f"The AI Horde faulted the request: {reason}"
    metadata: dict[str, Any] = {"request_id": request_id}
    if rc:
        metadata["rc"] = rc
    if reason:
        metadata["fault_reason"] = reason
    return OpenAIError(
        502, message, RC.ChatRequestFaulted, metadata=metadata, headers={"x-should-retry": "false"}
    )


def no_generation_error(request_id: str) -> OpenAIError:
    """502 ChatRequestNoGeneration: the request ended without a reply to deliver."""
    return OpenAIError(
        502,
        "The AI Horde finished the request without a reply to deliver; it was cancelled.",
        RC.ChatRequestNoGeneration,
        metadata={"request_id": request_id},
    )


def timeout_error(request_id: str, budget: float) -> OpenAIError:
    """408 ChatRequestTimeout: the budget ran out; the native request was cancelled."""
    return OpenAIError(
        408,
        f"The request did not complete within {budget:g} seconds and was cancelled. No worker finished it in "
        "time; retry later or lower max_tokens.",
        RC.ChatRequestTimeout,
        metadata={"request_id": request_id},
    )


def queue_unavailable_error(
    request_id: str, reason: str, threads: Any, wait_time: Any, remaining: float
) -> OpenAIError:
    """503 queue_unavailable (horde.availability_mode fail_fast) with a capped Retry-After."""
    wait_text = f"{wait_time} s" if isinstance(wait_time, int | float) else "unknown"
    message = (
        f"No worker can take this request within its budget: {threads if threads is not None else 'unknown'} "
        f"eligible worker threads, estimated wait {wait_text}, {max(0, int(remaining))} s of budget left. "
        "The request was cancelled."
    )
    if reason == "no_eligible_threads":
        retry_after = 30
    else:
        retry_after = min(
            QUEUE_UNAVAILABLE_RETRY_AFTER_CAP_SECONDS, max(1, int(wait_time or 0) - int(remaining))
        )
    exc = OpenAIError(
        503,
        message,
        "queue_unavailable",
        type="service_unavailable_error",
        param="horde.availability_mode",
        metadata={"request_id": request_id},
        headers={"Retry-After": str(retry_after)},
    )
    exc.reason = reason
    return exc


ChatEntries = Callable[[], Awaitable[Mapping[str, Mapping[str, Any]]]]


class ChatWait:
    """The wait of one submitted request.

    ``run()`` returns the done status with a finished generation or raises :class:`OpenAIError` (after
    cancelling the native request). ``first_read_passed`` is set once the first status read passed the
    availability checks, when a stream may send its headers.
    """

    def __init__(
        self,
        *,
        request_id: str,
        submitted_at: float,
        budget: float,
        client: HordeClient,
        hub: SignalHub,
        cancels: CancelManager,
        recheck_seconds: float,
        grace_seconds: float,
        models: Sequence[str],
        fail_fast: bool = False,
        chat_entries: ChatEntries | None = None,
    ) -> None:
        self.request_id = request_id
        self.submitted_at = submitted_at
        self.budget = budget
        self.deadline = submitted_at + budget
        # The same deadline on the monotonic clock the wait's decisions use.
        self._deadline = time.monotonic() + (self.deadline - time.time())
        self.client = client
        self.hub = hub
        self.cancels = cancels
        self.recheck_seconds = recheck_seconds
        self.grace_seconds = grace_seconds
        self.models = list(models)
        self.fail_fast = fail_fast
        self.chat_entries = chat_entries
        self.first_read_passed = asyncio.Event()
        self.trace = WaitTrace()
        self.cancelled = False
        self.last_status: dict[str, Any] | None = None
        self._unanswered_reads = 0
        self._progress_until = 0.0

    def progress_seen(self) -> None:
        """The request's worker posted progress: it is running, so the periodic status read (the fallback
        for a lost signal) waits until ``recheck_seconds`` pass without progress. A relayed stream calls this
        for every batch, which spares a front holding many streams most of its status reads; the signals
        still end the wait at once."""
        self._progress_until = time.monotonic() + self.recheck_seconds

    async def cancel(self) -> None:
        """Cancel the native request once (retried in the background when it fails)."""
        if not self.cancelled:
            self.cancelled = True
            await self.cancels.cancel(self.request_id, self.submitted_at)

    async def _refuse(self, error: OpenAIError) -> OpenAIError:
        await self.cancel()
        return error

    async def _read(self) -> rules.Seen:
        """The status; None when the Horde no longer holds the request (404); :data:`~horde_oai.wait_rules.UNANSWERED` for a read
        the Horde left unanswered (transport error, 5xx, 429), tolerated :data:`MAX_UNANSWERED_READS` - 1
        times in a row (docs/openai-front.md#streaming). Past that, and on any other refusal, the request is cancelled
        and the error raised: it must not run on and be charged for a reply nobody waits for."""
        try:
            response = await self.client.status(self.request_id)
        except OpenAIError as unavailable:
            return await self._unanswered(unavailable)
        if response.status == 404:
            return None
        if not response.ok:
            error = map_native_error(
                response.status, response.body, models=self.models, headers=response.headers
            )
            if response.status >= 500 or response.status == 429:
                return await self._unanswered(error)
            raise await self._refuse(error)
        self._unanswered_reads = 0
        body = response.body if isinstance(response.body, dict) else {}
        self.last_status = body
        if body.get("context_adjustments"):
            self.trace.context_adjustments = list(body["context_adjustments"])
        return body

    async def _unanswered(self, error: OpenAIError) -> rules.Seen:
        self._unanswered_reads += 1
        log.warning("status read unanswered", extra={"request_id": self.request_id, "code": error.code})
        if self._unanswered_reads >= MAX_UNANSWERED_READS:
            raise await self._refuse(error)
        return rules.UNANSWERED

    async def _gap_error(self, gap: Mapping[str, Any]) -> OpenAIError:
        entries: Mapping[str, Mapping[str, Any]] = {}
        if is_size_only_gap(gap) and self.chat_entries is not None:
            try:
                entries = await self.chat_entries()
            except Exception:
                log.warning("model list read failed for a size gap", exc_info=True)
        return await self._refuse(
            declaration_gap_error(gap, self.models, request_id=self.request_id, chat_entries=entries)
        )

    async def run(self) -> dict[str, Any]:
        sub = await self.hub.subscribe(self.request_id)
        try:
            return await self._loop(sub)
        except TimeoutError:
            raise (await self._refuse(timeout_error(self.request_id, self.budget))).settled() from None
        except OpenAIError as error:
            # The Horde created the request and it ended (or was cancelled): a retry would meet it again.
            raise error.settled() from None
        finally:
            await self.hub.unsubscribe(sub)

    async def _loop(self, sub: Any) -> dict[str, Any]:
        """Perform the actions :func:`~horde_oai.wait_rules.next_action` decides, from the first read on."""
        state = rules.WaitState(
            deadline=self._deadline,
            recheck_seconds=self.recheck_seconds,
            grace_seconds=self.grace_seconds,
            fail_fast_pending=self.fail_fast,
        )
        seen: rules.Seen = await self._read()
        while True:
            if isinstance(seen, Mapping) and state.first_read_at is None:
                self.trace.first_read_wait_time = seen.get("wait_time")
                self.trace.first_read_eligible_worker_threads = seen.get("eligible_worker_threads")
            action = rules.next_action(
                seen, replace(state, progress_until=self._progress_until), time.monotonic()
            )
            state = action.state
            self.trace.done_without_generation_reads = state.done_without_generation_reads
            if state.passed:
                self.first_read_passed.set()
            if isinstance(action, rules.Read):
                seen = await self._read()
            elif isinstance(action, rules.Sleep):
                event = await sub.wait(action.seconds)
                seen = rules.NO_SIGNAL if event is None else rules.Signal(cancelled=self._note_event(event))
            elif isinstance(action, rules.Finish):
                assert isinstance(seen, dict)
                return seen
            elif isinstance(action, rules.Fault):
                raise faulted_error(self.request_id, action.status, self.trace.fault_signal)
            elif isinstance(action, rules.TimeOut):
                raise TimeoutError
            else:
                raise await self._cancel_error(action)

    async def _cancel_error(self, action: rules.Cancel) -> OpenAIError:
        """Cancel the request; the refusal :class:`~horde_oai.wait_rules.Cancel` names."""
        if action.reason == "declaration_gap":
            assert action.gap is not None
            return await self._gap_error(action.gap)
        if action.reason == "no_generation":
            return await self._refuse(no_generation_error(self.request_id))
        if action.reason == "no_eligible_worker":
            return await self._refuse(
                no_eligible_worker(
                    "No worker is currently able to serve this request; it was cancelled. Retry later.",
                    stage="grace",
                    request_id=self.request_id,
                )
            )
        self.trace.queue_reason = action.reason
        self.trace.eligible_worker_threads = action.threads
        self.trace.wait_time = action.wait_time
        return await self._refuse(
            queue_unavailable_error(
                self.request_id, action.reason, action.threads, action.wait_time, action.remaining
            )
        )

    def _note_event(self, event: Mapping[str, Any]) -> bool:
        """Record a signal; True for a cancelled event."""
        self.trace.wakes += 1
        kind = event.get("event")
        if self.trace.woke_at is None:
            self.trace.woke_at = time.time()
            self.trace.woke_by = str(kind)
        if kind == "faulted":
            self.trace.fault_signal = {k: event.get(k) for k in ("fault_reason", "fault_rc")}
        return kind == "cancelled"
