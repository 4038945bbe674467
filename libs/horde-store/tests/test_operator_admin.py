"""horde-admin's operator controls (docs/operator-guide.md#operator-controls): ``modes``, ``ip-timeout`` and
``user set --flagged``, on a real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis
from horde_core.redis_keys import ip_timeout_key, redis_client
from horde_store import admin, modes
from horde_store.db import connect, create_pool
from horde_store.modes import read_modes
from horde_testing.seed import Factory

SALT = "test-salt"


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await connect(database_url)
    yield c
    await c.close()


def _admin(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``horde-admin ARGS`` through ``admin.main`` on a thread of its own (it calls asyncio.run), with the
    environment ``env`` (the process's HORDE_* store variables are replaced by it)."""
    out, err = io.StringIO(), io.StringIO()
    box: dict[str, int] = {}
    saved = {k: v for k, v in os.environ.items() if k.startswith("HORDE_")}

    def run() -> None:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                box["rc"] = admin.main(list(args))
            except SystemExit as exc:  # argparse usage errors
                box["rc"] = int(exc.code or 0)

    for key in saved:
        del os.environ[key]
    os.environ.update(env or {})
    try:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    finally:
        for key in env or {}:
            os.environ.pop(key, None)
        os.environ.update(saved)
    return subprocess.CompletedProcess(args, box["rc"], out.getvalue(), err.getvalue())


async def test_modes_maintenance_switches_and_aborts(
    database_url: str, redis_url: str, conn: asyncpg.Connection
) -> None:
    env = {"HORDE_DATABASE_URL": database_url, "HORDE_REDIS_URL": redis_url, "HORDE_SECRET_KEY": SALT}
    r = await asyncio.to_thread(_admin, "modes", "show", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"maintenance": False, "invite_only": False, "raid": False}

    pool = await create_pool(database_url)
    subscriber = aioredis.from_url(redis_url, decode_responses=True)
    pubsub = subscriber.pubsub()
    try:
        f = Factory(pool, model="m-admin")
        requester = await f.user()
        queued = await f.request(requester, n=1, hold=10)
        await pubsub.subscribe(f"horde:chat:{queued}")
        await pubsub.get_message(timeout=1)  # the subscribe confirmation

        r = await asyncio.to_thread(_admin, "modes", "maintenance", "on", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {
            "maintenance": True,
            "aborted": 1,
            "aborted_ids": [str(queued)],
            "signalled": 1,
        }
        assert (await read_modes(conn)).maintenance
        row = await conn.fetchrow("SELECT n, cancelled FROM waiting_prompts WHERE id = $1", queued)
        assert row is not None and (row["n"], row["cancelled"]) == (0, True)
        assert await conn.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", queued) == 0
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
        assert message is not None
        assert json.loads(message["data"]) == {"id": str(queued), "event": "cancelled", "generations": 0}

        r = await asyncio.to_thread(_admin, "modes", "show", env=env)
        assert json.loads(r.stdout)["maintenance"] is True
        r = await asyncio.to_thread(_admin, "modes", "maintenance", "off", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"maintenance": False, "aborted": 0, "aborted_ids": [], "signalled": 0}
        assert not (await read_modes(conn)).maintenance

        # Without Redis the switch still happens; the operator is told no signal went out.
        no_redis = {"HORDE_DATABASE_URL": database_url}
        r = await asyncio.to_thread(_admin, "modes", "maintenance", "on", env=no_redis)
        assert r.returncode == 0, r.stderr
        assert "not signalled" in r.stderr and json.loads(r.stdout)["maintenance"] is True
        r = await asyncio.to_thread(_admin, "modes", "maintenance", "off", env=no_redis)
        assert r.returncode == 0, r.stderr

        r = await asyncio.to_thread(_admin, "modes", "maintenance", "maybe", env=env)
        assert r.returncode == 2
    finally:
        await pubsub.aclose()
        await subscriber.aclose()
        await pool.close()


async def test_ip_timeout_set_show_clear(redis_url: str) -> None:
    env = {"HORDE_REDIS_URL": redis_url}
    cache = redis_client(redis_url)
    try:
        r = await asyncio.to_thread(_admin, "ip-timeout", "198.51.100.4", "--minutes", "5", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"address": "198.51.100.4", "seconds": 300}
        assert 0 < await cache.ttl(ip_timeout_key("198.51.100.4")) <= 300

        r = await asyncio.to_thread(_admin, "ip-timeout", "198.51.100.4", env=env)
        shown = json.loads(r.stdout)
        assert shown["address"] == "198.51.100.4" and 0 < shown["seconds"] <= 300

        # IPv6: the timeout covers the address's /64, stored as ipaddress writes it.
        r = await asyncio.to_thread(
            _admin, "--redis-url", redis_url, "ip-timeout", "2001:DB8::0:1", "--minutes", "1"
        )
        assert json.loads(r.stdout) == {"address": "2001:db8::/64", "seconds": 60}
        assert await cache.exists(ip_timeout_key("2001:db8::/64"))

        r = await asyncio.to_thread(_admin, "ip-timeout", "198.51.100.4", "--clear", env=env)
        assert json.loads(r.stdout) == {"address": "198.51.100.4", "cleared": True}
        assert not await cache.exists(ip_timeout_key("198.51.100.4"))
        r = await asyncio.to_thread(_admin, "ip-timeout", "198.51.100.4", "--clear", env=env)
        assert json.loads(r.stdout)["cleared"] is False
        r = await asyncio.to_thread(_admin, "ip-timeout", "198.51.100.4", env=env)
        assert json.loads(r.stdout)["seconds"] == 0

        r = await asyncio.to_thread(_admin, "ip-timeout", "not-an-address", "--minutes", "5", env=env)
        assert r.returncode == 1 and "does not appear to be an IPv4 or IPv6 address" in r.stderr
        r = await asyncio.to_thread(_admin, "ip-timeout", "198.51.100.4", "--minutes", "0", env=env)
        assert r.returncode == 1 and "1 to" in r.stderr
        r = await asyncio.to_thread(
            _admin, "ip-timeout", "198.51.100.4", "--minutes", "5", "--clear", env=env
        )
        assert r.returncode == 2
        r = await asyncio.to_thread(_admin, "ip-timeout", "198.51.100.4", "--minutes", "5", env={})
        assert r.returncode == 2 and "HORDE_REDIS_URL" in r.stderr
        r = await asyncio.to_thread(
            _admin, "--redis-url", "redis://127.0.0.1:9/0", "ip-timeout", "198.51.100.4", "--minutes", "5"
        )
        assert r.returncode == 1 and "redis" in r.stderr
    finally:
        await cache.delete(ip_timeout_key("2001:db8::/64"))
        await cache.aclose()


@pytest.mark.parametrize(
    ("written", "normalized"),
    [
        ("::ffff:198.51.100.4", "198.51.100.4"),
        ("::FFFF:c633:6404", "198.51.100.4"),
        ("::ffff:102:304", "1.2.3.4"),
        ("198.51.100.4:5555", "198.51.100.4"),
        (" 198.51.100.4 ", "198.51.100.4"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("2001:db8::1%eth0", "2001:db8::1"),
        ("[2001:DB8:0::1%25eth0]:80", "2001:db8::1"),
        ("[::ffff:1.2.3.4]:80", "1.2.3.4"),
    ],
)
def test_address_forms_normalise_to_the_address(written: str, normalized: str) -> None:
    assert modes.normalize_address(written) == normalized


@pytest.mark.parametrize("bad", ["not-an-address", "[2001:db8::1", "[2001:db8::1]x", "1.2.3.4:port", "[]"])
def test_bad_address_forms_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        modes.normalize_address(bad)


def test_timeouts_cover_an_ipv4_address_or_an_ipv6_64() -> None:
    assert modes.timeout_target("::ffff:1.2.3.4") == "1.2.3.4"
    assert modes.timeout_target("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert modes.address_keys("1.2.3.4:80") == [ip_timeout_key("1.2.3.4")]
    assert modes.address_keys("[2001:db8:1:2::5]") == [
        ip_timeout_key("2001:db8:1:2::5"),
        ip_timeout_key("2001:db8:1:2::/64"),
    ]
    assert modes.address_keys("testclient") == [ip_timeout_key("testclient")]


async def test_timeouts_match_every_spelling_of_the_client(redis_url: str) -> None:
    cache = redis_client(redis_url)
    try:
        assert await modes.set_ip_timeout(cache, "::ffff:203.0.113.9", 60) == "203.0.113.9"
        for seen in (
            "203.0.113.9",
            "::ffff:203.0.113.9",
            "::ffff:cb00:7109",
            "203.0.113.9:5555",
            "[::ffff:203.0.113.9]:1",
        ):
            assert 0 < await modes.ip_timeout_seconds(cache, seen) <= 60, seen
        assert await modes.ip_timeout_seconds(cache, "203.0.113.10") == 0

        # An IPv6 timeout covers the /64: any address the client picks in it, however written.
        assert await modes.set_ip_timeout(cache, "2001:db8:77:1::1", 60) == "2001:db8:77:1::/64"
        for seen in (
            "2001:db8:77:1::1",
            "2001:db8:77:1:ffff:1:2:3",
            "[2001:db8:77:1::9]:443",
            "2001:db8:77:1::2%eth0",
        ):
            assert 0 < await modes.ip_timeout_seconds(cache, seen) <= 60, seen
        assert await modes.ip_timeout_seconds(cache, "2001:db8:77:2::1") == 0

        # A key of one exact IPv6 address (as an earlier release stored) still counts, and clearing lifts both.
        await cache.set(ip_timeout_key("2001:db8:78::1"), "1", ex=30)
        assert 0 < await modes.ip_timeout_seconds(cache, "2001:db8:78::1") <= 30
        assert await modes.clear_ip_timeout(cache, "2001:db8:78::1")
        assert await modes.ip_timeout_seconds(cache, "2001:db8:78::1") == 0

        assert await modes.clear_ip_timeout(cache, "2001:db8:77:1::abcd")
        assert await modes.ip_timeout_seconds(cache, "2001:db8:77:1::1") == 0
    finally:
        await modes.clear_ip_timeout(cache, "203.0.113.9")
        await modes.clear_ip_timeout(cache, "2001:db8:77:1::1")
        await cache.aclose()


async def test_user_set_flags_and_unflags(database_url: str, conn: asyncpg.Connection) -> None:
    env = {"HORDE_DATABASE_URL": database_url, "HORDE_SECRET_KEY": SALT}
    r = await asyncio.to_thread(_admin, "user", "create", "--username", "to-flag", env=env)
    assert r.returncode == 0, r.stderr
    r = await asyncio.to_thread(_admin, "user", "set", "--username", "to-flag", "--flagged", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["flagged"] is True
    assert await conn.fetchval("SELECT flagged FROM users WHERE username = 'to-flag'") is True
    r = await asyncio.to_thread(_admin, "user", "set", "--username", "to-flag", "--no-flagged", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["flagged"] is False
    assert await conn.fetchval("SELECT flagged FROM users WHERE username = 'to-flag'") is False


def test_the_commands_are_in_the_help() -> None:
    r = _admin("--help")
    assert r.returncode == 0
    for command in ("modes", "ip-timeout", "--redis-url"):
        assert command in r.stdout
    assert sys.modules["horde_store.admin"].__doc__ is not None
    assert "modes maintenance on|off" in sys.modules["horde_store.admin"].__doc__
