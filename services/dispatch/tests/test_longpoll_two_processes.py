"""Long-polled pops waiting on two dispatch processes never get the same job (issue 13: every stage correct with N
replicas; docs/worker-guide.md#long-poll, docs/operator-guide.md#correct-with-n-replicas).

Workers wait on both processes (``wait_seconds``) before any job exists; then chat requests, text requests of
``n = 2`` and, once those are handed out, restarted jobs (a faulted generation puts its job back, as submit's
fault does) are queued and announced. Every announcement reaches both processes, each wakes its own waiter,
and both run the pop: the queue statement's ``FOR UPDATE SKIP LOCKED`` and the ``n`` counter decide. The
processes re-check only every 60 s here, so it is the announcements that hand the jobs out. Every generation id
is handed out once, and each request gets exactly the generations it asked for.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from horde_core import queue_announce
from horde_core.redis_keys import signal_client
from horde_store import users
from horde_store.db import connect
from horde_testing.launcher import ServiceProcess, free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEST_SECRET_KEY = "horde-chat-test-salt"
MODEL = "koboldcpp/longpoll-race-7b"
WORKERS_PER_PROCESS = 3
CHAT_REQUESTS = 12
TEXT_REQUESTS = 8  # n = 2 each
RESTARTS = 4
DEADLINE_SECONDS = 60


@pytest.fixture(scope="module")
def dispatch_urls(horde_settings_env: dict[str, str]) -> Iterator[list[str]]:
    processes = []
    urls = []
    try:
        for name in ("dispatch-a", "dispatch-b"):
            port = free_port()
            env = {
                **horde_settings_env,
                "HORDE_DISPATCH_HTTP_PORT": str(port),
                "HORDE_DISPATCH_GRPC_PORT": str(free_port()),
                "HORDE_LOG_JSON": "false",
                "HORDE_POP_REQUEST_LIMIT_PER_IP": "100000/second",
                # Only announcements wake a waiting pop within the test.
                "HORDE_POP_WAIT_RECHECK_SECONDS": "60",
            }
            process = ServiceProcess(
                name, [sys.executable, "-m", "horde_dispatch"], env, f"http://127.0.0.1:{port}/readyz"
            )
            process.start()
            processes.append(process)
            urls.append(f"http://127.0.0.1:{port}")
        for process in processes:
            process.wait_healthy()
        yield urls
    finally:
        for process in processes:
            process.stop()


async def metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


async def until(test: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not await test():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_waiting_pops_on_two_processes_never_get_the_same_job(
    horde_settings_env: dict[str, str], dispatch_urls: list[str]
) -> None:
    db = await connect(horde_settings_env["HORDE_DATABASE_URL"])
    publisher = signal_client(horde_settings_env["HORDE_REDIS_URL"])
    tag = uuid.uuid4().hex[:6]
    handed: list[str] = []
    per_process: collections.Counter[str] = collections.Counter()
    stop = asyncio.Event()
    try:
        requester, _ = await users.create_user(db, f"lp-requester-{tag}", salt=TEST_SECRET_KEY)
        # An untrusted owner may run 3 workers: one owner per process.
        keys = [
            (await users.create_user(db, f"lp-owner-{tag}-{p}", salt=TEST_SECRET_KEY))[1] for p in range(2)
        ]

        async def worker(client: httpx.AsyncClient, url: str, name: str, key: str) -> None:
            body = {
                "name": name,
                "models": [MODEL],
                "max_length": 512,
                "max_context_length": 4096,
                "chat_jobs": True,
                "chat_limits": {"max_context_length": 4096, "max_length": 512},
                "model_id": MODEL,
                "wait_seconds": 2,
            }
            while not stop.is_set():
                r = await client.post(f"{url}/api/v2/generate/text/pop", json=body, headers={"apikey": key})
                assert r.status_code == 200, r.text
                handed.extend(r.json()["ids"])
                per_process[url] += len(r.json()["ids"])

        async def announce(rows: list[Any], n: int | None = None) -> None:
            for row in rows:
                message = queue_announce.announcement(
                    row["id"],
                    [MODEL],
                    is_chat=row["is_chat"],
                    max_length=row["max_length"],
                    max_context_length=2048,
                    n=n or row["n"],
                )
                assert await queue_announce.publish(publisher, message)

        async with httpx.AsyncClient(timeout=30) as client:
            workers = [
                asyncio.create_task(worker(client, url, f"lp-{tag}-{p}-{w}", keys[p]))
                for p, url in enumerate(dispatch_urls)
                for w in range(WORKERS_PER_PROCESS)
            ]
            try:

                async def all_waiting() -> bool:
                    waiting = [await metric(client, u, "horde_pop_longpoll_waiting") for u in dispatch_urls]
                    return all(w >= WORKERS_PER_PROCESS for w in waiting)

                await until(all_waiting, "the workers never all waited on both processes")
                chat = await db.fetch(
                    """
                    INSERT INTO waiting_prompts (user_id, is_chat, models, n, jobs, max_length, max_context_length,
                                                 params, messages, prompt, active, created, chat_required_features)
                    SELECT $1, true, ARRAY[$2], 1, 1, 256, 2048, '{"max_length": 256}'::jsonb,
                           '[{"role": "user", "content": "race"}]'::jsonb, 'user: race', true,
                           now() - make_interval(secs => g), '{}'
                      FROM generate_series(1, $3) g
                    RETURNING id, is_chat, n, max_length
                    """,
                    requester.id,
                    MODEL,
                    CHAT_REQUESTS,
                )
                text = await db.fetch(
                    """
                    INSERT INTO waiting_prompts (user_id, is_chat, models, n, jobs, max_length, max_context_length,
                                                 params, prompt, active, created)
                    SELECT $1, false, ARRAY[$2], 2, 2, 128, 2048, '{"max_length": 128}'::jsonb, 'race', true,
                           now() - make_interval(secs => g)
                      FROM generate_series(1, $3) g
                    RETURNING id, is_chat, n, max_length
                    """,
                    requester.id,
                    MODEL,
                    TEXT_REQUESTS,
                )
                await announce([*chat, *text])
                first = CHAT_REQUESTS + 2 * TEXT_REQUESTS

                async def handed_out(count: int) -> bool:
                    return len(handed) >= count

                await until(lambda: handed_out(first), f"{len(handed)} of {first} jobs handed out")
                # Restarts: a generation faults and its job goes back to the queue, announced again.
                restarted = await db.fetch(
                    """
                    WITH g AS (
                        UPDATE processing_gens SET faulted = true
                         WHERE id IN (SELECT id FROM processing_gens WHERE wp_id = ANY($1::uuid[])
                                       ORDER BY created LIMIT $2)
                        RETURNING wp_id
                    )
                    UPDATE waiting_prompts w SET n = w.n + 1 FROM g WHERE w.id = g.wp_id
                    RETURNING w.id, w.is_chat, w.n, w.max_length
                    """,
                    [r["id"] for r in chat],
                    RESTARTS,
                )
                assert len(restarted) == RESTARTS
                await announce(restarted, n=1)
                await until(
                    lambda: handed_out(first + RESTARTS), f"{len(handed)} of {first + RESTARTS} handed out"
                )
            finally:
                stop.set()
                await asyncio.gather(*workers)

        assert len(handed) == first + RESTARTS, handed
        assert len(set(handed)) == len(handed), "a generation id was handed out twice"
        mine = [r["id"] for r in [*chat, *text]]
        stored = await db.fetch(
            "SELECT id::text, wp_id, faulted FROM processing_gens WHERE wp_id = ANY($1::uuid[])", mine
        )
        assert {r["id"] for r in stored} == set(handed)
        live = collections.Counter(r["wp_id"] for r in stored if not r["faulted"])
        jobs = {
            r["id"]: r["jobs"]
            for r in await db.fetch("SELECT id, jobs FROM waiting_prompts WHERE id = ANY($1)", mine)
        }
        assert live == jobs, "a request got more or fewer generations than it asked for"
        assert await db.fetchval("SELECT sum(n) FROM waiting_prompts WHERE id = ANY($1)", mine) == 0
        # Both processes' waiters took part (reported, the statement decides which one wins each job).
        assert sum(per_process.values()) == len(handed), per_process
    finally:
        await publisher.aclose()
        await db.close()
