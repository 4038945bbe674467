"""The call records that make a retry the same operation (docs/openai-front.md#retries-and-idempotency), against a real
Redis: which attempt joins, which starts anew, what an idempotency key replays, and what a dropped
connection's grace decides."""

from __future__ import annotations

import json
import uuid

import pytest
from horde_core.redis_keys import operation_record_key
from horde_oai.errors import OpenAIError
from horde_oai.operations import (
    MAX_IDEMPOTENCY_KEY_LENGTH,
    OPERATION_RECORD_TTL_SECONDS,
    UNQUEUED_RECORD_TTL_SECONDS,
    Call,
    OperationRecords,
    idempotency_key_of,
    normal_operation_key,
)


@pytest.fixture
async def records(signal_redis) -> OperationRecords:
    return OperationRecords(signal_redis)


def fresh_key() -> str:
    return uuid.uuid4().hex


async def claim(
    records: OperationRecords,
    key: str,
    body: str = "body-1",
    *,
    idem: str | None = None,
    op: str | None = None,
    declared: bool = False,
) -> Call | OpenAIError:
    return await records.claim(key, body, idempotency_key=idem, client_operation_key=op, declared=declared)


async def stored(signal_redis, call: Call) -> dict[str, str]:
    return await signal_redis.hgetall(operation_record_key(call.call_key))


async def test_a_new_call_gets_a_fresh_operation_key_and_an_open_record(records, signal_redis):
    call = await claim(records, fresh_key())
    assert isinstance(call, Call) and call.tracked and not call.joined
    uuid.UUID(call.operation_key)
    assert await stored(signal_redis, call) == {
        "op": call.operation_key,
        "state": "open",
        "live": "1",
        "body": "body-1",
    }
    assert 0 < await signal_redis.ttl(operation_record_key(call.call_key)) <= OPERATION_RECORD_TTL_SECONDS


async def test_after_a_retryable_error_the_same_body_joins_the_first_operation(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key)
    assert isinstance(first, Call)
    await first.end_with(
        OpenAIError(502, "The Horde could not be reached: x", "HordeUnavailable"), created=False
    )
    assert (await stored(signal_redis, first))["state"] == "retryable"
    retry = await claim(records, key)  # no retry header: a retry loop of any client
    assert isinstance(retry, Call) and retry.joined
    assert retry.operation_key == first.operation_key
    assert await stored(signal_redis, retry) == {
        "op": first.operation_key,
        "state": "open",
        "live": "1",
        "body": "body-1",
    }
    # Joined: the call may have a request now, so the record lives the request's 20 minutes again.
    assert await signal_redis.ttl(operation_record_key(first.call_key)) > UNQUEUED_RECORD_TTL_SECONDS


async def test_a_concurrent_identical_call_is_its_own_operation_unless_it_declares_a_retry(records):
    key = fresh_key()
    first = await claim(records, key)
    other = await claim(records, key)
    assert isinstance(first, Call) and isinstance(other, Call)
    assert not other.joined and other.operation_key != first.operation_key
    declared = await claim(records, key, declared=True)
    assert isinstance(declared, Call) and declared.joined
    assert declared.operation_key == other.operation_key


async def test_a_replaced_record_is_not_touched_by_the_attempt_it_replaced(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key)
    second = await claim(records, key)
    assert isinstance(first, Call) and isinstance(second, Call)
    await first.end("delivered")
    assert (await stored(signal_redis, second))["op"] == second.operation_key
    assert (await stored(signal_redis, second))["state"] == "open"


async def test_a_delivered_body_call_is_joined_only_by_a_declared_retry(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key)
    assert isinstance(first, Call)
    await first.end("delivered")
    assert (await stored(signal_redis, first))["state"] == "delivered"
    retry = await claim(records, key, declared=True)
    assert isinstance(retry, Call) and retry.joined and retry.operation_key == first.operation_key
    await retry.end("delivered")
    again = await claim(records, key)
    assert isinstance(again, Call) and not again.joined and again.operation_key != first.operation_key


async def test_a_settled_body_call_is_forgotten(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key)
    assert isinstance(first, Call)
    error = OpenAIError(408, "The request did not complete", "ChatRequestTimeout").settled()
    await first.end_with(error, created=True)
    assert await stored(signal_redis, first) == {}
    again = await claim(records, key, declared=True)
    assert isinstance(again, Call) and not again.joined


async def test_an_idempotency_key_replays_the_settled_error_of_its_request(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key, idem="idem-1")
    assert isinstance(first, Call)
    error = OpenAIError(
        502,
        "The AI Horde faulted the request: boom",
        "ChatRequestFaulted",
        metadata={"request_id": "r-1", "fault_reason": "boom"},
        headers={"x-should-retry": "false"},
    )
    await first.end_with(error, created=True)
    record = await stored(signal_redis, first)
    assert record["state"] == "final" and json.loads(record["error"])["status"] == 502
    conflict = await claim(records, key, "another body", idem="idem-1")
    assert isinstance(conflict, OpenAIError)
    assert (conflict.status, conflict.code, conflict.param) == (400, "OperationKeyConflict", None)
    assert conflict.message == "This Idempotency-Key already identifies a different request."
    assert conflict.headers["x-should-retry"] == "false"
    replay = await claim(records, key, idem="idem-1")
    assert isinstance(replay, OpenAIError)
    assert replay.body() == error.body() and replay.status == 502
    assert replay.headers["x-should-retry"] == "false"
    # Another key, or the same idempotency key under another API key, is another call.
    assert isinstance(await claim(records, key, idem="idem-2"), Call)
    assert await signal_redis.ttl(operation_record_key(first.call_key)) > 600  # the request's own 20 minutes
    assert isinstance(await claim(records, fresh_key(), idem="idem-1"), Call)


async def test_an_idempotency_key_refused_before_any_request_starts_over(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key, idem="k")
    assert isinstance(first, Call)
    await first.end_with(OpenAIError(400, "bad", "BadRequest"), created=False)
    assert await stored(signal_redis, first) == {}
    again = await claim(records, key, idem="k")
    assert isinstance(again, Call) and not again.joined


async def test_an_idempotency_key_always_joins_a_live_or_delivered_call(records):
    key = fresh_key()
    first = await claim(records, key, idem="k")
    joined = await claim(records, key, idem="k")
    assert isinstance(first, Call) and isinstance(joined, Call)
    assert joined.joined and joined.operation_key == first.operation_key
    await first.end("delivered")
    await joined.end("delivered")
    later = await claim(records, key, idem="k")
    assert isinstance(later, Call) and later.joined and later.operation_key == first.operation_key


async def test_a_client_operation_key_is_the_operation_key(records):
    op = str(uuid.uuid4())
    call = await claim(records, fresh_key(), op=op)
    assert isinstance(call, Call) and call.operation_key == op and call.kind == "idem"


async def test_a_drop_leaves_the_call_to_a_retry_until_its_grace_ends(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key)
    assert isinstance(first, Call)
    await first.end("dropped")
    record = await stored(signal_redis, first)
    assert (record["op"], record["state"], record["live"]) == (first.operation_key, "retryable", "0")
    assert await first.joined_meanwhile() is False
    retry = await claim(records, key)
    assert isinstance(retry, Call) and retry.joined
    assert await first.joined_meanwhile() is True  # a retry joined: the request goes on
    await first.abandon(None)  # a cancel racing the join changes nothing
    assert (await stored(signal_redis, retry))["live"] == "1"
    await retry.end("dropped")
    await retry.abandon(None)  # nobody came back and nothing was charged: a later call is new
    assert await stored(signal_redis, retry) == {}


async def test_an_abandoned_call_whose_request_still_runs_stays_open_to_a_retry(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key)
    assert isinstance(first, Call)
    await first.end("dropped")
    await first.abandon("retryable")
    assert (await stored(signal_redis, first))["state"] == "retryable"
    later = await claim(records, key)
    assert isinstance(later, Call) and later.joined and later.operation_key == first.operation_key


async def test_without_redis_an_idempotency_key_still_names_one_operation():
    records = OperationRecords(None)
    first = await claim(records, "k", idem="i")
    again = await claim(records, "k", idem="i")
    plain = await claim(records, "k")
    plain_again = await claim(records, "k")
    assert isinstance(first, Call) and isinstance(again, Call)
    assert not first.tracked and first.operation_key == again.operation_key
    assert isinstance(plain, Call) and isinstance(plain_again, Call)
    assert plain.operation_key != plain_again.operation_key
    assert await first.joined_meanwhile() is False


async def test_another_body_under_a_used_key_does_not_take_the_call_away(records, signal_redis):
    key = fresh_key()
    first = await claim(records, key, idem="k")
    assert isinstance(first, Call)
    await first.end("delivered")
    conflicting = await claim(records, key, "another body", idem="k")
    assert isinstance(conflicting, Call) and conflicting.joined
    conflict = OpenAIError(400, "The operation key was used for another request.", "OperationKeyConflict")
    await conflicting.end_with(conflict, created=False)
    record = await stored(signal_redis, first)
    assert record["op"] == first.operation_key and record["live"] == "0"
    later = await claim(records, key, idem="k")
    assert isinstance(later, Call) and later.joined and later.operation_key == first.operation_key


async def test_a_call_refused_before_queueing_keeps_its_record_two_minutes(records, signal_redis):
    first = await claim(records, fresh_key())
    assert isinstance(first, Call)
    await first.end_with(OpenAIError(429, "slow down", "rate_limit_exceeded"), created=False)
    assert 0 < await signal_redis.ttl(operation_record_key(first.call_key)) <= UNQUEUED_RECORD_TTL_SECONDS


def test_the_idempotency_key_header_is_stripped_and_bounded():
    assert idempotency_key_of({"idempotency-key": "  k-1 "}) == "k-1"
    assert idempotency_key_of({"idempotency-key": "   "}) is None
    assert idempotency_key_of({}) is None
    assert idempotency_key_of({"idempotency-key": "x" * MAX_IDEMPOTENCY_KEY_LENGTH}) == "x" * 255
    with pytest.raises(OpenAIError) as refused:
        idempotency_key_of({"idempotency-key": "x" * (MAX_IDEMPOTENCY_KEY_LENGTH + 1)})
    assert (refused.value.status, refused.value.code) == (400, "BadRequest")
    assert refused.value.message == "The Idempotency-Key header is longer than 255 characters."


def test_spellings_of_one_operation_key_are_one_key():
    key = uuid.uuid4()
    spellings = {str(key).upper(), "{" + str(key) + "}", f"urn:uuid:{key}", key.hex}
    assert {normal_operation_key(s) for s in spellings} == {str(key)}
    assert normal_operation_key("not-a-uuid") == "not-a-uuid"
    assert normal_operation_key(None) is None and normal_operation_key("") is None
