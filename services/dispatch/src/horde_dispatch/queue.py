"""The queue query: pick the first eligible waiting request for a worker and hand out its job(s).

See docs/native-api.md#eligibility (rules 1–4 in SQL), #tool-temperature-limit, #job-lease (speed gate,
the job_ttl from HORDE_TEXT_JOB_LEASE_SECONDS, lease cap), #impossible-reason (assignment snapshot); docs/native-api.md#pop (queue order
``extra_priority DESC, created ASC``, the owner's and priority users' requests first, filters, batch
``min(amount, n)``, a pop decrements n and refreshes the expiry).

One statement, so one implicit transaction: the candidate is locked ``FOR UPDATE SKIP LOCKED``, n is
decremented and the generations are inserted together, so two dispatch processes popping at once never
hand out one job twice (a row another pop decremented is re-checked against ``n > 0`` when it is locked).
Indexes: the plain page walks ``ix_waiting_prompts_queue`` (partial on active, n > 0, not faulted, in queue
order) when the worker's models are common in the queue, and otherwise BitmapOrs ``ix_waiting_prompts_models``
(GIN, ``models && ...``) with ``ix_waiting_prompts_queue_any_model`` (text requests for any model) and sorts
the few matches; the priority page reads ``ix_waiting_prompts_user_id``. A pop first tries the statement's head
variant (the first fitting request among the first queued ones, on connections that keep one generic plan:
:class:`HeadPool`), which hands out the same request when it finds one.

A paused worker (docs/native-api.md#workers) picks its request exactly as an unpaused one would. Its owner's
request is a real job; any other request gets one fake generation (``processing_gens.fake``), once per
request and worker: the request's n and expiry are left alone, so real workers still take it, and submit
neither pays nor delivers the reply; its fault (submitted or lapsed) is only marked: no restart, no worker
counter, no count toward the request's fault, and a pending fake holds no kudos hold (nothing real in flight).
On the wire a fake job is the real payload, so the worker cannot tell (upstream's countermeasure).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
from horde_contract import CHAT_REQUEST_EXPIRY_SECONDS, ChatImageTransport
from horde_store.db import Conn, create_pool

from .sql import Params

#: A request whose messages carry an image part (JSONB containment on chat rows; has_images is the
#: column admission sets, the containment covers a row written without it).
_IMAGE_PART = """'[{"content": [{"type": "image_url"}]}]'::jsonb"""

#: Slow-worker threshold in tokens/s for a request with slow_workers false (docs/native-api.md#pop: 5 for a model
#: below 13B or not in the reference, which dispatch does not load).
SLOW_WORKER_SPEED = 5.0


@dataclass(frozen=True, slots=True)
class PopWorker:
    """Everything the queue query reads about the popping worker (lengths in tokens, speed in tok/s).

    ``text_*`` are the stored text limits (the 30 s window keeps them), ``models`` the pop's models;
    the ``chat_*`` fields are the declaration of this pop. ``capacity`` is the speed gate's largest chat
    max_length. ``lease_cap`` and ``job_ttl`` are the job lease's cap and initial length, in seconds from the
    pop.
    """

    worker_id: uuid.UUID
    owner_id: int
    priority_user_ids: tuple[int, ...]
    models: tuple[str, ...]
    accepts_prompt_jobs: bool
    text_max_length: int
    text_max_context_length: int
    accepts_chat_jobs: bool
    chat_model_id: str | None
    chat_features: tuple[str, ...]
    chat_max_length: int | None
    chat_max_context_length: int | None
    chat_tools_max_temperature: float | None
    image_transports: tuple[str, ...]
    capacity: int
    trusted: bool
    validated: bool
    slow: bool
    maintenance: bool
    paused: bool
    amount: int
    lease_cap: int
    job_ttl: int

    @property
    def receives_images(self) -> bool:
        return any(t in (ChatImageTransport.url, ChatImageTransport.base64) for t in self.image_transports)

    @property
    def image_transport(self) -> str | None:
        """The transport a request with images is assigned: url when declared, else base64."""
        if ChatImageTransport.url in self.image_transports:
            return ChatImageTransport.url.value
        if ChatImageTransport.base64 in self.image_transports:
            return ChatImageTransport.base64.value
        return None

    @property
    def offload_transport(self) -> str | None:
        """messages_url when declared: an offloaded request then travels by URL."""
        return (
            ChatImageTransport.messages_url.value
            if ChatImageTransport.messages_url in self.image_transports
            else None
        )


@dataclass(slots=True)
class PoppedJob:
    """A job handed out: the request's stored fields and the generation ids created for it."""

    wp_id: uuid.UUID
    requester_id: int
    shared_key_id: uuid.UUID | None
    is_chat: bool
    prompt: str
    params: dict[str, Any]
    messages: list[dict[str, Any]] | None
    max_length: int
    max_context_length: int
    chat_extras: dict[str, Any] | None
    stream_progress: bool
    model: str
    image_transport: str | None
    created: datetime
    assigned: datetime
    over_capacity: bool
    generation_ids: list[uuid.UUID] = field(default_factory=list)
    #: A paused worker's decoy: its one generation is ``processing_gens.fake`` and the request kept its n.
    fake: bool = False


def _common_filters(p: Params, w: PopWorker) -> list[str]:
    """Rule 4 and the row state: active, jobs left, not faulted or cancelled, not expired, worker list,
    trusted, validated, slow workers, maintenance."""
    wid = p.add(w.worker_id, "uuid", "worker_id")
    filters = [
        "wp.active",
        "wp.n > 0",
        "NOT wp.faulted",
        "NOT wp.cancelled",
        "wp.expiry > now()",
        f"(cardinality(wp.workers) = 0 OR (wp.workers @> ARRAY[{wid}]) <> wp.worker_blacklist)",
    ]
    if not w.trusted:
        filters.append("NOT wp.trusted_workers")
    if not w.validated:
        filters.append("NOT wp.validated_backends")
    if w.slow:
        filters.append("wp.slow_workers")
    if w.maintenance:
        # A worker in maintenance serves only its owner's requests. A paused one is not filtered here: it
        # picks as any worker would, and the pop statement turns others' requests into fake jobs.
        filters.append(f"wp.user_id = {p.add(w.owner_id, 'bigint', 'owner_id')}")
    elif w.paused:
        # One decoy per request and paused worker: a fake job leaves the request queued, so without this the
        # worker would get the same request again at once, forever (a busy loop against the pop and submit
        # limits its neighbours share). Its owner's requests are real jobs and are never excluded.
        owner = p.add(w.owner_id, "bigint", "owner_id")
        filters.append(
            f"(wp.user_id = {owner} OR NOT EXISTS (SELECT 1 FROM processing_gens f "
            f"WHERE f.wp_id = wp.id AND f.worker_id = {wid} AND f.fake))"
        )
    return filters


def _model_filter(p: Params, w: PopWorker) -> str:
    """The models conjunct, in index-friendly form: ``models && ...`` reads the GIN index
    ix_waiting_prompts_models and ``cardinality(models) = 0`` the partial ix_waiting_prompts_queue_any_model
    (migration 0200), so a pop whose models are rare in the queue does not walk the whole queue."""
    if not w.accepts_prompt_jobs and w.chat_model_id is not None:
        return f"wp.models @> ARRAY[{p.add(w.chat_model_id, 'text', 'model_id')}]"
    models = p.add(list(w.models), "text[]", "models")
    return f"(wp.models && {models} OR cardinality(wp.models) = 0)"


def _kind_filter(p: Params, w: PopWorker) -> str:
    """Chat rows by the declaration (rules 1–3 and the speed gate), text rows by the text limits."""
    kinds: list[str] = []
    if w.accepts_chat_jobs and w.chat_model_id is not None:
        chat = [
            "wp.is_chat",
            f"wp.models @> ARRAY[{p.add(w.chat_model_id, 'text', 'model_id')}]",
            f"coalesce(wp.chat_required_features, '{{}}'::text[]) <@ {p.add(list(w.chat_features), 'text[]')}",
            f"wp.max_context_length <= {p.add(w.chat_max_context_length or 0, 'int')}",
            # Rule 3 and the speed gate in one bound: speed * 120 >= max_length.
            f"wp.max_length <= {p.add(min(w.chat_max_length or 0, w.capacity), 'int')}",
        ]
        if w.chat_tools_max_temperature is not None:
            chat.append(
                "(wp.chat_tools_temperature IS NULL OR wp.chat_tools_temperature <= "
                f"{p.add(w.chat_tools_max_temperature, 'float8')})"
            )
        if not w.receives_images:
            chat.append(f"NOT wp.has_images AND NOT coalesce(wp.messages @> {_IMAGE_PART}, false)")
        kinds.append("(" + " AND ".join(chat) + ")")
    if w.accepts_prompt_jobs:
        text = [
            "NOT wp.is_chat",
            f"(cardinality(wp.models) = 0 OR wp.models && {p.add(list(w.models), 'text[]', 'models')})",
            f"wp.max_length <= {p.add(w.text_max_length, 'int')}",
            f"wp.max_context_length <= {p.add(w.text_max_context_length, 'int')}",
        ]
        kinds.append("(" + " AND ".join(text) + ")")
    if not kinds:
        return "false"
    return "(" + " OR ".join(kinds) + ")"


def _fake_expression(p: Params, w: PopWorker) -> str:
    """Whether the picked row (``user_id`` in scope) is a fake job: only for a paused worker, on a request
    that is not its owner's. A constant ``false`` otherwise (an unpaused pop's statement has no decoy branch)."""
    if not w.paused:
        return "false"
    return f"(user_id <> {p.add(w.owner_id, 'bigint', 'owner_id')})"


#: The head variant reads at most this many requests at the front of the queue (queue order, any model) ...
HEAD_SCAN_ROWS = 256
#: ... and tries to lock the first this many of them that fit (more than the pops racing for one request).
HEAD_CANDIDATES = 16


def _head_page(filters: str, order: str, prio: str) -> str:
    """The head variant's page: the first HEAD_CANDIDATES of the first HEAD_SCAN_ROWS queued requests that pass
    ``filters``, read without a lock, then locked in queue order (``order``), each re-checked against
    ``filters`` when locked (a row another pop just decremented is skipped, as in the full statement). Nothing
    while a user of ``prio`` (the owner and the priority users) has a request queued: the full statement
    serves those first. That check reads ``ix_waiting_prompts_user_id`` in order and stops at the first row, so
    the generic plan cannot turn it into a scan of the queue however many requests one user queued."""
    return f"""
    SELECT wp.id, wp.n, wp.disable_batching, wp.user_id
    FROM (
        SELECT wp.id, wp.extra_priority, wp.created FROM (
            SELECT * FROM waiting_prompts wp WHERE wp.active AND wp.n > 0 AND NOT wp.faulted
            ORDER BY wp.extra_priority DESC, wp.created ASC LIMIT {HEAD_SCAN_ROWS}
        ) wp
        WHERE {filters}
        ORDER BY wp.extra_priority DESC, wp.created ASC
        LIMIT {HEAD_CANDIDATES}
    ) candidate JOIN waiting_prompts wp ON wp.id = candidate.id
    WHERE {filters}
      AND (SELECT mine.user_id FROM waiting_prompts mine
           WHERE mine.user_id = ANY({prio}) AND NOT mine.faulted AND mine.n > 0
           ORDER BY mine.user_id LIMIT 1) IS NULL
    {order}"""


def build_pop_statement(w: PopWorker, *, head: bool = False) -> tuple[str, list[Any]]:
    """The pop statement and its parameters (see the module docstring).

    ``head``: the variant for a worker whose requests stand at the front of the queue, the common case. It reads
    only the first HEAD_SCAN_ROWS requests in queue order, whatever their models, so one generic plan serves
    every pop (the full statement's best plan depends on how common the worker's models are in the queue, so
    PostgreSQL plans it on every pop: about 0.8 ms, two thirds of the pop's database time). It finds nothing
    when none of those fits, when every fitting one is locked by another pop, or when the worker's owner or a
    priority user has a request queued; the full statement is then the answer (:func:`pop_job`). When it finds
    a request, it is the one the full statement would have handed out.
    """
    p = Params()
    filters = " AND ".join([*_common_filters(p, w), _model_filter(p, w), _kind_filter(p, w)])
    prio = p.add(list(dict.fromkeys((w.owner_id, *w.priority_user_ids))), "bigint[]")
    amount = p.add(w.amount, "int")
    fake = _fake_expression(p, w)
    models = p.add(list(w.models), "text[]", "models")
    model_id = p.add(w.chat_model_id, "text", "model_id")
    offload = p.add(w.offload_transport, "text")
    images = p.add(w.image_transport, "text")
    worker_id = p.add(w.worker_id, "uuid", "worker_id")
    owner_id = p.add(w.owner_id, "bigint", "owner_id")
    lease_cap = p.add(w.lease_cap, "int")
    job_ttl = p.add(w.job_ttl, "int")
    chat_ctx = p.add(w.chat_max_context_length, "int")
    chat_len = p.add(w.chat_max_length, "int")
    capacity = p.add(w.capacity, "int")
    order = "ORDER BY wp.extra_priority DESC, wp.created ASC LIMIT 1 FOR UPDATE OF wp SKIP LOCKED"
    batch = (
        f"CASE WHEN {fake} OR disable_batching THEN 1 ELSE least({amount}, n) END AS batch, {fake} AS fake"
    )
    # What a job returns, whether the request was taken (UPDATE ... RETURNING) or only read for a fake job.
    job_columns = f"""wp.id, wp.user_id, wp.shared_key_id, wp.is_chat, wp.prompt, wp.params, wp.messages,
              wp.max_length, wp.max_context_length, wp.chat_extras, wp.stream_progress, wp.created, picked.batch,
              picked.fake,
              CASE WHEN wp.is_chat THEN {model_id}
                   ELSE coalesce(
                       (SELECT m FROM unnest(wp.models) AS m WHERE m = ANY({models}) ORDER BY random() LIMIT 1),
                       ({models})[1 + floor(random() * cardinality({models}))::int])
              END AS model,
              CASE WHEN NOT wp.is_chat THEN NULL
                   WHEN wp.chat_messages_offloaded AND {offload} IS NOT NULL THEN {offload}
                   WHEN wp.has_images OR coalesce(wp.messages @> {_IMAGE_PART}, false) THEN {images}
              END AS image_transport,
              -- Over capacity is not recorded for a fake job (docs/native-api.md#eligibility).
              (NOT picked.fake AND NOT wp.is_chat AND wp.max_length > {capacity}) AS over_capacity"""
    # A fake job reads the locked row and changes nothing on it: n and expiry stay for the real workers.
    decoy = (
        f"""
), decoy AS (
    SELECT {job_columns}
    FROM waiting_prompts wp JOIN picked ON picked.id = wp.id
    WHERE picked.fake"""
        if w.paused
        else ""
    )
    jobs = "SELECT * FROM taken UNION ALL SELECT * FROM decoy" if w.paused else "SELECT * FROM taken"
    if head:
        prio_page = (
            "\n    SELECT wp.id, wp.n, wp.disable_batching, wp.user_id FROM waiting_prompts wp WHERE false"
        )
        plain_page = _head_page(filters, order, prio)
    else:
        prio_page = f"""
    SELECT wp.id, wp.n, wp.disable_batching, wp.user_id FROM waiting_prompts wp
    WHERE {filters} AND wp.user_id = ANY({prio})
    {order}"""
        plain_page = f"""
    SELECT wp.id, wp.n, wp.disable_batching, wp.user_id FROM waiting_prompts wp
    WHERE {filters} AND NOT EXISTS (SELECT 1 FROM prio)
    {order}"""
    sql = f"""
WITH prio AS ({prio_page}
), plain AS ({plain_page}
), picked AS (
    SELECT id, {batch} FROM prio
    UNION ALL
    SELECT id, {batch} FROM plain
    LIMIT 1
), taken AS (
    UPDATE waiting_prompts wp
    SET n = wp.n - picked.batch,
        expiry = greatest(wp.expiry, now() + make_interval(secs => {CHAT_REQUEST_EXPIRY_SECONDS}))
    FROM picked
    WHERE wp.id = picked.id AND NOT picked.fake
    RETURNING {job_columns}{decoy}
), job AS (
    {jobs}
), gens AS (
    INSERT INTO processing_gens (
        wp_id, worker_id, user_id, model, job_ttl, lease_cap, assigned_model, assigned_max_context_length,
        assigned_max_length, image_transport, over_capacity_at_assignment, fake, created, started_at
    )
    SELECT t.id, {worker_id}, {owner_id}, t.model, {job_ttl}, {lease_cap},
           CASE WHEN t.is_chat THEN t.model END,
           CASE WHEN t.is_chat THEN {chat_ctx} END,
           CASE WHEN t.is_chat THEN {chat_len} END,
           t.image_transport, t.over_capacity, t.fake, now(), now()
    FROM job t CROSS JOIN generate_series(1, t.batch)
    RETURNING id
)
SELECT t.*, now() AS assigned, (SELECT array_agg(g.id) FROM gens g) AS generation_ids FROM job t
"""
    return sql, p.values


class HeadPool:
    """A few connections for the head variant of the pop statement (:func:`build_pop_statement`), whose
    sessions plan with ``plan_cache_mode=force_generic_plan``: the head variant's generic plan is its best plan,
    so PostgreSQL plans it once per connection instead of on every pop (its default ``auto`` mode keeps
    custom-planning it, about 0.8 ms of a pop's 1.2 ms in the database). The full statement's generic plan is a
    disaster (a BitmapOr and a sort of the queue on every pop), so it never runs here.

    ``size`` connections, kept open (no idle lifetime: an idle pool must not lose them); a pop never waits for
    one (:meth:`fetchrow` answers None when all are in use), since the variant only saves time.
    """

    def __init__(self, pool: asyncpg.Pool, size: int) -> None:
        self._pool = pool
        self._free = asyncio.Semaphore(size)

    @classmethod
    async def open(cls, dsn: str, size: int, statement_cache_size: int) -> HeadPool:
        """Open ``size`` connections on ``dsn``; raises what :func:`horde_store.db.create_pool` raises."""
        pool = await create_pool(
            dsn,
            min_size=size,
            max_size=size,
            statement_cache_size=statement_cache_size,
            max_inactive_connection_lifetime=0,
            server_settings={"plan_cache_mode": "force_generic_plan"},
        )
        return cls(pool, size)

    async def close(self) -> None:
        await self._pool.close()

    async def fetchrow(self, sql: str, values: list[Any]) -> asyncpg.Record | None:
        """The statement's first row; None when it has none, or without running it when every connection is
        in use."""
        if self._free.locked():
            return None
        async with self._free, self._pool.acquire() as conn:
            return await conn.fetchrow(sql, *values)


async def pop_job(conn: Conn, w: PopWorker, head: HeadPool | None = None) -> PoppedJob | None:
    """Hand the worker the first eligible request's job(s), or None when nothing fits: the head variant on
    ``head`` when it is given and has a free connection, then, when that finds nothing, the full statement on
    ``conn`` (:func:`build_pop_statement`). Each is one statement."""
    row = None
    if head is not None:
        sql, values = build_pop_statement(w, head=True)
        row = await head.fetchrow(sql, values)
    if row is None:
        sql, values = build_pop_statement(w)
        row = await conn.fetchrow(sql, *values)
    if row is None:
        return None
    return PoppedJob(
        wp_id=row["id"],
        requester_id=row["user_id"],
        shared_key_id=row["shared_key_id"],
        is_chat=row["is_chat"],
        prompt=row["prompt"],
        params=dict(row["params"] or {}),
        messages=row["messages"],
        max_length=row["max_length"],
        max_context_length=row["max_context_length"],
        chat_extras=row["chat_extras"],
        stream_progress=bool(row["stream_progress"]),
        model=row["model"],
        image_transport=row["image_transport"],
        created=row["created"],
        assigned=row["assigned"],
        over_capacity=bool(row["over_capacity"]),
        generation_ids=list(row["generation_ids"] or []),
        fake=bool(row["fake"]),
    )


# --- skipped: why the queue's other requests were not offered (an empty pop only) ---------------------------


def build_skipped_statement(w: PopWorker, limit: int) -> tuple[str, list[Any]]:
    """Count, by first refusal reason, the first ``limit`` queued requests that list the worker's models.

    Reasons: worker_id, untrusted, bridge_version, performance, then for chat rows the missing chat
    declaration values (chat_features, image_transports), max_context_length, max_length,
    tools_max_temperature, lease_speed; for text rows prompt_jobs, max_context_length, max_length. A
    requests another worker holds, or one this worker could take, has no reason and is not counted.
    """
    p = Params()
    wid = p.add(w.worker_id, "uuid")
    models = p.add(list(w.models), "text[]")
    chat_ok = w.accepts_chat_jobs and w.chat_model_id is not None
    # The pop's models include the chat model_id, so one index-friendly conjunct narrows both kinds.
    model_match = [f"(NOT wp.is_chat AND (cardinality(wp.models) = 0 OR wp.models && {models}))"]
    if chat_ok:
        model_match.append(f"(wp.is_chat AND wp.models @> ARRAY[{p.add(w.chat_model_id, 'text')}])")
    chat_cases = ""
    if chat_ok:
        tools_max = p.add(w.chat_tools_max_temperature, "float8")
        receives = "true" if w.receives_images else "false"
        chat_cases = f"""
            WHEN wp.is_chat AND NOT coalesce(wp.chat_required_features, '{{}}'::text[])
                 <@ {p.add(list(w.chat_features), "text[]")} THEN 'chat_features'
            WHEN wp.is_chat AND NOT {receives}
                 AND (wp.has_images OR coalesce(wp.messages @> {_IMAGE_PART}, false)) THEN 'image_transports'
            WHEN wp.is_chat AND wp.max_context_length > {p.add(w.chat_max_context_length or 0, "int")}
                 THEN 'max_context_length'
            WHEN wp.is_chat AND wp.max_length > {p.add(w.chat_max_length or 0, "int")} THEN 'max_length'
            WHEN wp.is_chat AND {tools_max} IS NOT NULL AND wp.chat_tools_temperature > {tools_max}
                 THEN 'tools_max_temperature'
            WHEN wp.is_chat AND wp.max_length > {p.add(w.capacity, "int")} THEN 'lease_speed'"""
    prompt_case = "" if w.accepts_prompt_jobs else "WHEN NOT wp.is_chat THEN 'prompt_jobs'"
    sql = f"""
SELECT reason, count(*)::int AS n FROM (
    SELECT CASE
        WHEN NOT (cardinality(wp.workers) = 0 OR (wp.workers @> ARRAY[{wid}]) <> wp.worker_blacklist) THEN 'worker_id'
        WHEN wp.trusted_workers AND NOT {"true" if w.trusted else "false"} THEN 'untrusted'
        WHEN wp.validated_backends AND NOT {"true" if w.validated else "false"} THEN 'bridge_version'
        WHEN NOT wp.slow_workers AND {"true" if w.slow else "false"} THEN 'performance'
        {chat_cases}
        {prompt_case}
        WHEN NOT wp.is_chat AND wp.max_context_length > {p.add(w.text_max_context_length, "int")}
             THEN 'max_context_length'
        WHEN NOT wp.is_chat AND wp.max_length > {p.add(w.text_max_length, "int")} THEN 'max_length'
    END AS reason
    FROM (
        SELECT wp.* FROM waiting_prompts wp
        WHERE wp.active AND wp.n > 0 AND NOT wp.faulted AND NOT wp.cancelled AND wp.expiry > now()
          AND (wp.models && {models} OR cardinality(wp.models) = 0)
          AND ({" OR ".join(model_match)})
        ORDER BY wp.extra_priority DESC, wp.created ASC
        LIMIT {p.add(limit, "int")}
    ) wp
) r
WHERE reason IS NOT NULL
GROUP BY reason
"""
    return sql, p.values


async def count_skipped(conn: Conn, w: PopWorker, limit: int) -> dict[str, int]:
    """``skipped`` of an empty pop: ``{reason: count}`` (see :func:`build_skipped_statement`)."""
    if limit <= 0:
        return {}
    sql, values = build_skipped_statement(w, limit)
    rows = await conn.fetch(sql, *values)
    return {r["reason"]: r["n"] for r in rows}
