"""Benchmark of the front's call records (README: Retries and idempotency): what retry safety adds per call.

Run: ``uv run python bench/bench_operations.py`` (``--quick`` for a short run). Every chat completion the
front admits makes two record scripts on Redis: the claim before the native submit and the end after the
outcome (``horde_oai.operations``, one EVAL each, on the Redis of horde_testing). Cases, each at 1 and the
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
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client
from horde_oai.operations import Call, OperationRecords, operation_record_key
from horde_testing.stores import redis_store


async def redis_cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def eval_usec(client: Any) -> float:
    stats = await client.info("commandstats")
    entry = stats.get("cmdstat_eval") or {}
    return float(entry.get("usec_per_call", 0.0))


async def run_case(
    client: Any, name: str, callers: int, calls: int, call: Any
) -> tuple[list[str], str]:
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
        records = OperationRecords(client)
        tag = uuid.uuid4().hex[:8]
        rows: list[tuple[list[str], str]] = []
        delivered: list[Call] = []

        async def new_call(index: int, n: int) -> None:
            call = await records.claim(
                f"{tag}-{index}", f"b{n}", idempotency_key=None, client_operation_key=None, declared=False
            )
            assert isinstance(call, Call)
            await call.end("delivered")
            if n % 97 == 0:
                delivered.append(call)

        async def retry(index: int, n: int) -> None:
            call = await records.claim(
                f"{tag}-r{index}", "same", idempotency_key=None, client_operation_key=None, declared=False
            )
            assert isinstance(call, Call)
            await call.end("retryable")

        async def ping(index: int, n: int) -> None:
            await client.ping()

        for callers in sorted({1, *args.concurrency}):
            rows.append(await run_case(client, "new call (claim + end)", callers, calls, new_call))
            rows.append(await run_case(client, "retry (join + end)", callers, calls, retry))
            rows.append(await run_case(client, "PING", callers, calls, ping))
        print_table(
            ["case", "callers", "calls/s", "p50 ms", "p99 ms", "Redis us/EVAL", "CPU ms per call: client, Redis"],
            rows,
        )
        for call in delivered:
            key = operation_record_key(call.call_key)
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
