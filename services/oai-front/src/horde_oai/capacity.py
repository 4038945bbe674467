"""The front's in-flight cap (docs/openai-front.md#metrics-and-logs: FrontAtCapacity).

A pure ASGI middleware counts the chat completions in flight, per client address and in total, from the
request's arrival until its response (a stream included) has been sent. Past either cap a new request is
refused at once with 503 ``FrontAtCapacity`` and ``Retry-After``, before its body is read, so a burst from one
client cannot hold every waiting slot of the process. The total is also the gauge
``horde_oai_completions_in_flight``, the front's autoscaling signal (docs/operator-guide.md#scaling).
"""

from __future__ import annotations

import time
from collections import Counter

from horde_contract.errors import RC
from starlette.types import ASGIApp, Receive, Scope, Send

from horde_oai.completions import record_refusal
from horde_oai.errors import OpenAIError
from horde_oai.metrics import COMPLETIONS_IN_FLIGHT

CAPACITY_RETRY_AFTER_SECONDS = 1
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


class InFlightCap:
    """Caps ``POST /v1/chat/completions`` in flight at ``total`` and at ``per_address`` per client address."""

    def __init__(self, app: ASGIApp, *, total: int, per_address: int) -> None:
        self.app = app
        self.total = total
        self.per_address = per_address
        self.in_flight = 0
        self.by_address: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != CHAT_COMPLETIONS_PATH:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else "unknown"
        if self.in_flight >= self.total or self.by_address[address] >= self.per_address:
            await self._refuse(scope, receive, send)
            return
        # One event loop per process: the counters need no lock.
        self.in_flight += 1
        self.by_address[address] += 1
        COMPLETIONS_IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            COMPLETIONS_IN_FLIGHT.dec()
            self.by_address[address] -= 1
            if self.by_address[address] <= 0:
                del self.by_address[address]

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = OpenAIError(
            503,
            "The front has too many requests in flight right now; retry shortly.",
            RC.FrontAtCapacity,
            headers={"Retry-After": str(CAPACITY_RETRY_AFTER_SECONDS)},
        )
        record_refusal(error, time.time(), streamed=False)
        await error.response()(scope, receive, send)
