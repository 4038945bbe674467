"""Long-poll pop (docs/worker-guide.md#long-poll): ``wait_seconds`` on the pop, waiting without a pool
connection, the announcements that wake waiters, the wake policy (no thundering herd, bounded hand-offs), the
periodic recheck, a worker that hung up, and shutdown.

The module's dispatch app rechecks only every 30 s and a pop's wait ends without a last statement, so a
waiting pop that gets a job (with ``wait_seconds`` under 30) was woken by an announcement or a hand-off, not by
the safety net or its deadline; the wake and wait counters say which. No test times anything: the ``wait_for``
bounds are hang guards.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
import redis.asyncio as redis
from horde_contract.limits import MAX_POP_WAIT_SECONDS
from horde_core import queue_announce
from horde_core.redis_keys import redis_client, signal_client
from horde_dispatch import longpoll as lp
from horde_dispatch import pop as pop_module
from horde_dispatch.app import create_app
from horde_dispatch.metrics import LONGPOLL_WAITS, LONGPOLL_WAKES
from horde_dispatch.pop_body import parse_pop_body
from horde_dispatch.queue import PoppedJob, PopWorker
from horde_dispatch.settings import DispatchSettings
from horde_testing.launcher import free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY

Harness = Any
CHAT_MODEL = "koboldcpp/test-chat-7b"
RECHECK_SECONDS = 30.0


def _settings(env: dict[str, str], **overrides: Any) -> DispatchSettings:
    values: dict[str, Any] = {
        k.removeprefix("HORDE_").lower(): v for k, v in env.items() if k.startswith("HORDE_")
    }
    values.update(
        secret_key=TEST_SECRET_KEY,
        dispatch_grpc_port=free_port(),
        log_json=False,
        pop_wait_recheck_seconds=RECHECK_SECONDS,
    )
    values.update(overrides)
    return DispatchSettings(**values)


@pytest.fixture(scope="module")
def dispatch_settings(horde_settings_env: dict[str, str]) -> DispatchSettings:
    """This module's dispatch: the conftest's, with a 30 s recheck (announcements do the waking here)."""
    return _settings(horde_settings_env)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def publisher(redis_url: str) -> AsyncIterator[redis.Redis]:
    client = signal_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def longpoll_of(h: Harness) -> lp.LongPoll:
    longpoll = h.app.state.dispatch.longpoll
    assert longpoll is not None
    return longpoll  # type: ignore[no-any-return]


async def subscribed(h: Harness) -> None:
    await until(lambda: h.app.state.dispatch.announcements.subscribed)


async def announce(
    client: redis.Redis,
    wp: uuid.UUID,
    *,
    models: list[str] | None = None,
    n: int = 1,
    is_chat: bool = True,
    max_length: int = 512,
    max_context_length: int = 4096,
) -> None:
    message = queue_announce.announcement(
        wp,
        [CHAT_MODEL] if models is None else models,
        is_chat=is_chat,
        max_length=max_length,
        max_context_length=max_context_length,
        n=n,
    )
    assert await queue_announce.publish(client, message)


async def start_waiters(
    h: Harness, pops: list[tuple[str, dict[str, Any]]]
) -> list[asyncio.Task[httpx.Response]]:
    """Start one waiting pop per ``(apikey, body)``, in order: each is registered before the next starts, so
    FIFO order is the list's."""
    longpoll = longpoll_of(h)
    tasks = []
    for key, body in pops:
        before = longpoll.waiting
        tasks.append(asyncio.create_task(h.pop(key, body)))
        await until(lambda: longpoll.waiting > before)  # noqa: B023 - awaited before the loop moves on
    return tasks


def counted(metric: Any, *labels: str) -> float:
    """A counter's value for one combination of label values (all of them: ``counted(M)``)."""
    return sum(
        sample.value
        for family in metric.collect()
        for sample in family.samples
        if sample.name.endswith("_total") and tuple(sample.labels.values())[: len(labels)] == labels
    )


def wakes_total() -> float:
    return sum(
        sample.value
        for metric in LONGPOLL_WAKES.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


class CountingPop:
    """Wraps the pop statement the route's retries call, counting them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = pop_module.pop_job

        async def counted(conn: Any, pw: PopWorker, head: Any = None) -> PoppedJob | None:
            self.calls += 1
            return await original(conn, pw, head)

        monkeypatch.setattr(pop_module, "pop_job", counted)


# -- the field --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", "Input should be a valid number"),
        (True, "Input should be a valid number"),
        (-1, "Input should be greater than or equal to 0"),
        (21, "Input should be less than or equal to 20"),
        (20.5, "Input should be less than or equal to 20"),
    ],
)
async def test_wait_seconds_out_of_type_or_range_is_400(h: Harness, value: Any, message: str) -> None:
    _, key = await h.user()
    r = await h.pop(key, h.chat_body("w-bad-wait", wait_seconds=value))
    assert r.status_code == 400
    assert r.json() == {
        "message": f"Input payload validation failed: wait_seconds: {message}",
        "rc": "BadRequest",
    }


def test_wait_seconds_bounds_and_default() -> None:
    body = {"name": "w", "models": ["model-a"]}
    assert parse_pop_body(body).wait_seconds == 0
    assert parse_pop_body({**body, "wait_seconds": 0}).wait_seconds == 0
    assert parse_pop_body({**body, "wait_seconds": 0.25}).wait_seconds == 0.25
    assert parse_pop_body({**body, "wait_seconds": MAX_POP_WAIT_SECONDS}).wait_seconds == 20


async def test_without_wait_seconds_an_empty_pop_answers_at_once(h: Harness) -> None:
    _, key = await h.user()
    waits = counted(LONGPOLL_WAITS)
    r = await asyncio.wait_for(h.pop(key, h.chat_body("w-no-wait")), 30)
    assert r.status_code == 200 and r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {}}
    assert counted(LONGPOLL_WAITS) == waits  # it never waited


# -- waiting ----------------------------------------------------------------------------------------------------


async def test_a_waiting_pop_gets_a_job_queued_and_announced_after_it_started(
    h: Harness, publisher: redis.Redis
) -> None:
    await subscribed(h)
    requester, _ = await h.user()
    _, key = await h.user()
    (task,) = await start_waiters(h, [(key, h.chat_body("w-long", wait_seconds=10))])
    wp = await h.request(user_id=requester)
    woken = counted(LONGPOLL_WAKES, "announcement", "job")
    await announce(publisher, wp)
    r = await asyncio.wait_for(task, 30)
    assert counted(LONGPOLL_WAKES, "announcement", "job") == woken + 1
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] is not None and body["chat"] is True and body["skipped"] == {}
    assert await h.db.fetchval("SELECT wp_id FROM processing_gens WHERE id = $1", uuid.UUID(body["id"])) == wp
    assert longpoll_of(h).waiting == 0


async def test_a_waiting_pop_answers_empty_when_its_time_is_up(h: Harness) -> None:
    requester, _ = await h.user()
    _, key = await h.user()
    # A request this worker may not take (past its chat max_length): counted in skipped, once, at the end.
    await h.request(user_id=requester, max_length=4000)
    timeouts = counted(LONGPOLL_WAITS, "timeout")
    r = await asyncio.wait_for(h.pop(key, h.chat_body("w-timeout", wait_seconds=0.6)), 30)
    assert r.status_code == 200
    assert r.json() == {"payload": {}, "id": None, "ids": [], "skipped": {"max_length": 1}}
    assert counted(LONGPOLL_WAITS, "timeout") == timeouts + 1  # it waited, and its time ended the wait
    assert longpoll_of(h).waiting == 0


async def test_a_worker_in_maintenance_gets_its_403_at_once(h: Harness) -> None:
    _, key = await h.user()
    assert (await h.pop(key, h.chat_body("w-maint"))).status_code == 200
    await h.set_worker("w-maint", maintenance=True)
    waits = counted(LONGPOLL_WAITS)
    r = await asyncio.wait_for(h.pop(key, h.chat_body("w-maint", wait_seconds=5)), 30)
    assert (r.status_code, r.json()["rc"]) == (403, "WorkerMaintenance")
    assert counted(LONGPOLL_WAITS) == waits and longpoll_of(h).waiting == 0  # it never waited


async def test_no_pool_connection_is_held_while_waiting(h: Harness) -> None:
    pool = h.app.state.dispatch.pool
    _, key = await h.user(trusted=True)
    count = h.settings.db_pool_max_size + 2
    tasks = await start_waiters(h, [(key, h.chat_body(f"w-pool-{i}", wait_seconds=5)) for i in range(count)])
    assert longpoll_of(h).waiting == count
    assert pool.get_idle_size() == pool.get_size()
    # More waiters than the pool has connections, and an immediate pop is answered while they all still wait.
    r = await asyncio.wait_for(h.pop(key, h.chat_body("w-pool-quick")), 30)
    assert r.status_code == 200 and r.json()["id"] is None
    assert longpoll_of(h).waiting == count and not any(task.done() for task in tasks)
    for r in await asyncio.gather(*tasks):
        assert r.json()["id"] is None


async def test_one_announced_job_wakes_one_of_many_waiters(
    h: Harness, publisher: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await subscribed(h)
    requester, _ = await h.user()
    _, key = await h.user(trusted=True)
    tasks = await start_waiters(h, [(key, h.chat_body(f"w-herd-{i}", wait_seconds=2)) for i in range(8)])
    counting = CountingPop(monkeypatch)
    wakes_before = wakes_total()
    wp = await h.request(user_id=requester)
    await announce(publisher, wp)
    done, _ = await asyncio.wait(tasks, timeout=3, return_when=asyncio.FIRST_COMPLETED)
    assert done, "no waiter was answered"
    await asyncio.sleep(0.3)  # room for any further (wrong) wake
    assert counting.calls == 1  # the first woken waiter took it: one statement, not eight
    assert wakes_total() - wakes_before == 1
    results = [r.json() for r in await asyncio.gather(*tasks)]
    jobs = [b for b in results if b["id"] is not None]
    assert len(jobs) == 1
    assert results[0]["id"] is not None  # the first waiter in FIFO order
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE wp_id = $1", wp) == 1


async def test_an_announcement_of_n_wakes_n_waiters(
    h: Harness, publisher: redis.Redis, monkeypatch: Any
) -> None:
    await subscribed(h)
    requester, _ = await h.user()
    _, key = await h.user(trusted=True)
    tasks = await start_waiters(h, [(key, h.chat_body(f"w-n-{i}", wait_seconds=2)) for i in range(6)])
    counting = CountingPop(monkeypatch)
    wp = await h.request(user_id=requester, n=3)
    await announce(publisher, wp, n=3)
    results = [r.json() for r in await asyncio.gather(*tasks)]
    assert [b["id"] is not None for b in results] == [True, True, True, False, False, False]
    assert counting.calls == 3
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE wp_id = $1", wp) == 3


async def test_a_wake_nobody_could_take_is_handed_on_a_bounded_number_of_times(
    h: Harness, publisher: redis.Redis, monkeypatch: Any
) -> None:
    """Untrusted waiters cannot take a trusted-only request (a rule the pre-filter does not know): the wake goes
    from one to the next, four times at most, and the trusted waiter behind them gets the job only when the
    chain reaches it."""
    await subscribed(h)
    requester, _ = await h.user()
    untrusted = [await h.user() for _ in range(3)]
    _, trusted_key = await h.user(trusted=True)
    pops = [(key, h.chat_body(f"w-hand-{i}", wait_seconds=2)) for i, (_, key) in enumerate(untrusted)]
    pops.append((trusted_key, h.chat_body("w-hand-trusted", wait_seconds=2)))
    tasks = await start_waiters(h, pops)
    counting = CountingPop(monkeypatch)
    wp = await h.request(user_id=requester, trusted_workers=True)
    await announce(publisher, wp)
    r = await asyncio.wait_for(tasks[-1], 3)
    assert r.json()["id"] is not None
    assert counting.calls == 4  # three empty retries, each handing on, then the job
    for t in tasks[:-1]:
        assert (await t).json()["id"] is None

    # Seven waiters that cannot take it before the one that could: 1 + 4 statements, then the chain stops.
    untrusted = [await h.user() for _ in range(7)]
    pops = [(key, h.chat_body(f"w-cap-{i}", wait_seconds=1.5)) for i, (_, key) in enumerate(untrusted)]
    pops.append((trusted_key, h.chat_body("w-cap-trusted", wait_seconds=1.5)))
    tasks = await start_waiters(h, pops)
    counting.calls = 0
    wp = await h.request(user_id=requester, trusted_workers=True)
    await announce(publisher, wp)
    results = [r.json() for r in await asyncio.gather(*tasks)]
    assert counting.calls == 1 + lp.HANDOFF_LIMIT
    assert all(b["id"] is None for b in results)  # found at the next recheck or pop, not by this chain


async def test_an_announcement_the_waiter_cannot_serve_does_not_wake_it(
    h: Harness, publisher: redis.Redis, monkeypatch: Any
) -> None:
    await subscribed(h)
    _, key = await h.user()
    (task,) = await start_waiters(h, [(key, h.chat_body("w-filter", wait_seconds=1))])
    counting = CountingPop(monkeypatch)
    await announce(publisher, uuid.uuid4(), models=["some/other-model"])
    await announce(publisher, uuid.uuid4(), max_length=4000)  # past the chat max_length of 1024
    # a text job for any model, past the worker's text max_length (512)
    await announce(publisher, uuid.uuid4(), is_chat=False, models=[], max_length=600)
    await asyncio.wait_for(task, 3)
    assert counting.calls == 0


async def test_a_job_queued_while_the_first_attempt_ran_is_caught_up(h: Harness, monkeypatch: Any) -> None:
    """An announcement routed after the pop noted the sequence but before it registered gives it an
    immediate retry (it could have been committed after the first statement's snapshot)."""
    requester, _ = await h.user()
    _, key = await h.user()
    longpoll = longpoll_of(h)
    original = pop_module.pop_job
    queued: list[uuid.UUID] = []

    async def first_attempt_misses(conn: Any, pw: PopWorker, head: Any = None) -> PoppedJob | None:
        if not queued:
            wp = await h.request(user_id=requester)
            queued.append(wp)
            longpoll.announce(
                queue_announce.announcement(
                    wp, [CHAT_MODEL], is_chat=True, max_length=512, max_context_length=4096
                )
            )
            return None  # as if the statement's snapshot predated the commit
        return await original(conn, pw, head)

    monkeypatch.setattr(pop_module, "pop_job", first_attempt_misses)
    woken = counted(LONGPOLL_WAKES, "announcement", "job")
    r = await asyncio.wait_for(h.pop(key, h.chat_body("w-catch-up", wait_seconds=5)), 30)
    # A job, so not the deadline (no statement runs there) nor the 30 s recheck: the caught-up announcement.
    assert r.json()["id"] is not None
    assert counted(LONGPOLL_WAKES, "announcement", "job") == woken + 1


# -- a worker that hung up -----------------------------------------------------------------------------------------


async def test_a_worker_that_hung_up_is_not_given_the_job(h: Harness, publisher: redis.Redis) -> None:
    """The ASGI app called directly: the worker's connection closes while it waits; the announcement's retry
    sees the disconnect first, so the job stays queued for a live worker."""
    await subscribed(h)
    requester, _ = await h.user()
    _, key = await h.user()
    body = json.dumps(h.chat_body("w-gone", wait_seconds=5)).encode()
    hung_up = asyncio.Event()
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v2/generate/text/pop",
        "raw_path": b"/api/v2/generate/text/pop",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"dispatch"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"apikey", key.encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("dispatch", 80),
    }
    longpoll = longpoll_of(h)
    call = asyncio.create_task(h.app(scope, receive, send))
    await until(lambda: longpoll.waiting == 1)
    hung_up.set()
    wp = await h.request(user_id=requester)
    await announce(publisher, wp)
    await asyncio.wait_for(call, 3)
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"]) == {"payload": {}, "id": None, "ids": [], "skipped": {}}
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE wp_id = $1", wp) == 0
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1


# -- Redis down, shutdown ------------------------------------------------------------------------------------------


async def test_with_redis_hung_a_waiting_pop_finds_a_job_at_its_recheck(
    h: Harness, horde_settings_env: dict[str, str], hung_redis: str
) -> None:
    settings = _settings(
        horde_settings_env, redis_url=hung_redis, dispatch_grpc_enabled=False, pop_wait_recheck_seconds=0.3
    )
    app = create_app(settings)
    requester, _ = await h.user()
    _, key = await h.user()
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d") as client:
            assert app.state.dispatch.announcements.subscribed is False
            task = asyncio.create_task(
                client.post(
                    "/api/v2/generate/text/pop",
                    json=h.chat_body("w-hung", wait_seconds=3),
                    headers={"apikey": key},
                )
            )
            await until(lambda: app.state.dispatch.longpoll.waiting == 1)
            rechecked = counted(LONGPOLL_WAKES, "recheck", "job")
            await h.request(user_id=requester)  # no announcement can reach this process
            r = await asyncio.wait_for(task, 30)
            assert r.json()["id"] is not None
            assert counted(LONGPOLL_WAKES, "recheck", "job") == rechecked + 1
            # nothing queued: the empty answer at the deadline
            timeouts = counted(LONGPOLL_WAITS, "timeout")
            r = await asyncio.wait_for(
                client.post(
                    "/api/v2/generate/text/pop",
                    json=h.chat_body("w-hung", wait_seconds=0.7),
                    headers={"apikey": key},
                ),
                30,
            )
            assert r.json()["id"] is None
            assert counted(LONGPOLL_WAITS, "timeout") == timeouts + 1


async def test_shutdown_releases_waiting_pops_with_the_empty_answer(
    h: Harness, horde_settings_env: dict[str, str]
) -> None:
    app = create_app(_settings(horde_settings_env, dispatch_grpc_enabled=False))
    _, key = await h.user()
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d")
    try:
        task = asyncio.create_task(
            client.post(
                "/api/v2/generate/text/pop",
                json=h.chat_body("w-shutdown", wait_seconds=15),
                headers={"apikey": key},
            )
        )
        await until(lambda: app.state.dispatch.longpoll.waiting == 1)
        closed = counted(LONGPOLL_WAITS, "closed")
        await lifespan.__aexit__(None, None, None)
        r = await asyncio.wait_for(task, 30)
        assert counted(LONGPOLL_WAITS, "closed") == closed + 1  # released by the shutdown, not at 15 s
        assert (r.status_code, r.json()) == (200, {"payload": {}, "id": None, "ids": [], "skipped": {}})
    finally:
        await client.aclose()


async def test_the_shutdown_hook_chains_to_the_servers_signal_handler() -> None:
    seen: list[str] = []
    original = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append("server"))
    try:
        remove = lp.on_shutdown_signal(lambda: seen.append("longpoll"))
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0.05)
        assert seen == ["server", "longpoll"]  # the server's handler runs in the signal; ours on the loop
        remove()
        seen.clear()
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0.05)
        assert seen == ["server"]
    finally:
        signal.signal(signal.SIGTERM, original)


# -- the registry on its own ---------------------------------------------------------------------------------------


def pop_worker(**overrides: Any) -> PopWorker:
    values: dict[str, Any] = {
        "worker_id": uuid.uuid4(),
        "owner_id": 1,
        "priority_user_ids": (),
        "models": (CHAT_MODEL, "text/model"),
        "accepts_prompt_jobs": True,
        "text_max_length": 512,
        "text_max_context_length": 2048,
        "accepts_chat_jobs": True,
        "chat_model_id": CHAT_MODEL,
        "chat_features": (),
        "chat_max_length": 1024,
        "chat_max_context_length": 8192,
        "chat_tools_max_temperature": None,
        "image_transports": (),
        "capacity": 1200,
        "trusted": False,
        "validated": True,
        "slow": False,
        "maintenance": False,
        "paused": False,
        "amount": 1,
        "lease_cap": 600,
        "job_ttl": 150,
    }
    values.update(overrides)
    return PopWorker(**values)


def chat_announcement(**overrides: Any) -> queue_announce.Announcement:
    values: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "models": (CHAT_MODEL,),
        "is_chat": True,
        "max_length": 512,
        "max_context_length": 4096,
        "n": 1,
    }
    values.update(overrides)
    return queue_announce.Announcement(**values)


@pytest.mark.parametrize(
    ("worker", "announcement", "expected"),
    [
        ({}, {}, True),
        ({}, {"models": ()}, True),
        ({}, {"models": ("other",)}, False),
        ({}, {"max_length": 1025}, False),
        ({"capacity": 300}, {"max_length": 512}, False),
        ({}, {"max_context_length": 8193}, False),
        ({"accepts_chat_jobs": False, "chat_model_id": None}, {}, False),
        ({"paused": True}, {}, False),
        ({}, {"is_chat": False, "models": ("text/model",), "max_context_length": 2048}, True),
        ({}, {"is_chat": False, "models": (), "max_context_length": 2048}, True),
        ({}, {"is_chat": False, "models": ("x", "y"), "max_context_length": 2048}, False),
        (
            {},
            {"is_chat": False, "models": ("text/model",), "max_length": 513, "max_context_length": 2048},
            False,
        ),
        ({}, {"is_chat": False, "models": ("text/model",), "max_context_length": 2049}, False),
        (
            {"accepts_prompt_jobs": False},
            {"is_chat": False, "models": ("text/model",), "max_context_length": 2048},
            False,
        ),
    ],
)
def test_plausible(worker: dict[str, Any], announcement: dict[str, Any], expected: bool) -> None:
    assert lp.plausible(pop_worker(**worker), chat_announcement(**announcement)) is expected


def popped(request_id: str | None) -> PoppedJob:
    now = datetime.now(UTC)
    return PoppedJob(
        wp_id=uuid.UUID(request_id) if request_id else uuid.uuid4(),
        requester_id=1,
        shared_key_id=None,
        is_chat=True,
        prompt="",
        params={},
        messages=None,
        max_length=512,
        max_context_length=4096,
        chat_extras=None,
        stream_progress=False,
        model=CHAT_MODEL,
        image_transport=None,
        created=now,
        assigned=now,
        over_capacity=False,
        generation_ids=[uuid.uuid4()],
    )


class Recorder:
    """Fake pop statements for registry tests: record which waiter ran one, hand out what ``jobs`` holds."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.jobs: list[PoppedJob] = []

    def pop_for(self, index: int) -> Callable[[], Awaitable[PoppedJob | None]]:
        async def pop() -> PoppedJob | None:
            self.calls.append(index)
            return self.jobs.pop(0) if self.jobs else None

        return pop


async def not_gone() -> bool:
    return False


async def start_registry_waiters(
    longpoll: lp.LongPoll, recorder: Recorder, count: int, wait: float
) -> list[asyncio.Task[Any]]:
    loop = asyncio.get_running_loop()
    tasks = []
    for i in range(count):
        tasks.append(
            asyncio.create_task(
                longpoll.wait(
                    pop_worker(owner_id=1 + i),  # one owner each: an owner's waiters use one hand-off
                    since=longpoll.sequence,
                    deadline=loop.time() + wait,
                    pop=recorder.pop_for(i),
                    gone=not_gone,
                )
            )
        )
    await until(lambda: longpoll.waiting == count)
    return tasks


async def test_an_announcement_nobody_can_take_costs_one_plus_the_hand_off_limit() -> None:
    longpoll = lp.LongPoll(recheck_seconds=30)
    recorder = Recorder()
    tasks = await start_registry_waiters(longpoll, recorder, 10, wait=0.5)
    assert longpoll.announce(chat_announcement(n=2)) == 1
    outcomes = await asyncio.gather(*tasks)
    assert recorder.calls == [0, 1, 2, 3, 4]  # FIFO, then four hand-offs, then it stops
    assert {o for _, o in outcomes} == {lp.WaitOutcome.timeout}


async def test_the_generations_of_an_announcement_go_to_one_waiter_after_the_other() -> None:
    """n = 3: the first waiter takes one, then the next is woken for the rest (never all at once, which would
    have them contend for the request's row)."""
    longpoll = lp.LongPoll(recheck_seconds=30)
    recorder = Recorder()
    announcement = chat_announcement(n=3)
    recorder.jobs = [popped(announcement.request_id) for _ in range(3)]
    tasks = await start_registry_waiters(longpoll, recorder, 5, wait=0.5)
    longpoll.announce(announcement)
    outcomes = [o for _, o in await asyncio.gather(*tasks)]
    assert recorder.calls == [0, 1, 2]
    assert outcomes == [lp.WaitOutcome.job] * 3 + [lp.WaitOutcome.timeout] * 2


async def test_a_reconnect_wakes_every_waiter_once() -> None:
    longpoll = lp.LongPoll(recheck_seconds=30)
    recorder = Recorder()
    tasks = await start_registry_waiters(longpoll, recorder, 5, wait=0.4)
    assert longpoll.wake_all() == 5
    await asyncio.gather(*tasks)
    assert sorted(recorder.calls) == [0, 1, 2, 3, 4]


async def test_waiters_recheck_periodically_and_close_releases_them() -> None:
    longpoll = lp.LongPoll(recheck_seconds=0.1)
    recorder = Recorder()
    tasks = await start_registry_waiters(longpoll, recorder, 2, wait=10)
    # About every 0.1 s (±20 %) each: the interval drawn, and the rechecks it brings (nothing else wakes them).
    assert all(0.08 <= longpoll._recheck_interval() <= 0.12 for _ in range(200))
    await until(lambda: len(recorder.calls) >= 6, within=30)
    longpoll.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [o for _, o in outcomes] == [lp.WaitOutcome.closed, lp.WaitOutcome.closed]
    assert longpoll.waiting == 0
    job, outcome = await longpoll.wait(
        pop_worker(),
        since=0,
        deadline=asyncio.get_running_loop().time() + 5,
        pop=recorder.pop_for(9),
        gone=not_gone,
    )
    assert (job, outcome) == (None, lp.WaitOutcome.closed)


async def test_a_gone_worker_runs_no_statement_and_passes_its_wake_on() -> None:
    longpoll = lp.LongPoll(recheck_seconds=30)
    recorder = Recorder()
    loop = asyncio.get_running_loop()

    async def gone() -> bool:
        return True

    first = asyncio.create_task(
        longpoll.wait(pop_worker(), since=0, deadline=loop.time() + 2, pop=recorder.pop_for(0), gone=gone)
    )
    await until(lambda: longpoll.waiting == 1)
    second = asyncio.create_task(
        longpoll.wait(
            pop_worker(),
            since=longpoll.sequence,
            deadline=loop.time() + 0.5,
            pop=recorder.pop_for(1),
            gone=not_gone,
        )
    )
    await until(lambda: longpoll.waiting == 2)
    longpoll.announce(chat_announcement())
    assert (await first)[1] is lp.WaitOutcome.gone
    await second
    assert recorder.calls == [1]  # the gone waiter's wake went to the next one, without using a hand-off


async def test_the_subscriber_wakes_every_waiter_when_it_subscribes_again(redis_url: str) -> None:
    name = f"longpoll-test-{uuid.uuid4().hex[:8]}"
    client = redis_client(redis_url, client_name=name)
    longpoll = lp.LongPoll(recheck_seconds=30)
    subscriber = lp.AnnouncementSubscriber(client, longpoll)
    recorder = Recorder()
    subscriber.start()
    try:
        await until(lambda: subscriber.subscribed)
        tasks = await start_registry_waiters(longpoll, recorder, 3, wait=6)
        # Drop the subscriber's connection: the subscription is made again, announcements sent meanwhile may
        # be lost, so every waiter retries once.
        clients = await client.execute_command("CLIENT", "LIST", "TYPE", "pubsub")
        (subscription,) = [
            line for line in str(clients).splitlines() if f"name={name}" in line and " sub=1 " in line
        ]
        await client.execute_command("CLIENT", "KILL", "ID", subscription.split()[0].removeprefix("id="))
        await until(lambda: len(recorder.calls) == 3, within=5)
        await until(lambda: subscriber.subscribed)
        assert sorted(recorder.calls) == [0, 1, 2]
        # and announcements flow again
        await queue_announce.publish(client, chat_announcement())
        await until(lambda: len(recorder.calls) > 3, within=3)
        longpoll.close()
        await asyncio.gather(*tasks)
    finally:
        await subscriber.stop()
        await client.aclose()


async def test_the_operator_cap_bounds_every_wait(
    h: Harness, horde_settings_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(_settings(horde_settings_env, dispatch_grpc_enabled=False, pop_wait_max_seconds=0.3))
    _, key = await h.user()
    waited: list[float] = []  # the wait each pop was given, in seconds of the loop's clock
    wait = lp.LongPoll.wait

    async def spy(self: lp.LongPoll, pw: PopWorker, **kwargs: Any) -> Any:
        waited.append(kwargs["deadline"] - asyncio.get_running_loop().time())
        return await wait(self, pw, **kwargs)

    monkeypatch.setattr(lp.LongPoll, "wait", spy)
    timeouts = counted(LONGPOLL_WAITS, "timeout")
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d") as client:
            r = await asyncio.wait_for(
                client.post(
                    "/api/v2/generate/text/pop",
                    json=h.chat_body("w-capped", wait_seconds=10),
                    headers={"apikey": key},
                ),
                30,
            )
            assert r.json()["id"] is None
            assert len(waited) == 1 and 0 < waited[0] <= 0.3  # the cap, not the 10 s asked for
            assert counted(LONGPOLL_WAITS, "timeout") == timeouts + 1


async def test_waiting_pops_do_not_use_up_the_in_flight_cap(
    h: Harness, horde_settings_env: dict[str, str]
) -> None:
    app = create_app(_settings(horde_settings_env, dispatch_grpc_enabled=False, max_in_flight_requests=2))
    _, key = await h.user(trusted=True)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d") as client:

            def pop(name: str, wait: float) -> Any:
                return client.post(
                    "/api/v2/generate/text/pop",
                    json=h.chat_body(name, wait_seconds=wait),
                    headers={"apikey": key},
                )

            tasks = []
            for i in range(4):
                tasks.append(asyncio.create_task(pop(f"w-cap-{i}", 1.5)))
                await until(lambda: app.state.dispatch.longpoll.waiting == i + 1)  # noqa: B023 - awaited here
            r = await pop("w-cap-now", 0)
            assert r.status_code == 200, r.text
            assert all(r.status_code == 200 for r in await asyncio.gather(*tasks))


# -- a hostile worker ------------------------------------------------------------------------------------------


async def test_a_worker_put_in_maintenance_while_waiting_gets_the_403_not_another_users_job(
    h: Harness, publisher: redis.Redis
) -> None:
    await subscribed(h)
    requester, _ = await h.user()
    _, key = await h.user()
    (task,) = await start_waiters(h, [(key, h.chat_body("w-maint-late", wait_seconds=5))])
    await h.set_worker("w-maint-late", maintenance=True)
    wp = await h.request(user_id=requester)
    await announce(publisher, wp)
    r = await task
    assert r.status_code == 403
    assert r.json() == {"message": pop_module.DEFAULT_MAINTENANCE_MESSAGE, "rc": "WorkerMaintenance"}
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE wp_id = $1", wp) == 0
    assert await h.db.fetchval("SELECT n FROM waiting_prompts WHERE id = $1", wp) == 1


async def test_an_owner_flagged_while_waiting_gets_the_403_and_no_job(
    h: Harness, publisher: redis.Redis
) -> None:
    await subscribed(h)
    requester, _ = await h.user()
    owner_id, key = await h.user()
    (task,) = await start_waiters(h, [(key, h.chat_body("w-flag-late", wait_seconds=5))])
    await h.db.execute("UPDATE users SET flagged = true WHERE id = $1", owner_id)
    wp = await h.request(user_id=requester)
    await announce(publisher, wp)
    r = await task
    assert (r.status_code, r.json()["rc"]) == (403, "WorkerFlaggedMaintenance")
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE wp_id = $1", wp) == 0


async def test_trust_revoked_while_waiting_keeps_trusted_only_jobs_away(
    h: Harness, publisher: redis.Redis
) -> None:
    await subscribed(h)
    requester, _ = await h.user()
    owner_id, key = await h.user(trusted=True)
    (task,) = await start_waiters(h, [(key, h.chat_body("w-trust-late", wait_seconds=1))])
    await h.db.execute("UPDATE users SET trusted = false WHERE id = $1", owner_id)
    wp = await h.request(user_id=requester, trusted_workers=True)
    await announce(publisher, wp)
    r = await task
    assert r.status_code == 200 and r.json()["id"] is None
    assert await h.db.fetchval("SELECT count(*) FROM processing_gens WHERE wp_id = $1", wp) == 0


async def test_a_worker_waits_with_at_most_its_threads_pops(h: Harness) -> None:
    longpoll = longpoll_of(h)
    _, key = await h.user()
    body = h.chat_body("w-threads-2", wait_seconds=5, threads=2)
    waiting = await start_waiters(h, [(key, body), (key, body)])
    assert longpoll.waiting_for(await h.db.fetchval("SELECT id FROM workers WHERE name = 'w-threads-2'")) == 2
    waits = counted(LONGPOLL_WAITS)
    third = await asyncio.wait_for(h.pop(key, body), 30)
    assert counted(LONGPOLL_WAITS) == waits  # answered at once, not held: no wait ended, the two still wait
    assert third.status_code == 200 and third.json()["id"] is None and "skipped" in third.json()
    assert longpoll.waiting_for(await h.db.fetchval("SELECT id FROM workers WHERE name = 'w-threads-2'")) == 2
    longpoll.close()
    for r in await asyncio.gather(*waiting):
        assert r.status_code == 200 and r.json()["id"] is None
    longpoll.closed = False


async def test_each_owners_waiters_at_the_head_use_one_hand_off(h: Harness, publisher: redis.Redis) -> None:
    await subscribed(h)
    requester, _ = await h.user()
    _, one = await h.user()
    _, other = await h.user()
    _, trusted = await h.user(trusted=True)
    # Six untrusted waiters of two owners ahead: more than the first wake and its 4 hand-offs.
    pops = [
        (key, h.chat_body(f"w-head-{n}-{i}", wait_seconds=5))
        for n, key in enumerate((one, other))
        for i in range(3)
    ]
    pops.append((trusted, h.chat_body("w-trusted-tail", wait_seconds=5)))
    tasks = await start_waiters(h, pops)
    wp = await h.request(user_id=requester, trusted_workers=True)
    await announce(publisher, wp)
    # A job within its 5 s, so not the 30 s recheck nor the deadline (no statement there): the hand-off.
    got = await asyncio.wait_for(tasks[-1], 30)
    assert got.status_code == 200 and got.json()["ids"]
    assert (
        await h.db.fetchval(
            "SELECT w.name FROM processing_gens p JOIN workers w ON w.id = p.worker_id WHERE p.wp_id = $1", wp
        )
        == "w-trusted-tail"
    )
    longpoll_of(h).close()
    for r in await asyncio.gather(*tasks[:-1]):
        assert r.status_code == 200 and r.json()["id"] is None
    longpoll_of(h).closed = False


def test_rechecks_are_spread_to_a_per_process_budget() -> None:
    longpoll = lp.LongPoll(recheck_seconds=3)
    assert 3 * 0.8 <= longpoll._recheck_interval() <= 3 * 1.2
    for _ in range(400):
        longpoll._waiters[lp.Waiter(pop_worker())] = None
    # 400 waiters at most MAX_RECHECKS_PER_SECOND (20) rechecks a second: 20 s apart each, give or take 20 %
    assert 20 * 0.8 <= longpoll._recheck_interval() <= 20 * 1.2
