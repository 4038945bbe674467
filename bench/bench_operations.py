"""Benchmark of the front's call records (docs/openai-front.md#retries-and-idempotency): what retry safety adds per call.

Run: ``uv run python bench/bench_operations.py`` (``--quick`` for a short run). Every chat completion the
front admits makes two record scripts on Redis: the claim before the native submit and the end after the
outcome (``horde_core.operation_records``, one EVAL each, on the Redis of horde_testing, with the arguments the
front's ``horde_oai.operations`` passes). Cases, each at 1 and the
``--concurrency`` callers over one shared client (the front's own arrangement: one pool per process):

- new call: claim (a fresh record) then end ``delivered``;
- retry: claim of a record left ``retryable`` (joins), then end;
- PING: the client's round-trip floor.

``Redis us/EVAL`` is Redis's own time per script call from ``INFO commandstats`` (reset before each case);
the CPU column is CPU milliseconds per call of this process and of Redis (``INFO cpu``). Afterwards every
record of a new call must be ``delivered`` with ``live`` 0 and a TTL; the run exits 1 otherwise.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

from _harness import bench_parser, median_ms, percentile_ms, print_table
from horde_core.operation_records import CLAIM_SCRIPT, END_SCRIPT
from horde_core.redis_keys import CHAT_SIGNAL_DB, operation_record_key, redis_client
from horde_testing.stores import redis_store

#: The record's lifetime the front gives a call (its native request's expiry, 20 minutes).
RECORD_TTL_SECONDS = 20 * 60


async def claim(client: Any, call_key: str, body_digest: str) -> str:
    """The front's claim of a body call that declares no retry; returns the operation key it is to submit with
    (a fresh one, or the record's when it joined)."""
    found = await client.eval(
        CLAIM_SCRIPT,
        1,
        operation_record_key(call_key),
        str(uuid.uuid4()),
        "body",
        "0",
        RECORD_TTL_SECONDS,
        body_digest,
    )
    verdict, operation_key = found
    assert verdict in ("new", "joined"), found
    return str(operation_key)


async def end(client: Any, call_key: str, operation_key: str, outcome: str) -> None:
    """The front's end of an attempt with ``outcome`` (no error)."""
    await client.eval(
        END_SCRIPT, 1, operation_record_key(call_key), operation_key, outcome, "", "body", RECORD_TTL_SECONDS
    )


async def redis_cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def eval_usec(client: Any) -> float:
    stats = await client.info("commandstats")
    entry = stats.get("cmdstat_eval") or {}
    return float(entry.get("usec_per_call", 0.0))


async def run_case(client: Any, name: str, callers: int, calls: int, call: Any) -> tuple[list[str], str]:
    latencies: list[float] = []
    await client.config_resetstat()
    cpu_redis = await redis_cpu(client)
    cpu_self = time.process_time()
    per_caller = calls // callers

    async def caller(index: int) -> None:
        for n in range(per_caller):
            started = time.perf_counter()
            await call(index, n)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    elapsed = time.perf_counter() - started
    done = len(latencies)
    cpu_self = (time.process_time() - cpu_self) * 1000 / done
    cpu_redis = (await redis_cpu(client) - cpu_redis) * 1000 / done
    usec = await eval_usec(client)
    row = [
        name,
        str(callers),
        f"{done / elapsed:,.0f}",
        f"{median_ms(latencies):.2f}",
        f"{percentile_ms(latencies, 0.99):.2f}",
        f"{usec:.1f}" if usec else "–",
        f"{cpu_self:.3f}, {cpu_redis:.3f}",
    ]
    return row, ""


async def main() -> int:
    parser = bench_parser(__doc__ or "", quick_help="fewer calls per case")
    args = parser.parse_args()
    calls = 2_000 if args.quick else 20_000
    print(f"uptime: {os.getloadavg()}")
    failures = 0
    with redis_store() as rd:
        client = redis_client(rd.url, db=CHAT_SIGNAL_DB)
        tag = uuid.uuid4().hex[:8]
        rows: list[tuple[list[str], str]] = []
        delivered: list[str] = []

        async def new_call(index: int, n: int) -> None:
            call_key = f"{tag}-{index}-{n}"
            await end(client, call_key, await claim(client, call_key, f"b{n}"), "delivered")
            if n % 97 == 0:
                delivered.append(call_key)

        async def retry(index: int, n: int) -> None:
            call_key = f"{tag}-r{index}"
            await end(client, call_key, await claim(client, call_key, "same"), "retryable")

        async def ping(index: int, n: int) -> None:
            await client.ping()

        for callers in sorted({1, *args.concurrency}):
            rows.append(await run_case(client, "new call (claim + end)", callers, calls, new_call))
            rows.append(await run_case(client, "retry (join + end)", callers, calls, retry))
            rows.append(await run_case(client, "PING", callers, calls, ping))
        print_table(
            [
                "case",
                "callers",
                "calls/s",
                "p50 ms",
                "p99 ms",
                "Redis us/EVAL",
                "CPU ms per call: client, Redis",
            ],
            rows,
        )
        for call_key in delivered:
            key = operation_record_key(call_key)
            record = await client.hgetall(key)
            ttl = await client.ttl(key)
            if record.get("state") != "delivered" or record.get("live") != "0" or ttl <= 0:
                failures += 1
        print(f"records checked: {len(delivered)}, failures: {failures}")
        print(f"uptime: {os.getloadavg()}")
        await client.aclose()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
