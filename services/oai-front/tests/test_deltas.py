"""The delta reader and the resume records against a real Redis (docs/openai-front.md
#streaming): one XREAD for every registered request, batches per read, recovery from a broken connection
without skipping entries, and nothing from a stream recreated below the last id read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from horde_core.chat_stream import progress_stream_key
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client
from horde_oai.deltas import MAX_STREAM_CONNECTIONS, DeltaFeed, DeltaStreamReader, RelayRecords, StreamBusy


async def next_batch(feed: DeltaFeed):
    return await asyncio.wait_for(feed.batches.get(), 5.0)


@asynccontextmanager
async def running_reader(redis_url: str, **settings: Any) -> AsyncIterator[DeltaStreamReader]:
    """A started reader on its own connection to the stream database (its XREAD blocks that connection)."""
    client = redis_client(redis_url, db=CHAT_SIGNAL_DB)
    reader = DeltaStreamReader(client, **settings)
    await reader.start()
    try:
        yield reader
    finally:
        await reader.stop()
        await client.aclose()


async def test_one_reader_serves_every_registered_request_in_order(redis_url, signal_redis):
    writer = signal_redis
    await writer.delete(progress_stream_key("r1"), progress_stream_key("r2"), progress_stream_key("r3"))
    async with running_reader(redis_url, block_ms=50) as reader:
        one, two = reader.register("r1"), reader.register("r2")
        await writer.xadd(progress_stream_key("r1"), {"gen": "g", "seq": 1, "content": "a"})
        await writer.xadd(progress_stream_key("r1"), {"gen": "g", "seq": 2, "content": "b"})
        await writer.xadd(progress_stream_key("r2"), {"gen": "h", "ended": 1})
        got: list[str] = []
        while len(got) < 2:
            got += [e.content for e in await next_batch(one)]
        assert got == ["a", "b"]
        (marker,) = await next_batch(two)
        assert marker.ended and marker.gen == "h"
        assert reader.registered == 2
        reader.unregister(two)
        await writer.xadd(progress_stream_key("r2"), {"gen": "h", "seq": 1, "content": "late"})
        await writer.xadd(progress_stream_key("r1"), {"gen": "g", "seq": 3, "content": "c"})
        assert [e.content for e in await next_batch(one)] == ["c"]
        assert two.batches.empty()


async def test_registration_from_an_id_skips_what_came_before(redis_url, signal_redis):
    key = progress_stream_key("from-id")
    await signal_redis.delete(key)
    first = await signal_redis.xadd(key, {"gen": "g", "seq": 1, "content": "seen"})
    await signal_redis.xadd(key, {"gen": "g", "seq": 2, "content": "new"})
    async with running_reader(redis_url, block_ms=50) as reader:
        feed = reader.register("from-id", first)
        assert [e.content for e in await next_batch(feed)] == ["new"]


async def test_a_recreated_stream_with_lower_ids_yields_nothing(redis_url, signal_redis):
    client = signal_redis
    key = progress_stream_key("recreated")
    await client.delete(key)
    await client.xadd(key, {"gen": "g", "seq": 1, "content": "x"}, id="5000-0")
    async with running_reader(redis_url, block_ms=50) as reader:
        feed = reader.register("recreated")
        assert [e.id for e in await next_batch(feed)] == ["5000-0"]
        await client.delete(key)  # a failover lost the key; the horde writes it again from lower ids
        await client.xadd(key, {"gen": "g", "seq": 2, "content": "y"}, id="4000-0")
        await asyncio.sleep(0.3)
        assert feed.batches.empty()
        await client.xadd(key, {"gen": "g", "seq": 3, "content": "z"}, id="6000-0")
        assert [e.content for e in await next_batch(feed)] == ["z"]


async def test_a_broken_connection_is_read_again_from_the_last_entry(redis_url, signal_redis):
    admin = signal_redis  # redis-py reconnects it after the kill below
    key = progress_stream_key("broken")
    await admin.delete(key)
    async with running_reader(redis_url, block_ms=2000, retry_seconds=0.1) as reader:
        feed = reader.register("broken")
        await admin.xadd(key, {"gen": "g", "seq": 1, "content": "before"})
        assert [e.content for e in await next_batch(feed)] == ["before"]
        await asyncio.sleep(0.1)  # the reader is blocked in XREAD again
        await admin.client_kill_filter(_type="normal", skipme=True)
        await admin.xadd(key, {"gen": "g", "seq": 2, "content": "after"})
        got = await next_batch(feed)
        assert [e.content for e in got] == ["after"]
        assert feed.batches.empty()


async def test_a_read_over_the_timeout_is_abandoned_and_made_again(redis_url, signal_redis):
    writer = signal_redis
    key = progress_stream_key("abandoned")
    await writer.delete(key)
    # BLOCK longer than the timeout: every empty read is abandoned, as a hung connection's would be.
    async with running_reader(redis_url, block_ms=3000, read_timeout=0.2, retry_seconds=0.1) as reader:
        feed = reader.register("abandoned")
        await asyncio.sleep(0.5)  # at least one abandoned read
        await writer.xadd(key, {"gen": "g", "seq": 1, "content": "still here"})
        assert [e.content for e in await next_batch(feed)] == ["still here"]


async def test_reader_without_redis_is_silent():
    reader = DeltaStreamReader(None)
    await reader.start()
    feed = reader.register("x")
    assert not reader.enabled
    await asyncio.sleep(0.05)
    assert feed.batches.empty()
    await reader.stop()


async def test_relay_records_save_load_attach_and_history(signal_redis):
    client = signal_redis
    records = RelayRecords(client, ttl_seconds=60)
    await records.save("rec", "k" * 64, "b" * 64, 1234.5)
    found = await records.load("rec")
    assert found == {"key": "k" * 64, "body": "b" * 64, "submitted_at": "1234.5", "attach": "1", "live": "1"}
    assert 0 < await client.ttl("horde:oai:relay:rec") <= 60
    assert await records.attach("rec") == 2
    assert await records.load("missing") is None
    assert await records.attach("missing") is None
    # The resume ends with the stream; the original drops for good: the last one closes the record, and
    # no later resume can attach to its cancelled request.
    assert await records.detach("rec", close_if_last=False) is True
    assert await records.detach("rec", close_if_last=True) is False
    assert (await records.load("rec") or {})["closed"] == "1"
    assert await records.attach("rec") is None
    await client.delete(progress_stream_key("rec"))
    await client.xadd(progress_stream_key("rec"), {"gen": "g", "seq": 1, "content": "hi"})
    assert [e.content for e in await records.history("rec")] == ["hi"]


async def test_a_stream_takes_at_most_max_connections(signal_redis):
    records = RelayRecords(signal_redis, ttl_seconds=60)
    await records.save("busy", "k", "b", 1.0)
    for expected in range(2, MAX_STREAM_CONNECTIONS + 1):
        assert await records.attach("busy") == expected
    with pytest.raises(StreamBusy):
        await records.attach("busy")
    # A dropped connection still counts until its grace ends; a resume meanwhile keeps the stream open.
    assert await records.detach("busy", close_if_last=True) is True
    assert await records.attach("busy") == MAX_STREAM_CONNECTIONS + 1


async def test_every_connection_of_a_request_gets_each_entry_after_its_own_start(redis_url, signal_redis):
    client = signal_redis
    key = progress_stream_key("fan-out")
    await client.delete(key)
    first = await client.xadd(key, {"gen": "g", "seq": 1, "content": "one"})
    async with running_reader(redis_url, block_ms=50) as reader:
        original = reader.register("fan-out")
        assert [e.content for e in await next_batch(original)] == ["one"]
        resumed = reader.register("fan-out", first)  # a resume that replayed entry one from XRANGE
        await client.xadd(key, {"gen": "g", "seq": 2, "content": "two"})
        assert [e.content for e in await next_batch(original)] == ["two"]
        assert [e.content for e in await next_batch(resumed)] == ["two"]
        reader.unregister(resumed)
        await client.xadd(key, {"gen": "g", "seq": 3, "content": "three"})
        assert [e.content for e in await next_batch(original)] == ["three"]
        assert resumed.batches.empty() and reader.registered == 1
