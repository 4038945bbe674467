"""Benchmark of the submit service: submits per second against the real ``python -m horde_submit`` process.

Run: ``uv run python bench/bench_submit.py`` (``--quick`` for a short run; ``--processes 2`` for two replicas
behind a round robin). Each case seeds popped jobs by SQL (users, workers, requests, generations, as admission
and dispatch write them) on the real PostgreSQL and Redis of horde_testing, then submits every job once with a
fixed number of concurrent HTTP clients and reports throughput and latency percentiles. Cases:

- chat, spread: a structured chat reply (strict conformance, no extras) per job, 200 worker owners and 200
  requesters, so the per-user rows rarely collide;
- chat, strict schema: the same with a strict json_schema response format the reply is validated against;
- chat, hot rows: one worker owner and one requester for every job (every settlement updates the same two
  user rows: the worst case of the text path's hot-row lesson);
- text: legacy text submits;
- faulted: faulted chat submits with a fault reason (record + fault + restart).

Every submit must return 200; the script checks the stored state afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
from horde_store.db import create_pool
from horde_store.migrate import migrate
from horde_store.users import hash_api_key
from horde_testing.launcher import ServiceProcess, free_port
from horde_testing.pgadmin import create_database_sync, run_sync
from horde_testing.stores import postgres_store, redis_store

SALT = "bench-salt"
MODEL = "bench/model-13b"
STRICT_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
            "required": ["answer", "confidence"],
            "additionalProperties": False,
        },
    },
}
REPLY = "The horde answers: " + "lorem ipsum dolor sit amet " * 20


@dataclass
class Case:
    name: str
    is_chat: bool
    owners: int
    requesters: int
    extras: dict[str, Any] | None
    body: Callable[[uuid.UUID], dict[str, Any]]


def chat_body(gen_id: uuid.UUID) -> dict[str, Any]:
    return {
        "id": str(gen_id),
        "message": {"role": "assistant", "content": REPLY},
        "finish_reason": "stop",
        "model_id": MODEL,
        "prompt_tokens": 120,
        "completion_tokens": 140,
    }


def schema_body(gen_id: uuid.UUID) -> dict[str, Any]:
    body = chat_body(gen_id)
    body["message"]["content"] = '{"answer": "' + "forty-two " * 40 + '", "confidence": 0.9}'
    return body


def text_body(gen_id: uuid.UUID) -> dict[str, Any]:
    return {"id": str(gen_id), "generation": REPLY, "seed": 1}


def fault_body(gen_id: uuid.UUID) -> dict[str, Any]:
    return {"id": str(gen_id), "state": "faulted", "model_id": MODEL, "fault_reason": "generation_error"}


CASES = [
    Case("chat, spread", True, 200, 200, None, chat_body),
    Case("chat, strict schema", True, 200, 200, {"response_format": STRICT_SCHEMA}, schema_body),
    Case("chat, hot rows", True, 1, 1, None, chat_body),
    Case("text", False, 200, 200, None, text_body),
    Case("faulted", True, 200, 200, None, fault_body),
]


async def seed(pool: asyncpg.Pool, case: Case, jobs: int) -> tuple[list[uuid.UUID], list[str]]:
    """Insert ``jobs`` popped jobs; returns the generation ids and, per job, its owner's API key."""
    tag = uuid.uuid4().hex[:8]
    async with pool.acquire() as conn:
        owner_keys = [f"owner-{tag}-{i}" for i in range(case.owners)]
        owner_ids = await conn.fetch(
            """
            INSERT INTO users (username, api_key_hash, kudos)
            SELECT u, h, 0 FROM unnest($1::text[], $2::text[]) AS t(u, h) RETURNING id
            """,
            [f"o{tag}{i}" for i in range(case.owners)],
            [hash_api_key(k, SALT) for k in owner_keys],
        )
        requester_ids = await conn.fetch(
            """
            INSERT INTO users (username, api_key_hash, kudos)
            SELECT u, h, 1000000 FROM unnest($1::text[], $2::text[]) AS t(u, h) RETURNING id
            """,
            [f"r{tag}{i}" for i in range(case.requesters)],
            [hash_api_key(f"req-{tag}-{i}", SALT) for i in range(case.requesters)],
        )
        owners = [r["id"] for r in owner_ids]
        requesters = [r["id"] for r in requester_ids]
        workers = await conn.fetch(
            """
            INSERT INTO workers (user_id, name, models, accepts_chat_jobs, chat_model_id, chat_max_context_length,
                                 chat_max_length, bridge_agent)
            SELECT o, 'w' || $2 || '-' || o, ARRAY[$3], true, $3, 8192, 1024, 'KoboldCppEmbedWorker:2:x'
              FROM unnest($1::bigint[]) AS o
            RETURNING id, user_id
            """,
            owners,
            tag,
            MODEL,
        )
        worker_of = {w["user_id"]: w["id"] for w in workers}
        job_owner = [owners[i % len(owners)] for i in range(jobs)]
        job_requester = [requesters[i % len(requesters)] for i in range(jobs)]
        wps = await conn.fetch(
            """
            INSERT INTO waiting_prompts (user_id, is_chat, prompt, messages, models, n, jobs, max_length,
                                         max_context_length, active, chat_extras)
            SELECT r, $2, 'user: tell me something', $3, ARRAY[$4], 0, 1, 512, 4096, true, $5
              FROM unnest($1::bigint[]) WITH ORDINALITY AS t(r, i) ORDER BY i
            RETURNING id
            """,
            job_requester,
            case.is_chat,
            [{"role": "user", "content": "tell me something"}] if case.is_chat else None,
            MODEL,
            case.extras,
        )
        gens = await conn.fetch(
            """
            INSERT INTO processing_gens (wp_id, worker_id, user_id, model, assigned_model, started_at)
            SELECT wp, w, o, $4::text, CASE WHEN $5 THEN $4::text END, now() - interval '3 seconds'
              FROM unnest($1::uuid[], $2::uuid[], $3::bigint[]) WITH ORDINALITY AS t(wp, w, o, i) ORDER BY i
            RETURNING id
            """,
            [r["id"] for r in wps],
            [worker_of[o] for o in job_owner],
            job_owner,
            MODEL,
            case.is_chat,
        )
    keys = [owner_keys[owners.index(o)] for o in job_owner]
    return [g["id"] for g in gens], keys


async def run_case(
    pool: asyncpg.Pool, urls: list[str], case: Case, jobs: int, concurrency: int
) -> dict[str, Any]:
    gen_ids, keys = await seed(pool, case, jobs)
    latencies: list[float] = []
    failures: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(limits=limits, timeout=30.0, trust_env=False) as client:

        async def worker(slot: int) -> None:
            url = urls[slot % len(urls)]
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                r = await client.post(url, json=case.body(gen_ids[i]), headers={"apikey": keys[i]})
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in range(concurrency)))
        elapsed = time.perf_counter() - t0
    async with pool.acquire() as conn:
        if case.body is fault_body:
            done = await conn.fetchval(
                "SELECT count(*) FROM processing_gens WHERE id = ANY($1) AND faulted", gen_ids
            )
        else:
            done = await conn.fetchval(
                "SELECT count(*) FROM processing_gens WHERE id = ANY($1) AND generation IS NOT NULL", gen_ids
            )
    latencies.sort()
    return {
        "case": case.name,
        "jobs": jobs,
        "concurrency": concurrency,
        "per_second": jobs / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "failures": len(failures),
        "first_failure": failures[0] if failures else "",
        "stored": done,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (300 jobs per case)")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--processes", type=int, default=1, help="submit replicas (round robin)")
    args = parser.parse_args()
    jobs = 300 if args.quick else args.jobs

    with postgres_store() as pg, redis_store() as rd:
        name = f"horde_bench_submit_{os.getpid()}"
        create_database_sync(pg.dsn, name)
        dsn = pg.dsn_for(name)
        run_sync(migrate(dsn))
        procs: list[ServiceProcess] = []
        urls: list[str] = []
        try:
            for i in range(args.processes):
                port = free_port()
                env = {
                    "HORDE_DATABASE_URL": dsn,
                    "HORDE_REDIS_URL": rd.url,
                    "HORDE_SECRET_KEY": SALT,
                    "HORDE_SUBMIT_HTTP_PORT": str(port),
                    "HORDE_SUBMIT_GRPC_PORT": str(free_port()),
                    "HORDE_LOG_LEVEL": "WARNING",
                    "HORDE_DB_POOL_MAX_SIZE": "20",
                }
                proc = ServiceProcess(
                    f"submit{i}",
                    [sys.executable, "-m", "horde_submit"],
                    env=env,
                    health_url=f"http://127.0.0.1:{port}/healthz",
                )
                proc.__enter__()
                procs.append(proc)
                urls.append(f"http://127.0.0.1:{port}/v2/generate/text/submit")

            async def run_all() -> list[dict[str, Any]]:
                pool = await create_pool(dsn)
                try:
                    # Warm up connections and code paths.
                    await run_case(pool, urls, CASES[0], 50, 4)
                    rows = []
                    for concurrency in args.concurrency:
                        for case in CASES:
                            rows.append(await run_case(pool, urls, case, jobs, concurrency))
                    return rows
                finally:
                    await pool.close()

            rows = asyncio.run(run_all())
        finally:
            for proc in procs:
                proc.__exit__(None, None, None)

    print(
        f"# submit bench: {platform.python_version()}, {os.cpu_count()} cores, {args.processes} submit process(es), {pg.source} postgres, {rd.source} redis"
    )
    print("| case | jobs | clients | submits/s | p50 ms | p99 ms | failures | stored |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['jobs']} | {r['concurrency']} | {r['per_second']:.0f} | {r['p50_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {r['failures']} | {r['stored']} |"
        )
        if r["first_failure"]:
            print(f"  first failure: {r['first_failure']}")
    if any(r["failures"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
