"""The progress-stream wire format (horde_core.chat_stream) against the real Redis of horde_testing: entry
decoding, the lease written at pop, the append script, cancel flagging, the ended marker, and that all of it
lives on the chat signal database (docs/native-api.md#progress, #job-lease)."""

from __future__ import annotations

import ast
import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as redis
from horde_contract.limits import CHAT_PROGRESS_LEASE_GRACE_SECONDS, CHAT_PROGRESS_STREAM_TTL_SECONDS
from horde_core import chat_stream as cs
from horde_core.chat_stream import (
    APPEND_PROGRESS_SCRIPT,
    ENDED_MARKER,
    FLAG_CANCELLED_LEASES_SCRIPT,
    AppendResult,
    AppendStatus,
    EntryField,
    LeaseField,
    ProgressAppender,
    StreamEntry,
    StreamLease,
    delete_lease,
    end_stream,
    extend_lease,
    flag_cancelled_leases,
    lease_key_check,
    progress_stream_key,
    read_accepted_bytes,
    read_generation_entries,
    stream_lease_key,
    write_stream_leases,
)
from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client, signal_client
from horde_core.settings import HordeSettings

STORED_KEY_HASH = "stored-key-hash"
CHECK = lease_key_check(STORED_KEY_HASH)


@pytest.fixture(scope="module")
def signals(signal_redis: redis.Redis) -> redis.Redis:
    return signal_redis


@pytest.fixture(scope="module")
def url_db(url_redis: redis.Redis) -> redis.Redis:
    """The database the URL names (0), where nothing of the stream may land."""
    return url_redis


@pytest.fixture(scope="module")
def appender(signals: redis.Redis) -> ProgressAppender:
    return ProgressAppender(signals)


def a_lease(**overrides: object) -> StreamLease:
    values: dict[str, object] = {
        "request_id": str(uuid.uuid4()),
        "worker_id": str(uuid.uuid4()),
        "model": "koboldcpp/test-7b",
        "owner_id": 42,
        "owner_key_hash": STORED_KEY_HASH,
        "max_length": 100,
        "started": datetime.now(UTC),
        "job_ttl": 150,
        "lease_cap": 200,
        "trusted": False,
    }
    values.update(overrides)
    return StreamLease.at_pop(**values)  # type: ignore[arg-type]


async def leased(signals: redis.Redis, **overrides: object) -> tuple[str, StreamLease]:
    """A fresh generation id with its lease written as the pop writes it."""
    gen = str(uuid.uuid4())
    lease = a_lease(**overrides)
    assert await write_stream_leases(signals, {gen: lease})
    return gen, lease


async def stream(signals: redis.Redis, request_id: str) -> list[StreamEntry]:
    entries: list[tuple[str, dict[str, str]]] = await signals.xrange(progress_stream_key(request_id))  # type: ignore[assignment]
    return [StreamEntry.from_fields(i, f) for i, f in entries]


def unreachable() -> redis.Redis:
    # Port 1 refuses at once on loopback: a Redis failure without waiting for a timeout.
    return redis_client("redis://127.0.0.1:1/0", db=CHAT_SIGNAL_DB, socket_connect_timeout=1)


# --- Decoding ---------------------------------------------------------------------------------------------------


def test_stream_entry_decodes_str_and_bytes() -> None:
    as_str = StreamEntry.from_fields(
        "1700000000123-0",
        {"gen": "g", "seq": "3", "content": "Hel", "reasoning_content": "hmm", "worker": "w", "model": "m"},
    )
    as_bytes = StreamEntry.from_fields(
        b"1700000000123-0",
        {
            b"gen": b"g",
            b"seq": b"3",
            b"content": b"Hel",
            b"reasoning_content": b"hmm",
            b"worker": b"w",
            b"model": b"m",
        },
    )
    assert as_str == as_bytes == StreamEntry("1700000000123-0", "g", 3, "Hel", "hmm", "w", "m", False)
    assert as_str.time_seconds == pytest.approx(1700000000.123)


def test_stream_entry_without_reasoning_worker_or_model() -> None:
    entry = StreamEntry.from_fields("5-1", {"gen": "g", "seq": "1", "content": "", "extra": "ignored"})
    assert (entry.reasoning, entry.worker, entry.model, entry.content, entry.ended) == (
        None,
        None,
        None,
        "",
        False,
    )


def test_stream_entry_ended_marker() -> None:
    for fields in ({"gen": "g", "ended": ENDED_MARKER}, {b"gen": b"g", b"ended": b"1"}):
        entry = StreamEntry.from_fields("7-0", fields)
        assert (entry.gen, entry.ended, entry.seq, entry.content) == ("g", True, None, "")
    assert not StreamEntry.from_fields("7-0", {"gen": "g", "ended": "0"}).ended
    assert StreamEntry.from_fields("7-0", {"gen": "g", "seq": "x"}).seq is None


def test_append_reply_decoding() -> None:
    ok = AppendResult.from_reply([b"ok", b"2", b"1", b"1700000000", b"150", b"600", b"1"])
    assert ok == AppendResult(
        AppendStatus.ok, seq=2, cancelled=True, started=1700000000, job_ttl=150, lease_cap=600, trusted=True
    )
    assert AppendResult.from_reply(["sequence", "4"]) == AppendResult(AppendStatus.sequence, expected_seq=4)
    assert AppendResult.from_reply(["retry", "3", "0"]).accepted
    assert not AppendResult.from_reply(["cap"]).accepted
    with pytest.raises(ValueError):
        AppendResult.from_reply(["what"])


def test_scripts_take_every_name_from_the_python_constants() -> None:
    """Field names, key prefixes and statuses reach the scripts only through the prelude formatted from Python;
    the script bodies read the lease hash by name, never by position."""
    prelude = cs._LUA_PRELUDE
    for script in (APPEND_PROGRESS_SCRIPT, FLAG_CANCELLED_LEASES_SCRIPT):
        assert script.startswith(prelude)
        body = script.removeprefix(prelude)
        for member in (*LeaseField, *EntryField, *AppendStatus):
            assert f"'{member.value}'" in prelude
            assert f"'{member.value}'" not in body, member
        assert "horde:chat:" not in body
        assert "HMGET" not in body and not re.search(r"\bf\[\d", body)


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module, docstrings left out (they may name a key pattern)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_service_spells_the_wire_format() -> None:
    """Services (and the benches) reach leases and streams only through this module: no key prefix, and no
    field only the lease hash has, is spelled in their code."""
    root = Path(__file__).resolve().parents[3]
    sources = sorted((root / "services").glob("*/src/**/*.py")) + sorted((root / "bench").glob("*.py"))
    if not sources:
        pytest.skip("not run from the workspace")
    lease_only = {"last_seq", "last_content", "last_reasoning", "max_bytes"}
    offenders = [
        f"{path.relative_to(root)}: {text[:40]!r}"
        for path in sources
        for text in _code_strings(path)
        if "horde:chat:lease:" in text or "horde:chat:stream:" in text or text in lease_only
    ]
    assert offenders == []


def test_settings_lease_length() -> None:
    assert HordeSettings().text_job_lease_seconds == 150
    assert HordeSettings(text_job_lease_seconds=5).text_job_lease_seconds == 5
    with pytest.raises(ValueError):
        HordeSettings(text_job_lease_seconds=0)


# --- The lease --------------------------------------------------------------------------------------------------


async def test_lease_is_written_on_the_signal_database(signals: redis.Redis, url_db: redis.Redis) -> None:
    started = datetime.now(UTC)
    gen, lease = await leased(signals, started=started, trusted=True, lease_cap=600)
    key = stream_lease_key(gen)
    assert key == f"horde:chat:lease:{gen}"
    assert await signals.hgetall(key) == {
        "request": lease.request_id,
        "worker": lease.worker_id,
        "model": "koboldcpp/test-7b",
        "owner": "42",
        "key": CHECK,
        "max_bytes": "1600",  # 16 bytes per max_length token
        "fake": "0",
        "started": str(int(started.timestamp())),
        "job_ttl": "150",
        "lease_cap": "600",
        "trusted": "1",
    }
    assert 150 + CHAT_PROGRESS_LEASE_GRACE_SECONDS - 2 <= await signals.ttl(key) <= 240
    assert signals.connection_pool.connection_kwargs["db"] == CHAT_SIGNAL_DB
    assert await url_db.exists(key) == 0


async def test_signal_client_uses_db_7_whatever_database_the_url_names(redis_url: str) -> None:
    """redis-py lets a URL's database win over a ``db`` keyword; the signal client must not."""
    base = redis_url.rsplit("/", 1)[0]
    gen = str(uuid.uuid4())
    for url in (f"{base}/3", f"{base}/0?db=4", base):
        client = signal_client(url)
        raw = redis.Redis.from_url(f"{base}/{CHAT_SIGNAL_DB}", decode_responses=True)
        try:
            assert await write_stream_leases(client, {gen: a_lease()})
            assert await raw.hget(stream_lease_key(gen), LeaseField.job_ttl.value) == "150"
            await raw.delete(stream_lease_key(gen))
        finally:
            await client.aclose()
            await raw.aclose()
    assert redis_client(f"{base}/3").connection_pool.connection_kwargs["db"] == 3


async def test_lease_expiry_follows_its_job_ttl(signals: redis.Redis) -> None:
    gen, _ = await leased(signals, job_ttl=5)
    assert 5 + CHAT_PROGRESS_LEASE_GRACE_SECONDS - 2 <= await signals.ttl(stream_lease_key(gen)) <= 95


async def test_lease_write_replaces_an_old_hash(signals: redis.Redis) -> None:
    gen = str(uuid.uuid4())
    await signals.hset(stream_lease_key(gen), mapping={LeaseField.cancelled.value: "1", "last_seq": "9"})
    assert await write_stream_leases(signals, {gen: a_lease()})
    assert await signals.hget(stream_lease_key(gen), LeaseField.cancelled.value) is None
    assert await signals.hget(stream_lease_key(gen), LeaseField.last_seq.value) is None


async def test_extend_lease_moves_job_ttl_and_expiry(signals: redis.Redis) -> None:
    started = int(time.time()) - 100
    gen, _ = await leased(signals, started=datetime.fromtimestamp(started, UTC))
    assert await extend_lease(signals, gen, started=started, job_ttl=250)
    assert await signals.hget(stream_lease_key(gen), LeaseField.job_ttl.value) == "250"
    # Expires at started + 250 + 90, i.e. about 240 s from now.
    assert 235 <= await signals.ttl(stream_lease_key(gen)) <= 240
    # A lease a submit deleted meanwhile is not recreated as a partial hash.
    await signals.delete(stream_lease_key(gen))
    assert await extend_lease(signals, gen, started=started, job_ttl=300) is False
    assert await signals.exists(stream_lease_key(gen)) == 0


async def test_submit_deletes_the_lease_and_leaves_the_stream(
    signals: redis.Redis, appender: ProgressAppender
) -> None:
    gen, lease = await leased(signals)
    assert (await appender.append(gen, key_check=CHECK, seq=1, content="x")).status is AppendStatus.ok
    assert await delete_lease(signals, gen)
    assert await signals.exists(stream_lease_key(gen)) == 0
    assert len(await stream(signals, lease.request_id)) == 1


async def test_end_stream_appends_the_ended_marker_and_deletes_the_lease(
    signals: redis.Redis, url_db: redis.Redis
) -> None:
    gen, lease = await leased(signals)
    assert await end_stream(signals, lease.request_id, gen)
    assert await signals.exists(stream_lease_key(gen)) == 0
    raw: list[tuple[str, dict[str, str]]] = await signals.xrange(progress_stream_key(lease.request_id))  # type: ignore[assignment]
    assert [fields for _, fields in raw] == [{"gen": gen, "ended": "1"}]
    [entry] = await stream(signals, lease.request_id)
    assert entry.ended and entry.gen == gen
    assert 0 < await signals.ttl(progress_stream_key(lease.request_id)) <= CHAT_PROGRESS_STREAM_TTL_SECONDS
    assert await url_db.exists(progress_stream_key(lease.request_id)) == 0


async def test_best_effort_helpers_swallow_redis_failures() -> None:
    client = unreachable()
    try:
        assert await write_stream_leases(client, {"g": a_lease()}) is False
        assert await extend_lease(client, "g", started=1, job_ttl=2) is False
        assert await delete_lease(client, "g") is False
        assert await end_stream(client, "r", "g") is False
        assert await flag_cancelled_leases(client, "r", ["g"]) == 0
        with pytest.raises(redis.ConnectionError):
            await ProgressAppender(client).append("g", key_check=CHECK, seq=1, content="x")
    finally:
        await client.aclose()
    assert await write_stream_leases(None, {"g": a_lease()}) is False
    assert await end_stream(None, "r", "g") is False
    assert await flag_cancelled_leases(None, "r", ["g"]) == 0


# --- The append script ------------------------------------------------------------------------------------------


async def test_append_ok_then_retry_then_sequence(
    signals: redis.Redis, url_db: redis.Redis, appender: ProgressAppender
) -> None:
    started = datetime.now(UTC)
    gen, lease = await leased(signals, started=started)
    first = await appender.append(gen, key_check=CHECK, seq=1, content="Hel", reasoning="hmm")
    assert first == AppendResult(
        AppendStatus.ok, seq=1, cancelled=False, started=int(started.timestamp()), job_ttl=150, lease_cap=200
    )
    retry = await appender.append(gen, key_check=CHECK, seq=1, content="Hel", reasoning="hmm")
    assert retry == AppendResult(AppendStatus.retry, seq=1, cancelled=False)
    # The same seq with other content, and a gap, are out of sequence.
    assert await appender.append(gen, key_check=CHECK, seq=1, content="Other") == AppendResult(
        AppendStatus.sequence, expected_seq=2
    )
    assert (await appender.append(gen, key_check=CHECK, seq=3, content="x")).expected_seq == 2
    assert (await appender.append(gen, key_check=CHECK, seq=2, content="lo")).status is AppendStatus.ok
    entries = await stream(signals, lease.request_id)
    assert [(e.gen, e.seq, e.content, e.reasoning, e.worker, e.model) for e in entries] == [
        (gen, 1, "Hel", "hmm", lease.worker_id, lease.model),
        (gen, 2, "lo", None, lease.worker_id, lease.model),
    ]
    fields = await signals.hgetall(stream_lease_key(gen))
    assert (fields["last_seq"], fields["bytes"], fields["last_content"], fields["last_reasoning"]) == (
        "2",
        "8",
        "lo",
        "",
    )
    assert 0 < await signals.ttl(progress_stream_key(lease.request_id)) <= CHAT_PROGRESS_STREAM_TTL_SECONDS
    assert await url_db.exists(progress_stream_key(lease.request_id)) == 0
    assert await read_generation_entries(signals, lease.request_id, gen) == entries
    assert await read_accepted_bytes(signals, gen) == 8


async def test_append_empty_reasoning_is_carried_when_sent(
    signals: redis.Redis, appender: ProgressAppender
) -> None:
    gen, lease = await leased(signals)
    await appender.append(gen, key_check=CHECK, seq=1, content="a", reasoning="")
    [entry] = await stream(signals, lease.request_id)
    assert entry.reasoning == ""


async def test_append_refusals(signals: redis.Redis, appender: ProgressAppender) -> None:
    gen, lease = await leased(signals)
    assert await appender.append(
        gen, key_check=lease_key_check("another"), seq=1, content="x"
    ) == AppendResult(AppendStatus.forbidden)
    assert (await appender.append(gen, key_check="", seq=1, content="x")).status is AppendStatus.forbidden
    assert await appender.append(str(uuid.uuid4()), key_check=CHECK, seq=1, content="x") == AppendResult(
        AppendStatus.nolease
    )
    assert await stream(signals, lease.request_id) == []


async def test_append_caps(signals: redis.Redis, appender: ProgressAppender) -> None:
    gen, _ = await leased(signals)
    assert (
        await appender.append(gen, key_check=CHECK, seq=1, content="a", entry_cap=1)
    ).status is AppendStatus.ok
    assert (
        await appender.append(gen, key_check=CHECK, seq=2, content="b", entry_cap=1)
    ).status is AppendStatus.cap
    # max_length 1 → 16 bytes of content plus reasoning.
    gen, _ = await leased(signals, max_length=1)
    assert (await appender.append(gen, key_check=CHECK, seq=1, content="12345", reasoning="678")).accepted
    assert (await appender.append(gen, key_check=CHECK, seq=2, content="12345678")).status is AppendStatus.ok
    assert (await appender.append(gen, key_check=CHECK, seq=3, content="9")).status is AppendStatus.cap
    assert await read_accepted_bytes(signals, gen) == 16


async def test_fake_lease_is_answered_and_appends_nothing(
    signals: redis.Redis, appender: ProgressAppender
) -> None:
    gen, lease = await leased(signals, fake=True)
    assert (await appender.append(gen, key_check=CHECK, seq=1, content="x")).status is AppendStatus.ok
    assert (await appender.append(gen, key_check=CHECK, seq=1, content="x")).status is AppendStatus.retry
    assert await stream(signals, lease.request_id) == []
    assert await signals.hget(stream_lease_key(gen), LeaseField.last_seq.value) == "1"


async def test_lease_without_model_gives_entries_without_one(
    signals: redis.Redis, appender: ProgressAppender
) -> None:
    gen, lease = await leased(signals)
    await signals.hdel(stream_lease_key(gen), LeaseField.model.value)
    await appender.append(gen, key_check=CHECK, seq=1, content="x")
    raw: list[tuple[str, dict[str, str]]] = await signals.xrange(progress_stream_key(lease.request_id))  # type: ignore[assignment]
    assert EntryField.model.value not in raw[0][1]
    assert (await stream(signals, lease.request_id))[0].model is None


# --- Cancel flagging and settlement reads -----------------------------------------------------------------------


async def test_flag_cancelled_leases(
    signals: redis.Redis, url_db: redis.Redis, appender: ProgressAppender
) -> None:
    request_id = str(uuid.uuid4())
    real, _ = await leased(signals, request_id=request_id)
    fake, _ = await leased(signals, request_id=request_id, fake=True)
    gone = str(uuid.uuid4())
    assert await flag_cancelled_leases(signals, request_id, [real, fake, gone]) == 2
    assert await signals.hget(stream_lease_key(real), LeaseField.cancelled.value) == "1"
    assert await signals.hget(stream_lease_key(fake), LeaseField.cancelled.value) == "1"
    assert await signals.exists(stream_lease_key(gone)) == 0  # only existing leases are written
    entries = await stream(signals, request_id)
    assert [(e.gen, e.ended) for e in entries] == [(real, True)]
    assert 0 < await signals.ttl(progress_stream_key(request_id)) <= CHAT_PROGRESS_STREAM_TTL_SECONDS
    assert await url_db.exists(progress_stream_key(request_id)) == 0
    # The lease is kept: the worker's next post is accepted and told to stop.
    after = await appender.append(real, key_check=CHECK, seq=1, content="late")
    assert (after.status, after.cancelled) == (AppendStatus.ok, True)
    retry = await appender.append(real, key_check=CHECK, seq=1, content="late")
    assert (retry.status, retry.cancelled) == (AppendStatus.retry, True)
    assert await flag_cancelled_leases(signals, request_id, []) == 0


async def test_read_generation_entries_orders_and_filters(
    signals: redis.Redis, appender: ProgressAppender
) -> None:
    request_id = str(uuid.uuid4())
    mine, _ = await leased(signals, request_id=request_id)
    other, _ = await leased(signals, request_id=request_id)
    await appender.append(mine, key_check=CHECK, seq=1, content="ab")
    await appender.append(other, key_check=CHECK, seq=1, content="zzz")
    await appender.append(mine, key_check=CHECK, seq=2, content="cd", reasoning="r")
    await end_stream(signals, request_id, other)
    entries = await read_generation_entries(signals, request_id, mine)
    assert [(e.seq, e.content) for e in entries] == [(1, "ab"), (2, "cd")]
    assert await read_generation_entries(signals, str(uuid.uuid4()), mine) == []
    assert await read_accepted_bytes(signals, mine) == 5
    assert await read_accepted_bytes(signals, other) is None  # its lease ended
