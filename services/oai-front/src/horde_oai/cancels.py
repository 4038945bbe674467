"""Cancelling native requests, with retries (docs/openai-front.md#metrics-and-logs).

A cancel whose attempt ends failed or timed_out is retried every ``HORDE_OAI_CANCEL_RETRY_SECONDS`` until
20 minutes after the request's submission (its native expiry), and once more during shutdown. At most
:data:`MAX_FAILED_CANCELS` requests wait in the retry queue; the oldest are dropped first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from horde_core.tasks import stop_task

from horde_oai.horde_client import HordeClient
from horde_oai.metrics import CANCELS

log = logging.getLogger(__name__)

HORDE_CHAT_REQUEST_EXPIRY_SECONDS = 20 * 60
MAX_FAILED_CANCELS = 1000
CANCEL_TIMEOUT_SECONDS = 10.0


class CancelManager:
    """Cancels native requests; keeps the failed ones for retry."""

    def __init__(self, client: HordeClient, retry_seconds: float) -> None:
        self.client = client
        self.retry_seconds = retry_seconds
        self._failed: OrderedDict[str, float] = OrderedDict()  # request id -> submitted at (unix)
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[bool]] = set()
        self._delayed: set[asyncio.Task[bool]] = set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._retry_loop(), name="horde-oai-cancel-retry")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        for task in self._delayed:
            task.cancel()  # their cancels run now instead of after the resume grace
        if self._pending or self._delayed:
            await asyncio.gather(*self._pending, *self._delayed, return_exceptions=True)
        await self._retry_all()  # once more during shutdown

    async def cancel(self, request_id: str, submitted_at: float) -> bool:
        """Cancel now; True when the Horde confirmed (200) or no longer holds the request (404)."""
        confirmed, _ = await self.cancel_with_status(request_id, submitted_at)
        return confirmed

    async def cancel_with_status(
        self, request_id: str, submitted_at: float
    ) -> tuple[bool, Mapping[str, Any]]:
        """Cancel now: whether the Horde confirmed (200) or no longer holds the request (404), and the status
        body a confirming 200 carries (the status after the cancel; empty otherwise)."""
        status: Mapping[str, Any] = {}
        try:
            response = await asyncio.wait_for(self.client.cancel(request_id), CANCEL_TIMEOUT_SECONDS)
        except TimeoutError:
            outcome = "timed_out"
        except (httpx.HTTPError, OSError):
            outcome = "failed"
        else:
            if response.ok:
                outcome = "cancelled"
                status = response.body if isinstance(response.body, Mapping) else {}
            elif response.status == 404:
                outcome = "not_found"
            else:
                outcome = "failed"
        CANCELS.labels(outcome=outcome).inc()
        if outcome in ("cancelled", "not_found"):
            self._failed.pop(request_id, None)
            return True, status
        log.warning("native cancel failed", extra={"request_id": request_id, "outcome": outcome})
        self._remember(request_id, submitted_at)
        return False, status

    def cancel_in_background(self, request_id: str, submitted_at: float) -> None:
        """Cancel without waiting (a disconnected client's request); the task is kept until it ends."""
        task = asyncio.get_running_loop().create_task(self.cancel(request_id, submitted_at))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def cancel_later(
        self,
        request_id: str,
        submitted_at: float,
        delay: float,
        unless: Callable[[], Awaitable[bool]],
        then: Callable[[Mapping[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        """Cancel after ``delay`` seconds unless ``unless()`` then says the request was taken over (a retry of
        its call, or a resume of its relayed stream), and pass the status after the cancel to ``then``. A
        shutdown meanwhile cancels at once."""

        async def later() -> bool:
            try:
                await asyncio.sleep(delay)
                if await unless():
                    return False
            except asyncio.CancelledError:
                pass
            except Exception:
                log.warning(
                    "take-over check failed; cancelling", extra={"request_id": request_id}, exc_info=True
                )
            confirmed, status = await self.cancel_with_status(request_id, submitted_at)
            if then is not None:
                try:
                    await then(status)
                except Exception:
                    log.warning("after-cancel step failed", extra={"request_id": request_id}, exc_info=True)
            return confirmed

        task = asyncio.get_running_loop().create_task(later())
        self._delayed.add(task)
        task.add_done_callback(self._delayed.discard)

    def _remember(self, request_id: str, submitted_at: float) -> None:
        self._failed[request_id] = submitted_at
        self._failed.move_to_end(request_id)
        while len(self._failed) > MAX_FAILED_CANCELS:
            self._failed.popitem(last=False)

    async def _retry_all(self) -> None:
        now = time.time()
        for request_id, submitted_at in list(self._failed.items()):
            if now - submitted_at > HORDE_CHAT_REQUEST_EXPIRY_SECONDS:
                self._failed.pop(request_id, None)
                continue
            self._failed.pop(request_id, None)
            await self.cancel(request_id, submitted_at)

    async def _retry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retry_seconds)
            try:
                await self._retry_all()
            except Exception:  # the loop must survive any failure
                log.exception("cancel retry pass failed")
