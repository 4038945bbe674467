"""The long-poll pop across two dispatch processes (docs/worker-guide.md#long-poll).

Long-polling workers spread over two dispatch processes wait while chat requests are queued through admission:
every job is handed out exactly once, and soon after its request was queued (the stack's dispatch processes
recheck only every 60 s here, so it is the announcements that wake them). A waiting pop answers empty when its
time is up; a dispatch process that gets SIGTERM answers its waiting pops at once. The reference worker, which
long-polls by default, answers a completion at once after a quiet spell.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from horde_store.db import connect
from horde_testing.launcher import ServiceProcess, free_port

from .conftest import MODEL, Stack

GREETING = "Hello from the scripted backend:"
LONGPOLL_MODEL = "e2e-longpoll/chat-7b"
WORKERS_PER_DISPATCH = 3
JOBS = 24


@pytest.fixture(scope="module")
def stack_env_overrides() -> dict[str, str]:
    # Only announcements wake a waiting pop within the tests' time frames.
    return {"HORDE_POP_WAIT_RECHECK_SECONDS": "60"}


@dataclass
class Dispatch:
    process: ServiceProcess
    url: str


@pytest.fixture(scope="module")
def second_dispatch(stack: Stack) -> Iterator[Dispatch]:
    """Another dispatch process on the same stores (HTTP only)."""
    port = free_port()
    env = {
        **stack.env,
        "HORDE_DISPATCH_HTTP_PORT": str(port),
        "HORDE_DISPATCH_GRPC_ENABLED": "false",
    }
    process = ServiceProcess(
        "dispatch-b", [sys.executable, "-m", "horde_dispatch"], env, f"http://127.0.0.1:{port}/readyz"
    )
    process.start()
    try:
        process.wait_healthy(60)
        yield Dispatch(process, f"http://127.0.0.1:{port}")
    finally:
        process.stop()


def pop_body(name: str, wait: float, model: str = LONGPOLL_MODEL) -> dict[str, Any]:
    return {
        "name": name,
        "models": [model],
        "max_length": 512,
        "max_context_length": 4096,
        "bridge_agent": "Horde Chat Worker:0.1.0:e2e",
        "chat_jobs": True,
        "prompt_jobs": False,
        "chat_limits": {"max_context_length": 8192, "max_length": 1024},
        "model_id": model,
        # a strict request needs the guarantee (docs/native-api.md#guarantees)
        "chat_features": ["prompt_overflow_refused"],
        "wait_seconds": wait,
    }


async def subscribed(url: str) -> None:
    """Wait until the dispatch at ``url`` has its announcement subscription (its metrics say so)."""
    async with httpx.AsyncClient(timeout=5) as client:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            text = (await client.get(f"{url}/metrics")).text
            if 'horde_pop_longpoll_subscriber_total{event="subscribed"}' in text:
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"dispatch at {url} never subscribed")


async def waiting(url: str) -> float:
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"{url}/metrics")).text
    for line in text.splitlines():
        if line.startswith("horde_pop_longpoll_waiting "):
            return float(line.split()[1])
    return 0.0


async def test_every_job_is_handed_out_once_across_two_dispatch_processes(
    stack: Stack, second_dispatch: Dispatch
) -> None:
    urls = [stack.url("dispatch"), second_dispatch.url]  # type: ignore[attr-defined]
    for url in urls:
        await subscribed(url)
    handed: list[tuple[str, float]] = []  # (generation id, when popped)
    skipped: list[dict[str, int]] = []  # a non-empty skipped: requests these workers could not take
    stop = asyncio.Event()
    headers = {"apikey": stack.worker_key}
    # A client of its own: the jobs stay unfinished, and a user may have only 30 waiting requests.
    client_key = str(
        stack.admin("user", "create", "--username", f"lp-{uuid.uuid4().hex[:8]}", "--kudos", "1000")[
            "api_key"
        ]
    )

    async def worker(client: httpx.AsyncClient, url: str, name: str) -> None:
        while not stop.is_set():
            r = await client.post(
                f"{url}/api/v2/generate/text/pop", json=pop_body(name, 3), headers=headers, timeout=30
            )
            assert r.status_code == 200, r.text
            body = r.json()
            handed.extend((gid, time.monotonic()) for gid in body["ids"])
            if body["skipped"]:
                skipped.append(body["skipped"])

    async with httpx.AsyncClient() as client:
        workers = [
            asyncio.create_task(worker(client, url, f"lp-{d}-{i}"))
            for d, url in enumerate(urls)
            for i in range(WORKERS_PER_DISPATCH)
        ]
        try:
            # every worker has checked in and waits (the model is known to admission from then on)
            deadline = time.monotonic() + 15
            while sum([await waiting(u) for u in urls]) < 2 * WORKERS_PER_DISPATCH:
                assert time.monotonic() < deadline, "the workers never all waited"
                await asyncio.sleep(0.05)

            queued: dict[str, float] = {}
            for i in range(JOBS):
                r = await client.post(
                    f"{stack.native}/generate/chat/async",
                    headers={"apikey": client_key},
                    json={"model": LONGPOLL_MODEL, "messages": [{"role": "user", "content": f"job {i}"}]},
                    timeout=30,
                )
                assert r.status_code == 202, r.text
                queued[r.json()["id"]] = time.monotonic()
                if i % 6 == 5:
                    await asyncio.sleep(0.3)  # some requests meet idle waiters, some a busy burst

            deadline = time.monotonic() + 15
            while len(handed) < JOBS and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*workers)

    ids = [gid for gid, _ in handed]
    assert len(ids) == JOBS and len(set(ids)) == JOBS, (handed, skipped[-3:])
    db = await connect(stack.env["HORDE_DATABASE_URL"])
    try:
        rows = await db.fetch(
            """
            SELECT wp.id, wp.n, count(g.id) AS gens, max(g.created) - wp.created AS delay
              FROM waiting_prompts wp LEFT JOIN processing_gens g ON g.wp_id = wp.id
             WHERE wp.id = ANY($1::uuid[])
             GROUP BY wp.id
            """,
            [uuid.UUID(r) for r in queued],
        )
    finally:
        await db.close()
    assert len(rows) == JOBS
    assert all(r["gens"] == 1 and r["n"] == 0 for r in rows), [dict(r) for r in rows]
    # Handed out soon after queueing: the 60 s recheck cannot have done that, the announcements did.
    assert max(r["delay"].total_seconds() for r in rows) < 2.0, [dict(r) for r in rows]


async def test_a_waiting_pop_answers_empty_when_its_time_is_up(
    stack: Stack, second_dispatch: Dispatch
) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        for url in (stack.url("dispatch"), second_dispatch.url):  # type: ignore[attr-defined]
            started = time.monotonic()
            r = await client.post(
                f"{url}/api/v2/generate/text/pop",
                json=pop_body(f"lp-empty-{uuid.uuid4().hex[:6]}", 1.0, model="e2e-longpoll/nobody-asks"),
                headers={"apikey": stack.worker_key},
            )
            elapsed = time.monotonic() - started
            assert r.status_code == 200, r.text
            assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {}}
            assert 1.0 <= elapsed < 3.0, elapsed


def test_the_reference_worker_answers_at_once_after_a_quiet_spell(stack: Stack) -> None:
    """The reference worker long-polls by default: after a quiet spell (its pop held, no backoff sleeping) a
    completion through the front is answered at once, not after the worker's next poll."""
    stack.stop_workers()
    stack.start_worker(f"lp-reference-{uuid.uuid4().hex[:6]}")
    client = openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=60)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "warm up"}])
    time.sleep(4)  # quiet: a classic worker would now be sleeping up to 1 s between empty pops
    timings = []
    for i in range(3):
        started = time.monotonic()
        completion = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"q{i}"}]
        )
        timings.append(time.monotonic() - started)
        assert completion.choices[0].message.content == f"{GREETING} q{i}"
        time.sleep(1.5)
    assert sorted(timings)[1] < 0.5, timings
    stack.stop_workers()


async def test_sigterm_answers_the_waiting_pops_of_a_dispatch_process_at_once(
    stack: Stack, second_dispatch: Dispatch
) -> None:
    url = second_dispatch.url
    async with httpx.AsyncClient(timeout=30) as client:
        task = asyncio.create_task(
            client.post(
                f"{url}/api/v2/generate/text/pop",
                json=pop_body(f"lp-term-{uuid.uuid4().hex[:6]}", 15, model="e2e-longpoll/nobody-asks"),
                headers={"apikey": stack.worker_key},
            )
        )
        deadline = time.monotonic() + 10
        while await waiting(url) < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        started = time.monotonic()
        pid = second_dispatch.process.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        r = await asyncio.wait_for(task, 10)
        assert time.monotonic() - started < 3.0
        assert (r.status_code, r.json()) == (200, {"payload": {}, "id": None, "ids": [], "skipped": {}})
