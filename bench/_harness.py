"""Shared harness of the service benchmarks (bench_pop.py, bench_submit.py, bench_progress.py): the stores and
a migrated database, the service processes, seeding users and workers by SQL, latency percentiles and the
Markdown result table."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
from horde_store.migrate import migrate
from horde_store.users import hash_api_key
from horde_testing.launcher import ServiceProcess, free_port
from horde_testing.pgadmin import create_database_sync, run_sync
from horde_testing.stores import postgres_store, redis_store

SALT = "bench-salt"
__all__ = [
    "SALT",
    "Service",
    "bench_parser",
    "bench_stores",
    "exit_on_failures",
    "http_client",
    "insert_users",
    "insert_workers",
    "median_ms",
    "percentile_ms",
    "print_results",
    "print_table",
    "running_services",
    "seed_client_and_owner",
    "timed_gather",
]


def bench_parser(doc: str, *, quick_help: str) -> argparse.ArgumentParser:
    """The arguments every bench takes: ``--quick`` and ``--concurrency`` (8 and 32 by default)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    return parser


@contextmanager
def bench_stores(database_prefix: str) -> Iterator[tuple[Any, Any, str]]:
    """PostgreSQL and Redis from horde_testing and a fresh migrated database on them: ``(pg, rd, dsn)``."""
    with postgres_store() as pg, redis_store() as rd:
        name = f"{database_prefix}_{os.getpid()}"
        create_database_sync(pg.dsn, name)
        dsn = pg.dsn_for(name)
        run_sync(migrate(dsn))
        yield pg, rd, dsn


@dataclass
class Service:
    """One running service process and its HTTP port."""

    process: ServiceProcess
    port: int

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@contextmanager
def running_services(
    service: str, dsn: str, redis_url: str, count: int = 1, *, names: Sequence[str] | None = None
) -> Iterator[list[Service]]:
    """``count`` replicas of ``python -m horde_<service>`` on the bench database, each on free ports."""
    upper = service.upper()
    with ExitStack() as stack:
        started: list[Service] = []
        for i in range(count):
            port = free_port()
            env = {
                "HORDE_DATABASE_URL": dsn,
                "HORDE_REDIS_URL": redis_url,
                "HORDE_SECRET_KEY": SALT,
                f"HORDE_{upper}_HTTP_PORT": str(port),
                f"HORDE_{upper}_GRPC_PORT": str(free_port()),
                "HORDE_LOG_LEVEL": "WARNING",
                "HORDE_DB_POOL_MAX_SIZE": "20",
            }
            proc = ServiceProcess(
                names[i] if names else f"{service}{i}",
                [sys.executable, "-m", f"horde_{service}"],
                env=env,
                health_url=f"http://127.0.0.1:{port}/healthz",
            )
            stack.enter_context(proc)
            started.append(Service(proc, port))
        yield started


async def insert_users(
    conn: asyncpg.Connection, names: list[str], key_hashes: list[str], kudos: int
) -> list[int]:
    """Insert users (in order) with ``kudos``; returns their ids."""
    rows = await conn.fetch(
        f"""
        INSERT INTO users (username, api_key_hash, kudos)
        SELECT u, h, {kudos:d} FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(u, h, i) ORDER BY i
        RETURNING id
        """,
        names,
        key_hashes,
    )
    return [r["id"] for r in rows]


async def seed_client_and_owner(dsn: str, prefix: str, concurrency: int) -> tuple[str, str]:
    """A requester (kudos to spare, ``concurrency``) and a worker owner named after ``prefix``: their API keys."""
    tag = uuid.uuid4().hex[:8]
    client_key, owner_key = f"{prefix}-client-{tag}", f"{prefix}-owner-{tag}"
    conn = await asyncpg.connect(dsn)
    try:
        [client_id] = await insert_users(conn, [f"{prefix}-c-{tag}"], [hash_api_key(client_key, SALT)], 10**9)
        await insert_users(conn, [f"{prefix}-o-{tag}"], [hash_api_key(owner_key, SALT)], 0)
        await conn.execute("UPDATE users SET concurrency = $2 WHERE id = $1", client_id, concurrency)
    finally:
        await conn.close()
    return client_key, owner_key


async def insert_workers(conn: asyncpg.Connection, owners: list[int], tag: str, model: str) -> dict[int, Any]:
    """One chat worker serving ``model`` per owner; returns owner id → worker id."""
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
        model,
    )
    return {w["user_id"]: w["id"] for w in workers}


def http_client(connections: int) -> httpx.AsyncClient:
    """A loopback HTTP client with a pool of ``connections`` keep-alive connections."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=30.0, trust_env=False)


async def timed_gather(task: Callable[[int], Awaitable[None]], concurrency: int) -> float:
    """Run ``task(slot)`` for every slot concurrently; returns the elapsed seconds."""
    t0 = time.perf_counter()
    await asyncio.gather(*(task(s) for s in range(concurrency)))
    return time.perf_counter() - t0


def median_ms(latencies: list[float]) -> float:
    """The median of ``latencies`` (seconds) in milliseconds."""
    return 1000 * statistics.median(latencies)


def percentile_ms(latencies: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank below) of ``latencies`` (seconds) in milliseconds."""
    latencies = sorted(latencies)
    return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]


def print_table(columns: list[str], rows: list[tuple[list[str], str]], *, left: int = 1) -> None:
    """A Markdown table (the first ``left`` columns left-aligned), each row followed by its first failure."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" if i < left else "---:" for i in range(len(columns))) + "|")
    for cells, first_failure in rows:
        print("| " + " | ".join(cells) + " |")
        if first_failure:
            print(f"  first failure: {first_failure}")


def print_results(columns: list[tuple[str, str, str]], rows: list[dict[str, Any]]) -> None:
    """:func:`print_table` of result dicts; ``columns`` are ``(header, key, format spec)``."""
    print_table(
        [header for header, _, _ in columns],
        [([format(r[key], spec) for _, key, spec in columns], r["first_failure"]) for r in rows],
    )


def exit_on_failures(rows: list[dict[str, Any]]) -> None:
    """Exit 1 when any result row counts failures."""
    if any(r["failures"] for r in rows):
        sys.exit(1)
