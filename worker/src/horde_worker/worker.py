"""The worker loop: pop → backend → submit, one loop per thread (docs/worker-guide.md#the-loop).

Each pop sends the upstream fields (docs/native-api.md#pop) and the chat declaration (docs/native-api.md
#chat-declaration), and ``wait_seconds`` (``pop_wait_seconds``, 10 s by default;
docs/worker-guide.md#long-poll): dispatch holds an empty pop that long and answers as soon as a job is queued, so the loop pops again at
once after an empty long poll. With ``pop_wait_seconds`` 0, or when the answer came back well before the wait
(a horde that does not long-poll), empty pops back off 1/2/3 s as koboldcpp's worker does. A chat job's reply
goes through :func:`horde_worker.replies.build_chat_submit` and is submitted structured (
docs/native-api.md#submit), or faulted with a reason (docs/native-api.md#worker-fault-reasons); a legacy text job is submitted as
``{id, generation, state, seed}``.

A chat job carrying the stream hint (and no tools) is generated with the backend's ``stream_chat`` while a
:class:`horde_worker.progress.ProgressSession` posts its deltas about once a ``progress_interval``
(docs/native-api.md#progress); each accepted post renews the job's local deadline (docs/native-api.md#job-lease), and a cancel
(``cancelled: true`` or 404 ``ChatJobAborted``) aborts the generation and skips the submit.

Submit answers: 200 done; 404 and 400 ``AbortedGen``/``DuplicateGen`` drop the job; any other 400 on a chat
reply faults the job ``reply_refused`` (a text reply: a fault without reason); 429, 5xx and connection
errors retry with backoff. Shutdown (SIGTERM/SIGINT): stop popping (a long poll in flight is abandoned:
dispatch checks that its worker is still connected before it hands out a job), let held jobs finish for
``shutdown_grace`` seconds, then fault what is still held; a second signal faults at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx
from horde_contract import (
    MAX_CHAT_BODY_BYTES,
    RC,
    TEXT_JOB_LEASE_SECONDS,
    TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
    ChatFaultReason,
)

from horde_worker import __version__
from horde_worker.backends.base import Backend
from horde_worker.config import WorkerSettings
from horde_worker.declaration import Capabilities, build_declaration
from horde_worker.jobs import BackendFault, ChatJob, ChatOutput, JobCancelled, TextJob
from horde_worker.metrics import MetricsServer, WorkerMetrics
from horde_worker.progress import PROGRESS_PATH, JobLease, ProgressPolicy, ProgressSession
from horde_worker.replies import build_chat_fault, build_chat_submit, build_text_fault, build_text_submit

log = logging.getLogger("horde_worker")

POP_PATH = "/api/v2/generate/text/pop"
SUBMIT_PATH = "/api/v2/generate/text/submit"
BRIDGE_NAME = "Horde Chat Worker"
#: A long poll's HTTP read timeout is its wait plus this (dispatch answers at the wait's end at the latest).
POP_TIMEOUT_MARGIN_SECONDS = 30.0
#: After a stop request, a pop in flight may still answer this long before a held long poll is abandoned (an
#: answer already on its way, a job included, is still taken and run).
POP_STOP_GRACE_SECONDS = 1.0


def api_url(base: str, path: str) -> str:
    """Join a horde base URL and an ``/api/v2/...`` path; a base already ending in ``/api`` is not doubled."""
    base = base.rstrip("/")
    if base.endswith("/api"):
        return base + path[len("/api") :]
    return base + path


def bridge_agent(url: str) -> str:
    """``Horde Chat Worker:<version>:<url>`` (the name is what the Horde reads before the first ``:``)."""
    return f"{BRIDGE_NAME}:{__version__}:{url}"


def empty_pop_delay(count: int, delays: tuple[float, float, float] = (1.0, 2.0, 3.0)) -> float:
    """Seconds to wait after the ``count``-th empty pop in a row: koboldcpp's 1 s for the first 10, 2 s up to
    25, then 3 s (docs/worker-guide.md#the-loop)."""
    if count <= 10:
        return delays[0]
    if count <= 25:
        return delays[1]
    return delays[2]


@dataclass
class Timings:
    """Waits of the loop, in seconds. Tests shrink them; the defaults are the production ones."""

    empty_pop: tuple[float, float, float] = (1.0, 2.0, 3.0)
    pop_error: float = 2.0
    connect_error: float = 5.0
    submit_backoff: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 10.0)
    submit_attempts: int = 10
    lease_margin: float = 60.0  # a submit inside the stale thread's 60 s pass is still accepted
    lease_renewal: float | None = None  # an accepted progress post renews the lease this long (None: the ttl)
    lease_cap: float = TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS  # ... up to this long from the pop
    progress_resends: int = 3  # an unanswered progress post is resent unchanged this many times
    progress_resend_delay: float = 1.0
    progress_timeout: float = 10.0  # per progress post
    progress_flush: float = 5.0  # the most the last progress post may delay the submit

    def submit_delay(self, attempt: int) -> float:
        return self.submit_backoff[min(attempt, len(self.submit_backoff) - 1)]


class Worker:
    """One worker process: ``threads`` pop loops sharing one backend.

    Use ``await worker.run()``; :meth:`request_stop` (wired to SIGTERM/SIGINT by ``__main__``) ends it.
    ``declaration`` and ``model_id`` are available once the backend has started.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        backend: Backend,
        timings: Timings | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.timings = timings or Timings()
        self.metrics = metrics or WorkerMetrics()
        self.capabilities: Capabilities | None = None
        self.declaration: dict[str, Any] = {}
        self.model_id: str = settings.model_id or ""
        self.models: list[str] = list(settings.models)
        self.bridge_agent = bridge_agent(settings.bridge_url)
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(60.0, connect=10.0),
            headers={"apikey": settings.api_key, "Client-Agent": self.bridge_agent},
        )
        self._stopping = asyncio.Event()
        self._hard_stop = asyncio.Event()
        self._state = "starting"
        self._held: set[str] = set()
        self.metrics_server: MetricsServer | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``starting``, ``ok``, ``stopping`` or ``stopped`` (``/healthz``)."""
        return self._state

    def request_stop(self) -> None:
        """First call: stop popping, finish held jobs within ``shutdown_grace``. Second call: fault them now."""
        if self._stopping.is_set():
            log.warning("second stop request: faulting held jobs now")
            self._hard_stop.set()
            return
        log.info("stopping: no more pops; %d held job(s) may finish", len(self._held))
        self._state = "stopping"
        self._stopping.set()

    async def start(self) -> None:
        """Start the backend and compute the declaration. Raises whatever the backend raises."""
        if self.settings.metrics_port and self.metrics_server is None:
            self.metrics_server = MetricsServer(
                self.metrics, self.settings.metrics_host, self.settings.metrics_port, lambda: self.state
            )
            self.metrics_server.start()
        self.capabilities = await self.backend.start()
        if not self.model_id:
            self.model_id = self.capabilities.model_name or self.backend.kind
        if self.model_id not in self.models:
            self.models = [self.model_id, *self.models]
        self.declaration = build_declaration(
            self.capabilities,
            model_id=self.model_id,
            prompt_jobs=self.settings.prompt_jobs,
            max_context_length=self.settings.max_context_length,
            max_length=self.settings.max_length,
            only_features=self.settings.features or None,
            disabled_features=self.settings.disable_features or None,
            messages_url=self.settings.messages_url,
        )
        log.info("declaration: %s", json.dumps(self.declaration, sort_keys=True))

    async def run(self) -> None:
        """Start, run ``threads`` pop loops until stopped, then fault what is left and close."""
        try:
            await self.start()
            self._state = "ok"
            loops = [
                asyncio.create_task(self._pop_loop(n), name=f"pop-{n}") for n in range(self.settings.threads)
            ]
            stop_wait = asyncio.create_task(self._stopping.wait())
            await asyncio.wait([stop_wait, *loops], return_when=asyncio.FIRST_COMPLETED)
            if not self._stopping.is_set():  # a loop ended on its own: a bug; stop the others cleanly
                self.request_stop()
            grace = asyncio.create_task(self._grace_timer())
            for result in await asyncio.gather(*loops, return_exceptions=True):
                if isinstance(result, BaseException):
                    log.error("pop loop failed: %r", result)
            grace.cancel()
            stop_wait.cancel()
        finally:
            self._state = "stopped"
            await self.backend.close()
            await self.http.aclose()
            if self.metrics_server is not None:
                self.metrics_server.stop()

    async def _grace_timer(self) -> None:
        await asyncio.sleep(self.settings.shutdown_grace)
        if self._held:
            log.warning("shutdown grace over: faulting %d held job(s)", len(self._held))
        self._hard_stop.set()

    async def _sleep(self, seconds: float) -> None:
        """Sleep unless a stop is requested first."""
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except TimeoutError:
            pass

    # -- pop -------------------------------------------------------------------------------------------------

    def pop_body(self) -> dict[str, Any]:
        """The pop body: upstream fields plus the chat declaration (sent on every pop), and ``wait_seconds``
        unless ``pop_wait_seconds`` is 0."""
        limits = self.declaration.get("chat_limits", {})
        body: dict[str, Any] = {
            "name": self.settings.name,
            "models": self.models,
            "max_length": limits.get("max_length", self.settings.max_length),
            "max_context_length": limits.get("max_context_length", self.settings.max_context_length),
            "threads": self.settings.threads,
            "amount": 1,
            "bridge_agent": self.bridge_agent,
            "softprompts": [],
            **self.declaration,
        }
        if self.settings.pop_wait_seconds > 0:
            body["wait_seconds"] = self.settings.pop_wait_seconds
        return body

    async def _pop(self, url: str) -> httpx.Response | None:
        """One pop; None when a stop was requested while a long poll was held and it did not answer within
        :data:`POP_STOP_GRACE_SECONDS` (the poll is abandoned)."""
        wait = self.settings.pop_wait_seconds
        if wait <= 0:
            return await self.http.post(url, json=self.pop_body())
        timeout = httpx.Timeout(max(60.0, wait + POP_TIMEOUT_MARGIN_SECONDS), connect=10.0)
        pop = asyncio.create_task(self.http.post(url, json=self.pop_body(), timeout=timeout))
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({pop, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not pop.done():
                await asyncio.wait({pop}, timeout=POP_STOP_GRACE_SECONDS)
        finally:
            stop.cancel()
            if not pop.done():
                pop.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                    await pop
        return None if pop.cancelled() else pop.result()

    async def _pop_loop(self, slot: int) -> None:
        empty = 0
        url = api_url(self.settings.dispatch_url or "", POP_PATH)
        wait = self.settings.pop_wait_seconds
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                resp = await self._pop(url)
            except httpx.HTTPError as exc:
                self.metrics.pops.labels("error").inc()
                log.warning("pop failed (%s): %r", url, exc)
                await self._sleep(self.timings.connect_error)
                continue
            if resp is None:
                break
            if resp.status_code != 200:
                self.metrics.pops.labels("error").inc()
                log.warning("pop answered %d: %s", resp.status_code, resp.text[:300])
                await self._sleep(self.timings.pop_error)
                continue
            try:
                data = resp.json()
            except ValueError:
                data = {}
            if not isinstance(data, dict) or not data.get("id"):
                self.metrics.pops.labels("empty").inc()
                if wait > 0 and time.monotonic() - started >= wait / 2:
                    # The horde held the pop for its wait: nothing to sleep off, pop again at once.
                    empty = 0
                    continue
                empty += 1
                await self._sleep(empty_pop_delay(empty, self.timings.empty_pop))
                continue
            empty = 0
            self.metrics.pops.labels("job").inc()
            try:
                await self._handle(data)
            except Exception:  # never let one job end the loop
                log.exception("job %s: unexpected error", data.get("id"))

    # -- one job ---------------------------------------------------------------------------------------------

    async def _handle(self, pop: dict[str, Any]) -> None:
        job_id = str(pop["id"])
        is_chat = pop.get("chat") is True
        kind = "chat" if is_chat else "text"
        self._held.add(job_id)
        self.metrics.in_flight.inc()
        try:
            try:
                body, fault_reason = await self._produce(pop, is_chat)
            except JobCancelled as cancel:
                log.info("job %s: %s by the horde; generation stopped, not submitted", job_id, cancel.reason)
                self.metrics.jobs.labels(kind, "cancelled").inc()
                return
            if body is None:
                outcome = await self._submit_fault(job_id, is_chat, fault_reason)
            else:
                outcome = await self._submit_reply(job_id, body, is_chat)
            self.metrics.jobs.labels(kind, outcome).inc()
        finally:
            self._held.discard(job_id)
            self.metrics.in_flight.dec()

    async def _produce(self, pop: dict[str, Any], is_chat: bool) -> tuple[dict[str, Any] | None, str | None]:
        """Generate; return ``(submit body, None)`` or ``(None, fault reason or None)``."""
        job_id = str(pop["id"])
        ttl = int(pop["ttl"]) if isinstance(pop.get("ttl"), int) else TEXT_JOB_LEASE_SECONDS
        # the horde renews a lease to its base length (the pop's ttl, TEXT_JOB_LEASE_SECONDS) after each post
        renewal = self.timings.lease_renewal if self.timings.lease_renewal is not None else ttl
        lease = JobLease.from_ttl(ttl, self.timings.lease_margin, renewal=renewal, cap=self.timings.lease_cap)
        started = lease.started
        gen = asyncio.create_task(self._generate(pop, is_chat, lease))
        hard = asyncio.create_task(self._hard_stop.wait())
        try:
            while True:  # the deadline moves while progress posts are accepted
                left = lease.remaining()
                if left <= 0:
                    break
                done, _ = await asyncio.wait([gen, hard], timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if done:
                    break
        finally:
            hard.cancel()
        self.metrics.generation.labels("chat" if is_chat else "text").observe(time.monotonic() - started)
        if not gen.done():
            gen.cancel()
            await asyncio.wait([gen], timeout=5.0)  # let the backend stop its generation (close, abort)
            if self._hard_stop.is_set():
                log.warning("job %s: faulted on shutdown", job_id)
                return None, None
            log.warning("job %s: backend did not answer within %.0f s", job_id, time.monotonic() - started)
            return None, ChatFaultReason.generation_error.value
        try:
            return gen.result(), None
        except JobCancelled:
            raise
        except BackendFault as fault:
            log.info("job %s: fault %s (%s)", job_id, fault.reason, fault)
            return None, fault.reason
        except Exception as exc:
            log.exception("job %s: backend failed: %r", job_id, exc)
            return None, ChatFaultReason.generation_error.value

    async def _generate(self, pop: dict[str, Any], is_chat: bool, lease: JobLease) -> dict[str, Any]:
        if not is_chat:
            text_job = TextJob.from_pop(pop)
            limit = int(self.declaration.get("chat_limits", {}).get("max_length", self.settings.max_length))
            requested = text_job.payload.get("max_length")
            max_length = min(limit, int(requested)) if isinstance(requested, int) and requested > 0 else limit
            return build_text_submit(text_job, await self.backend.generate_text(text_job, max_length))
        try:
            job = ChatJob.from_pop(pop)
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendFault(None, f"unreadable chat payload: {exc!r}") from exc
        if not job.messages and job.messages_url:
            job.messages = await self._fetch_messages(job.messages_url)
        declared = frozenset(self.declaration.get("chat_features", []))
        if self.streams(job):
            output = await self._stream_chat(job, lease)
        else:
            output = await self.backend.generate_chat(job)
        # In a thread: a strict schema's check may take up to its bound (horde_contract.reply_schema), and the
        # loop keeps other jobs' progress posts and lease renewals going meanwhile.
        return await asyncio.to_thread(build_chat_submit, job, output, self.model_id, declared)

    # -- streaming progress ----------------------------------------------------------------------------------

    def streams(self, job: ChatJob) -> bool:
        """Whether to stream a chat job: it carries the stream hint, has no tools (tool calls are checked, and
        text parsed into calls, only once the reply is whole), and progress is on."""
        return self.settings.progress and job.stream_progress and not job.tools

    async def _stream_chat(self, job: ChatJob, lease: JobLease) -> ChatOutput:
        """Generate with the backend's ``stream_chat`` while a :class:`ProgressSession` posts the deltas.

        Returns the backend's final output (submitted as usual). Raises :class:`JobCancelled` when the horde
        cancels or aborts the job; the backend's generation is stopped at once. The last pending delta is
        posted before returning, within ``progress_flush`` seconds.
        """
        session = ProgressSession(
            self.http,
            api_url(self.settings.submit_url or "", PROGRESS_PATH),
            job.id,
            ProgressPolicy(
                interval=self.settings.progress_interval,
                resends=self.timings.progress_resends,
                resend_delay=self.timings.progress_resend_delay,
                timeout=self.timings.progress_timeout,
            ),
            self.metrics,
            on_accepted=lease.renew,
        )
        consume = asyncio.create_task(self._consume_stream(job, session))
        poster = asyncio.create_task(session.run())
        aborted = asyncio.create_task(session.aborted.wait())
        try:
            await asyncio.wait([consume, aborted], return_when=asyncio.FIRST_COMPLETED)
            if session.abort_reason is not None:
                raise JobCancelled(session.abort_reason)
            output = consume.result()
            session.finish()
            await asyncio.wait(
                [poster, aborted], timeout=self.timings.progress_flush, return_when=asyncio.FIRST_COMPLETED
            )
            if session.abort_reason is not None:
                raise JobCancelled(session.abort_reason)
            return output
        finally:
            for task in (consume, poster, aborted):
                task.cancel()
            await asyncio.gather(consume, poster, aborted, return_exceptions=True)

    async def _consume_stream(self, job: ChatJob, session: ProgressSession) -> ChatOutput:
        async with aclosing(self.backend.stream_chat(job)) as items:
            async for item in items:
                if isinstance(item, ChatOutput):
                    return item
                session.add(item)
        raise BackendFault(
            ChatFaultReason.generation_error.value, "the backend's stream ended without a reply"
        )

    async def _fetch_messages(self, url: str) -> list[dict[str, Any]]:
        """GET an offloaded messages array (docs/native-api.md#messages-offload): gzip honoured, 36 MiB cap. A failure is a
        fault without reason (docs/worker-guide.md#faults)."""
        try:
            async with httpx.AsyncClient(timeout=30.0, follow_redirects=True) as client:
                async with client.stream("GET", url) as resp:
                    if resp.status_code != 200:
                        raise BackendFault(None, f"messages_url answered {resp.status_code}")
                    chunks, size = [], 0
                    async for chunk in resp.aiter_bytes():  # decoded: Content-Encoding gzip is undone here
                        size += len(chunk)
                        if size > MAX_CHAT_BODY_BYTES:
                            raise BackendFault(None, "messages_url body over 36 MiB")
                        chunks.append(chunk)
            messages = json.loads(b"".join(chunks))
        except httpx.HTTPError as exc:
            raise BackendFault(None, f"messages_url fetch failed: {exc!r}") from exc
        except ValueError as exc:
            raise BackendFault(None, f"messages_url is not JSON: {exc}") from exc
        if not isinstance(messages, list):
            raise BackendFault(None, "messages_url is not an array")
        return messages

    # -- submit ----------------------------------------------------------------------------------------------

    async def _submit_fault(self, job_id: str, is_chat: bool, reason: str | None) -> str:
        self.metrics.faults.labels(reason or "none").inc()
        body = build_chat_fault(job_id, self.model_id, reason) if is_chat else build_text_fault(job_id)
        outcome = await self._post_submit(job_id, body)
        return "faulted" if outcome == "ok" else "dropped"

    async def _submit_reply(self, job_id: str, body: dict[str, Any], is_chat: bool) -> str:
        outcome = await self._post_submit(job_id, body)
        if outcome == "ok":
            return "submitted"
        if outcome == "refused":
            reason = ChatFaultReason.reply_refused.value if is_chat else None
            await self._submit_fault(job_id, is_chat, reason)
            return "refused"
        return "dropped"

    async def _post_submit(self, job_id: str, body: dict[str, Any]) -> str:
        """POST one submit with retries. Returns ``ok``, ``refused`` (a 400 other than AbortedGen/DuplicateGen)
        or ``dropped`` (404, AbortedGen, DuplicateGen, auth errors, or attempts exhausted)."""
        url = api_url(self.settings.submit_url or "", SUBMIT_PATH)
        for attempt in range(self.timings.submit_attempts):
            try:
                resp = await self.http.post(url, json=body)
            except httpx.HTTPError as exc:
                self.metrics.submits.labels("error").inc()
                log.warning("job %s: submit failed: %r", job_id, exc)
            else:
                status = resp.status_code
                self.metrics.submits.labels(str(status)).inc()
                if status == 200:
                    return "ok"
                rc, message = _error(resp)
                if status == 404:
                    log.info("job %s: gone (404 %s); dropped", job_id, rc)
                    return "dropped"
                if status == 400:
                    if rc in (RC.AbortedGen, RC.DuplicateGen):
                        log.info("job %s: %s; dropped", job_id, rc)
                        return "dropped"
                    log.warning("job %s: submit refused: %s %s", job_id, rc, message[:300])
                    return "refused"
                if status != 429 and status < 500:
                    log.error("job %s: submit answered %d %s %s; dropped", job_id, status, rc, message[:300])
                    return "dropped"
                log.warning("job %s: submit answered %d; retrying", job_id, status)
            if self._hard_stop.is_set():
                return "dropped"
            await asyncio.sleep(self.timings.submit_delay(attempt))
        log.error("job %s: submit gave up after %d attempts", job_id, self.timings.submit_attempts)
        return "dropped"


def _error(resp: httpx.Response) -> tuple[str | None, str]:
    """``(rc, message)`` of a Horde error envelope ``{"message", "rc"}``."""
    try:
        data = resp.json()
    except ValueError:
        return None, resp.text
    if not isinstance(data, dict):
        return None, resp.text
    return data.get("rc"), str(data.get("message", ""))
