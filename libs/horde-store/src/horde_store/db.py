"""PostgreSQL connections for every service: an asyncpg pool whose connections decode ``json`` and
``jsonb`` to Python values (and encode them with :func:`json.dumps`).

The pool has timeouts, so a hung or overloaded server fails a request fast (``TimeoutError``, which the app
factory answers 503 ServiceUnavailable) instead of queueing requests behind it forever: opening a connection
(:data:`CONNECT_TIMEOUT_SECONDS`), waiting for a free connection of the pool (:data:`ACQUIRE_TIMEOUT_SECONDS`,
the default of every ``pool.acquire()`` and of the pool's own ``fetch``/``execute``…) and each command
(:data:`COMMAND_TIMEOUT_SECONDS`, asyncpg's ``command_timeout``). A caller may pass other values.

A released connection goes back to the pool without asyncpg's reset query (``RESET ALL``, ``UNLISTEN *``,
``CLOSE ALL``, advisory unlock): no service keeps session state on a pooled connection (no ``SET``, session
advisory lock, ``LISTEN`` or cursor outside a transaction), and that query was one more round trip on every
release, several per request. asyncpg still rolls back a transaction left open.

Behind a transaction-mode pooler (PgBouncer ``pool_mode=transaction``; docs/operator-guide.md#pgbouncer) each
transaction, and each statement outside one, may run on another server connection. What that needs:

* no named prepared statements: ``HORDE_DATABASE_STATEMENT_CACHE_SIZE=0`` (asyncpg's ``statement_cache_size``),
  so every statement is asyncpg's unnamed one, parsed again in the same round trip that runs it; no code here
  calls ``Connection.prepare()`` (tests/e2e/test_pgbouncer_e2e.py runs the stack that way);
* no session state, which the services already keep none of (above): the one advisory lock a service takes is
  transaction-scoped (dispatch's worker creation, ``pg_advisory_xact_lock``), signals go through Redis pub/sub,
  not ``LISTEN``/``NOTIFY`` (horde_core.queue_announce);
* the migrator (``horde-admin migrate``, horde_store.migrate) holds a *session* advisory lock for its run and
  must reach PostgreSQL directly (or through a session-mode pool).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

#: What a statement runs on: a connection of :func:`connect` or one acquired from a pool.
Conn = asyncpg.Connection | PoolConnectionProxy
#: A :data:`Conn` or the pool itself (asyncpg's pool runs ``fetch``/``execute`` on a connection it acquires):
#: for statements that need no transaction.
ConnOrPool = Conn | asyncpg.Pool

#: Opening one connection (asyncpg's ``timeout``; its default is 60 s).
CONNECT_TIMEOUT_SECONDS = 5.0
#: Waiting for a connection of the pool when every one is in use (asyncpg's default: forever).
ACQUIRE_TIMEOUT_SECONDS = 10.0
#: One statement (asyncpg's ``command_timeout``; its default: none). Request-path statements take
#: milliseconds; the longest (the janitor's batched sweeps) well under a second.
COMMAND_TIMEOUT_SECONDS = 30.0
#: asyncpg's prepared statement cache per connection (its default); 0 behind a transaction-mode pooler.
DEFAULT_STATEMENT_CACHE_SIZE = 100


def normalize_dsn(dsn: str) -> str:
    """Accept SQLAlchemy-style schemes (``postgresql+asyncpg://``) as plain ``postgresql://``."""
    scheme, sep, rest = dsn.partition("://")
    if sep and "+" in scheme:
        scheme = scheme.split("+", 1)[0]
    if scheme == "postgres":
        scheme = "postgresql"
    return f"{scheme}{sep}{rest}" if sep else dsn


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's ``reset``: nothing to undo (see the module docstring)."""


def _dumps(value: Any) -> str:
    # Compact and NaN-free, like the JSON the Horde returns: a NaN in a jsonb column is an error.
    return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


async def setup_connection(conn: asyncpg.Connection) -> None:
    """Register the json/jsonb codecs on ``conn`` (Python values in, Python values out).

    A ``jsonb`` parameter takes any JSON-serialisable value (dict, list, str, number, bool, None);
    SQL NULL is Python None only for a NULL column, a JSON ``null`` also reads as None.
    """
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(typename, schema="pg_catalog", encoder=_dumps, decoder=json.loads)


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """One connection with the codecs of :func:`setup_connection` (for CLIs and tests)."""
    conn: asyncpg.Connection = await asyncpg.connect(normalize_dsn(dsn), **kwargs)
    await setup_connection(conn)
    return conn


class TimedPool(asyncpg.Pool):
    """An asyncpg pool whose ``acquire()`` waits at most ``acquire_timeout`` seconds unless given a timeout."""

    __slots__ = ("_acquire_timeout",)

    def __init__(self, *args: Any, acquire_timeout: float | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acquire_timeout = acquire_timeout

    def acquire(self, *, timeout: float | None = None) -> Any:
        return super().acquire(timeout=self._acquire_timeout if timeout is None else timeout)


async def create_pool(
    dsn: str,
    *,
    acquire_timeout: float | None = ACQUIRE_TIMEOUT_SECONDS,
    min_size: int = 10,
    max_size: int = 10,
    **kwargs: Any,
) -> asyncpg.Pool:
    """An asyncpg pool on ``dsn`` with the json/jsonb codecs set on every connection and the timeouts above.

    ``kwargs`` go to asyncpg (``command_timeout``, ``timeout``, ``max_queries``, ``statement_cache_size``…); an
    ``init`` callback
    given there runs after the codecs are set; ``acquire_timeout`` None waits for a connection forever.
    Raises what asyncpg raises when the server is unreachable (OSError, TimeoutError, asyncpg.PostgresError).
    """
    user_init: Callable[[asyncpg.Connection], Awaitable[None]] | None = kwargs.pop("init", None)

    async def init(conn: asyncpg.Connection) -> None:
        await setup_connection(conn)
        if user_init is not None:
            await user_init(conn)

    kwargs.setdefault("timeout", CONNECT_TIMEOUT_SECONDS)
    kwargs.setdefault("command_timeout", COMMAND_TIMEOUT_SECONDS)
    pool = TimedPool(
        normalize_dsn(dsn),
        acquire_timeout=acquire_timeout,
        min_size=min_size,
        max_size=max_size,
        max_queries=kwargs.pop("max_queries", 50000),
        max_inactive_connection_lifetime=kwargs.pop("max_inactive_connection_lifetime", 300.0),
        connection_class=kwargs.pop("connection_class", asyncpg.Connection),
        record_class=kwargs.pop("record_class", asyncpg.Record),
        loop=None,
        init=init,
        reset=kwargs.pop("reset", _keep_session),
        **kwargs,
    )
    await pool
    return pool
