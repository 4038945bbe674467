"""PostgreSQL connections for every service: an asyncpg pool whose connections decode ``json`` and
``jsonb`` to Python values (and encode them with :func:`json.dumps`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg


def normalize_dsn(dsn: str) -> str:
    """Accept SQLAlchemy-style schemes (``postgresql+asyncpg://``) as plain ``postgresql://``."""
    scheme, sep, rest = dsn.partition("://")
    if sep and "+" in scheme:
        scheme = scheme.split("+", 1)[0]
    if scheme == "postgres":
        scheme = "postgresql"
    return f"{scheme}{sep}{rest}" if sep else dsn


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


async def create_pool(dsn: str, **kwargs: Any) -> asyncpg.Pool:
    """``asyncpg.create_pool(dsn, **kwargs)`` with the json/jsonb codecs set on every connection.

    ``kwargs`` go to asyncpg (``min_size``, ``max_size``, ``command_timeout``…); an ``init`` callback
    given there runs after the codecs are set. Raises what asyncpg raises when the server is
    unreachable (OSError, asyncpg.PostgresError).
    """
    user_init: Callable[[asyncpg.Connection], Awaitable[None]] | None = kwargs.pop("init", None)

    async def init(conn: asyncpg.Connection) -> None:
        await setup_connection(conn)
        if user_init is not None:
            await user_init(conn)

    pool = await asyncpg.create_pool(normalize_dsn(dsn), init=init, **kwargs)
    assert pool is not None
    return pool
