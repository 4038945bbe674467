"""Seed rows by SQL the way admission and dispatch would write them: users, workers, waiting requests and
in-flight generations. The defaults describe one chat job on :data:`DEFAULT_MODEL`; every column can be
overridden or added through keyword arguments."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from horde_store.db import Conn
from horde_store.users import create_user

from horde_testing.pytest_plugin import TEST_SECRET_KEY

DEFAULT_MODEL = "test/model-7b"


@dataclass
class User:
    """A seeded user: its id and its plain API key."""

    id: int
    api_key: str


async def create_test_user(
    conn: Conn,
    *,
    name: str | None = None,
    salt: str = TEST_SECRET_KEY,
    kudos: float = 1000.0,
    **kw: Any,
) -> User:
    """Create a user (unique name unless given) whose key is hashed with the test salt."""
    record, key = await create_user(
        conn,  # type: ignore[arg-type]  # a pooled connection proxies a Connection
        name or f"u_{uuid.uuid4().hex[:12]}",
        salt=salt,
        kudos=kudos,
        **kw,
    )
    return User(record.id, key)


async def insert_row(
    conn: Conn,
    table: str,
    values: dict[str, Any],
    *,
    computed: dict[str, tuple[str, Any]] | None = None,
) -> Any:
    """``INSERT`` one row into ``table`` and return its ``id``.

    ``values`` are bound as they are; ``computed`` maps a column to ``(sql, arg)`` where ``sql`` holds ``{}``
    for the placeholder of ``arg`` (e.g. ``("now() + make_interval(secs => {})", 60.0)``).
    """
    names = list(values)
    args = list(values.values())
    placeholders = [f"${i}" for i in range(1, len(args) + 1)]
    for column, (sql, arg) in (computed or {}).items():
        names.append(column)
        args.append(arg)
        placeholders.append(sql.format(f"${len(args)}"))
    return await conn.fetchval(
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(placeholders)}) RETURNING id", *args
    )


class Factory:
    """Inserts the rows admission and dispatch write (users, workers, waiting_prompts, processing_gens)."""

    def __init__(
        self, pool: asyncpg.Pool, *, model: str = DEFAULT_MODEL, salt: str = TEST_SECRET_KEY
    ) -> None:
        self.pool = pool
        self.model = model
        self.salt = salt

    async def user(self, kudos: float = 1000.0, trusted: bool = False, *, name: str | None = None) -> User:
        """A new user with ``kudos``."""
        async with self.pool.acquire() as conn:
            return await create_test_user(conn, name=name, salt=self.salt, kudos=kudos, trusted=trusted)

    async def worker(self, owner: User, model: str | None = None, **columns: Any) -> uuid.UUID:
        """A chat worker of ``owner`` serving ``model`` (8192/1024 chat limits); ``columns`` add or override."""
        model = model or self.model
        values: dict[str, Any] = {
            "user_id": owner.id,
            "name": f"w-{uuid.uuid4().hex[:10]}",
            "models": [model],
            "accepts_chat_jobs": True,
            "chat_model_id": model,
            "chat_max_context_length": 8192,
            "chat_max_length": 1024,
            **columns,
        }
        async with self.pool.acquire() as conn:
            worker_id: uuid.UUID = await insert_row(conn, "workers", values)
        return worker_id

    async def request(
        self,
        requester: User,
        *,
        is_chat: bool = True,
        model: str | None = None,
        message: str = "hi",
        prompt: str | None = None,
        n: int = 0,
        jobs: int = 1,
        max_length: int = 512,
        max_context_length: int = 4096,
        expiry_seconds: float = 1200,
        hold: float = 0.0,
        **columns: Any,
    ) -> uuid.UUID:
        """An active waiting request of ``requester`` expiring in ``expiry_seconds``.

        A chat request carries one user ``message`` (the prompt defaults to ``"user: <message>"``); a
        ``hold`` > 0 also reserves that many kudos for it. ``columns`` add or override columns.
        """
        values: dict[str, Any] = {
            "user_id": requester.id,
            "is_chat": is_chat,
            "prompt": prompt if prompt is not None else f"user: {message}",
            "messages": [{"role": "user", "content": message}] if is_chat else None,
            "models": [model or self.model],
            "n": n,
            "jobs": jobs,
            "max_length": max_length,
            "max_context_length": max_context_length,
            "active": True,
            **columns,
        }
        computed = {"expiry": ("now() + make_interval(secs => {})", float(expiry_seconds))}
        async with self.pool.acquire() as conn:
            wp_id: uuid.UUID = await insert_row(conn, "waiting_prompts", values, computed=computed)
            if hold:
                await conn.execute(
                    "INSERT INTO kudos_holds (wp_id, user_id, amount) VALUES ($1, $2, $3)",
                    wp_id,
                    requester.id,
                    hold,
                )
        return wp_id

    async def generation(
        self,
        wp_id: uuid.UUID,
        worker_id: uuid.UUID,
        owner: User,
        model: str | None = None,
        *,
        started_seconds_ago: float = 2.0,
        job_ttl: int = 150,
        **columns: Any,
    ) -> uuid.UUID:
        """A generation of ``wp_id`` on ``worker_id`` started ``started_seconds_ago``; ``columns`` add or
        override (``assigned_model`` defaults to ``model``)."""
        model = model or self.model
        values: dict[str, Any] = {
            "wp_id": wp_id,
            "worker_id": worker_id,
            "user_id": owner.id,
            "model": model,
            "assigned_model": model,
            "job_ttl": job_ttl,
            **columns,
        }
        ago = ("now() - make_interval(secs => {})", float(started_seconds_ago))
        async with self.pool.acquire() as conn:
            gen_id: uuid.UUID = await insert_row(
                conn, "processing_gens", values, computed={"created": ago, "started_at": ago}
            )
        return gen_id

    async def row(self, sql: str, *args: Any) -> asyncpg.Record | None:
        """The first row of ``sql`` (``None`` when there is none)."""
        async with self.pool.acquire() as conn:
            record: asyncpg.Record | None = await conn.fetchrow(sql, *args)
        return record
