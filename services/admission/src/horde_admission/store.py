"""Admission's SQL: the request rows it creates, and the status and cancel reads (asyncpg, few round trips).

See docs/native-api.md#routes, #operation-key, #submit (the done rule),
#free-output-allowance; docs/native-api.md#status-and-cancel (status fields), #kudos (concurrency, holds, priority, tax). Every read filters on
``is_chat`` so the chat and text route families never see each other's rows.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from horde_store.db import Conn


class OperationKeyRace(Exception):
    """Another submission claimed the same (user, operation_key) first; this one rolled back."""


class HoldRefused(Exception):
    """The requester cannot cover the upfront hold."""


class SharedKeyHoldRefused(HoldRefused):
    """The shared key the request is sent with cannot cover it: ``amount`` is above the key's ``available``
    kudos (its kudos less the holds of its requests still held). 403 SharedKeyInsufficientKudos."""

    def __init__(self, available: float, amount: float) -> None:
        super().__init__(f"shared key has {available:g} kudos available; {amount:g} needed")
        self.available = available
        self.amount = amount


@dataclass
class NewRequest:
    """A request row to create (waiting_prompts), already validated, sized and priced."""

    id: uuid.UUID
    user_id: int
    is_chat: bool
    prompt: str
    params: dict[str, Any]
    models: list[str]
    max_length: int
    max_context_length: int
    n: int = 1
    messages: list[dict[str, Any]] | None = None
    submitted_prompt: str | None = None
    trusted_workers: bool = False
    validated_backends: bool = False
    slow_workers: bool = True
    worker_ids: list[str] = field(default_factory=list)
    worker_blacklist: bool = False
    shared_key_id: str | None = None
    #: What the shared key must cover besides the hold (kudos.shared_key_amount); checked with the hold, under
    #: the key's row lock, against the key's kudos less its requests' holds. 0: the hold only.
    shared_key_amount: float = 0.0
    client_agent: str = "unknown:0:unknown"
    ipaddr: str | None = None
    operation_key: str | None = None
    operation_fingerprint: str | None = None
    context_adjustments: list[dict[str, Any]] | None = None
    chat_extras: dict[str, Any] | None = None
    chat_required_features: list[str] | None = None
    chat_conformance: str = "strict"
    chat_tools_temperature: float | None = None
    kudos_estimate: float = 0.0
    tax: float = 1.0
    flagged_user: bool = False
    ttl_seconds: int = 1200
    stream_progress: bool = False
    has_images: bool = False
    #: The messages are also stored as one object (docs/native-api.md#messages-offload); dispatch then sends
    #: a worker that declared messages_url a URL in their place.
    chat_messages_offloaded: bool = False


async def find_operation_claim(conn: Conn, user_id: int, operation_key: str) -> asyncpg.Record | None:
    """The request holding ``(user_id, operation_key)``: ``{id, operation_fingerprint, kudos}`` or None."""
    return await conn.fetchrow(
        """
        SELECT id, operation_fingerprint, kudos
        FROM waiting_prompts
        WHERE user_id = $1 AND operation_key = $2::uuid
        """,
        user_id,
        operation_key,
    )


async def count_concurrent(conn: Conn, user_id: int, anonymous: bool, models: list[str]) -> int:
    """Σn over the user's unfaulted requests with n ≥ 1; for anonymous, active ones listing a requested model."""
    if anonymous:
        value = await conn.fetchval(
            """
            SELECT coalesce(sum(n), 0) FROM waiting_prompts
            WHERE user_id = $1 AND NOT faulted AND n >= 1 AND active AND models && $2::text[]
            """,
            user_id,
            models,
        )
    else:
        value = await conn.fetchval(
            "SELECT coalesce(sum(n), 0) FROM waiting_prompts WHERE user_id = $1 AND NOT faulted AND n >= 1",
            user_id,
        )
    return int(value)


#: The queued requests one of the workers $1 could take (docs/native-api.md#free-output-allowance, competing
#: requests): a chat request by a worker serving one of its models with chat, within its chat limits; a text
#: request by a worker taking prompt jobs that lists one of its models (any worker for a request without
#: models), within its text limits. The ``models`` conjunct narrows the queue through ix_waiting_prompts_models
#: (and the any-model partial index) before the per-row check.
_COMPETING_QUEUE = """
WITH ew AS (
    SELECT w.models, w.accepts_prompt_jobs, w.max_length, w.max_context_length, w.accepts_chat_jobs,
           w.chat_model_id, w.chat_max_length, w.chat_max_context_length
    FROM workers w WHERE w.id = ANY($1::uuid[])
), served AS (
    SELECT coalesce(array_agg(DISTINCT m), '{}'::text[]) AS models
    FROM (SELECT unnest(ew.models) AS m FROM ew UNION SELECT ew.chat_model_id FROM ew) names
    WHERE m IS NOT NULL
)
SELECT coalesce(sum(r.max_length * r.n), 0) AS tokens, coalesce(sum(r.n), 0) AS jobs
FROM waiting_prompts r, served
WHERE r.active AND NOT r.faulted AND r.n > 0 AND r.expiry > now()
  AND (r.models && served.models OR cardinality(r.models) = 0)
  AND EXISTS (
      SELECT 1 FROM ew WHERE
          (r.is_chat AND ew.accepts_chat_jobs AND ew.chat_model_id = ANY(r.models)
           AND r.max_length <= ew.chat_max_length AND r.max_context_length <= ew.chat_max_context_length)
       OR (NOT r.is_chat AND ew.accepts_prompt_jobs
           AND (cardinality(r.models) = 0 OR r.models && ew.models)
           AND r.max_length <= ew.max_length AND r.max_context_length <= ew.max_context_length))
"""


async def competing_queue(conn: Conn, worker_ids: list[str]) -> tuple[int, int]:
    """Outstanding tokens and generations of the queued requests one of the workers ``worker_ids`` (the new
    request's eligible workers) could take by their models, chat opt-in and length limits (``_COMPETING_QUEUE``;
    docs/native-api.md#free-output-allowance). ``(0, 0)`` without workers."""
    if not worker_ids:
        return 0, 0
    row = await conn.fetchrow(_COMPETING_QUEUE, worker_ids)
    assert row is not None
    return int(row["tokens"]), int(row["jobs"])


async def queue_ahead(conn: Conn, request_id: uuid.UUID, models: list[str]) -> tuple[int, int, int]:
    """``(queue_position, tokens, jobs)`` of the queued requests sharing a model, up to and including this one.

    Queue order is ``extra_priority DESC, created ASC`` (docs/native-api.md#pop); the position counts from 1.
    """
    row = await conn.fetchrow(
        """
        WITH me AS (SELECT extra_priority, created FROM waiting_prompts WHERE id = $1)
        SELECT count(*) AS position, coalesce(sum(w.max_length * w.n), 0) AS tokens, coalesce(sum(w.n), 0) AS jobs
        FROM waiting_prompts w, me
        WHERE w.active AND NOT w.faulted AND w.n > 0 AND w.expiry > now()
          AND (cardinality($2::text[]) = 0 OR cardinality(w.models) = 0 OR w.models && $2::text[])
          AND (w.extra_priority > me.extra_priority
               OR (w.extra_priority = me.extra_priority AND w.created <= me.created))
        """,
        request_id,
        models,
    )
    assert row is not None
    return int(row["position"]), int(row["tokens"]), int(row["jobs"])


async def lock_user(conn: Conn, user_id: int) -> None:
    """Lock the user row until the transaction ends: every placement of a hold takes this lock first."""
    await conn.execute("SELECT 1 FROM users WHERE id = $1 FOR UPDATE", user_id)


async def available_balance(conn: Conn, user_id: int) -> float:
    """The user's kudos minus their floor and active holds; lock, then check (inside a transaction).

    The row lock is taken by its own statement, and the balance read by the next one: under READ COMMITTED a
    statement's snapshot is taken when it starts, so a sum in the locking statement itself would miss the holds
    that requests committed while it waited for the lock, and parallel requests would each see room for their
    own hold. The second statement's snapshot sees every hold committed before the lock was
    granted, and no other hold of this user can be placed until this transaction ends."""
    await lock_user(conn, user_id)
    value = await conn.fetchval(
        """
        SELECT u.kudos - u.min_kudos
               - coalesce((SELECT sum(h.amount) FROM kudos_holds h WHERE h.user_id = u.id), 0)
        FROM users u WHERE u.id = $1
        """,
        user_id,
    )
    return float(value or 0)


async def shared_key_available(conn: Conn, user_id: int, key_id: str) -> float | None:
    """The shared key's kudos less the holds of its requests, with the key row locked (lock, then check, as
    :func:`available_balance`); None for an unlimited key (-1) or a key that no longer exists."""
    await conn.execute("SELECT 1 FROM user_shared_keys WHERE id = $1::uuid FOR UPDATE", key_id)
    row = await conn.fetchrow(
        """
        SELECT k.kudos,
               coalesce((SELECT sum(h.amount) FROM kudos_holds h
                          WHERE h.user_id = $2 AND h.shared_key_id = k.id), 0) AS held
        FROM user_shared_keys k WHERE k.id = $1::uuid
        """,
        key_id,
        user_id,
    )
    if row is None or row["kudos"] < 0:
        return None
    return float(row["kudos"]) - float(row["held"])


def _reserves(req: NewRequest, hold: float) -> bool:
    """Whether :func:`reserve` has anything to check: a hold, or a shared key with an amount to cover."""
    return hold > 0 or bool(req.shared_key_id and max(req.shared_key_amount, hold) > 0)


async def reserve(conn: Conn, req: NewRequest, hold: float) -> None:
    """Check that the requester, and the shared key the request is sent with, cover the request, inside the
    creating transaction and before the row, its hold and its tax are written (docs/native-api.md#kudos).

    Lock, then check: the user row first (the order settlement locks in too), then the shared key's row, so
    parallel requests of one user or one key, on either route and in any process, are checked one after the
    other, each seeing the holds and taxes of those before it. A key must cover ``max(shared_key_amount, hold)``
    with its kudos less its requests' holds (:class:`SharedKeyHoldRefused`); the user must cover ``hold`` above
    their floor and active holds (:class:`HoldRefused`). Nothing is locked for a request without a hold or key.
    """
    if not _reserves(req, hold):
        return
    key_amount = max(req.shared_key_amount, hold) if req.shared_key_id else 0.0
    if req.shared_key_id and key_amount > 0:
        await lock_user(conn, req.user_id)
        available = await shared_key_available(conn, req.user_id, req.shared_key_id)
        if available is not None and available < key_amount:
            raise SharedKeyHoldRefused(available, key_amount)
    if hold > 0 and await available_balance(conn, req.user_id) < hold:
        raise HoldRefused()


_INSERT_REQUEST = """
WITH taxed AS (
    UPDATE users SET kudos = kudos - $28::float8 WHERE id = $2
    RETURNING kudos + $28::float8 AS kudos_before
), wp AS (
    INSERT INTO waiting_prompts (
        id, user_id, is_chat, prompt, params, models, max_length, n, jobs, active, faulted, expiry, created,
        extra_priority, consumed_kudos, kudos, messages, submitted_prompt, trusted_workers, validated_backends,
        slow_workers, workers, worker_blacklist, shared_key_id, client_agent, ipaddr, operation_key,
        operation_fingerprint, context_adjustments, chat_extras, chat_required_features, chat_conformance,
        chat_tools_temperature, max_context_length, stream_progress, has_images, chat_messages_offloaded
    )
    SELECT $1, $2, $3, $4, $5::jsonb, $6::text[], $7, $8, $8, $34::boolean, false,
           now() + make_interval(secs => $29::float8), now(),
           CASE WHEN $30::boolean THEN (CASE WHEN t.kudos_before > 10 THEN round(t.kudos_before / 1000) ELSE -100 END)
                ELSE round(t.kudos_before) END,
           $28::float8, $9, $10::jsonb, $11, $12, $13, $14, $15::uuid[], $16, $17::uuid, $18, $19, $20::uuid,
           $21, $22::jsonb, $23::jsonb, $24::text[], $25, $26, $27, $32, $33, $35::boolean
    FROM taxed t
    RETURNING id
), hold AS (
    INSERT INTO kudos_holds (wp_id, user_id, shared_key_id, amount)
    SELECT wp.id, $2, $17::uuid, $31::float8 FROM wp WHERE $31::float8 > 0
    RETURNING wp_id
), shared AS (
    UPDATE user_shared_keys
    SET kudos = CASE WHEN kudos < 0 THEN kudos ELSE greatest(kudos - $28::float8, 0) END, utilized = utilized + $28::float8
    WHERE id = $17::uuid AND EXISTS (SELECT 1 FROM wp)
    RETURNING id
)
SELECT (SELECT id FROM wp) AS id
"""


async def create_request(conn: Conn, req: NewRequest, hold: float, *, active: bool = True) -> uuid.UUID:
    """Create and activate a request in one transaction: the row, the upfront hold, the horde tax.

    ``hold`` is the upfront amount (0: none); the requester must cover it, and a shared key the request is sent
    with must cover it (or its ``shared_key_amount`` when larger), checked under row locks (:func:`reserve`), or
    :class:`HoldRefused` (:class:`SharedKeyHoldRefused` for the key) is raised.
    Extra priority is the user's kudos (flagged users: ``round(kudos/1000)`` above 10 kudos, else -100).
    Raises :class:`OperationKeyRace` when the (user, operation_key) unique index refuses the row.

    ``active=False`` writes the inactive row only (no tax, hold or operation key): a request with images
    stores them between the row and :func:`activate_request`.
    """
    if not active:
        req = dataclasses.replace(req, tax=0.0, operation_key=None, shared_key_amount=0.0)
        hold = 0.0
    args = (
        req.id,
        req.user_id,
        req.is_chat,
        req.prompt,
        req.params,
        req.models,
        req.max_length,
        req.n,
        req.kudos_estimate,
        req.messages,
        req.submitted_prompt,
        req.trusted_workers,
        req.validated_backends,
        req.slow_workers,
        req.worker_ids,
        req.worker_blacklist,
        req.shared_key_id,
        req.client_agent,
        req.ipaddr,
        req.operation_key,
        req.operation_fingerprint,
        req.context_adjustments,
        req.chat_extras,
        req.chat_required_features,
        req.chat_conformance,
        req.chat_tools_temperature,
        req.max_context_length,
        req.tax,
        float(req.ttl_seconds),
        req.flagged_user,
        hold,
        req.stream_progress,
        req.has_images,
        active,
        req.chat_messages_offloaded,
    )
    try:
        if _reserves(req, hold):
            async with conn.transaction():
                await reserve(conn, req, hold)
                created = await conn.fetchval(_INSERT_REQUEST, *args)
        else:
            # One statement is its own transaction: no BEGIN/COMMIT round trips, and the users row the tax
            # updates stays locked for one statement only (every request of a user queues on it).
            created = await conn.fetchval(_INSERT_REQUEST, *args)
    except asyncpg.UniqueViolationError as exc:
        if req.operation_key and "operation_key" in str(exc.constraint_name or exc):
            raise OperationKeyRace() from None
        raise
    if created is None:
        raise RuntimeError(f"user {req.user_id} vanished while creating a request")
    return uuid.UUID(str(created))


_ACTIVATE_REQUEST = """
WITH taxed AS (
    UPDATE users SET kudos = kudos - $3::float8 WHERE id = $2
    RETURNING kudos + $3::float8 AS kudos_before
), wp AS (
    UPDATE waiting_prompts w
    SET active = true, operation_key = $4::uuid, operation_fingerprint = $5, consumed_kudos = consumed_kudos + $3::float8,
        extra_priority = CASE WHEN $6::boolean
                              THEN (CASE WHEN t.kudos_before > 10 THEN round(t.kudos_before / 1000) ELSE -100 END)
                              ELSE round(t.kudos_before) END,
        expiry = greatest(w.expiry, now() + make_interval(secs => $7::float8))
    FROM taxed t
    WHERE w.id = $1 AND NOT w.active
    RETURNING w.id, w.shared_key_id
), hold AS (
    INSERT INTO kudos_holds (wp_id, user_id, shared_key_id, amount)
    SELECT wp.id, $2, wp.shared_key_id, $8::float8 FROM wp WHERE $8::float8 > 0
    RETURNING wp_id
), shared AS (
    UPDATE user_shared_keys k
    SET kudos = CASE WHEN k.kudos < 0 THEN k.kudos ELSE greatest(k.kudos - $3::float8, 0) END,
        utilized = k.utilized + $3::float8
    FROM wp WHERE k.id = wp.shared_key_id
    RETURNING k.id
)
SELECT (SELECT id FROM wp) AS id
"""


async def activate_request(conn: Conn, req: NewRequest, hold: float) -> None:
    """Activate an inactive request (:func:`create_request` with ``active=False``): hold, tax, priority and
    the operation key claim in one transaction. Raises :class:`HoldRefused` or :class:`OperationKeyRace`."""
    try:
        async with conn.transaction():
            await reserve(conn, req, hold)
            await conn.fetchval(
                _ACTIVATE_REQUEST,
                req.id,
                req.user_id,
                req.tax,
                req.operation_key,
                req.operation_fingerprint,
                req.flagged_user,
                float(req.ttl_seconds),
                hold,
            )
    except asyncpg.UniqueViolationError as exc:
        if req.operation_key and "operation_key" in str(exc.constraint_name or exc):
            raise OperationKeyRace() from None
        raise


async def delete_request(conn: Conn, request_id: uuid.UUID) -> None:
    """Delete a request row that failed before activation (its hold cascades)."""
    await conn.execute("DELETE FROM waiting_prompts WHERE id = $1", request_id)


# ---------------------------------------------------------------------------------------------------------
# Status and cancel
# ---------------------------------------------------------------------------------------------------------

_STATUS_HEAD = """
SELECT w.id, w.user_id, w.n, w.jobs, w.active, w.faulted, w.cancelled, w.consumed_kudos, w.models, w.max_length,
       w.max_context_length, w.chat_required_features, w.chat_tools_temperature, w.chat_extras,
       w.context_adjustments, w.chat_fault_reason, w.chat_fault_rc, w.created, w.extra_priority,
       w.trusted_workers, w.validated_backends, w.slow_workers, w.workers, w.worker_blacklist,
       w.has_images, w.max_length,
       coalesce(g.finished, 0) AS finished, coalesce(g.processing, 0) AS processing,
       coalesce(g.restarted, 0) AS restarted
FROM waiting_prompts w
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE NOT p.fake AND NOT p.faulted AND p.generation IS NOT NULL) AS finished,
           count(*) FILTER (WHERE NOT p.fake AND NOT p.faulted AND p.generation IS NULL) AS processing,
           count(*) FILTER (WHERE NOT p.fake AND p.faulted) AS restarted
    FROM processing_gens p WHERE p.wp_id = w.id
) g ON true
WHERE w.id = $1 AND w.is_chat = $2
"""

_GENERATIONS = """
SELECT p.id, p.worker_id, wk.name AS worker_name, p.model, p.state, p.generation, p.message, p.finish_reason,
       p.native_finish_reason, p.prompt_tokens, p.completion_tokens, p.reasoning_tokens, p.charge_basis,
       p.seed, p.gen_metadata, extract(epoch FROM p.created - w.created) AS queue_wait_seconds
FROM processing_gens p
JOIN waiting_prompts w ON w.id = p.wp_id
LEFT JOIN workers wk ON wk.id = p.worker_id
WHERE p.wp_id = $1 AND NOT p.fake AND NOT p.faulted AND p.generation IS NOT NULL
ORDER BY p.created
"""


async def read_status(
    conn: Conn, request_id: uuid.UUID, is_chat: bool
) -> tuple[asyncpg.Record, list[asyncpg.Record]] | None:
    """The request's head (counts, flags, fault details) in one statement, then its finished generations."""
    head = await conn.fetchrow(_STATUS_HEAD, request_id, is_chat)
    if head is None:
        return None
    gens = await conn.fetch(_GENERATIONS, request_id) if head["finished"] else []
    return head, gens


async def cancel_request(conn: Conn, request_id: uuid.UUID, is_chat: bool) -> bool | None:
    """Claim the cancellation: ``n = 0``, ``cancelled = true``. None when the row does not exist.

    Returns True when this call claimed it (the row was not cancelled yet). The upfront hold is released when
    nothing is in flight (a paused worker's fake generation does not count: it never took a job), since the
    request is then done.
    """
    async with conn.transaction():
        row = await conn.fetchrow(
            """
            WITH target AS (
                SELECT id, cancelled FROM waiting_prompts WHERE id = $1 AND is_chat = $2 FOR UPDATE
            ), upd AS (
                UPDATE waiting_prompts w SET n = 0, cancelled = true
                FROM target t WHERE w.id = t.id AND NOT t.cancelled
                RETURNING w.id
            )
            SELECT t.id, (SELECT count(*) FROM upd) > 0 AS claimed FROM target t
            """,
            request_id,
            is_chat,
        )
        if row is None:
            return None
        if row["claimed"]:
            await conn.execute(
                """
                DELETE FROM kudos_holds h WHERE h.wp_id = $1 AND NOT EXISTS (
                    SELECT 1 FROM processing_gens p
                    WHERE p.wp_id = $1 AND NOT p.faulted AND NOT p.fake AND p.generation IS NULL
                )
                """,
                request_id,
            )
        return bool(row["claimed"])


async def streamed_in_flight(conn: Conn, request_id: uuid.UUID) -> list[uuid.UUID]:
    """Ids of a streamed request's generations still in flight (not faulted, no result, not fake)."""
    rows = await conn.fetch(
        """
        SELECT p.id FROM processing_gens p JOIN waiting_prompts w ON w.id = p.wp_id
        WHERE p.wp_id = $1 AND NOT p.faulted AND p.generation IS NULL AND NOT p.fake
          AND w.stream_progress
        """,
        request_id,
    )
    return [r["id"] for r in rows]


async def count_results(conn: Conn, request_id: uuid.UUID) -> int:
    """Generations with a stored result (the completion signal's ``generations``)."""
    value = await conn.fetchval(
        """
        SELECT count(*) FROM processing_gens
        WHERE wp_id = $1 AND NOT faulted AND NOT fake AND generation IS NOT NULL
        """,
        request_id,
    )
    return int(value or 0)
