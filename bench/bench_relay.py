"""Benchmark of relayed streams: worker progress post → client chunk through the real front.

Run: ``uv run python bench/bench_relay.py`` (``--quick`` for a ~30 s run). Admission, dispatch, submit and the
OpenAI front (``python -m horde_oai``) run as processes on the real PostgreSQL and Redis of horde_testing,
with admission's rate limits raised, the requester's concurrency raised, the front's in-flight caps above the
stream count and pacing off (``HORDE_OAI_DELTA_PACING_MAX_WINDOW_SECONDS=0``, so each post is one chunk).
Every other setting is the default (the front re-reads each request's status every 5 s, sends a keepalive
comment after 10 s without an event). This process is both the OpenAI client and the worker:

- the client opens relayed streams (``POST /v1/chat/completions``, ``stream: true``, no tools, no
  response_format) with raw httpx streaming and parses the SSE ``data:`` lines; each stream's user message
  carries a tag, so the worker can tell which popped job belongs to which stream;
- the worker pops the jobs from dispatch (``POST /api/v2/generate/text/pop`` with a chat declaration), posts
  progress deltas to submit (``POST /api/v2/generate/text/progress``, the owner's ``apikey``), each delta's
  content carrying a unique marker ``[m<seq>]``, then submits the final reply (the concatenated deltas) so
  the stream ends with the finish chunk and ``data: [DONE]``.

Two measurements:

1. **Relay latency**, from just before the progress post is sent to when the client reads the chunk with its
   marker (same process, monotonic clock); the post's own round trip is reported beside it, and the time from
   the final submit to ``[DONE]``.

   - back to back (``--concurrency``, default 1 8 32 streams, ``--posts`` deltas each): once every stream's
     headers arrived, each stream posts seq 1 (its first delta) and waits for it; once every stream's seq 1 was
     read, each stream's poster posts seq 2..K, the next as soon as the previous answered (one keep-alive
     connection per poster), which gives posts/s and the post round trips; the final reply is submitted once
     the client saw every marker;
   - one after another, reader blocking on an idle stream (``--first-trials`` streams): one stream stays open
     without posts, so the front's reader sits in full ``XREAD BLOCK 250`` rounds; each trial stream posts seq
     1 as soon as its headers arrive and seq 2 once seq 1 was read. A stream registers with the reader before
     its native submit, and its key joins the next XREAD, not the pending one: this is the first delta's
     worst case.

2. **Holding N relayed streams** (``--streams``, default 1000): N streams opened (``--opening`` at a time) and
   their jobs popped, then every stream gets a post about every ``--hold-interval`` s (staggered) for
   ``--hold-seconds``. Reported: the front's RSS (``/proc/<pid>/status`` VmRSS) before, with the streams open
   and the most while holding; the CPU of the front and of every other process during the hold (the load
   generator shares the cores); the chunk latency; the lag of posts behind their schedule (the client falling
   behind); the front's ``/healthz`` round trip (its event loop's lag); the front's XREAD rounds that returned
   entries. Then every stream is finished (``--end-rate`` a second) and the time from each final submit to its
   ``[DONE]`` is reported. Posts go through submit's HTTP route (``--hold-posts http``, the default), straight
   to Redis with the route's own Lua append (``redis``: ``horde_core.chat_stream.ProgressAppender``, which
   takes submit and most of the client's work off the shared cores; the front cannot tell the difference),
   nowhere (``idle``: only the cost of holding), or each in turn (``all``).

Afterwards every stream must have got all its markers, in order, and ``[DONE]`` without an error event; any
failure (a refused post or submit, a lost or reordered marker, an error event, a stream that never ended) is
counted (by kind, and for the held streams by phase) and the script exits 1. ``uptime`` is printed before and
after, as the machine is shared. ``PYTHONPATH`` reaches the service processes, so a patched copy of a
service's package can be measured without touching the tree.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as redis
from _harness import (
    SALT,
    Service,
    bench_parser,
    bench_stores,
    exit_on_failures,
    percentile_ms,
    print_table,
    running_services,
    seed_client_and_owner,
)
from horde_core.chat_stream import AppendStatus, ProgressAppender, lease_key_check
from horde_core.redis_keys import signal_client
from horde_store.users import hash_api_key

MODEL = "bench/relay-chat-13b"
WORKER_NAME = "bench-relay-worker"
MAX_TOKENS = 128  # the progress byte cap is 16 bytes a token: 2,048 bytes, far above what a stream posts
POPPERS = 8
SUBMITTERS = 16
OPENING = 16  # streams opening at once (until their headers arrive)
MARKER = re.compile(r"\[m(\d+)\]")
TAG = re.compile(r"relaytag:([0-9a-f]+-\d+);")
FRONT_ENV = {
    "HORDE_CHAT_REQUEST_2SEC_LIMIT_PER_IP": "100000/second",
    "HORDE_CHAT_REQUEST_90MIN_LIMIT_PER_IP": "100000/second",
    "HORDE_APIKEY_REQUEST_LIMIT": "100000/second",
    "HORDE_OAI_DELTA_PACING_MAX_WINDOW_SECONDS": "0",
}


def delta(seq: int) -> str:
    """A few tokens of text with the post's marker."""
    return f" token{seq} [m{seq}]"


def pop_body() -> dict[str, Any]:
    return {
        "name": WORKER_NAME,
        "models": [MODEL],
        "max_length": 1024,
        "max_context_length": 8192,
        "threads": 1,
        "amount": 1,
        "bridge_agent": "Horde Chat Worker:0.1.0:bench",
        "softprompts": [],
        "chat_jobs": True,
        "prompt_jobs": False,
        "chat_features": ["seed", "prompt_overflow_refused"],
        "chat_limits": {"max_context_length": 8192, "max_length": 1024},
        "model_id": MODEL,
        "image_transports": [],
    }


# --- processes ------------------------------------------------------------------------------------------------


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        with open("/proc/loadavg") as f:
            return "loadavg " + f.read().strip()


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` in MiB (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Stack:
    front: Service
    admission: Service
    dispatch: Service
    submit: Service
    client_key: str
    owner_key: str

    def pid(self, name: str) -> int:
        service: Service = getattr(self, name)
        assert service.process.proc is not None
        return service.process.proc.pid


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in os.environ (the service processes inherit it) for the block."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def running_stack(dsn: str, redis_url: str, streams: int) -> Iterator[tuple[Service, ...]]:
    """dispatch and submit, then admission (pointed at their gRPC ports) and the front (at admission)."""
    with ExitStack() as stack:
        stack.enter_context(environment(FRONT_ENV))
        [dispatch] = stack.enter_context(running_services("dispatch", dsn, redis_url, names=["dispatch"]))
        [submit] = stack.enter_context(running_services("submit", dsn, redis_url, names=["submit"]))
        stack.enter_context(
            environment(
                {
                    "HORDE_DISPATCH_GRPC_TARGET": f"127.0.0.1:{dispatch.process.env['HORDE_DISPATCH_GRPC_PORT']}",
                    "HORDE_SUBMIT_GRPC_TARGET": f"127.0.0.1:{submit.process.env['HORDE_SUBMIT_GRPC_PORT']}",
                }
            )
        )
        [admission] = stack.enter_context(running_services("admission", dsn, redis_url, names=["admission"]))
        cap = str(max(2 * streams, 1024))
        stack.enter_context(
            environment(
                {
                    "HORDE_OAI_HORDE_URL": admission.url("/api"),
                    "HORDE_OAI_MAX_IN_FLIGHT": cap,
                    "HORDE_OAI_MAX_IN_FLIGHT_PER_ADDRESS": cap,
                }
            )
        )
        [front] = stack.enter_context(running_services("oai", dsn, redis_url, names=["oai-front"]))
        yield front, admission, dispatch, submit


async def seed(dsn: str) -> tuple[str, str]:
    """The requester (kudos and concurrency to spare) and the worker owner: their API keys."""
    return await seed_client_and_owner(dsn, "relay", 1000000)


# --- the client side ------------------------------------------------------------------------------------------


@dataclass
class Stream:
    """One relayed stream as the client sees it, and its job as the worker sees it."""

    tag: str
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    status: int = 0
    text: str = ""
    scanned: int = 0
    seen: dict[int, float] = field(default_factory=dict)  # seq → monotonic time its chunk was read
    order: list[int] = field(default_factory=list)
    sent: dict[int, float] = field(default_factory=dict)  # seq → monotonic time just before its post
    marker_waiters: dict[int, asyncio.Event] = field(default_factory=dict)
    done: bool = False
    finish_reason: str | None = None
    error: str = ""
    error_at: float = 0.0  # monotonic time the error was seen
    gen_id: str = ""
    final_sent: float = 0.0
    final_rtt: float = 0.0
    done_at: float = 0.0

    def wait_marker(self, seq: int) -> asyncio.Event:
        event = self.marker_waiters.setdefault(seq, asyncio.Event())
        if seq in self.seen:
            event.set()
        return event

    def on_text(self, text: str, now: float) -> None:
        self.text += text
        for m in MARKER.finditer(self.text, max(0, self.scanned - 16)):
            if m.end() <= self.scanned:
                continue
            seq = int(m.group(1))
            if seq not in self.seen:
                self.seen[seq] = now
                self.order.append(seq)
                if seq in self.marker_waiters:
                    self.marker_waiters[seq].set()
        self.scanned = len(self.text)

    def problems(self, posts: int) -> str:
        if self.error:
            return self.error
        if not self.done:
            return f"{self.tag}: no [DONE] (status {self.status}, markers {self.order[-3:]})"
        if self.order != list(range(1, posts + 1)):
            return f"{self.tag}: markers {self.order[:5]}...{self.order[-3:]} ({len(self.order)} of {posts})"
        if self.finish_reason is None:
            return f"{self.tag}: no finish chunk"
        return ""


def chat_body(tag: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Count for the bench. relaytag:{tag};"}],
        "stream": True,
        "max_tokens": MAX_TOKENS,
    }


async def read_stream(
    client: httpx.AsyncClient, url: str, key: str, stream: Stream, opening: asyncio.Semaphore
) -> None:
    """Open the relayed stream and read it to the end."""
    held = True
    await opening.acquire()
    try:
        async with client.stream(
            "POST", url, json=chat_body(stream.tag), headers={"Authorization": f"Bearer {key}"}
        ) as response:
            stream.status = response.status_code
            opening.release()
            held = False
            if response.status_code != 200:
                stream.error = f"{stream.tag}: {response.status_code} {(await response.aread())[:300]!r}"
                stream.error_at = time.monotonic()
                return
            stream.opened.set()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.monotonic()
                data = line[6:]
                if data == "[DONE]":
                    stream.done = True
                    stream.done_at = now
                    break
                event = json.loads(data)
                if "error" in event:
                    stream.error = f"{stream.tag}: error event {data[:300]}"
                    stream.error_at = now
                    continue
                for choice in event.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        stream.on_text(text, now)
                    if choice.get("finish_reason"):
                        stream.finish_reason = choice["finish_reason"]
    except (httpx.HTTPError, ValueError) as exc:
        stream.error = f"{stream.tag}: {type(exc).__name__}: {exc}"
        stream.error_at = time.monotonic()
    finally:
        if held:
            opening.release()
        stream.opened.set()  # wake a waiter of a stream that failed to open
        stream.ended.set()


def client_pools(streams: int, per_client: int = 50) -> list[httpx.AsyncClient]:
    """Clients for ``streams`` long-lived streams: several small pools, as httpx's pool walks its connections
    on every request it assigns."""
    count = max(1, math.ceil(streams / per_client))
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    timeout = httpx.Timeout(120.0, connect=30.0, pool=600.0)
    return [httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) for _ in range(count)]


def one_connection_clients(count: int) -> list[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return [httpx.AsyncClient(limits=limits, timeout=60.0, trust_env=False) for _ in range(count)]


# --- the worker side ------------------------------------------------------------------------------------------


class Worker:
    """The bench worker: pops jobs and posts progress and final replies."""

    def __init__(self, stack: Stack, signals: redis.Redis) -> None:
        self.stack = stack
        self.pop_url = stack.dispatch.url("/api/v2/generate/text/pop")
        self.progress_url = stack.submit.url("/api/v2/generate/text/progress")
        self.submit_url = stack.submit.url("/api/v2/generate/text/submit")
        self.headers = {"apikey": stack.owner_key}
        self.appender = ProgressAppender(signals)
        self.key_check = lease_key_check(hash_api_key(stack.owner_key, SALT))
        self.failures: list[str] = []
        # Made once: an httpx client costs some 20 ms of CPU to make (its SSL context), which would stall the
        # event loop, and with it the streams' readers, in the middle of a measurement.
        self.poppers = one_connection_clients(POPPERS)
        self.submitters = one_connection_clients(SUBMITTERS)

    async def aclose(self) -> None:
        for c in self.poppers + self.submitters:
            await c.aclose()

    async def check_in(self) -> None:
        """One empty pop, so the worker is online and admission knows its model."""
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
            r = await client.post(self.pop_url, json=pop_body(), headers=self.headers)
            r.raise_for_status()

    async def pop_all(self, streams: dict[str, Stream], deadline: float) -> None:
        """Pop until every stream's job is popped (``POPPERS`` concurrent pop loops)."""
        waiting = {tag for tag, s in streams.items() if not s.gen_id}

        async def loop(client: httpx.AsyncClient) -> None:
            while waiting and time.monotonic() < deadline:
                # A stream that failed before its request was queued has no job to pop.
                waiting.difference_update([t for t in waiting if streams[t].ended.is_set()])
                if not waiting:
                    break
                try:
                    r = await client.post(self.pop_url, json=pop_body(), headers=self.headers)
                except httpx.HTTPError as exc:
                    self.failures.append(f"pop: {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.2)
                    continue
                if r.status_code != 200:
                    self.failures.append(f"pop: {r.status_code} {r.text[:200]}")
                    await asyncio.sleep(0.2)
                    continue
                job = r.json()
                if not job.get("id"):
                    await asyncio.sleep(0.05)
                    continue
                found = TAG.search(json.dumps(job.get("payload")))
                stream = streams.get(found.group(1)) if found else None
                if stream is None or stream.gen_id:
                    # A job of an earlier case's stream that failed after its request was queued (that
                    # failure is counted there), or a job handed out twice (counted here).
                    if stream is not None:
                        self.failures.append(f"pop: job of {stream.tag} handed out twice")
                    continue
                stream.gen_id = str(job["id"])
                waiting.discard(stream.tag)

        await asyncio.gather(*(loop(c) for c in self.poppers))
        if waiting:
            self.failures.append(f"pop: {len(waiting)} jobs never popped")

    async def post(self, client: httpx.AsyncClient | None, stream: Stream, seq: int) -> float:
        """Post ``seq`` (over HTTP with ``client``, else straight to Redis); returns its round trip in seconds."""
        text = delta(seq)
        t0 = time.monotonic()
        stream.sent[seq] = t0
        try:
            if client is None:
                result = await self.appender.append(
                    stream.gen_id, key_check=self.key_check, seq=seq, content=text
                )
                rtt = time.monotonic() - t0
                if result.status is not AppendStatus.ok or result.cancelled:
                    self.failures.append(f"append {stream.tag} seq {seq}: {result}")
                return rtt
            r = await client.post(
                self.progress_url,
                json={"id": stream.gen_id, "seq": seq, "delta": {"content": text}},
                headers=self.headers,
            )
            rtt = time.monotonic() - t0
            if r.status_code != 200 or r.json() != {"accepted_seq": seq, "cancelled": False}:
                self.failures.append(f"progress {stream.tag} seq {seq}: {r.status_code} {r.text[:200]}")
            return rtt
        except (httpx.HTTPError, redis.RedisError) as exc:
            self.failures.append(f"progress {stream.tag} seq {seq}: {type(exc).__name__}: {exc}")
            return time.monotonic() - t0

    async def finish(self, client: httpx.AsyncClient, stream: Stream, posts: int) -> None:
        """Submit the final reply: the concatenated deltas, so nothing is left to send but the end."""
        body = {
            "id": stream.gen_id,
            "message": {
                "role": "assistant",
                "content": "".join(delta(s) for s in range(1, posts + 1)) or " idle",
            },
            "finish_reason": "stop",
            "native_finish_reason": "eos",
            "model_id": MODEL,
        }
        stream.final_sent = time.monotonic()
        try:
            r = await client.post(self.submit_url, json=body, headers=self.headers)
        except httpx.HTTPError as exc:
            self.failures.append(f"submit {stream.tag}: {type(exc).__name__}: {exc}")
            return
        stream.final_rtt = time.monotonic() - stream.final_sent
        if r.status_code != 200:
            self.failures.append(f"submit {stream.tag}: {r.status_code} {r.text[:200]}")


async def open_streams(
    stack: Stack,
    worker: Worker,
    count: int,
    clients: list[httpx.AsyncClient],
    limit: float,
    readers: list[asyncio.Task[None]],
    opening_at_once: int = OPENING,
) -> tuple[dict[str, Stream], float]:
    """Open ``count`` streams (their reader tasks go to ``readers``) and pop their jobs; returns the streams and
    the seconds it took."""
    run = uuid.uuid4().hex[:8]
    streams = {f"{run}-{i}": Stream(f"{run}-{i}") for i in range(count)}
    url = stack.front.url("/v1/chat/completions")
    opening = asyncio.Semaphore(opening_at_once)
    t0 = time.monotonic()
    readers += [
        asyncio.create_task(read_stream(clients[i % len(clients)], url, stack.client_key, s, opening))
        for i, s in enumerate(streams.values())
    ]
    await worker.pop_all(streams, time.monotonic() + limit)
    await asyncio.wait_for(asyncio.gather(*(s.opened.wait() for s in streams.values())), limit)
    return streams, time.monotonic() - t0


async def end_streams(
    worker: Worker,
    streams: dict[str, Stream],
    readers: list[asyncio.Task[None]],
    posts: int,
    limit: float,
    rate: float = 0.0,
) -> list[str]:
    """Submit every final reply (``SUBMITTERS`` at a time; at most ``rate`` a second when given), wait for
    every stream's end; returns the problems."""
    queue: asyncio.Queue[Stream] = asyncio.Queue()
    for s in streams.values():
        if s.gen_id:
            queue.put_nowait(s)
    start = time.monotonic()
    taken = 0

    async def submitter(client: httpx.AsyncClient) -> None:
        nonlocal taken
        while not queue.empty():
            stream = queue.get_nowait()
            if rate > 0:
                taken += 1
                await asyncio.sleep(max(0.0, start + taken / rate - time.monotonic()))
            await worker.finish(client, stream, posts)

    await asyncio.gather(*(submitter(c) for c in worker.submitters))
    await wait_readers(readers, limit)
    return [p for p in (s.problems(posts) for s in streams.values()) if p]


async def close_all(readers: list[asyncio.Task[None]], clients: list[httpx.AsyncClient]) -> None:
    """Cancel the readers still running, then close the clients."""
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for c in clients:
        await c.aclose()


async def wait_readers(readers: list[asyncio.Task[None]], limit: float) -> None:
    """Wait for the streams' readers to end; a reader still running after ``limit`` seconds is cancelled (its
    stream then has no [DONE], which the check reports)."""
    _, pending = await asyncio.wait(readers, timeout=limit)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def marker_latencies(streams: dict[str, Stream], first: bool) -> list[float]:
    return [
        s.seen[seq] - t
        for s in streams.values()
        for seq, t in s.sent.items()
        if seq in s.seen and (seq == 1) == first
    ]


# --- 1. relay latency -----------------------------------------------------------------------------------------


@dataclass
class LatencyRow:
    case: str
    streams: int
    posts: int
    per_second: float
    rtt: list[float]
    chunk: list[float]
    first: list[float]
    done: list[float]
    failures: int
    first_failure: str
    failure_list: list[str] = field(default_factory=list)


async def latency_case(stack: Stack, worker: Worker, concurrency: int, posts: int) -> LatencyRow:
    clients = client_pools(concurrency)
    posters = one_connection_clients(concurrency)
    failures_before = len(worker.failures)
    readers: list[asyncio.Task[None]] = []
    try:
        streams, _ = await open_streams(stack, worker, concurrency, clients, 120.0, readers)
        rtts: list[float] = []
        live = [s for s in streams.values() if s.gen_id and not s.error]
        first_read = asyncio.Barrier(len(live) + 1)
        go = asyncio.Event()
        ends: list[float] = []

        async def drive(slot: int, stream: Stream) -> None:
            # seq 1 alone (its stream's first delta), then seq 2..K back to back once every stream's seq 1 was
            # read, so the later deltas measure the relay in its stride, not the first read's wait.
            await worker.post(posters[slot], stream, 1)
            try:
                await asyncio.wait_for(stream.wait_marker(1).wait(), 10.0)
            except TimeoutError:
                pass  # reported by the stream check
            await first_read.wait()
            await go.wait()
            for seq in range(2, posts + 1):
                rtts.append(await worker.post(posters[slot], stream, seq))
            ends.append(time.monotonic())
            try:
                await asyncio.wait_for(stream.wait_marker(posts).wait(), 10.0)
            except TimeoutError:
                pass
            await worker.finish(posters[slot], stream, posts)

        tasks = [asyncio.create_task(drive(i, s)) for i, s in enumerate(live)]
        await first_read.wait()
        t0 = time.monotonic()
        go.set()
        await asyncio.gather(*tasks)
        elapsed = max(ends, default=t0 + 1.0) - t0
        await wait_readers(readers, 60.0)
        problems = [p for p in (s.problems(posts) for s in streams.values()) if p]
    finally:
        await close_all(readers, clients + posters)
    failures = problems + worker.failures[failures_before:]
    return LatencyRow(
        "back to back",
        concurrency,
        len(rtts),
        len(rtts) / elapsed,
        rtts,
        marker_latencies(streams, first=False),
        marker_latencies(streams, first=True),
        [s.done_at - s.final_sent for s in streams.values() if s.done and s.final_sent and not s.error],
        len(failures),
        failures[0] if failures else "",
        failures,
    )


async def first_delta_case(stack: Stack, worker: Worker, trials: int) -> LatencyRow:
    """A stream's first delta while the reader blocks on another stream: one idle stream stays open (so every
    ``XREAD BLOCK 250`` runs its full 250 ms), then ``trials`` streams, one after the other, post seq 1 as soon
    as their headers arrive and seq 2 once seq 1 was read. A stream registers with the reader before its native
    submit; its key joins the next XREAD, not the one pending."""
    clients = client_pools(2)
    [poster] = one_connection_clients(1)
    failures_before = len(worker.failures)
    streams: dict[str, Stream] = {}
    readers: list[asyncio.Task[None]] = []
    try:
        idle, _ = await open_streams(stack, worker, 1, clients, 60.0, readers)
        streams.update(idle)
        rtts: list[float] = []
        for _ in range(trials):
            one, _ = await open_streams(stack, worker, 1, clients, 60.0, readers)
            streams.update(one)
            [stream] = one.values()
            if not stream.gen_id or stream.error:
                continue
            for seq in (1, 2):
                rtts.append(await worker.post(poster, stream, seq))
                try:
                    await asyncio.wait_for(stream.wait_marker(seq).wait(), 15.0)
                except TimeoutError:
                    pass  # reported by the stream check
            await worker.finish(poster, stream, 2)
        for stream in idle.values():
            for seq in (1, 2):
                rtts.append(await worker.post(poster, stream, seq))
            await worker.finish(poster, stream, 2)
        await wait_readers(readers, 60.0)
    finally:
        await close_all(readers, [*clients, poster])
    problems = [p for p in (s.problems(2) for s in streams.values()) if p]
    failures = problems + worker.failures[failures_before:]
    trial_streams = {tag: s for tag, s in streams.items() if tag not in idle}
    return LatencyRow(
        "one after another, reader blocking on an idle stream",
        trials,
        len(rtts),
        0.0,  # paced by the opening of each stream: no throughput figure
        rtts,
        marker_latencies(trial_streams, first=False),
        marker_latencies(trial_streams, first=True),
        [s.done_at - s.final_sent for s in trial_streams.values() if s.done and s.final_sent and not s.error],
        len(failures),
        failures[0] if failures else "",
        failures,
    )


# --- 2. holding many streams ----------------------------------------------------------------------------------


@dataclass
class HoldRow:
    streams: int
    mode: str
    open_seconds: float
    hold_seconds: float
    posts: int
    per_second: float
    rss_before: float
    rss_open: float
    rss_hold: float
    cpu: dict[str, float]  # share of one core during the hold, by process
    rtt: list[float]
    chunk: list[float]
    lag: list[float]
    done: list[float]
    submits: list[float]  # the final submits' round trips
    end_seconds: float  # from the first final submit to the last [DONE]
    health: list[float]
    errors_by_phase: dict[str, int]
    end_rate: float  # streams that ended with an error: while opening, holding, ending
    reads: float  # XREAD rounds with entries per second during the hold
    failures: int
    first_failure: str
    failure_list: list[str] = field(default_factory=list)


async def delta_reads(client: httpx.AsyncClient, metrics_url: str) -> float:
    text = (await client.get(metrics_url)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("horde_oai_delta_reads_total{") and 'outcome="entries"' in line
    )


async def redis_cpu(signals: redis.Redis) -> float:
    info = await signals.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def hold_case(
    stack: Stack,
    worker: Worker,
    signals: redis.Redis,
    count: int,
    hold_seconds: float,
    interval: float,
    mode: str,
    posters_count: int,
    opening_at_once: int,
    end_rate: float,
) -> HoldRow:
    front_pid = stack.pid("front")
    pids = {name: stack.pid(name) for name in ("front", "admission", "dispatch", "submit")}
    rounds = 0 if mode == "idle" else max(1, int(hold_seconds / interval))
    failures_before = len(worker.failures)
    clients = client_pools(count)
    posters = one_connection_clients(posters_count) if mode == "http" else []
    free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    appending = asyncio.Semaphore(posters_count)
    for c in posters:
        free.put_nowait(c)
    metrics = httpx.AsyncClient(timeout=30.0, trust_env=False)
    samples: list[float] = []
    readers: list[asyncio.Task[None]] = []
    health: list[float] = []  # the front's /healthz round trips while holding: its event loop's lag
    try:
        rss_before = rss_mib(front_pid)
        opened_from = time.monotonic()
        streams, open_seconds = await open_streams(
            stack, worker, count, clients, 600.0, readers, opening_at_once
        )
        await asyncio.sleep(1.0)
        rss_open = rss_mib(front_pid)
        rtts: list[float] = []
        lags: list[float] = []
        live = [s for s in streams.values() if s.gen_id and not s.error]

        async def drive(i: int, stream: Stream, start: float) -> None:
            phase = start + interval * i / len(live)
            for k in range(rounds):
                due = phase + k * interval
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if mode == "http":
                    client = await free.get()
                    try:
                        lags.append(time.monotonic() - due)
                        rtts.append(await worker.post(client, stream, k + 1))
                    finally:
                        free.put_nowait(client)
                else:
                    async with appending:  # within the Redis client's connection pool
                        lags.append(time.monotonic() - due)
                        rtts.append(await worker.post(None, stream, k + 1))

        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                samples.append(rss_mib(front_pid))
                t = time.monotonic()
                try:
                    await metrics.get(stack.front.url("/healthz"))
                    health.append(time.monotonic() - t)
                except httpx.HTTPError:
                    health.append(time.monotonic() - t)
                await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample())
        reads0 = await delta_reads(metrics, stack.front.url("/metrics"))
        cpu0 = {name: process_cpu(pid) for name, pid in pids.items()}
        cpu0["redis"] = await redis_cpu(signals)
        cpu0["bench client"] = time.process_time()
        start = time.monotonic() + 0.5
        if rounds:
            await asyncio.gather(*(drive(i, s, start) for i, s in enumerate(live)))
        else:
            await asyncio.sleep(0.5 + hold_seconds)
        posting = time.monotonic() - start
        held_until = time.monotonic()
        # Let the last chunks arrive before closing the CPU window.
        if live and rounds:
            _, late = await asyncio.wait(
                [asyncio.create_task(s.wait_marker(rounds).wait()) for s in live], timeout=15.0
            )
            for task in late:
                task.cancel()
        elapsed = time.monotonic() - start
        cpu1 = {name: process_cpu(pid) for name, pid in pids.items()}
        cpu1["redis"] = await redis_cpu(signals)
        cpu1["bench client"] = time.process_time()
        reads = (await delta_reads(metrics, stack.front.url("/metrics")) - reads0) / elapsed
        stop.set()
        await sampler
        problems = await end_streams(worker, streams, readers, rounds, 300.0, end_rate)
        ended = [s for s in streams.values() if s.done and s.final_sent and not s.error]
        errors = [s.error_at for s in streams.values() if s.error]
        by_phase = {
            "opening": sum(1 for t in errors if t < opened_from + open_seconds),
            "holding": sum(1 for t in errors if opened_from + open_seconds <= t < held_until),
            "ending": sum(1 for t in errors if t >= held_until),
        }
        end_seconds = max(s.done_at for s in ended) - min(s.final_sent for s in ended) if ended else 0.0
    finally:
        await close_all(readers, [*clients, *posters, metrics])
    failures = problems + worker.failures[failures_before:]
    return HoldRow(
        count,
        mode,
        open_seconds,
        posting,
        len(rtts),
        len(rtts) / posting,
        rss_before,
        rss_open,
        max(samples) if samples else 0.0,
        {name: (cpu1[name] - cpu0[name]) / elapsed for name in cpu0},
        rtts,
        marker_latencies(streams, first=False) + marker_latencies(streams, first=True),
        lags,
        [s.done_at - s.final_sent for s in streams.values() if s.done and s.final_sent and not s.error],
        [s.final_rtt for s in streams.values() if s.final_rtt],
        end_seconds,
        health,
        by_phase,
        end_rate,
        reads,
        len(failures),
        failures[0] if failures else "",
        failures,
    )


# --- main -----------------------------------------------------------------------------------------------------


def failure_kinds(failures: list[str]) -> str:
    """The failures counted by kind: ids, tags and numbers blanked."""
    kinds = Counter(re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{8}-\d+|\d+", "#", f)[:160] for f in failures)
    return "; ".join(f"{n} × {kind}" for kind, n in kinds.most_common(6))


def ms(values: list[float], q: float) -> str:
    return f"{percentile_ms(values, q):.1f}" if values else "-"


def main() -> None:
    parser = bench_parser(__doc__ or "", quick_help="a short run (~30 s): 1 and 8 streams, then 100 held")
    parser.set_defaults(concurrency=[1, 8, 32])
    parser.add_argument(
        "--posts", type=int, default=20, help="progress posts per stream in the latency cases"
    )
    parser.add_argument(
        "--first-trials", type=int, default=20, help="streams of the first-delta case (seq 1 and 2 each)"
    )
    parser.add_argument("--streams", type=int, default=1000, help="streams held open at once")
    parser.add_argument("--hold-seconds", type=float, default=20.0, help="how long the streams are held")
    parser.add_argument("--hold-interval", type=float, default=1.0, help="seconds between one stream's posts")
    parser.add_argument(
        "--hold-posts",
        choices=["http", "redis", "idle", "all"],
        default="http",
        help="hold posts through submit's HTTP route, straight to Redis with the route's Lua append, none "
        "(idle: the streams are only held), or each in turn",
    )
    parser.add_argument(
        "--opening", type=int, default=OPENING, help="held streams opening at once (until their headers)"
    )
    parser.add_argument(
        "--end-rate",
        type=float,
        default=100.0,
        help="held streams finished per second at the end (0: as fast as 16 submitters go)",
    )
    parser.add_argument("--posters", type=int, default=48, help="HTTP connections posting during the hold")
    if parser.parse_args().quick:  # smaller defaults; arguments given explicitly still win
        parser.set_defaults(concurrency=[1, 8], posts=10, first_trials=5, streams=100, hold_seconds=6.0)
    args = parser.parse_args()
    modes = ["idle", "http", "redis"] if args.hold_posts == "all" else [args.hold_posts]
    load_before = uptime()

    with (
        bench_stores("horde_bench_relay") as (pg, rd, dsn),
        running_stack(dsn, rd.url, args.streams) as (front, admission, dispatch, submit),
    ):

        async def run_all() -> tuple[list[LatencyRow], list[HoldRow]]:
            client_key, owner_key = await seed(dsn)
            stack = Stack(front, admission, dispatch, submit, client_key, owner_key)
            signals = signal_client(rd.url)
            worker = Worker(stack, signals)
            try:
                await worker.check_in()
                await latency_case(stack, worker, 4, 3)  # warm-up: connections, code paths
                worker.failures.clear()
                latency = [await latency_case(stack, worker, c, args.posts) for c in args.concurrency]
                latency.append(await first_delta_case(stack, worker, args.first_trials))
                holds = [
                    await hold_case(
                        stack,
                        worker,
                        signals,
                        args.streams,
                        args.hold_seconds,
                        args.hold_interval,
                        mode,
                        args.posters,
                        args.opening,
                        args.end_rate,
                    )
                    for mode in modes
                ]
                return latency, holds
            finally:
                await worker.aclose()
                await signals.aclose()

        latency, holds = asyncio.run(run_all())
        if any(r.failures for r in latency) or any(r.failures for r in holds):
            for service in (front, admission):
                print(service.process.log_tail(40), file=sys.stderr)
    load_after = uptime()

    print(
        f"# relay bench: Python {platform.python_version()}, {os.cpu_count()} cores, one process each of "
        f"admission, dispatch, submit and the front, {pg.source} postgres, {rd.source} redis; pacing off"
    )
    if os.environ.get("PYTHONPATH"):
        print(f"# PYTHONPATH={os.environ['PYTHONPATH']} (the services import from it first)")
    print(f"# load before: {load_before}")
    print(f"# load after:  {load_after}")
    print()
    print("## 1. worker post → client chunk")
    print_table(
        [
            "case",
            "streams",
            "posts",
            "posts/s",
            "post RTT p50 ms",
            "p99",
            "later deltas p50 ms",
            "p99",
            "first delta p50 ms",
            "p99",
            "max",
            "submit → [DONE] p50 ms",
            "p99",
            "failures",
        ],
        [
            (
                [
                    r.case,
                    f"{r.streams}",
                    f"{r.posts}",
                    f"{r.per_second:,.0f}" if r.per_second else "-",
                    ms(r.rtt, 0.5),
                    ms(r.rtt, 0.99),
                    ms(r.chunk, 0.5),
                    ms(r.chunk, 0.99),
                    ms(r.first, 0.5),
                    ms(r.first, 0.99),
                    f"{1000 * max(r.first):.1f}" if r.first else "-",
                    ms(r.done, 0.5),
                    ms(r.done, 0.99),
                    f"{r.failures}",
                ],
                r.first_failure,
            )
            for r in latency
        ],
    )
    print()
    print("## 2. streams held by one front process")
    print_table(
        [
            "posts via",
            "streams",
            "open s",
            "hold s",
            "posts",
            "posts/s",
            "front RSS MiB: before, open, holding",
            "KiB/stream",
            "front CPU %",
            "chunk p50 ms",
            "p99",
            "post RTT p50 ms",
            "p99",
            "post lag p99 ms",
            "XREADs/s",
            "submit → [DONE] p50 ms",
            "p99",
            "failures",
        ],
        [
            (
                [
                    r.mode,
                    f"{r.streams}",
                    f"{r.open_seconds:.1f}",
                    f"{r.hold_seconds:.1f}",
                    f"{r.posts}",
                    f"{r.per_second:,.0f}",
                    f"{r.rss_before:.0f}, {r.rss_open:.0f}, {r.rss_hold:.0f}",
                    f"{1024 * (r.rss_hold - r.rss_before) / max(r.streams, 1):.0f}",
                    f"{100 * r.cpu['front']:.0f}",
                    ms(r.chunk, 0.5),
                    ms(r.chunk, 0.99),
                    ms(r.rtt, 0.5),
                    ms(r.rtt, 0.99),
                    ms(r.lag, 0.99),
                    f"{r.reads:.1f}",
                    ms(r.done, 0.5),
                    ms(r.done, 0.99),
                    f"{r.failures}",
                ],
                r.first_failure,
            )
            for r in holds
        ],
        left=2,
    )
    for r in holds:
        shares = ", ".join(f"{name} {100 * share:.0f} %" for name, share in r.cpu.items())
        print(f"# CPU during the hold ({r.mode}), % of one core: {shares}")
        print(
            f"# final submits ({r.mode}, {SUBMITTERS} at a time, {r.end_rate:g}/s): round trip p50 {ms(r.submits, 0.5)} ms, "
            f"p99 {ms(r.submits, 0.99)} ms; first submit to last [DONE] {r.end_seconds:.1f} s"
        )
        print(
            f"# front /healthz while holding ({r.mode}, every 0.5 s): p50 {ms(r.health, 0.5)} ms, "
            f"max {1000 * max(r.health, default=0.0):.1f} ms"
        )
        if r.failures:
            phases = ", ".join(f"{n} {phase}" for phase, n in r.errors_by_phase.items())
            print(f"# streams that ended with an error ({r.mode}): {phases}")
        if r.chunk:
            print(
                f"# chunk latency during the hold ({r.mode}): mean {1000 * statistics.fmean(r.chunk):.1f} ms, "
                f"max {1000 * max(r.chunk):.1f} ms"
            )
    for failure_list in [r.failure_list for r in latency] + [r.failure_list for r in holds]:
        if failure_list:
            print(f"# failures by kind: {failure_kinds(failure_list)}")
    exit_on_failures([{"failures": r.failures} for r in latency] + [{"failures": r.failures} for r in holds])


if __name__ == "__main__":
    main()
