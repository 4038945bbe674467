"""Users, keys, authentication and the horde-admin CLI, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from horde_store import admin, users
from horde_store.db import connect, create_pool

SALT = "test-salt"


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await connect(database_url)
    yield c
    await c.close()


def test_hash_api_key_is_salted_sha256_hex() -> None:
    assert users.hash_api_key("key", "salt") == hashlib.sha256(b"saltkey").hexdigest()
    assert len(users.generate_api_key()) == 22


async def test_anonymous_user_authenticates_with_the_public_key(conn: asyncpg.Connection) -> None:
    for salt in (SALT, "another-salt"):
        anon = await users.authenticate(conn, "0000000000", salt)
        assert anon is not None
        assert (anon.id, anon.username, anon.is_anonymous, anon.shared_key) == (0, "Anonymous", True, None)
        assert anon.kudos == 0 and anon.min_kudos == -50 and anon.concurrency == 30
        assert anon.oauth_id == "anon"
    assert await users.authenticate(conn, "0000000001", SALT) is None
    assert await users.authenticate(conn, "", SALT) is None


async def test_create_set_and_authenticate(conn: asyncpg.Connection) -> None:
    user, key = await users.create_user(conn, "alice", salt=SALT, kudos=100, trusted=True, concurrency=5)
    assert (user.username, user.kudos, user.trusted, user.patron, user.concurrency) == (
        "alice",
        100,
        True,
        False,
        5,
    )
    stored = await conn.fetchval("SELECT api_key_hash FROM users WHERE id = $1", user.id)
    assert stored == users.hash_api_key(key, SALT) and key not in stored

    found = await users.authenticate(conn, key, SALT)
    assert found is not None and found.id == user.id and found.shared_key is None
    assert await users.authenticate(conn, key, "wrong-salt") is None

    with pytest.raises(users.UserExists):
        await users.create_user(conn, "alice", salt=SALT)

    changed = await users.set_user(conn, "alice", kudos=7, trusted=False, flagged=True, patron=None)
    assert (changed.kudos, changed.trusted, changed.flagged, changed.patron) == (7, False, True, False)
    with pytest.raises(users.UserNotFound):
        await users.set_user(conn, "nobody-here", kudos=1)
    with pytest.raises(ValueError):
        await users.set_user(conn, "alice", api_key_hash="x")


async def test_shared_key_authenticates_as_its_owner(conn: asyncpg.Connection) -> None:
    owner, _ = await users.create_user(conn, "bob", salt=SALT, kudos=50)
    key = await users.create_shared_key(
        conn, "bob", kudos=-1, expiry_days=2, max_text_tokens=300, name="friend"
    )
    assert key.unlimited and key.max_text_tokens == 300 and key.name == "friend"
    assert key.expiry is not None and not key.is_expired()
    assert key.is_expired(datetime.now(UTC) + timedelta(days=3))

    found = await users.authenticate(conn, str(key.id), SALT)
    assert found is not None and found.id == owner.id
    assert found.shared_key is not None and found.shared_key.id == key.id

    # A UUID that is no shared key falls back to the hash look-up (a user's key may look like a UUID).
    uuid_key = str(uuid.uuid4())
    carol, _ = await users.create_user(conn, "carol", salt=SALT, api_key=uuid_key)
    found = await users.authenticate(conn, uuid_key, SALT)
    assert found is not None and found.id == carol.id and found.shared_key is None

    with pytest.raises(users.UserNotFound):
        await users.create_shared_key(conn, "nobody-here")
    with pytest.raises(ValueError):
        await users.create_shared_key(conn, "bob", max_text_tokens=501)


async def test_pool_decodes_json_and_jsonb(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        async with pool.acquire() as c:
            wp = await c.fetchval(
                "INSERT INTO waiting_prompts (user_id, params, messages, chat_extras) VALUES (0, $1, $2, $3) "
                "RETURNING id",
                {"max_length": 80, "temperature": 0.7},
                [{"role": "user", "content": "héllo"}],
                None,
            )
            row = await c.fetchrow(
                "SELECT params, messages, chat_extras FROM waiting_prompts WHERE id = $1", wp
            )
            assert row is not None
            assert row["params"] == {"max_length": 80, "temperature": 0.7}
            assert row["messages"] == [{"role": "user", "content": "héllo"}]
            assert row["chat_extras"] is None
            assert await c.fetchval("SELECT '{\"a\": [1]}'::json") == {"a": [1]}
    finally:
        await pool.close()


def _admin(dsn: str, *args: str, in_process: bool = False) -> subprocess.CompletedProcess[str]:
    """Run horde-admin: as a real process, or (``in_process``, to keep the test fast) through
    ``admin.main`` on a thread of its own (it calls asyncio.run)."""
    if not in_process:
        env = {**os.environ, "HORDE_DATABASE_URL": dsn, "HORDE_SECRET_KEY": SALT}
        return subprocess.run(
            [sys.executable, "-m", "horde_store.admin", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    out, err = io.StringIO(), io.StringIO()
    box: dict[str, int] = {}

    def run() -> None:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                box["rc"] = admin.main(["--database-url", dsn, *args] if dsn else list(args))
            except SystemExit as exc:  # argparse usage errors
                box["rc"] = int(exc.code or 0)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return subprocess.CompletedProcess(args, box["rc"], out.getvalue(), err.getvalue())


async def test_horde_admin_cli(
    database_url: str, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HORDE_SECRET_KEY", SALT)
    r = _admin(database_url, "migrate", in_process=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"applied": []}

    create = ("user", "create", "--username", "dave", "--kudos", "250", "--trusted", "--concurrency", "7")
    r = await asyncio.to_thread(_admin, database_url, *create)
    assert r.returncode == 0, r.stderr
    created = json.loads(r.stdout)
    assert set(created) == {"id", "username", "api_key"} and created["username"] == "dave"
    assert len(created["api_key"]) == 22
    found = await users.authenticate(conn, created["api_key"], SALT)
    assert found is not None and found.id == created["id"] and found.trusted and found.kudos == 250
    assert found.concurrency == 7

    r = _admin(database_url, "user", "create", "--username", "dave", in_process=True)
    assert r.returncode == 1 and "already exists" in r.stderr

    rotate = ("user", "create", "--username", "dave", "--rotate-if-exists", "--kudos", "9")
    r = _admin(database_url, *rotate, in_process=True)
    assert r.returncode == 0, r.stderr
    rotated = json.loads(r.stdout)
    assert rotated["id"] == created["id"] and rotated["api_key"] != created["api_key"]
    assert await users.authenticate(conn, created["api_key"], SALT) is None
    assert (await users.authenticate(conn, rotated["api_key"], SALT)).kudos == 9  # type: ignore[union-attr]

    update = ("user", "set", "--username", "dave", "--kudos", "1000", "--no-trusted", "--patron", "--flagged")
    r = await asyncio.to_thread(_admin, database_url, *update, "--concurrency", "3", "--moderator")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert (shown["kudos"], shown["trusted"], shown["patron"], shown["flagged"]) == (1000, False, True, True)
    assert shown["moderator"] is True
    assert await conn.fetchval("SELECT moderator FROM users WHERE username = 'dave'") is True
    assert shown["concurrency"] == 3 and "api_key_hash" not in shown

    r = _admin(database_url, "user", "show", "--username", "dave", in_process=True)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert (shown["id"], shown["kudos"], shown["requests"]) == (created["id"], 1000, [])
    assert "api_key_hash" not in shown
    await conn.execute(
        "INSERT INTO waiting_prompts (id, user_id, kudos, consumed_kudos) VALUES (gen_random_uuid(), $1, 12, 3.5)",
        created["id"],
    )
    (request,) = json.loads(
        _admin(database_url, "user", "show", "--username", "dave", in_process=True).stdout
    )["requests"]
    assert (request["kudos"], request["consumed_kudos"], request["cancelled"], request["finished"]) == (
        12,
        3.5,
        False,
        0,
    )
    r = _admin(database_url, "user", "show", "--username", "ghost", in_process=True)
    assert r.returncode == 1 and "no user 'ghost'" in r.stderr, r.stderr

    share = ("shared-key", "create", "--username", "dave", "--kudos", "500", "--expiry-days", "1")
    r = await asyncio.to_thread(_admin, database_url, *share, "--max-text-tokens", "200", "--name", "team")
    assert r.returncode == 0, r.stderr
    key = json.loads(r.stdout)
    assert key["kudos"] == 500 and key["max_text_tokens"] == 200 and key["name"] == "team" and key["expiry"]
    found = await users.authenticate(conn, key["key"], SALT)
    assert found is not None and found.username == "dave" and found.shared_key is not None

    r = await asyncio.to_thread(_admin, database_url, "user", "set", "--username", "ghost", "--kudos", "1")
    assert r.returncode == 1 and "no user 'ghost'" in r.stderr, r.stderr
    r = _admin(database_url, "shared-key", "create", "--username", "ghost", in_process=True)
    assert r.returncode == 1 and "no user 'ghost'" in r.stderr, r.stderr

    # worker set: the way out of automatic maintenance
    owner = created["id"]
    await conn.execute(
        "INSERT INTO workers (id, user_id, name, maintenance, maintenance_msg) "
        "VALUES (gen_random_uuid(), $1, 'w-maint', true, 'dropping too many jobs')",
        owner,
    )
    r = _admin(database_url, "worker", "set", "--name", "w-maint", "--no-maintenance", in_process=True)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert (shown["name"], shown["maintenance"], shown["maintenance_msg"], shown["paused"]) == (
        "w-maint",
        False,
        None,
        False,
    )
    row = await conn.fetchrow("SELECT maintenance, maintenance_msg FROM workers WHERE name = 'w-maint'")
    assert row is not None
    assert (row["maintenance"], row["maintenance_msg"]) == (False, None)
    r = _admin(database_url, "worker", "set", "--name", "w-maint", "--paused", in_process=True)
    assert json.loads(r.stdout)["paused"] is True
    r = _admin(database_url, "worker", "set", "--name", "nobody", "--no-maintenance", in_process=True)
    assert r.returncode == 1 and "no worker named 'nobody'" in r.stderr, r.stderr

    monkeypatch.delenv("HORDE_DATABASE_URL", raising=False)
    r = _admin("", "migrate", in_process=True)
    assert r.returncode == 2 and "HORDE_DATABASE_URL" in r.stderr


def test_horde_admin_console_script_is_installed() -> None:
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "horde-admin"]
    assert ep.value == "horde_store.admin:main"
