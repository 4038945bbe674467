"""Two dispatch processes pop concurrently from one database: no job is handed out twice (the pop's
``FOR UPDATE SKIP LOCKED``)."""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from horde_store import users
from horde_store.db import connect
from horde_testing.launcher import ServiceProcess, free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEST_SECRET_KEY = "horde-chat-test-salt"
MODEL = "koboldcpp/race-chat-7b"
CHAT_REQUESTS = 240
TEXT_REQUESTS = 60  # n = 2 each: 120 text jobs
OWNERS = 3
WORKERS_PER_OWNER = 4


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
                # Every test worker pops from 127.0.0.1 at full speed: room above upstream's 60/second.
                "HORDE_POP_REQUEST_LIMIT_PER_IP": "100000/second",
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


async def test_two_processes_never_hand_out_a_job_twice(
    horde_settings_env: dict[str, str], dispatch_urls: list[str]
) -> None:
    db = await connect(horde_settings_env["HORDE_DATABASE_URL"])
    try:
        requester, _ = await users.create_user(db, "race-requester", salt=TEST_SECRET_KEY)
        keys = []
        for i in range(OWNERS):
            _, key = await users.create_user(db, f"race-owner-{i}", salt=TEST_SECRET_KEY)
            keys.append(key)
        await db.execute(
            """
            INSERT INTO waiting_prompts (user_id, is_chat, models, n, jobs, max_length, max_context_length, params,
                                         messages, prompt, active, extra_priority, created, chat_required_features)
            SELECT $1, true, ARRAY[$2], 1, 1, 256, 2048, '{"max_length": 256}'::jsonb,
                   '[{"role": "user", "content": "race"}]'::jsonb, 'user: race', true, g % 7,
                   now() - make_interval(secs => g), '{}'
            FROM generate_series(1, $3) g
            """,
            requester.id,
            MODEL,
            CHAT_REQUESTS,
        )
        await db.execute(
            """
            INSERT INTO waiting_prompts (user_id, is_chat, models, n, jobs, max_length, max_context_length, params,
                                         prompt, active, extra_priority, created)
            SELECT $1, false, ARRAY[$2], 2, 2, 128, 2048, '{"max_length": 128}'::jsonb, 'race', true, g % 5,
                   now() - make_interval(secs => g)
            FROM generate_series(1, $3) g
            """,
            requester.id,
            MODEL,
            TEXT_REQUESTS,
        )
        expected_jobs = CHAT_REQUESTS + 2 * TEXT_REQUESTS

        handed: list[str] = []
        per_process: collections.Counter[str] = collections.Counter()

        async def worker_loop(client: httpx.AsyncClient, key: str, name: str, start: int) -> None:
            body = {
                "name": name,
                "models": [MODEL],
                "max_length": 512,
                "max_context_length": 4096,
                "chat_jobs": True,
                "chat_limits": {"max_context_length": 4096, "max_length": 512},
                "model_id": MODEL,
            }
            empty = 0
            turn = start
            while empty < 3:
                url = dispatch_urls[turn % 2]
                turn += 1
                r = await client.post(f"{url}/api/v2/generate/text/pop", json=body, headers={"apikey": key})
                assert r.status_code == 200, r.text
                ids = r.json()["ids"]
                if not ids:
                    empty += 1
                    continue
                empty = 0
                handed.extend(ids)
                per_process[url] += len(ids)

        async with httpx.AsyncClient(timeout=30) as client:
            # Check every worker in first, so all of them race from the start.
            loops = [
                worker_loop(client, keys[o], f"race-{o}-{w}", o * WORKERS_PER_OWNER + w)
                for o in range(OWNERS)
                for w in range(WORKERS_PER_OWNER)
            ]
            await asyncio.wait_for(asyncio.gather(*loops), timeout=60)

        assert len(handed) == expected_jobs
        assert len(set(handed)) == len(handed), "a generation id was handed out twice"
        assert all(per_process[url] > 0 for url in dispatch_urls), per_process
        stored = await db.fetch("SELECT id::text, wp_id FROM processing_gens")
        assert {r["id"] for r in stored} == set(handed)
        per_request: dict[Any, int] = collections.Counter(r["wp_id"] for r in stored)
        jobs = {r["id"]: r["jobs"] for r in await db.fetch("SELECT id, jobs FROM waiting_prompts")}
        assert per_request == jobs, "a request got more or fewer generations than it asked for"
        assert await db.fetchval("SELECT sum(n) FROM waiting_prompts") == 0
    finally:
        await db.close()
