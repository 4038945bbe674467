"""The native HTTP calls the front makes, exactly as to a public horde (README.md#architecture).

Routes: ``POST /v2/generate/chat/async``, ``GET``/``DELETE /v2/generate/chat/status/{id}``,
``GET /v2/status/models?type=text&chat=true``, under the configured base URL (``.../api``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from horde_contract.errors import RC
from horde_core.request_id import outgoing_headers

from horde_oai.errors import OpenAIError
from horde_oai.metrics import NATIVE_CALL_DURATION, status_class

log = logging.getLogger(__name__)

CLIENT_AGENT = "horde-oai:0.1.0:https://github.com/Haidra-Org/AI-Horde"
# Native calls in flight at once; more wait for a connection (every in-flight request makes one call at a time,
# and spends most of its life waiting on its signal, not in a call).
NATIVE_MAX_CONNECTIONS = 100
# Seconds an idle pooled connection is kept. Below the 5 s after which uvicorn (every native service) closes an
# idle connection, so the pool never hands out one the server is closing at that moment.
NATIVE_KEEPALIVE_SECONDS = 4.0


@dataclass(slots=True)
class NativeResponse:
    """A native answer: HTTP status, parsed JSON body (``{}`` when not JSON) and headers."""

    status: int
    body: Any
    headers: httpx.Headers

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def horde_unavailable(detail: str) -> OpenAIError:
    """502 HordeUnavailable: the horde did not answer."""
    return OpenAIError(502, f"The Horde could not be reached: {detail}", RC.HordeUnavailable)


async def _send_request_id(request: httpx.Request) -> None:
    """The front's request id goes onward as ``X-Request-ID`` (horde_core.request_id), so admission's log lines
    of the call carry it too."""
    request.headers.update(outgoing_headers())


class HordeClient:
    """A thin async client of the native chat routes. One instance per process: every request's calls share
    its pool of keep-alive HTTP/1.1 connections (a new connection costs about 1 ms on loopback; the native
    services run uvicorn, which serves no HTTP/2). The pool keeps as many idle connections as it may open, so
    a burst of calls does not close and reopen them."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        proxy_passkey: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.proxy_passkey = proxy_passkey
        self.limits = httpx.Limits(
            max_connections=NATIVE_MAX_CONNECTIONS,
            max_keepalive_connections=NATIVE_MAX_CONNECTIONS,
            keepalive_expiry=NATIVE_KEEPALIVE_SECONDS,
        )
        headers = {"Client-Agent": CLIENT_AGENT}
        if proxy_passkey:
            # On every call: it marks the front as a horde process, whose trace context admission continues
            # (horde_core.tracing); Proxied-For goes with it on the submit only.
            headers["Proxy-Authorization"] = proxy_passkey
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=5.0),
            headers=headers,
            transport=transport,
            limits=self.limits,
            event_hooks={"request": [_send_request_id]},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(self, route: str, method: str, path: str, **kwargs: Any) -> NativeResponse:
        """One native call, timed on ``horde.oai.native.duration`` under ``route`` (a NATIVE_ROUTES name) and
        its status class (``error`` when it raised)."""
        started = time.perf_counter()
        status: int | None = None
        try:
            response = await self._client.request(method, path, **kwargs)
            status = response.status_code
            try:
                body = response.json()
            except ValueError:
                body = {}
        finally:
            NATIVE_CALL_DURATION.labels(route, status_class(status)).observe(time.perf_counter() - started)
        return NativeResponse(response.status_code, body, response.headers)

    async def submit(
        self, apikey: str, body: dict[str, Any], retries: int = 2, client_address: str | None = None
    ) -> NativeResponse:
        """``POST /v2/generate/chat/async``; a transport error or 5xx is retried (the operation key makes
        it idempotent). Raises 502 HordeUnavailable when every attempt failed in transport.

        With a proxy passkey (which every call carries in ``Proxy-Authorization``) and the client's address, the
        call carries ``Proxied-For``, so the horde counts its per-address rate limits by the front's client
        rather than by the front (docs/native-api.md#rate-limits).
        """
        headers = {"apikey": apikey}
        if self.proxy_passkey and client_address:
            headers["Proxied-For"] = client_address
        last_error: Exception | None = None
        response: NativeResponse | None = None
        for attempt in range(retries + 1):
            if attempt:
                await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
            try:
                response = await self._call(
                    "submit", "POST", "/v2/generate/chat/async", json=body, headers=headers
                )
            except httpx.HTTPError as exc:
                last_error = exc
                log.warning("native submit failed", extra={"attempt": attempt, "error": repr(exc)})
                continue
            if response.status not in (500, 502, 504):
                return response
        if response is not None:
            return response
        raise horde_unavailable(type(last_error).__name__ if last_error else "no answer")

    async def status(self, request_id: str) -> NativeResponse:
        """``GET /v2/generate/chat/status/{id}``. A read that fails in transport before a timeout is made once
        more at once: a server may close a pooled keep-alive connection just as it is reused (the pool retires
        idle connections before uvicorn's 5 s, but a server behind another proxy may close sooner). Raises 502
        HordeUnavailable when that fails too."""
        path = f"/v2/generate/chat/status/{request_id}"
        try:
            try:
                return await self._call("status", "GET", path)
            except httpx.TimeoutException:
                raise
            except httpx.TransportError:
                return await self._call("status", "GET", path)
        except httpx.HTTPError as exc:
            raise horde_unavailable(type(exc).__name__) from exc

    async def cancel(self, request_id: str) -> NativeResponse:
        """``DELETE /v2/generate/chat/status/{id}`` (httpx errors propagate; the caller retries)."""
        return await self._call("cancel", "DELETE", f"/v2/generate/chat/status/{request_id}")

    async def chat_models(self) -> NativeResponse:
        """``GET /v2/status/models?type=text&chat=true``. Raises 502 HordeUnavailable on a transport error."""
        try:
            return await self._call(
                "models", "GET", "/v2/status/models", params={"type": "text", "chat": "true"}
            )
        except httpx.HTTPError as exc:
            raise horde_unavailable(type(exc).__name__) from exc
