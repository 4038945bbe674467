"""The migration history on a real PostgreSQL: idempotence, two concurrent migrators, the spec's
columns, the operation-key index and the repair of an INVALID leftover index."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from horde_store.db import connect
from horde_store.migrate import MIGRATION_LOCK_KEY, load_migrations, migrate, split_sql
from horde_testing.pgadmin import create_database_sync, drop_database_sync
from horde_testing.stores import PostgresStore

ALL_VERSIONS = [m.version for m in load_migrations()]


@pytest.fixture
def empty_db(pg_server: PostgresStore) -> Iterator[str]:
    """A brand-new database with no schema (DSN)."""
    name = f"horde_empty_{secrets.token_hex(4)}"
    create_database_sync(pg_server.dsn, name)
    yield pg_server.dsn_for(name)
    drop_database_sync(pg_server.dsn, name)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await connect(database_url)
    yield c
    await c.close()


async def test_migrate_twice_is_a_noop(empty_db: str) -> None:
    first = await migrate(empty_db)
    assert first == ALL_VERSIONS
    assert await migrate(empty_db) == []
    c = await asyncpg.connect(empty_db)
    try:
        rows = await c.fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == sorted(ALL_VERSIONS)
        assert await c.fetchval("SELECT count(*) FROM users WHERE id = 0") == 1
    finally:
        await c.close()


async def test_two_processes_migrate_at_once(empty_db: str) -> None:
    code = (
        "import asyncio, json, sys\n"
        "from horde_store.migrate import migrate\n"
        "print(json.dumps(asyncio.run(migrate(sys.argv[1]))))\n"
    )
    holder = await asyncpg.connect(empty_db)
    try:
        # Hold the migration lock until both migrators are connected and waiting, so they contend.
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - a quick spawn; the waits below are off the loop
                [sys.executable, "-c", code, empty_db], stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            for _ in range(2)
        ]
        for _ in range(600):
            waiting = await holder.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if waiting >= 2 or any(p.poll() is not None for p in procs):
                break
            await asyncio.sleep(0.02)
        assert waiting >= 2
        await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        results = []
        for p in procs:
            out, err = await asyncio.to_thread(p.communicate, timeout=60)
            assert p.returncode == 0, err.decode()
            results.append(json.loads(out))
        # Each file was applied by exactly one of them; the other found it done.
        assert sorted(results[0] + results[1]) == sorted(ALL_VERSIONS)
        assert not set(results[0]) & set(results[1])
        assert await holder.fetchval("SELECT count(*) FROM schema_migrations") == len(ALL_VERSIONS)
        assert await holder.fetchval(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'ix_waiting_prompts_user_operation_key'::regclass"
        )
    finally:
        await holder.close()


# (table, column) -> (data_type or udt_name for arrays, character_maximum_length, is_nullable, default)
# the columns the services read and write; None = not checked.
SPEC_CHAT_COLUMNS: dict[tuple[str, str], tuple[str, int | None, str, str | None]] = {
    ("waiting_prompts", "is_chat"): ("boolean", None, "NO", "false"),
    ("waiting_prompts", "messages"): ("jsonb", None, "YES", None),
    ("workers", "accepts_chat_jobs"): ("boolean", None, "NO", "false"),
    ("workers", "accepts_prompt_jobs"): ("boolean", None, "NO", "true"),
    ("workers", "chat_features"): ("_text", None, "YES", None),
    ("workers", "chat_max_context_length"): ("integer", None, "YES", None),
    ("workers", "chat_max_length"): ("integer", None, "YES", None),
    ("workers", "chat_model_id"): ("character varying", None, "YES", None),
    ("workers", "image_transports"): ("_text", None, "YES", None),
    ("processing_gens", "message"): ("jsonb", None, "YES", None),
    ("processing_gens", "finish_reason"): ("character varying", 32, "YES", None),
    ("processing_gens", "native_finish_reason"): ("character varying", 32, "YES", None),
    ("processing_gens", "prompt_tokens"): ("integer", None, "YES", None),
    ("processing_gens", "completion_tokens"): ("integer", None, "YES", None),
    ("processing_gens", "reasoning_tokens"): ("integer", None, "YES", None),
    ("processing_gens", "charge_basis"): ("character varying", 16, "YES", None),
    ("processing_gens", "assigned_model"): ("character varying", None, "YES", None),
    ("processing_gens", "assigned_max_context_length"): ("integer", None, "YES", None),
    ("processing_gens", "assigned_max_length"): ("integer", None, "YES", None),
    ("processing_gens", "image_transport"): ("character varying", 16, "YES", None),
    ("waiting_prompts", "operation_key"): ("uuid", None, "YES", None),
    ("waiting_prompts", "operation_fingerprint"): ("character", 64, "YES", None),
    ("waiting_prompts", "context_adjustments"): ("jsonb", None, "YES", None),
    ("waiting_prompts", "chat_extras"): ("jsonb", None, "YES", None),
    ("waiting_prompts", "chat_required_features"): ("_text", None, "YES", None),
    ("waiting_prompts", "chat_conformance"): ("character varying", None, "NO", "'strict'::character varying"),
    ("waiting_prompts", "chat_tools_temperature"): ("double precision", None, "YES", None),
    ("waiting_prompts", "chat_messages_offloaded"): ("boolean", None, "NO", "false"),
    ("workers", "chat_tools_max_temperature"): ("double precision", None, "YES", None),
    ("waiting_prompts", "chat_fault_reason"): ("character varying", 1000, "YES", None),
    ("waiting_prompts", "chat_fault_rc"): ("character varying", 32, "YES", None),
    ("processing_gens", "chat_refusal_rc"): ("character varying", 32, "YES", None),
    ("processing_gens", "settled_character_count"): ("integer", None, "YES", None),
    ("workers", "nonconformant_replies"): ("integer", None, "NO", "0"),
}

# Text-path and lease columns the services rely on (docs/native-api.md#job-lease).
TEXT_COLUMNS = {
    "users": "id username api_key_hash kudos min_kudos trusted patron flagged deleted concurrency "
    "evaluating_kudos created oauth_id",
    "user_shared_keys": "id user_id name kudos utilized expiry max_text_tokens created",
    "workers": "id user_id name created last_check_in ipaddr bridge_agent threads max_length max_context_length "
    "speed kudos contributions fulfilments aborted_jobs uncompleted_jobs last_aborted_job uptime paused "
    "maintenance maintenance_msg nsfw models",
    "worker_performances": "worker_id performance created",
    "waiting_prompts": "id user_id shared_key_id is_chat prompt submitted_prompt messages params models n jobs "
    "max_length max_context_length workers worker_blacklist trusted_workers validated_backends slow_workers "
    "active faulted cancelled consumed_kudos extra_priority created expiry client_agent ipaddr stream_progress "
    "has_images",
    "processing_gens": "id wp_id worker_id user_id model generation seed gen_metadata state censored faulted "
    "cancelled fake kudos created started_at job_ttl lease_cap over_capacity_at_assignment",
    "kudos_holds": "wp_id user_id shared_key_id amount created",
}


async def test_every_spec_chat_column(conn: asyncpg.Connection) -> None:
    rows = await conn.fetch(
        """
        SELECT table_name, column_name, data_type, udt_name, character_maximum_length, is_nullable,
               column_default
        FROM information_schema.columns WHERE table_schema = current_schema()
        """
    )
    cols = {(r["table_name"], r["column_name"]): r for r in rows}
    problems = []
    for key, (dtype, length, nullable, default) in SPEC_CHAT_COLUMNS.items():
        r = cols.get(key)
        if r is None:
            problems.append(f"{key}: missing")
            continue
        actual_type = r["udt_name"] if dtype.startswith("_") else r["data_type"]
        if actual_type != dtype:
            problems.append(f"{key}: type {actual_type} != {dtype}")
        if length is not None and r["character_maximum_length"] != length:
            problems.append(f"{key}: length {r['character_maximum_length']} != {length}")
        if r["is_nullable"] != nullable:
            problems.append(f"{key}: nullable {r['is_nullable']} != {nullable}")
        if default is not None and r["column_default"] != default:
            problems.append(f"{key}: default {r['column_default']} != {default}")
        if nullable == "NO" and r["column_default"] is None:
            problems.append(f"{key}: NOT NULL without a constant default would rewrite the table")
    for table, names in TEXT_COLUMNS.items():
        for name in names.split():
            if (table, name) not in cols:
                problems.append(f"{table}.{name}: missing")
    assert not problems, "\n".join(problems)


async def test_queue_and_lookup_indexes(conn: asyncpg.Connection) -> None:
    defs = {
        r["indexname"]: r["indexdef"]
        for r in await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
        )
    }
    queue = defs["ix_waiting_prompts_queue"]
    assert "extra_priority DESC, created" in queue and "WHERE (active AND (n > 0) AND (NOT faulted))" in queue
    assert "USING gin (models)" in defs["ix_waiting_prompts_models"]
    assert "USING gin (models)" in defs["ix_workers_models"]
    assert "(wp_id)" in defs["ix_processing_gens_wp_id"]
    assert "(last_check_in)" in defs["ix_workers_last_check_in"]
    fk = await conn.fetchval(
        """
        SELECT confdeltype::text FROM pg_constraint
        WHERE conrelid = 'processing_gens'::regclass AND contype = 'f'
          AND confrelid = 'waiting_prompts'::regclass
        """
    )
    assert fk == "c"  # ON DELETE CASCADE


async def _insert_wp(conn: asyncpg.Connection, user_id: int, key: uuid.UUID | None) -> uuid.UUID:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "INSERT INTO waiting_prompts (user_id, operation_key, is_chat) VALUES ($1, $2, true) RETURNING id",
        user_id,
        key,
    )


async def test_operation_key_index_is_unique_partial_and_valid(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(
        """
        SELECT i.indisvalid, i.indisunique, pg_get_indexdef(i.indexrelid) AS def
        FROM pg_index i WHERE i.indexrelid = 'ix_waiting_prompts_user_operation_key'::regclass
        """
    )
    assert row is not None
    assert row["indisvalid"] and row["indisunique"]
    assert "(user_id, operation_key) WHERE (operation_key IS NOT NULL)" in row["def"]

    other = await conn.fetchval(
        "INSERT INTO users (username, api_key_hash) VALUES ('opkey-other', repeat('a', 64)) RETURNING id"
    )
    key = uuid.uuid4()
    await _insert_wp(conn, 0, key)
    with pytest.raises(asyncpg.UniqueViolationError) as err:
        await _insert_wp(conn, 0, key)
    assert err.value.constraint_name == "ix_waiting_prompts_user_operation_key"
    await _insert_wp(conn, other, key)  # the same key from another user is a separate claim
    await _insert_wp(conn, 0, None)
    await _insert_wp(conn, 0, None)  # requests without a key never collide


async def test_invalid_leftover_index_is_rebuilt(make_database) -> None:  # type: ignore[no-untyped-def]
    dsn = make_database()
    c = await asyncpg.connect(dsn)
    try:
        # Simulate a failed CONCURRENTLY build: duplicates make it fail and leave an INVALID index.
        await c.execute("DROP INDEX ix_waiting_prompts_user_operation_key")
        key = uuid.uuid4()
        await _insert_wp(c, 0, key)
        await _insert_wp(c, 0, key)
        with pytest.raises(asyncpg.UniqueViolationError):
            await c.execute(
                "CREATE UNIQUE INDEX CONCURRENTLY ix_waiting_prompts_user_operation_key "
                "ON waiting_prompts (user_id, operation_key) WHERE operation_key IS NOT NULL"
            )
        valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = 'ix_waiting_prompts_user_operation_key'::regclass"
        assert await c.fetchval(valid) is False
        await c.execute("DELETE FROM waiting_prompts")
        # 0002 is recorded as applied, yet the migrator notices the INVALID index and rebuilds it.
        assert await migrate(dsn) == ["0002_operation_key_index"]
        assert await c.fetchval(valid) is True
        assert await migrate(dsn) == []
    finally:
        await c.close()


def test_split_sql_respects_quotes_comments_and_dollar_quotes() -> None:
    script = """
    -- a comment; with a semicolon
    CREATE TABLE a (x text DEFAULT 'semi;colon');
    /* block; comment */ SELECT 1;
    CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1; $body$ LANGUAGE sql;
    SELECT "odd;name" FROM a;
    """
    parts = split_sql(script)
    assert len(parts) == 4
    assert parts[0].endswith("DEFAULT 'semi;colon')")
    assert "$body$ SELECT 1; $body$" in parts[2]
    assert split_sql("-- only a comment\n") == []


def test_migration_files_follow_the_rules() -> None:
    migrations = load_migrations()
    assert [m.version for m in migrations][:2] == ["0001_initial", "0002_operation_key_index"]
    by_version = {m.version: m for m in migrations}
    assert by_version["0001_initial"].transactional
    assert not by_version["0002_operation_key_index"].transactional
    assert by_version["0002_operation_key_index"].concurrent_indexes == (
        "ix_waiting_prompts_user_operation_key",
    )
