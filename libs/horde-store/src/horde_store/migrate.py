"""The schema's one migration history (README.md#architecture): numbered ``.sql`` files in
``horde_store/migrations/``, applied in order and recorded in ``schema_migrations``.

File rules:

* name ``NNNN_words.sql``; files run in ascending ``NNNN`` (then name) order. Ranges: 0001-0099
  horde-store, 0100-0199 admission, 0200-0299 dispatch, 0300-0399 submit, 0400-0499 janitor.
* A file runs in one transaction together with its ``schema_migrations`` row, unless its first line
  is ``-- no-transaction``: then each statement runs on its own in autocommit (needed by
  ``CREATE INDEX CONCURRENTLY``) and the file is recorded after its last statement succeeded, so it
  must be written to be re-runnable (``IF NOT EXISTS``).
* An applied file must not be edited; a changed checksum is logged as a warning.

Concurrency: :func:`migrate` holds a session-level advisory lock for the whole run, so two processes
(replicas, the k8s Job, ``make run``) migrating at once apply each file once. The waiter polls
``pg_try_advisory_lock`` instead of blocking in ``pg_advisory_lock``: a blocked statement keeps an old
snapshot open, and ``CREATE INDEX CONCURRENTLY`` in the lock holder would wait for that snapshot
while the waiter waits for the lock — a deadlock.

Invalid indexes: a failed ``CREATE INDEX CONCURRENTLY`` leaves an INVALID index that
``IF NOT EXISTS`` would silently keep. Before each no-transaction file, any INVALID index the file
creates is dropped (``DROP INDEX CONCURRENTLY``) and the file is run again, even if it was recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from horde_store.db import normalize_dsn

log = logging.getLogger("horde_store.migrate")

#: pg advisory lock key of the migrator ("horde_mg" as a big-endian int64).
MIGRATION_LOCK_KEY = int.from_bytes(b"horde_mg", "big")

_NAME = re.compile(r"^(\d{4})_[A-Za-z0-9_]+\.sql$")
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?([A-Za-z_][A-Za-z0-9_$]*)\"?",
    re.IGNORECASE,
)

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     text PRIMARY KEY,
    checksum    char(64) NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """A migration file failed, is misnamed, or the migration lock could not be taken in time."""


@dataclass(frozen=True)
class Migration:
    """One migration file. ``version`` is the file stem (``0001_initial``), the key in
    ``schema_migrations``; ``number`` its numeric prefix."""

    version: str
    number: int
    sql: str
    transactional: bool
    checksum: str
    concurrent_indexes: tuple[str, ...]


def migrations_dir() -> Path:
    """The packaged ``horde_store/migrations`` directory."""
    return Path(str(resources.files("horde_store") / "migrations"))


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Read and order the migration files of ``directory`` (default: the packaged ones).

    Raises MigrationError for a ``.sql`` file whose name does not follow ``NNNN_words.sql``.
    """
    directory = directory or migrations_dir()
    found: list[Migration] = []
    for path in directory.iterdir():
        if path.suffix != ".sql":
            continue
        match = _NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file name must be NNNN_words.sql: {path.name}")
        sql = path.read_text(encoding="utf-8")
        first = sql.lstrip().splitlines()[0].strip().lower() if sql.strip() else ""
        transactional = first.replace(" ", "") != "--no-transaction"
        found.append(
            Migration(
                version=path.stem,
                number=int(match.group(1)),
                sql=sql,
                transactional=transactional,
                checksum=hashlib.sha256(sql.encode()).hexdigest(),
                concurrent_indexes=tuple(
                    m.group(1) for m in _CONCURRENT_INDEX.finditer(_strip_comments(sql))
                ),
            )
        )
    found.sort(key=lambda m: (m.number, m.version))
    return found


async def migrate(dsn: str, *, directory: Path | None = None, lock_timeout: float = 900.0) -> list[str]:
    """Apply every pending migration to the database at ``dsn``; return the versions applied
    (empty when up to date, so a second run is a no-op).

    ``lock_timeout``: seconds to wait for another migrator to finish (MigrationError after).
    Raises MigrationError (with the file name) when a file fails; earlier files stay applied.
    """
    conn = await asyncpg.connect(normalize_dsn(dsn))
    try:
        return await migrate_connection(conn, directory=directory, lock_timeout=lock_timeout)
    finally:
        await conn.close()


async def migrate_connection(
    conn: asyncpg.Connection, *, directory: Path | None = None, lock_timeout: float = 900.0
) -> list[str]:
    """:func:`migrate` on an open connection (not inside a transaction)."""
    migrations = load_migrations(directory)
    await _acquire_lock(conn, lock_timeout)
    try:
        await conn.execute(_CREATE_TABLE)
        applied = {
            r["version"]: r["checksum"].strip()
            for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")
        }
        done: list[str] = []
        for migration in migrations:
            rerun = False
            if not migration.transactional:
                rerun = await _drop_invalid_indexes(conn, migration)
            if migration.version in applied and not rerun:
                if applied[migration.version] != migration.checksum:
                    log.warning("migration %s changed after it was applied", migration.version)
                continue
            started = time.monotonic()
            try:
                await _apply(conn, migration)
            except Exception as exc:
                raise MigrationError(f"migration {migration.version} failed: {exc}") from exc
            log.info("applied migration %s in %.2fs", migration.version, time.monotonic() - started)
            done.append(migration.version)
        return done
    finally:
        if not conn.is_closed():
            with contextlib.suppress(asyncpg.PostgresError, OSError):
                await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def applied_versions(conn: asyncpg.Connection) -> list[str]:
    """Versions recorded in ``schema_migrations`` (empty if the table does not exist yet)."""
    if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        return []
    return [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")]


async def _acquire_lock(conn: asyncpg.Connection, wait_seconds: float) -> None:
    deadline = time.monotonic() + wait_seconds
    delay = 0.05
    while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY):
        if time.monotonic() >= deadline:
            raise MigrationError(
                f"another migrator held the migration lock for more than {wait_seconds:.0f}s"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def _apply(conn: asyncpg.Connection, migration: Migration) -> None:
    record = (
        "INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2) "
        "ON CONFLICT (version) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()"
    )
    if migration.transactional:
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(record, migration.version, migration.checksum)
        return
    for statement in split_sql(migration.sql):
        await conn.execute(statement)
    await conn.execute(record, migration.version, migration.checksum)


async def _drop_invalid_indexes(conn: asyncpg.Connection, migration: Migration) -> bool:
    if not migration.concurrent_indexes:
        return False
    rows = await conn.fetch(
        """
        SELECT c.relname
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        WHERE c.relname = ANY($1::text[])
          AND c.relnamespace = current_schema()::regnamespace
          AND NOT i.indisvalid
        """,
        list(migration.concurrent_indexes),
    )
    for row in rows:
        log.warning("dropping the INVALID index %s left by a failed build; rebuilding it", row["relname"])
        await conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{row["relname"]}"')
    return bool(rows)


def _strip_comments(sql: str) -> str:
    return "\n".join(part for part in split_sql(sql, keep_comments=False))


def split_sql(sql: str, *, keep_comments: bool = True) -> list[str]:
    """Split a script into statements at top-level ``;`` (outside quotes, dollar quotes and comments).

    Empty statements are dropped; with ``keep_comments=False`` comments are removed from the result.
    """
    statements: list[str] = []
    buf: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        nxt = sql[i + 1] if i + 1 < n else ""
        if ch == "-" and nxt == "-":
            end = sql.find("\n", i)
            end = n if end == -1 else end
            if keep_comments:
                buf.append(sql[i:end])
            i = end
            continue
        if ch == "/" and nxt == "*":
            end = sql.find("*/", i + 2)
            end = n if end == -1 else end + 2
            if keep_comments:
                buf.append(sql[i:end])
            i = end
            continue
        if ch in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # doubled quote escape
                        end += 2
                        continue
                    break
                end += 1
            buf.append(sql[i : end + 1])
            i = end + 1
            continue
        if ch == "$":
            tag = re.match(r"\$[A-Za-z_]*\$", sql[i:])
            if tag:
                close = sql.find(tag.group(0), i + len(tag.group(0)))
                close = n if close == -1 else close + len(tag.group(0))
                buf.append(sql[i:close])
                i = close
                continue
        if ch == ";":
            statement = "".join(buf).strip()
            if _has_code(statement):
                statements.append(statement)
            buf = []
            i += 1
            continue
        buf.append(ch)
        i += 1
    statement = "".join(buf).strip()
    if _has_code(statement):
        statements.append(statement)
    return statements


def _has_code(statement: str) -> bool:
    for line in statement.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("--"):
            return True
    return False
