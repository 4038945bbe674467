"""Helpers shared by the admission tests (imported by name: conftest puts this directory on sys.path)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from horde_testing.pytest_plugin import TEST_SECRET_KEY
from horde_testing.seed import create_test_user
from prometheus_client import REGISTRY

__all__ = [
    "TEST_SECRET_KEY",
    "add_chat_worker",
    "allowance_decisions",
    "chat_body",
    "new_user",
    "unique_model",
]


async def new_user(db: asyncpg.Connection, *, kudos: float = 1000.0, **kw: Any) -> tuple[int, str]:
    """Create a user with a unique name; returns ``(user id, api key)``."""
    user = await create_test_user(db, kudos=kudos, **kw)
    return user.id, user.api_key


async def add_chat_worker(
    db: asyncpg.Connection,
    model: str,
    *,
    owner: int | None = None,
    max_context_length: int = 8192,
    max_length: int = 2048,
    features: list[str] | None = None,
    threads: int = 1,
    speed: float | None = None,
    online: bool = True,
    accepts_prompt_jobs: bool = True,
    image_transports: list[str] | None = None,
) -> uuid.UUID:
    """Insert an online chat worker serving ``model`` (the declaration a pop would store)."""
    if owner is None:
        owner, _ = await new_user(db)
    worker_id: uuid.UUID = await db.fetchval(
        """
        INSERT INTO workers (user_id, name, threads, models, accepts_chat_jobs, accepts_prompt_jobs, chat_model_id,
                             chat_max_context_length, chat_max_length, chat_features, speed, last_check_in,
                             max_length, max_context_length, image_transports)
        VALUES ($1, $2, $3, ARRAY[$4], true, $5, $4, $6, $7, $8, $9,
                CASE WHEN $10 THEN now() ELSE now() - interval '1 hour' END, $7, $6, $11)
        RETURNING id
        """,
        owner,
        f"w_{uuid.uuid4().hex[:12]}",
        threads,
        model,
        accepts_prompt_jobs,
        max_context_length,
        max_length,
        features if features is not None else ["prompt_overflow_refused"],
        speed,
        online,
        image_transports,
    )
    return worker_id


def chat_body(model: str = "m", content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def unique_model() -> str:
    return f"model-{uuid.uuid4().hex[:8]}"


def allowance_decisions(outcome: str, requested: str, allowance: str, *, requester: str, chat: bool) -> float:
    """The count of ``horde.text.free_allowance.decisions`` for these labels (0 before the first)."""
    value = REGISTRY.get_sample_value(
        "horde_text_free_allowance_decisions_total",
        {
            "requester": requester,
            "outcome": outcome,
            "requested_bucket": requested,
            "allowance_bucket": allowance,
            "chat": "true" if chat else "false",
        },
    )
    return value or 0.0
