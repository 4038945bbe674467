"""The queue announcement wire format and its fail-open publisher (horde_core.queue_announce)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from horde_core import queue_announce
from horde_core.redis_keys import redis_client


def test_a_message_round_trips() -> None:
    message = queue_announce.announcement(
        "r1", ["a", "b"], is_chat=True, max_length=512, max_context_length=4096, n=3
    )
    assert json.loads(message.to_json()) == {
        "id": "r1",
        "models": ["a", "b"],
        "is_chat": True,
        "max_length": 512,
        "max_context_length": 4096,
        "n": 3,
    }
    assert queue_announce.parse(message.to_json()) == message
    assert queue_announce.parse(message.to_json().encode()) == message


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        "[]",
        '{"models": "a", "is_chat": true}',
        '{"models": [1], "is_chat": true}',
        '{"models": [], "is_chat": "yes"}',
        '{"models": [], "is_chat": true, "max_length": -1}',
        '{"models": [], "is_chat": true, "max_length": true}',
        '{"models": [], "is_chat": true, "n": 1.5}',
        '{"id": 7, "models": [], "is_chat": true}',
        b"\xff",
    ],
)
def test_malformed_messages_are_none(data: Any) -> None:
    assert queue_announce.parse(data) is None


def test_missing_optional_fields_default() -> None:
    parsed = queue_announce.parse('{"is_chat": false}')
    assert parsed == queue_announce.Announcement(None, (), False, 0, 0, 1)


async def test_publish_fails_open_and_suspends_on_a_hung_store(hung_redis: str) -> None:
    # The client's own read timeout (60 s) is past the hang guard (30 s): only the publish's deadline
    # (ANNOUNCE_TIMEOUT_SECONDS) can end the first publish in time, and the second is skipped (counted).
    client = redis_client(hung_redis, socket_timeout=60)
    message = queue_announce.announcement("r", [], is_chat=False, max_length=1, max_context_length=1)
    try:
        failed = queue_announce.ANNOUNCEMENTS.labels("failed")._value.get()
        assert await asyncio.wait_for(queue_announce.publish(client, message), 30) is False
        assert queue_announce.ANNOUNCEMENTS.labels("failed")._value.get() == failed + 1
        suspended = queue_announce.ANNOUNCEMENTS.labels("suspended")._value.get()
        assert await asyncio.wait_for(queue_announce.publish(client, message), 30) is False
        assert queue_announce.ANNOUNCEMENTS.labels("suspended")._value.get() == suspended + 1
        assert await queue_announce.publish(None, message) is False
    finally:
        await client.aclose()
