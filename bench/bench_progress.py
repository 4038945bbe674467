"""Benchmark of streaming progress: posts per second against the real ``python -m horde_submit`` process.

Run: ``uv run python bench/bench_progress.py`` (``--quick`` for a short run). Each case seeds streamed chat
generations as admission and dispatch leave them (users, workers, a ``stream_progress`` chat request and its
popped generation by SQL on the real PostgreSQL of horde_testing, and the stream lease that the pop writes,
through ``horde_core.chat_stream``'s ``StreamLease``/``write_stream_leases`` as dispatch does, on the real
Redis's signal database). Then a
fixed number of concurrent HTTP clients post ``POST /api/v2/generate/text/progress``. Each client owns a
disjoint slice of the generations and posts seq 1..K to each in turn, so every generation's posts are in
order while posts to different generations overlap. Each client is its own ``httpx.AsyncClient`` with one
keep-alive connection: a single client with a pool of 32 connections (``--shared-client``, as
bench_submit.py does) spends about 4 ms of CPU per request in the pool itself, so at 32 clients it
measures httpx rather than the service. Cases:

- append: seq 1..K, each post appends one stream entry. The lease is written as the pop writes it for an
  untrusted owner (lease_cap 200), so a post that moves the job lease's end by at least a whole second
  (the first post after the pop, then about one a second per generation) also extends it: one Postgres
  UPDATE plus one Redis transaction. The ``renewals`` column counts them,
  read from the service's ``horde_text_lease_renewals_total``;
- append, lease at cap: the same with the lease's cap equal to its TTL, so no post writes Postgres: the
  Lua script alone behind HTTP;
- retry: every generation already accepted seq 1, and each post repeats it with the same content. The
  script answers ``retry`` and appends nothing.

Then the Lua append script is called directly with redis-py through ``chat_stream.ProgressAppender`` (what
the route calls), without HTTP (append and retry, 1/8/32
concurrent callers, and PING as the client's floor). ``Redis us/EVALSHA`` is Redis's own time per script
call from ``INFO commandstats`` (reset before each case); the CPU column is CPU milliseconds per call of this
client process, the service process (``/proc/<pid>/stat``) and Redis (``INFO cpu``), which shows where a
post's time goes. ``uptime`` is printed before and after, since the machine is shared.

Bounded: N generations × K posts per case and ``--max-seconds`` per case (a case past its deadline stops and
is marked). Loopback only. Afterwards the script checks every stream and lease (K entries with seq 1..K per
append generation, exactly one per retried generation) and exits 1 on any failure.
"""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import redis.asyncio as redis
from _harness import (
    SALT,
    bench_parser,
    bench_stores,
    insert_users,
    insert_workers,
    median_ms,
    percentile_ms,
    print_table,
    running_services,
)
from horde_contract.limits import (
    MAX_CHAT_PROGRESS_ENTRIES,
    TEXT_JOB_LEASE_SECONDS,
    UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
)
from horde_core.chat_stream import (
    AppendResult,
    AppendStatus,
    LeaseField,
    ProgressAppender,
    StreamEntry,
    StreamLease,
    lease_key_check,
    progress_stream_key,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.redis_keys import signal_client
from horde_store.db import create_pool
from horde_store.users import hash_api_key

MODEL = "bench/chat-model-13b"
OWNERS = 40
MAX_LENGTH = 512


def delta(seq: int) -> str:
    """A few tokens of text, about 30 bytes: what a worker posting every few tokens sends."""
    return f" token{seq} lorem ipsum dolor"


@dataclass
class Job:
    gen_id: str
    wp_id: str
    key: str  # the worker owner's API key


@dataclass
class Row:
    kind: str
    case: str
    clients: int
    calls: int
    per_second: float
    p50_ms: float
    p99_ms: float
    server_us: float
    cpu_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)  # per call: this client, the service, Redis
    renewals: int = 0
    failures: int = 0
    first_failure: str = ""
    truncated: bool = False


async def seed(pool: asyncpg.Pool, signals: redis.Redis, gens: int, lease_cap: int) -> list[Job]:
    """``gens`` streamed chat generations, popped now, with their stream leases."""
    tag = uuid.uuid4().hex[:8]
    owner_keys = [f"owner-{tag}-{i}" for i in range(OWNERS)]
    owner_hashes = [hash_api_key(k, SALT) for k in owner_keys]
    async with pool.acquire() as conn:
        owners = await insert_users(conn, [f"o{tag}{i}" for i in range(OWNERS)], owner_hashes, 0)
        requesters = await insert_users(
            conn,
            [f"r{tag}{i}" for i in range(OWNERS)],
            [hash_api_key(f"req-{tag}-{i}", SALT) for i in range(OWNERS)],
            1000000,
        )
        worker_of = await insert_workers(conn, owners, tag, MODEL)
        job_owner = [i % OWNERS for i in range(gens)]
        wps = await conn.fetch(
            """
            INSERT INTO waiting_prompts (user_id, is_chat, prompt, messages, models, n, jobs, max_length,
                                         max_context_length, active, chat_extras, stream_progress)
            SELECT r, true, 'user: tell me something', $2, ARRAY[$3], 0, 1, $4, 4096, true,
                   '{"stream_progress": true}'::jsonb, true
              FROM unnest($1::bigint[]) WITH ORDINALITY AS t(r, i) ORDER BY i
            RETURNING id
            """,
            [requesters[o] for o in job_owner],
            [{"role": "user", "content": "tell me something"}],
            MODEL,
            MAX_LENGTH,
        )
        rows = await conn.fetch(
            """
            INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model, assigned_max_length,
                                         started_at, lease_cap)
            SELECT wp, w, o, $4::text, $4::text, $5, now(), $6
              FROM unnest($1::uuid[], $2::uuid[], $3::bigint[]) WITH ORDINALITY AS t(wp, w, o, i) ORDER BY i
            RETURNING id, wp_id, worker_id, user_id, started_at
            """,
            [r["id"] for r in wps],
            [worker_of[owners[o]] for o in job_owner],
            [owners[o] for o in job_owner],
            MODEL,
            MAX_LENGTH,
            lease_cap,
        )
    leases = {
        str(r["id"]): StreamLease.at_pop(
            request_id=str(r["wp_id"]),
            worker_id=str(r["worker_id"]),
            model=MODEL,
            owner_id=r["user_id"],
            owner_key_hash=owner_hashes[owners.index(r["user_id"])],
            max_length=MAX_LENGTH,
            started=r["started_at"],
            job_ttl=TEXT_JOB_LEASE_SECONDS,
            lease_cap=lease_cap,
            trusted=False,
        )
        for r in rows
    }
    if not await write_stream_leases(signals, leases):
        raise RuntimeError("writing the stream leases failed")
    return [Job(str(r["id"]), str(r["wp_id"]), owner_keys[owners.index(r["user_id"])]) for r in rows]


def seed_redis_only(gens: int) -> tuple[list[Job], dict[str, StreamLease]]:
    """Leases for the Lua-only cases (the script never reads Postgres)."""
    now = datetime.now(UTC)
    jobs: list[Job] = []
    leases: dict[str, StreamLease] = {}
    for i in range(gens):
        job = Job(str(uuid.uuid4()), str(uuid.uuid4()), f"lua-owner-{i % OWNERS}")
        jobs.append(job)
        leases[job.gen_id] = StreamLease.at_pop(
            request_id=job.wp_id,
            worker_id=str(uuid.uuid4()),
            model=MODEL,
            owner_id=i % OWNERS + 1,
            owner_key_hash=hash_api_key(job.key, SALT),
            max_length=MAX_LENGTH,
            started=now,
            job_ttl=TEXT_JOB_LEASE_SECONDS,
            lease_cap=UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
            trusted=False,
        )
    return jobs, leases


async def append(appender: ProgressAppender, job: Job, seq: int) -> AppendResult:
    """What the route runs for a content-only post (the key check computed per call, as the route does)."""
    return await appender.append(
        job.gen_id, key_check=lease_key_check(hash_api_key(job.key, SALT)), seq=seq, content=delta(seq)
    )


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_snapshot(signals: redis.Redis, service_pid: int | None) -> tuple[float, float, float]:
    info = await signals.info("cpu")
    return (
        time.process_time(),
        process_cpu(service_pid),
        float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
    )


def cpu_per_call(
    before: tuple[float, ...], after: tuple[float, ...], calls: int
) -> tuple[float, float, float]:
    a, b, c = (1000 * (y - x) / max(calls, 1) for x, y in zip(before, after, strict=True))
    return a, b, c


async def evalsha_usec(signals: redis.Redis) -> tuple[int, float]:
    stats = await signals.info("commandstats")
    entry = stats.get("cmdstat_evalsha") or {}
    return int(entry.get("calls", 0)), float(entry.get("usec_per_call", 0.0))


async def renewals(client: httpx.AsyncClient, metrics_url: str) -> int:
    text = (await client.get(metrics_url)).text
    total = 0
    for line in text.splitlines():
        if line.startswith("horde_text_lease_renewals_total{") and 'outcome="granted"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def drive(
    jobs: list[Job],
    posts: int,
    clients: int,
    deadline: float,
    call: Any,
    seq_of: Any,
) -> tuple[int, float, list[float], list[str], bool]:
    """``clients`` tasks; task s posts seq_of(k) for k in 0..posts-1 to each of jobs[s::clients] in turn."""
    latencies: list[float] = []
    failures: list[str] = []
    truncated = False

    async def one(slot: int) -> None:
        nonlocal truncated
        mine = jobs[slot::clients]
        for k in range(posts):
            for job in mine:
                if time.perf_counter() > deadline:
                    truncated = True
                    return
                t0 = time.perf_counter()
                error = await call(slot, job, seq_of(k))
                latencies.append(time.perf_counter() - t0)
                if error:
                    failures.append(error)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(s) for s in range(clients)))
    elapsed = time.perf_counter() - t0
    return len(latencies), elapsed, latencies, failures, truncated


async def check_streams(signals: redis.Redis, jobs: list[Job], expect: int) -> list[str]:
    """Every request's stream holds ``expect`` entries of its generation with seq 1..expect."""
    problems = []
    async with signals.pipeline(transaction=False) as pipe:
        for job in jobs:
            pipe.xrange(progress_stream_key(job.wp_id))
            pipe.hget(stream_lease_key(job.gen_id), LeaseField.last_seq.value)
        out = await pipe.execute()
    for i, job in enumerate(jobs):
        entries, last = out[2 * i], out[2 * i + 1]
        decoded = [StreamEntry.from_fields(entry_id, fields) for entry_id, fields in entries]
        seqs = [e.seq or 0 for e in decoded if e.gen == job.gen_id and not e.ended]
        if seqs != list(range(1, expect + 1)) or int(last or 0) != expect:
            problems.append(f"{job.gen_id}: stream seqs {seqs[:5]}... ({len(seqs)}), last_seq {last}")
    return problems


async def http_case(
    pool: asyncpg.Pool,
    signals: redis.Redis,
    url: str,
    metrics_url: str,
    name: str,
    gens: int,
    posts: int,
    clients: int,
    max_seconds: float,
    service_pid: int | None,
    shared_client: bool,
) -> Row:
    retry = name == "retry"
    at_cap = name.startswith("append, lease at cap")
    jobs = await seed(
        pool, signals, gens, TEXT_JOB_LEASE_SECONDS if at_cap else UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS
    )
    appender = ProgressAppender(signals)
    if retry:  # seq 1 accepted once, by the same script the route runs
        for job in jobs:
            status = (await append(appender, job, 1)).status
            assert status is AppendStatus.ok, status
    # One client (one keep-alive connection) per slot, or one shared pool of ``clients`` connections.
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    shared = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    pools = (
        [httpx.AsyncClient(limits=shared, timeout=30.0, trust_env=False)]
        if shared_client
        else [httpx.AsyncClient(limits=one, timeout=30.0, trust_env=False) for _ in range(clients)]
    )
    try:

        async def call(slot: int, job: Job, seq: int) -> str:
            r = await pools[slot % len(pools)].post(
                url,
                json={"id": job.gen_id, "seq": seq, "delta": {"content": delta(seq)}},
                headers={"apikey": job.key},
            )
            if r.status_code != 200 or r.json() != {"accepted_seq": seq, "cancelled": False}:
                return f"{r.status_code} {r.text[:200]}"
            return ""

        # Open every connection before measuring.
        await asyncio.gather(*(pools[s % len(pools)].get(metrics_url) for s in range(clients)))
        before = await renewals(pools[0], metrics_url)
        await signals.config_resetstat()
        cpu0 = await cpu_snapshot(signals, service_pid)
        n, elapsed, latencies, failures, truncated = await drive(
            jobs,
            posts,
            clients,
            time.perf_counter() + max_seconds,
            call,
            (lambda k: 1) if retry else (lambda k: k + 1),
        )
        cpu = cpu_per_call(cpu0, await cpu_snapshot(signals, service_pid), n)
        _, server_us = await evalsha_usec(signals)
        renewed = await renewals(pools[0], metrics_url) - before
    finally:
        for c in pools:
            await c.aclose()
    if not truncated:
        failures += await check_streams(signals, jobs, 1 if retry else posts)
    return Row(
        "http",
        name,
        clients,
        n,
        n / elapsed,
        median_ms(latencies),
        percentile_ms(latencies, 0.99),
        server_us,
        cpu,
        renewals=renewed,
        failures=len(failures),
        first_failure=failures[0] if failures else "",
        truncated=truncated,
    )


async def lua_case(
    signals: redis.Redis, redis_url: str, name: str, gens: int, posts: int, clients: int, max_seconds: float
) -> Row:
    """The append script (or PING) from redis-py, without HTTP, on its own connection pool."""
    service_pid = None
    jobs, leases = seed_redis_only(gens)
    if not await write_stream_leases(signals, leases):
        raise RuntimeError("writing the stream leases failed")
    client = signal_client(redis_url)
    appender = ProgressAppender(client)
    retry = name == "retry"
    if retry:
        for job in jobs:
            await append(appender, job, 1)
    try:
        await asyncio.gather(*(client.ping() for _ in range(clients)))  # open the connections

        async def call(slot: int, job: Job, seq: int) -> str:
            if name == "PING (client floor)":
                await client.ping()
                return ""
            result = await append(appender, job, seq)
            expected = AppendStatus.retry if retry else AppendStatus.ok
            return "" if result.status is expected else f"{result}"

        await signals.config_resetstat()
        cpu0 = await cpu_snapshot(signals, service_pid)
        n, elapsed, latencies, failures, truncated = await drive(
            jobs,
            posts,
            clients,
            time.perf_counter() + max_seconds,
            call,
            (lambda k: 1) if retry else (lambda k: k + 1),
        )
        cpu = cpu_per_call(cpu0, await cpu_snapshot(signals, service_pid), n)
        _, server_us = await evalsha_usec(signals)
    finally:
        await client.aclose()
    if name == "append" and not truncated:
        failures += await check_streams(signals, jobs, posts)
    return Row(
        "lua",
        name,
        clients,
        n,
        n / elapsed,
        median_ms(latencies),
        percentile_ms(latencies, 0.99),
        server_us,
        cpu,
        failures=len(failures),
        first_failure=failures[0] if failures else "",
        truncated=truncated,
    )


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        with open("/proc/loadavg") as f:
            return "loadavg " + f.read().strip()


def main() -> None:
    parser = bench_parser(__doc__, quick_help="a short run (100 generations × 5 posts)")
    parser.add_argument("--gens", type=int, default=400, help="generations per case")
    parser.add_argument("--posts", type=int, default=10, help="posts per generation (seq 1..K)")
    parser.add_argument(
        "--shared-client",
        action="store_true",
        help="one httpx client with a pool of N connections (as bench_submit) instead of one client per slot",
    )
    parser.add_argument("--max-seconds", type=float, default=60.0, help="deadline per case")
    args = parser.parse_args()
    gens, posts = (100, 5) if args.quick else (args.gens, args.posts)
    if posts * len(delta(posts)) > 16 * MAX_LENGTH or posts > MAX_CHAT_PROGRESS_ENTRIES:
        parser.error("--posts exceeds the generation's progress caps")
    load_before = uptime()

    with (
        bench_stores("horde_bench_progress") as (pg, rd, dsn),
        running_services("submit", dsn, rd.url, names=["submit"]) as [submit],
    ):
        url = submit.url("/api/v2/generate/text/progress")
        metrics_url = submit.url("/metrics")
        service_pid = submit.process.proc.pid if submit.process.proc is not None else None

        async def run_all() -> list[Row]:
            pool = await create_pool(dsn)
            signals = signal_client(rd.url)
            try:
                # Warm up connections and code paths.
                await http_case(
                    pool,
                    signals,
                    url,
                    metrics_url,
                    "append",
                    40,
                    3,
                    4,
                    args.max_seconds,
                    service_pid,
                    args.shared_client,
                )
                rows = []
                for clients in args.concurrency:
                    for case in ("append", "append, lease at cap (no Postgres write)", "retry"):
                        rows.append(
                            await http_case(
                                pool,
                                signals,
                                url,
                                metrics_url,
                                case,
                                gens,
                                posts,
                                clients,
                                args.max_seconds,
                                service_pid,
                                args.shared_client,
                            )
                        )
                for case, clients in (
                    ("append", 1),
                    ("append", 8),
                    ("append", 32),
                    ("retry", 8),
                    ("PING (client floor)", 8),
                ):
                    rows.append(await lua_case(signals, rd.url, case, gens, posts, clients, args.max_seconds))
                return rows
            finally:
                await signals.aclose()
                await pool.close()

        rows = asyncio.run(run_all())
    load_after = uptime()

    print(
        f"# progress bench: Python {platform.python_version()}, {os.cpu_count()} cores, 1 submit process, "
        f"{pg.source} postgres, {rd.source} redis; {gens} generations × {posts} posts per case"
    )
    print(f"# load before: {load_before}")
    print(f"# load after:  {load_after}")
    print()
    print_table(
        [
            "via",
            "case",
            "clients",
            "calls",
            "per s",
            "p50 ms",
            "p99 ms",
            "Redis us/EVALSHA",
            "CPU ms/call: client, service, Redis",
            "renewals",
            "failures",
        ],
        [
            (
                [
                    r.kind,
                    f"{r.case}{' (deadline)' if r.truncated else ''}",
                    f"{r.clients}",
                    f"{r.calls}",
                    f"{r.per_second:,.0f}",
                    f"{r.p50_ms:.2f}",
                    f"{r.p99_ms:.2f}",
                    f"{r.server_us:.1f}",
                    f"{r.cpu_ms[0]:.2f}, {'-' if r.kind == 'lua' else f'{r.cpu_ms[1]:.2f}'}, {r.cpu_ms[2]:.3f}",
                    f"{r.renewals if r.kind == 'http' else ''}",
                    f"{r.failures}",
                ],
                r.first_failure,
            )
            for r in rows
        ],
        left=2,
    )
    if any(r.failures for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
