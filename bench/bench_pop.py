"""Benchmark of the dispatch pop: pops per second against the real ``python -m horde_dispatch`` process.

Run: ``uv run python bench/bench_pop.py`` (``--quick`` for a short run; ``--processes 2`` for two replicas
behind a round robin). Each case queues waiting requests by SQL (as admission writes them) on the real
PostgreSQL of horde_testing, then lets a fixed number of concurrent chat workers (each its own name, 40
owners) pop over HTTP until the case's pop count is reached, and reports throughput and latency percentiles.
Every pop is the whole route: authentication, check-in with the chat declaration, the queue statement and
the payload. Cases:

- chat, N queued: N chat requests the workers can all take (the queue index's first row fits);
- text, N queued: N legacy text requests, n = 1;
- chat behind unfit, N queued: 90 % of the queue (the oldest, highest priority) is for another model, so
  every pop walks past those rows to the fitting 10 %;
- empty pops, N queued: nothing fits (another model): each pop returns no job and counts ``skipped``.

Afterwards the script checks that no generation was handed out twice and that every request has at most
its n generations.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from _harness import (
    SALT,
    bench_parser,
    bench_stores,
    exit_on_failures,
    http_client,
    median_ms,
    percentile_ms,
    print_results,
    running_services,
    timed_gather,
)
from horde_store.db import create_pool
from horde_store.users import hash_api_key

MODEL = "bench/chat-model-13b"
OTHER = "bench/other-model-70b"
OWNERS = 40
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me about the horde. " * 20},
]


@dataclass
class Case:
    name: str
    queued: int
    pops: int
    is_chat: bool = True
    unfit_share: float = 0.0  # the share of the queue (oldest first) that is for another model
    expect_jobs: bool = True


async def seed(pool: asyncpg.Pool, case: Case) -> None:
    """Empty the queue, then queue ``case.queued`` requests."""
    unfit = int(case.queued * case.unfit_share)
    fit = case.queued - unfit
    async with pool.acquire() as conn:
        await conn.execute("DELETE FROM processing_gens; DELETE FROM waiting_prompts")
        requester = await conn.fetchval("SELECT id FROM users WHERE username = 'bench-requester'")
        for count, model, offset in ((unfit, OTHER, 0), (fit, MODEL, unfit)):
            if count == 0:
                continue
            await conn.execute(
                """
                INSERT INTO waiting_prompts (user_id, is_chat, models, n, jobs, max_length, max_context_length,
                                             params, messages, prompt, active, extra_priority, created,
                                             chat_required_features)
                SELECT $1, $2, ARRAY[$3], 1, 1, 512, 4096,
                       '{"max_length": 512, "max_context_length": 4096, "temperature": 0.7}'::jsonb,
                       CASE WHEN $2 THEN $4::jsonb END, 'user: tell me about the horde', true,
                       1000 - (g + $6) / 10, now() - make_interval(secs => 100000 - g - $6),
                       CASE WHEN $2 THEN ARRAY['prompt_overflow_refused'] END
                FROM generate_series(1, $5) g
                """,
                requester,
                case.is_chat,
                model,
                MESSAGES,
                count,
                offset,
            )
        await conn.execute("ANALYZE waiting_prompts")


def pop_body(worker: int) -> dict[str, Any]:
    return {
        "name": f"bench-worker-{worker}",
        "models": [MODEL],
        "max_length": 1024,
        "max_context_length": 8192,
        "threads": 1,
        "bridge_agent": "Horde Chat Worker:0.1.0:bench",
        "chat_jobs": True,
        "chat_limits": {"max_context_length": 8192, "max_length": 1024},
        "model_id": MODEL,
        "chat_features": ["seed", "tools", "prompt_overflow_refused"],
    }


async def run_case(
    pool: asyncpg.Pool, urls: list[str], keys: list[str], case: Case, concurrency: int
) -> dict[str, Any]:
    await seed(pool, case)
    latencies: list[float] = []
    failures: list[str] = []
    handed: list[str] = []
    remaining = case.pops
    async with http_client(concurrency) as client:

        async def worker(slot: int) -> None:
            nonlocal remaining
            url = urls[slot % len(urls)]
            body = pop_body(slot)
            key = keys[slot % len(keys)]
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                r = await client.post(url, json=body, headers={"apikey": key})
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                    continue
                ids = r.json()["ids"]
                if case.expect_jobs and not ids:
                    failures.append("empty pop")
                handed.extend(ids)

        elapsed = await timed_gather(worker, concurrency)
    async with pool.acquire() as conn:
        stored = await conn.fetchval("SELECT count(*) FROM processing_gens")
        over = await conn.fetchval(
            "SELECT count(*) FROM (SELECT wp_id FROM processing_gens GROUP BY wp_id HAVING count(*) > 1) x"
        )
    if len(set(handed)) != len(handed) or stored != len(handed) or over:
        failures.append(
            f"double hand-out: {len(handed)} handed, {len(set(handed))} distinct, {stored} stored"
        )
    return {
        "case": case.name,
        "queued": case.queued,
        "pops": case.pops,
        "concurrency": concurrency,
        "per_second": case.pops / elapsed,
        "p50_ms": median_ms(latencies),
        "p99_ms": percentile_ms(latencies, 0.99),
        "jobs": len(handed),
        "failures": len(failures),
        "first_failure": failures[0] if failures else "",
    }


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            Case("chat", 1000, 300),
            Case("chat", 10000, 300),
            Case("empty pops", 10000, 200, expect_jobs=False, unfit_share=1.0),
        ]
    return [
        Case("chat", 1000, 600),
        Case("chat", 10000, 1500),
        Case("text", 10000, 1500, is_chat=False),
        Case("chat behind unfit", 10000, 600, unfit_share=0.9),
        Case("empty pops", 1000, 600, expect_jobs=False, unfit_share=1.0),
        Case("empty pops", 10000, 600, expect_jobs=False, unfit_share=1.0),
    ]


def main() -> None:
    parser = bench_parser(__doc__, quick_help="a short run")
    parser.add_argument("--processes", type=int, default=1, help="dispatch replicas (round robin)")
    args = parser.parse_args()

    with (
        bench_stores("horde_bench_pop") as (pg, rd, dsn),
        running_services("dispatch", dsn, rd.url, args.processes) as services,
    ):
        urls = [service.url("/v2/generate/text/pop") for service in services]

        async def run_all() -> list[dict[str, Any]]:
            pool = await create_pool(dsn)
            try:
                keys = [f"owner-{uuid.uuid4().hex}" for _ in range(OWNERS)]
                await pool.execute(
                    "INSERT INTO users (username, api_key_hash) SELECT 'bench-owner-' || i, h "
                    "FROM unnest($1::text[]) WITH ORDINALITY AS t(h, i)",
                    [hash_api_key(k, SALT) for k in keys],
                )
                await pool.execute(
                    "INSERT INTO users (username, api_key_hash) VALUES ('bench-requester', $1)",
                    hash_api_key("requester", SALT),
                )
                # Warm up connections, statement caches and the worker rows.
                await run_case(pool, urls, keys, Case("warm-up", 200, 100), 4)
                rows = []
                for concurrency in args.concurrency:
                    for case in cases(args.quick):
                        rows.append(await run_case(pool, urls, keys, case, concurrency))
                return rows
            finally:
                await pool.close()

        rows = asyncio.run(run_all())

    print(
        f"# pop bench: {platform.python_version()}, {os.cpu_count()} cores, {args.processes} dispatch "
        f"process(es), {pg.source} postgres, {rd.source} redis"
    )
    print_results(
        [
            ("case", "case", ""),
            ("queued", "queued", ""),
            ("pops", "pops", ""),
            ("workers", "concurrency", ""),
            ("pops/s", "per_second", ".0f"),
            ("p50 ms", "p50_ms", ".1f"),
            ("p99 ms", "p99_ms", ".1f"),
            ("jobs handed", "jobs", ""),
            ("failures", "failures", ""),
        ],
        rows,
    )
    exit_on_failures(rows)


if __name__ == "__main__":
    main()
