"""Benchmark of the submit service: submits per second against the real ``python -m horde_submit`` process.

Run: ``uv run python bench/bench_submit.py`` (``--quick`` for a short run; ``--processes 2`` for two replicas
behind a round robin). Each case seeds popped jobs by SQL (users, workers, requests, generations, as admission
and dispatch write them) on the real PostgreSQL and Redis of horde_testing, then submits every job once with a
fixed number of concurrent HTTP clients and reports throughput and latency percentiles. Cases:

- chat, spread: a structured chat reply (strict conformance, no extras) per job, 200 worker owners and 200
  requesters, so the per-user rows rarely collide;
- chat, strict schema: the same with a strict json_schema response format the reply is validated against;
- chat, hot rows: one worker owner and one requester for every job (every settlement updates the same two
  user rows: the worst case for row locks);
- text: legacy text submits;
- faulted: faulted chat submits with a fault reason (record + fault + restart).

Every submit must return 200; the script checks the stored state afterwards.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from _harness import (
    SALT,
    bench_parser,
    bench_stores,
    exit_on_failures,
    http_client,
    insert_users,
    insert_workers,
    median_ms,
    percentile_ms,
    print_results,
    running_services,
    timed_gather,
)
from horde_store.db import create_pool
from horde_store.users import hash_api_key

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
        owners = await insert_users(
            conn, [f"o{tag}{i}" for i in range(case.owners)], [hash_api_key(k, SALT) for k in owner_keys], 0
        )
        requesters = await insert_users(
            conn,
            [f"r{tag}{i}" for i in range(case.requesters)],
            [hash_api_key(f"req-{tag}-{i}", SALT) for i in range(case.requesters)],
            1000000,
        )
        worker_of = await insert_workers(conn, owners, tag, MODEL)
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

    async with http_client(concurrency) as client:

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

        elapsed = await timed_gather(worker, concurrency)
    async with pool.acquire() as conn:
        if case.body is fault_body:
            done = await conn.fetchval(
                "SELECT count(*) FROM processing_gens WHERE id = ANY($1) AND faulted", gen_ids
            )
        else:
            done = await conn.fetchval(
                "SELECT count(*) FROM processing_gens WHERE id = ANY($1) AND generation IS NOT NULL", gen_ids
            )
    return {
        "case": case.name,
        "jobs": jobs,
        "concurrency": concurrency,
        "per_second": jobs / elapsed,
        "p50_ms": median_ms(latencies),
        "p99_ms": percentile_ms(latencies, 0.99),
        "failures": len(failures),
        "first_failure": failures[0] if failures else "",
        "stored": done,
    }


def main() -> None:
    parser = bench_parser(__doc__, quick_help="a short run (300 jobs per case)")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=1, help="submit replicas (round robin)")
    args = parser.parse_args()
    jobs = 300 if args.quick else args.jobs

    with (
        bench_stores("horde_bench_submit") as (pg, rd, dsn),
        running_services("submit", dsn, rd.url, args.processes) as services,
    ):
        urls = [service.url("/v2/generate/text/submit") for service in services]

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

    print(
        f"# submit bench: {platform.python_version()}, {os.cpu_count()} cores, {args.processes} submit process(es), {pg.source} postgres, {rd.source} redis"
    )
    print_results(
        [
            ("case", "case", ""),
            ("jobs", "jobs", ""),
            ("clients", "concurrency", ""),
            ("submits/s", "per_second", ".0f"),
            ("p50 ms", "p50_ms", ".1f"),
            ("p99 ms", "p99_ms", ".1f"),
            ("failures", "failures", ""),
            ("stored", "stored", ""),
        ],
        rows,
    )
    exit_on_failures(rows)


if __name__ == "__main__":
    main()
