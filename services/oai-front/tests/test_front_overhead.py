"""What the front adds to a completion (bench/bench_front_latency.py): the signal hub's one
pub/sub connection stays subscribed and read, a waiter woken by the signal reads the status once and returns,
and the native calls share pooled keep-alive connections. On the real Redis; the native horde is a real HTTP
server on loopback. No timing assertions: a wait that must end on the signal has a recheck interval of an
hour, so only the signal can end it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as redis
import uvicorn
from horde_core.redis_keys import chat_signal_channel, signal_client
from horde_core.signals import CLIENT_NAME, SignalHub, publish_chat_event
from horde_oai.cancels import CancelManager
from horde_oai.horde_client import NATIVE_KEEPALIVE_SECONDS, HordeClient
from horde_oai.waiter import ChatWait
from horde_testing.launcher import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

HOUR = 3600.0
WAITING = {
    "done": False,
    "faulted": False,
    "waiting": 1,
    "processing": 0,
    "finished": 0,
    "queue_position": 1,
    "wait_time": 5,
    "is_possible": True,
    "eligible_worker_threads": 1,
    "generations": [],
}
DONE = {
    "done": True,
    "faulted": False,
    "waiting": 0,
    "processing": 0,
    "finished": 1,
    "is_possible": True,
    "generations": [
        {"text": "hi", "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
}


@dataclass
class NativePeer:
    """A real HTTP server standing in for admission: it records each call's route and client port, and
    answers the status with ``status()``."""

    url: str = ""
    calls: list[tuple[str, int]] = field(default_factory=list)  # (route, client port)
    status: Callable[[], dict[str, Any]] = lambda: WAITING
    read: asyncio.Event = field(default_factory=asyncio.Event)  # set at every status read


@pytest.fixture
async def native_peer() -> AsyncIterator[NativePeer]:
    peer = NativePeer()

    async def submit(request: Request) -> JSONResponse:
        peer.calls.append(("submit", request.client.port if request.client else 0))
        return JSONResponse({"id": "r1", "kudos": 1, "warnings": []}, status_code=202)

    async def status(request: Request) -> JSONResponse:
        peer.calls.append(("status", request.client.port if request.client else 0))
        peer.read.set()
        return JSONResponse(peer.status())

    app = Starlette(
        routes=[
            Route("/api/v2/generate/chat/async", submit, methods=["POST"]),
            Route("/api/v2/generate/chat/status/{id}", status, methods=["GET"]),
        ]
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    for _ in range(500):  # uvicorn exposes no start event; poll its flag for up to 5 s
        if server.started:
            break
        await asyncio.sleep(0.01)
    peer.url = f"http://127.0.0.1:{port}/api"
    try:
        yield peer
    finally:
        server.should_exit = True
        await task


async def test_native_calls_reuse_one_keep_alive_connection(native_peer: NativePeer) -> None:
    client = HordeClient(native_peer.url)
    try:
        for _ in range(3):  # three requests, one after another: submit, then two status reads each
            assert (await client.submit("key", {"model": "m"})).status == 202
            assert (await client.status("r1")).ok
            assert (await client.status("r1")).ok
    finally:
        await client.aclose()
    ports = {port for _, port in native_peer.calls}
    assert len(native_peer.calls) == 9 and len(ports) == 1, native_peer.calls


def test_the_pool_retires_an_idle_connection_before_the_server_closes_it() -> None:
    # uvicorn (every native service) closes a connection idle for timeout_keep_alive seconds; a pooled
    # connection reused just as the server closes it fails the call.
    server_keep_alive = uvicorn.Config(Starlette()).timeout_keep_alive
    assert NATIVE_KEEPALIVE_SECONDS < server_keep_alive
    limits = HordeClient("http://127.0.0.1:1/api").limits
    assert limits.keepalive_expiry == NATIVE_KEEPALIVE_SECONDS
    # Concurrent calls keep their connections instead of closing all but httpx's default 20 after a burst.
    assert limits.max_keepalive_connections == limits.max_connections


async def _numsub(publisher: redis.Redis, channel: str) -> int:
    [(_, count)] = await publisher.pubsub_numsub(channel)
    return int(count)


async def _subscribed(publisher: redis.Redis, channel: str) -> int:
    """The subscribers of ``channel`` once there is one: a SUBSCRIBE is only sent when ``subscribe()`` returns,
    and Redis may answer another connection's command first (up to 10 s, then the count as it is)."""
    for _ in range(1000):
        count = await _numsub(publisher, channel)
        if count:
            return count
        await asyncio.sleep(0.01)
    return await _numsub(publisher, channel)


async def test_the_hub_connection_stays_subscribed_while_no_request_waits(redis_url: str) -> None:
    hub = SignalHub(redis_url)
    publisher = signal_client(redis_url)
    await hub.start()
    try:
        assert await _subscribed(publisher, hub.hub_channel) == 1
        for n in range(5):  # requests one after another: each subscribes right after the last one left
            sub = await hub.subscribe(f"seq-{n}")
            assert await _subscribed(publisher, chat_signal_channel(f"seq-{n}")) == 1
            assert await publish_chat_event(publisher, f"seq-{n}", "generation", 1)
            event = await sub.wait(30)
            assert event is not None and event["event"] == "generation"
            await hub.unsubscribe(sub)
            assert await _numsub(publisher, hub.hub_channel) == 1
        assert hub.connects == 1
    finally:
        await hub.stop()
        await publisher.aclose()


async def test_a_dropped_hub_connection_is_reopened_and_wakes_every_waiter(redis_url: str) -> None:
    hub = SignalHub(redis_url)
    publisher = signal_client(redis_url)
    await hub.start()
    try:
        sub = await hub.subscribe("dropped-1")
        assert await _subscribed(publisher, sub.channel) == 1
        clients = await publisher.client_list(_type="pubsub")
        ours = [c for c in clients if c.get("name") == hub.client_name]
        assert all(c["name"].startswith(f"{CLIENT_NAME}:") for c in ours)
        assert ours, clients
        for c in ours:
            await publisher.client_kill_filter(_id=c["id"])
        # A message may have been lost while the connection was down: the waiter re-reads its status.
        assert await sub.wait(30) == {"event": "reconnected"}
        assert await hub.wait_connected(30)
        assert await _subscribed(publisher, sub.channel) == 1
        assert await publish_chat_event(publisher, "dropped-1", "done", 1)
        event = await sub.wait(30)
        assert event is not None and event["event"] == "done"
        await hub.unsubscribe(sub)
    finally:
        await hub.stop()
        await publisher.aclose()


async def test_a_waiter_woken_by_the_signal_reads_the_status_once_and_returns(
    redis_url: str, native_peer: NativePeer
) -> None:
    hub = SignalHub(redis_url)
    publisher = signal_client(redis_url)
    client = HordeClient(native_peer.url)
    await hub.start()
    finished = False
    native_peer.status = lambda: DONE if finished else WAITING
    wait = ChatWait(
        request_id="woken-1",
        submitted_at=time.time(),
        budget=HOUR,
        client=client,
        hub=hub,
        cancels=CancelManager(client, HOUR),
        recheck_seconds=HOUR,  # only the signal can end this wait
        grace_seconds=HOUR,
        models=["m"],
    )
    task = asyncio.create_task(wait.run())
    try:
        await asyncio.wait_for(native_peer.read.wait(), 30)  # the read after subscribing: still waiting
        assert await _subscribed(publisher, chat_signal_channel("woken-1")) == 1
        assert not task.done()
        finished = True  # the worker's submit commits, then publishes
        assert await publish_chat_event(publisher, "woken-1", "generation", 1)
        status = await asyncio.wait_for(task, 30)
    finally:
        task.cancel()
        await hub.stop()
        await publisher.aclose()
        await client.aclose()
    assert status["done"] is True
    assert [route for route, _ in native_peer.calls] == ["status", "status"]
    assert wait.trace.woke_by == "generation" and wait.trace.wakes == 1
