"""horde-local-stores: starts the stores, migrates, writes the env file, persists data, stops cleanly."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import redis
from horde_testing._proc import free_port
from horde_testing.stores import RedisStore, S3Endpoint


def _read_env(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        values[key] = shlex.split(value)[0]
    return values


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(")")[-1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _start(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    env_file = tmp_path / "stores.env"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "horde_testing.local_stores",
            "--env-file",
            str(env_file),
            "--data-dir",
            str(tmp_path / "data"),
            "--pg-port",
            str(free_port()),
            "--redis-port",
            str(free_port()),
            "--s3-port",
            str(free_port()),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    while not env_file.exists():
        assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no env file after 90s"
        time.sleep(0.05)
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    return proc, _read_env(env_file)


def _stop(proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    children = _children(proc.pid)
    assert children, "the stores run as children of horde-local-stores"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.wait(30) == 0, proc.stdout.read().decode()
    assert not (tmp_path / "stores.env").exists()
    assert all(_gone(pid) for pid in children)


async def test_local_stores_lifecycle(
    tmp_path: Path, redis_server: RedisStore, s3_endpoint: S3Endpoint
) -> None:
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_")}
    proc, values = _start(tmp_path, base_env)
    try:
        assert set(values) >= {
            "HORDE_DATABASE_URL",
            "HORDE_REDIS_URL",
            "HORDE_S3_ENDPOINT_URL",
            "HORDE_S3_ACCESS_KEY_ID",
            "HORDE_S3_SECRET_ACCESS_KEY",
            "HORDE_S3_IMAGE_BUCKET",
        }
        assert all(
            "127.0.0.1" in values[k]
            for k in ("HORDE_DATABASE_URL", "HORDE_REDIS_URL", "HORDE_S3_ENDPOINT_URL")
        )
        conn = await asyncpg.connect(values["HORDE_DATABASE_URL"])
        try:
            assert await conn.fetchval("SELECT current_database()") == "horde"
            assert await conn.fetchval("SELECT count(*) FROM schema_migrations") >= 2
            await conn.execute("INSERT INTO users (username, api_key_hash) VALUES ('kept', repeat('b', 64))")
        finally:
            await conn.close()
        r = redis.Redis.from_url(values["HORDE_REDIS_URL"])
        assert r.ping()
        r.close()
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=values["HORDE_S3_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id=values["HORDE_S3_ACCESS_KEY_ID"],
            aws_secret_access_key=values["HORDE_S3_SECRET_ACCESS_KEY"],
        )
        s3.head_bucket(Bucket=values["HORDE_S3_IMAGE_BUCKET"])
    finally:
        if proc.poll() is None:
            _stop(proc, tmp_path)

    # Second run: the data persisted, and stores configured by env are used instead of started.
    proc, values = _start(tmp_path, {**base_env, "HORDE_REDIS_URL": redis_server.url, **s3_endpoint.env()})
    try:
        assert values["HORDE_REDIS_URL"] == redis_server.url
        assert values["HORDE_S3_ENDPOINT_URL"] == s3_endpoint.endpoint_url
        conn = await asyncpg.connect(values["HORDE_DATABASE_URL"])
        try:
            assert await conn.fetchval("SELECT count(*) FROM users WHERE username = 'kept'") == 1
        finally:
            await conn.close()
    finally:
        _stop(proc, tmp_path)
