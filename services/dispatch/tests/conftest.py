"""Dispatch tests against real stores (horde_testing fixtures).

The dispatch app runs in-process with its lifespan (the real asyncpg pool, Redis, S3 client and the
WorkerPool gRPC server on a free port); the tests write users and waiting requests with SQL, as admission
would, and read back what dispatch stored.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
from horde_dispatch.app import create_app
from horde_dispatch.settings import DispatchSettings
from horde_store.db import connect
from horde_testing.launcher import free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY
from horde_testing.seed import create_test_user

CHAT_MODEL = "koboldcpp/test-chat-7b"
TEXT_MODEL = "koboldcpp/test-text-7b"


def settings_from_env(env: dict[str, str], **overrides: Any) -> DispatchSettings:
    """DispatchSettings from a ``HORDE_*`` dict (the fixtures' env), with overrides."""
    values: dict[str, Any] = {
        k.removeprefix("HORDE_").lower(): v for k, v in env.items() if k.startswith("HORDE_")
    }
    values.setdefault("secret_key", TEST_SECRET_KEY)
    values.update(overrides)
    return DispatchSettings(**values)


def chat_body(name: str, model: str = CHAT_MODEL, **overrides: Any) -> dict[str, Any]:
    """A chat worker's pop body: serves ``model`` with chat, 8192/1024 chat limits, no features."""
    body: dict[str, Any] = {
        "name": name,
        "models": [model],
        "max_length": 512,
        "max_context_length": 4096,
        "bridge_agent": "Horde Chat Worker:0.1.0:test",
        "chat_jobs": True,
        "chat_limits": {"max_context_length": 8192, "max_length": 1024},
        "model_id": model,
        "chat_features": [],
    }
    body.update(overrides)
    return body


class Harness:
    """The in-process dispatch app, an HTTP client on it and a database connection for set-up and checks.

    Test modules reach the helpers through the ``h`` fixture (``h.chat_body``, ``h.CHAT_MODEL``), since
    pytest's importlib mode does not let them import this file.
    """

    CHAT_MODEL = CHAT_MODEL
    TEXT_MODEL = TEXT_MODEL
    chat_body = staticmethod(chat_body)

    def __init__(
        self, app: Any, client: httpx.AsyncClient, db: asyncpg.Connection, settings: DispatchSettings
    ):
        self.app = app
        self.client = client
        self.db = db
        self.settings = settings
        self._users = 0

    async def user(self, *, trusted: bool = False, kudos: float = 0.0) -> tuple[int, str]:
        """A new user; returns ``(id, api_key)``."""
        self._users += 1
        user = await create_test_user(
            self.db, name=f"user-{uuid.uuid4().hex[:10]}", trusted=trusted, kudos=kudos
        )
        return user.id, user.api_key

    async def pop(self, apikey: str | None, body: Any) -> httpx.Response:
        headers = {"apikey": apikey} if apikey is not None else {}
        return await self.client.post("/api/v2/generate/text/pop", json=body, headers=headers)

    async def request(
        self,
        *,
        user_id: int,
        is_chat: bool = True,
        models: list[str] | None = None,
        max_length: int = 512,
        max_context_length: int = 4096,
        n: int = 1,
        params: dict[str, Any] | None = None,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | None = None,
        extra_priority: int = 0,
        created: datetime | None = None,
        **columns: Any,
    ) -> uuid.UUID:
        """Insert an active waiting request as admission would (chat by default) and return its id."""
        if messages is None and is_chat:
            messages = [{"role": "user", "content": "Hello"}]
        values: dict[str, Any] = {
            "user_id": user_id,
            "is_chat": is_chat,
            "models": [CHAT_MODEL] if models is None else models,
            "max_length": max_length,
            "max_context_length": max_context_length,
            "n": n,
            "jobs": n,
            "params": {"max_length": max_length, "max_context_length": max_context_length, **(params or {})},
            "messages": messages,
            "prompt": prompt if prompt is not None else ("user: Hello" if is_chat else "Once upon a time"),
            "extra_priority": extra_priority,
            "created": created or datetime.now(UTC),
            "active": True,
            "chat_required_features": [] if is_chat else None,
            **columns,
        }
        names = list(values)
        placeholders = ", ".join(f"${i}" for i in range(1, len(names) + 1))
        return await self.db.fetchval(
            f"INSERT INTO waiting_prompts ({', '.join(names)}) VALUES ({placeholders}) RETURNING id",
            *values.values(),
        )

    async def clear(self) -> None:
        """Empty the queue and the worker table (a module shares one database)."""
        await self.db.execute("DELETE FROM processing_gens; DELETE FROM waiting_prompts; DELETE FROM workers")

    async def set_worker(self, name: str, **columns: Any) -> None:
        sets = ", ".join(f"{k} = ${i}" for i, k in enumerate(columns, start=2))
        await self.db.execute(f"UPDATE workers SET {sets} WHERE name = $1", name, *columns.values())


@pytest.fixture(scope="module")
def dispatch_settings(horde_settings_env: dict[str, str]) -> DispatchSettings:
    # The tests all call from one address: upstream's 30 worker changes a minute would refuse them.
    return settings_from_env(
        horde_settings_env,
        dispatch_grpc_port=free_port(),
        log_json=False,
        modify_request_limit_per_ip="6000/minute",
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def harness(dispatch_settings: DispatchSettings) -> AsyncIterator[Harness]:
    app = create_app(dispatch_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dispatch") as client:
            db = await connect(dispatch_settings.database_url)
            try:
                yield Harness(app, client, db, dispatch_settings)
            finally:
                await db.close()


@pytest_asyncio.fixture(loop_scope="session")
async def h(harness: Harness) -> AsyncIterator[Harness]:
    """The module's harness with an empty queue and worker table."""
    await harness.clear()
    yield harness


@pytest.fixture
def past() -> Any:
    """``past(seconds)``: an aware datetime that many seconds ago."""
    return lambda seconds: datetime.now(UTC) - timedelta(seconds=seconds)
