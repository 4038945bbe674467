"""Database-level administration for tests and the local stack (CREATE/DROP DATABASE, clones).

The ``*_sync`` variants run their coroutine on a private event loop in a worker thread, so they are
safe to call from sync pytest fixtures even while pytest-asyncio's session loop exists (calling
``asyncio.run`` on the main thread would replace that loop as the thread's current loop).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

T = TypeVar("T")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop in a new thread and return its result."""
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=runner, name="horde-testing-run-sync", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def quote_ident(name: str) -> str:
    """Quote a database name; only plain identifiers are accepted (ValueError otherwise)."""
    if not _IDENT.match(name):
        raise ValueError(f"not a plain database name: {name!r}")
    return f'"{name}"'


def with_database(dsn: str, database: str) -> str:
    """``dsn`` with its path (database name) replaced by ``database``."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


def database_of(dsn: str) -> str:
    """The database name in ``dsn`` ('' when it has none)."""
    return urlsplit(dsn).path.lstrip("/")


async def create_database(
    admin_dsn: str, name: str, *, template: str | None = None, exist_ok: bool = False
) -> None:
    """CREATE DATABASE ``name`` (optionally ``TEMPLATE template``) through ``admin_dsn``.

    The template must have no other connections (PostgreSQL refuses to copy one in use).
    ``exist_ok``: a database that already exists is not an error.
    """
    conn = await asyncpg.connect(admin_dsn)
    try:
        if exist_ok and await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return
        sql = f"CREATE DATABASE {quote_ident(name)}"
        if template:
            # FILE_COPY: for small databases it beats the default WAL_LOG strategy by far.
            sql += f" TEMPLATE {quote_ident(template)} STRATEGY FILE_COPY"
        try:
            await conn.execute(sql)
        except asyncpg.DuplicateDatabaseError:
            if not exist_ok:
                raise
    finally:
        await conn.close()


async def drop_database(admin_dsn: str, name: str) -> None:
    """DROP DATABASE IF EXISTS ``name`` WITH (FORCE): connected sessions are terminated."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
    finally:
        await conn.close()


def create_database_sync(
    admin_dsn: str, name: str, *, template: str | None = None, exist_ok: bool = False
) -> None:
    """Sync :func:`create_database`."""
    run_sync(create_database(admin_dsn, name, template=template, exist_ok=exist_ok))


def drop_database_sync(admin_dsn: str, name: str) -> None:
    """Sync :func:`drop_database`."""
    run_sync(drop_database(admin_dsn, name))
