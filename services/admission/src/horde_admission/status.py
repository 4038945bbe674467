"""The status body of a chat or text request (docs/native-api.md#status-and-cancel; docs/native-api.md#submit's done rule, #pricing,
Impossible reason, Context adjustments, Refusal record)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from async_lru import alru_cache

from horde_admission import store
from horde_admission.availability import Availability
from horde_admission.kudos import estimated_wait_seconds


def _uuid(value: Any) -> str | None:
    return str(value) if value is not None else None


def counts(head: asyncpg.Record) -> dict[str, Any]:
    """finished, processing, restarted, waiting and done from the status head.

    done: faulted, or nothing waiting or processing and either every requested result stored or the rest
    cancelled (so a cancelled request with nothing in flight is done, with or without a generation).
    """
    finished, processing, restarted = int(head["finished"]), int(head["processing"]), int(head["restarted"])
    jobs, n = int(head["jobs"]), max(int(head["n"]), 0)
    waiting = max(0, min(n, jobs - processing - finished))
    faulted = bool(head["faulted"])
    done = faulted or (waiting == 0 and processing == 0 and (finished >= jobs or bool(head["cancelled"])))
    return {
        "finished": finished,
        "processing": processing,
        "restarted": restarted,
        "waiting": waiting,
        "done": done,
        "faulted": faulted,
    }


def chat_generation(row: asyncpg.Record) -> dict[str, Any]:
    """One finished chat generation with its structured reply (docs/native-api.md#pricing, last paragraph)."""
    wait = row["queue_wait_seconds"]
    return {
        "id": _uuid(row["id"]),
        "worker_id": _uuid(row["worker_id"]),
        "worker_name": row["worker_name"],
        "model": row["model"],
        "state": row["state"] or "ok",
        "text": row["generation"],
        "message": row["message"],
        "finish_reason": row["finish_reason"],
        "native_finish_reason": row["native_finish_reason"],
        "prompt_tokens": row["prompt_tokens"],
        "completion_tokens": row["completion_tokens"],
        "reasoning_tokens": row["reasoning_tokens"],
        "charge_basis": row["charge_basis"],
        "queue_wait_seconds": round(float(wait), 3) if wait is not None else None,
    }


def text_generation(row: asyncpg.Record) -> dict[str, Any]:
    """One finished text generation (docs/native-api.md#status-and-cancel: text, seed, worker, model, state, gen_metadata)."""
    return {
        "text": row["generation"],
        "seed": row["seed"] or 0,
        "worker_id": _uuid(row["worker_id"]),
        "worker_name": row["worker_name"],
        "model": row["model"],
        "state": row["state"] or "ok",
        "gen_metadata": row["gen_metadata"] or [],
    }


class QueueAheadMemo:
    """Each request's queue position and the work ahead of it (:func:`store.queue_ahead`), kept for
    ``memo_seconds`` (HORDE_STATUS_QUEUE_MEMO_SECONDS, 1 s).

    that statement counts every queued request ahead, so a status read at the back of a long queue
    cost PostgreSQL about a millisecond, and clients poll a request's status many times a second between
    them. The position and wait are estimates; the rest of the status (done, counts, generations) is read
    fresh every time. async-lru's TTL cache: concurrent reads of one request share one statement, at most
    ``max_entries`` requests are kept (least recently used first out), a failed read is not kept.
    """

    def __init__(self, pool: Any, memo_seconds: float, max_entries: int = 10_000) -> None:
        self.memo_seconds = memo_seconds

        async def read(request_id: uuid.UUID, models: tuple[str, ...]) -> tuple[int, int, int]:
            async with pool.acquire() as conn:
                return await store.queue_ahead(conn, request_id, list(models))

        self._read = read
        self._fetch = alru_cache(maxsize=max_entries, ttl=memo_seconds)(read)

    async def get(self, request_id: uuid.UUID, models: list[str]) -> tuple[int, int, int]:
        """``(queue_position, tokens, jobs)``, read on a connection of its own (never one a reader holds: ten
        readers holding the pool's ten connections would wait on each other); every time when the memo is off
        (``memo_seconds`` 0)."""
        if self.memo_seconds <= 0:
            return await self._read(request_id, tuple(models))
        return await self._fetch(request_id, tuple(models))


async def build_status(
    head: asyncpg.Record,
    gens: list[asyncpg.Record],
    is_chat: bool,
    availability: Availability | None,
    queue_ahead: QueueAheadMemo,
) -> dict[str, Any]:
    """The full status body from the status head and finished generations (:func:`store.read_status`).

    ``availability`` is the request's availability (cached up to 60 s); None leaves is_possible true and the
    chat availability fields null. The queue position and the work ahead come from ``queue_ahead``.
    """
    request_id = head["id"]
    body = counts(head)
    models = list(head["models"] or [])
    queue_position, wait_time = 0, 0
    if int(head["n"]) > 0 and not body["faulted"]:
        position, tokens, jobs = await queue_ahead.get(request_id, models)
        queue_position = position
        if availability is not None:
            wait = estimated_wait_seconds(
                tokens, jobs, availability.eligible_threads, availability.tokens_per_second
            )
            wait_time = round(wait) if wait is not None else 0
    eligible = availability.eligible_workers if availability is not None else None
    body.update(
        {
            "queue_position": queue_position,
            "wait_time": wait_time,
            "kudos": round(float(head["consumed_kudos"] or 0)),
            "is_possible": body["processing"] > 0 or eligible is None or eligible > 0,
        }
    )
    if is_chat:
        impossible = None
        if availability is not None and body["processing"] == 0 and not body["done"]:
            impossible = availability.impossible_reason()
        body.update(
            {
                "eligible_worker_threads": availability.eligible_threads
                if availability is not None
                else None,
                "impossible_reason": impossible,
                "context_adjustments": head["context_adjustments"],
                "fault_reason": head["chat_fault_reason"] if body["faulted"] else None,
                "fault_rc": head["chat_fault_rc"] if body["faulted"] else None,
                "generations": [chat_generation(g) for g in gens],
            }
        )
    else:
        body["generations"] = [text_generation(g) for g in gens]
    return body
