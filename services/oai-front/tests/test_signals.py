"""The signal hub against a real Redis: one pub/sub connection, events routed per request."""

from __future__ import annotations

import asyncio

from horde_core.redis_keys import signal_client
from horde_core.signals import SignalHub, publish_chat_event


async def test_events_reach_every_subscriber_of_the_request(redis_url):
    hub = SignalHub(redis_url)
    publisher = signal_client(redis_url)  # db 7, while the hub listens on the URL's db
    await hub.start()
    try:
        first = await hub.subscribe("req-1")
        second = await hub.subscribe("req-1")
        other = await hub.subscribe("req-2")
        await asyncio.sleep(0.2)  # the SUBSCRIBE reaches the server
        assert await publish_chat_event(publisher, "req-1", "generation", 1)
        assert await publish_chat_event(publisher, "req-1", "done", 1)
        assert await first.wait(5) == {"id": "req-1", "event": "generation", "generations": 1}
        done, generation = await first.wait(5), await second.wait(5)
        assert done is not None and done["event"] == "done"
        assert generation is not None and generation["event"] == "generation"
        assert await other.wait(0.3) is None
        await hub.unsubscribe(first)
        await hub.unsubscribe(second)
        await publish_chat_event(
            publisher, "req-2", "faulted", 0, fault_reason="why", fault_rc="ChatWorkerFault"
        )
        assert await other.wait(5) == {
            "id": "req-2",
            "event": "faulted",
            "generations": 0,
            "fault_reason": "why",
            "fault_rc": "ChatWorkerFault",
        }
        await hub.unsubscribe(other)
    finally:
        await hub.stop()
        await publisher.aclose()


async def test_hub_without_redis_only_times_out():
    hub = SignalHub(None)
    await hub.start()
    sub = await hub.subscribe("req")
    assert await sub.wait(0.05) is None
    await hub.unsubscribe(sub)
    await hub.stop()
