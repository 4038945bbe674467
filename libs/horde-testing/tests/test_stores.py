"""The store fixtures and the embedded servers behind them."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest
import redis
from horde_testing.embedded import pg_system_user
from horde_testing.pytest_plugin import TEST_SECRET_KEY
from horde_testing.stores import PostgresStore, RedisStore, S3Endpoint, docker_available


async def test_database_url_is_a_fresh_migrated_database(
    database_url: str, pg_dsn: str, make_database: Callable[[], str]
) -> None:
    assert database_url != pg_dsn
    other = make_database()
    assert other not in (database_url, pg_dsn)
    for dsn in (database_url, pg_dsn, other):
        conn = await asyncpg.connect(dsn)
        try:
            versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
            assert "0001_initial" in versions and "0002_operation_key_index" in versions
            assert await conn.fetchval("SELECT username FROM users WHERE id = 0") == "Anonymous"
        finally:
            await conn.close()


async def test_embedded_postgres_never_runs_as_root(pg_server: PostgresStore, database_url: str) -> None:
    if pg_server.source != "embedded":
        pytest.skip("the server is not embedded")
    conn = await asyncpg.connect(database_url)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
        assert await conn.fetchval("SHOW unix_socket_directories") == ""
        uid = os.stat(f"/proc/{backend}").st_uid  # while the backend lives
    finally:
        await conn.close()
    assert uid != 0
    expected = pg_system_user()
    assert uid == (expected[0] if expected else os.geteuid())


def test_redis_url(redis_url: str, redis_server: RedisStore) -> None:
    assert redis_url == redis_server.url and redis_url.endswith("/0")
    signals = redis.Redis.from_url(redis_server.url_for(7))
    try:
        assert signals.ping()
        signals.set("horde:test", "1")
        assert signals.get("horde:test") == b"1"
    finally:
        signals.close()


def test_s3_endpoint(s3_endpoint: S3Endpoint) -> None:
    assert isinstance(s3_endpoint, str) and s3_endpoint.startswith("http://127.0.0.1:")
    assert s3_endpoint == s3_endpoint.endpoint_url
    names = [b["Name"] for b in s3_endpoint.client().list_buckets()["Buckets"]]
    assert s3_endpoint.image_bucket in names and s3_endpoint.messages_bucket in names


def test_horde_settings_env(
    horde_settings_env: dict[str, str],
    database_url: str,
    redis_url: str,
    s3_endpoint: S3Endpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert horde_settings_env["HORDE_DATABASE_URL"] == database_url
    assert horde_settings_env["HORDE_REDIS_URL"] == redis_url
    assert horde_settings_env["HORDE_S3_ENDPOINT_URL"] == s3_endpoint.endpoint_url
    assert horde_settings_env["HORDE_SECRET_KEY"] == TEST_SECRET_KEY
    from horde_core.settings import HordeSettings

    for key, value in horde_settings_env.items():
        monkeypatch.setenv(key, value)
    settings = HordeSettings()
    assert settings.database_url == database_url and settings.redis_url == redis_url
    assert (
        settings.s3_endpoint_url == s3_endpoint.endpoint_url
        and settings.messages_bucket == s3_endpoint.image_bucket
    )


@pytest.mark.timeout(30)  # a hang guard: the engine below never answers, so returning at all is the timeout
def test_docker_probe_is_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(docker_available(timeout=1.0), bool)  # this machine's engine, if it has one
    path = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as engine:
        engine.bind(str(path))
        engine.listen()  # connections wait in the backlog, never accepted nor answered
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        assert docker_available(timeout=0.2) is False


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_embedded_servers_die_with_a_killed_parent(tmp_path: Path) -> None:
    """SIGKILL of the process that started the servers (nothing of ours runs) still stops them."""
    code = textwrap.dedent(
        """
        import time
        from horde_testing.embedded import EmbeddedPostgres, EmbeddedValkey
        servers = [EmbeddedPostgres(), EmbeddedValkey()]  # moto is spawned the same way as Valkey
        for s in servers:
            s.start()
        print(" ".join(str(s.proc.pid) for s in servers), flush=True)
        time.sleep(300)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_")}
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    assert all(_gone(p) for p in pids)
    # Only files are left; the next server of each kind would sweep them, do it now.
    from horde_testing.embedded import _sweep_stale_temp_roots

    for name in ("postgres", "valkey"):
        _sweep_stale_temp_roots(name)


def test_pgadmin_run_sync_does_not_touch_the_current_loop() -> None:
    from horde_testing.pgadmin import run_sync

    async def answer() -> int:
        return 42

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        assert run_sync(answer()) == 42
        assert asyncio.get_event_loop() is loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()


NONROOT_PROBE = textwrap.dedent(
    """
    import os, site, sys
    site.addsitedir(sys.argv[1])
    import asyncio, asyncpg
    from horde_testing.embedded import EmbeddedPostgres
    from horde_testing.pgadmin import run_sync

    with EmbeddedPostgres(database="horde") as pg:
        async def ask():
            conn = await asyncpg.connect(pg.dsn())
            try:
                return await conn.fetchval("SELECT current_database()")
            finally:
                await conn.close()

        assert run_sync(ask()) == "horde"
        assert pg.system_user is None and os.stat(pg.data_dir).st_uid == os.geteuid() != 0
    print("ok")
    """
)


def test_embedded_postgres_as_a_normal_user() -> None:
    """The non-root path: run the embedded server from a process of an unprivileged user."""
    import shutil
    import site

    system_python = Path("/usr/bin/python3.11")
    if os.geteuid() != 0 or not shutil.which("setpriv") or not system_python.exists():
        pytest.skip("needs root (to become 'nobody'), setpriv and a system python3.11")
    packages = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "HOME=/tmp"]
    reachable = subprocess.run(
        [*cmd, str(system_python), "-c", f"import os; os.listdir({packages!r})"], check=False
    )
    if reachable.returncode != 0:
        pytest.skip("the virtualenv is not readable by 'nobody'")
    result = subprocess.run(
        [*cmd, str(system_python), "-c", NONROOT_PROBE, packages], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
