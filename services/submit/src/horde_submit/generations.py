"""SQL of the submit stage: read a generation's context, claim it, settle it, record refusals and faults.

Every function takes an asyncpg connection; the caller owns transactions. Statements are few and wide (one
CTE where it can): round trips, not statement cost, bound submit's throughput (bench/RESULTS.md).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from horde_contract.errors import RC
from horde_contract.limits import (
    CHAT_REQUEST_EXPIRY_SECONDS,
    FAULTED_GENERATIONS_LIMIT,
    MAX_CHAT_FAULT_REASON_LENGTH,
)
from horde_store.db import Conn

#: ``log_aborted_job``: more aborted jobs than this within an hour put the worker into maintenance.
DROPPED_JOB_THRESHOLD = 20
DROPPED_JOB_WINDOW_SECONDS = 3600
DROPPED_JOBS_MAINTENANCE_MESSAGE = (
    "This worker has been put into maintenance mode because it dropped too many jobs within an hour."
)
NONCONFORMANT_RC = RC.ChatSubmitNonconformant.value


def parse_uuid(value: Any) -> uuid.UUID | None:
    """The UUID in ``value``, or None when it is not one (an id that cannot exist)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True, slots=True)
class GenerationContext:
    """What the submit route needs about one generation, its worker, the worker's owner and its request."""

    id: uuid.UUID
    wp_id: uuid.UUID
    worker_id: uuid.UUID
    model: str | None
    assigned_model: str | None
    submitted: bool
    faulted: bool
    fake: bool
    job_ttl: int
    elapsed_seconds: float
    chat_refusal_rc: str | None
    over_capacity: bool
    owner_id: int
    owner_trusted: bool
    owner_key_hash: str | None
    worker_name: str
    bridge_agent: str | None
    requester_id: int
    is_chat: bool
    chat_extras: dict[str, Any] | None
    chat_conformance: str
    streamed: bool
    max_length: int
    max_context_length: int
    prompt_characters: int
    request_cancelled: bool
    jobs: int
    request_expired: bool = False

    @property
    def pending(self) -> bool:
        """Neither stored nor faulted: the only state a reply can claim."""
        return not self.submitted and not self.faulted

    @property
    def cancel_settles(self) -> bool:
        """A pending, real generation of a cancelled request that streams progress.

        The cancel settles such a generation on the content its worker posted and faults it as cancelled (see
        docs/native-api.md#pricing, #progress); when the cancel's settlement call did not get through, whichever
        of the worker's submit, its fault, the lapse of its lease or the janitor's sweep reaches it first
        settles it the same way, so the worker is paid for what it posted and never counted as having dropped
        the job.
        """
        return self.pending and self.request_cancelled and self.streamed and not self.fake

    @property
    def aborted(self) -> bool:
        """A reply to this generation is refused with AbortedGen (docs/native-api.md#submit, #job-lease):
        it is faulted (its lease lapsed, the worker faulted it, or the cancel settled it), or it is still
        pending but its request is past its expiry (the pop refreshes the expiry to 20 minutes ahead and a
        lease lasts at most 600 s, so such a lease lapsed long ago)."""
        return self.faulted or (self.pending and self.request_expired)

    @property
    def served_model(self) -> str | None:
        """The model the generation is charged at: the assigned chat model, else the popped model."""
        return self.assigned_model or self.model


_CONTEXT_SQL = """
SELECT g.id, g.wp_id, g.worker_id, g.model, g.assigned_model,
       g.generation IS NOT NULL AS submitted, g.faulted, g.fake, g.job_ttl,
       extract(epoch FROM clock_timestamp() - g.started_at)::float8 AS elapsed_seconds,
       g.chat_refusal_rc, g.over_capacity_at_assignment,
       w.user_id AS owner_id, COALESCE(o.trusted, false) AS owner_trusted, o.api_key_hash AS owner_key_hash,
       w.name AS worker_name,
       w.bridge_agent,
       wp.user_id AS requester_id, wp.is_chat, wp.chat_extras, wp.chat_conformance, wp.stream_progress,
       wp.max_length, wp.max_context_length, length(wp.prompt) AS prompt_characters, wp.jobs,
       wp.cancelled AS request_cancelled, wp.expiry <= now() AS request_expired
  FROM processing_gens g
  JOIN waiting_prompts wp ON wp.id = g.wp_id
  JOIN workers w ON w.id = g.worker_id
  LEFT JOIN users o ON o.id = w.user_id
 WHERE g.id = $1
"""


async def load_context(conn: Conn, generation_id: uuid.UUID) -> GenerationContext | None:
    """The generation's context, or None when no such generation is stored (expired, or never popped)."""
    row = await conn.fetchrow(_CONTEXT_SQL, generation_id)
    if row is None:
        return None
    extras = row["chat_extras"]
    if isinstance(extras, str):
        extras = json.loads(extras)
    return GenerationContext(
        id=row["id"],
        wp_id=row["wp_id"],
        worker_id=row["worker_id"],
        model=row["model"],
        assigned_model=row["assigned_model"],
        submitted=row["submitted"],
        faulted=row["faulted"],
        fake=row["fake"],
        job_ttl=int(row["job_ttl"] or 0),
        elapsed_seconds=float(row["elapsed_seconds"] or 0.0),
        chat_refusal_rc=row["chat_refusal_rc"],
        over_capacity=bool(row["over_capacity_at_assignment"]),
        owner_id=row["owner_id"],
        owner_trusted=row["owner_trusted"],
        owner_key_hash=row["owner_key_hash"],
        worker_name=row["worker_name"],
        bridge_agent=row["bridge_agent"],
        requester_id=row["requester_id"],
        is_chat=row["is_chat"],
        chat_extras=extras,
        chat_conformance=row["chat_conformance"] or "strict",
        streamed=bool(row["stream_progress"]),
        max_length=row["max_length"],
        max_context_length=row["max_context_length"],
        prompt_characters=row["prompt_characters"],
        request_cancelled=bool(row["request_cancelled"]),
        jobs=int(row["jobs"]),
        request_expired=bool(row["request_expired"]),
    )


# --- Refusal and worker-fault records (each in its own commit) -----------------------------------------

# A fake generation's refusal is kept on the generation only: a paused worker writes nothing on another user's
# request (docs/native-api.md#workers).
_RECORD_REFUSAL_SQL = """
WITH g AS (
    UPDATE processing_gens SET chat_refusal_rc = $2
     WHERE id = $1 AND generation IS NULL AND NOT faulted
    RETURNING wp_id, fake
), wp AS (
    UPDATE waiting_prompts wp SET chat_fault_reason = $3, chat_fault_rc = $2
      FROM g WHERE wp.id = g.wp_id AND NOT g.fake
    RETURNING wp.id
)
SELECT wp_id FROM g
"""


async def record_chat_refusal(conn: Conn, generation_id: uuid.UUID, rc: str, message: str) -> bool:
    """Store a refused reply (docs/native-api.md#refusal-record): the request's chat_fault_reason
    (cut to 1000 characters) and chat_fault_rc, and the generation's chat_refusal_rc, in one statement that
    writes only while the generation is pending (a fake generation's only on the generation). True when it
    wrote."""
    row = await conn.fetchrow(_RECORD_REFUSAL_SQL, generation_id, rc, message[:MAX_CHAT_FAULT_REASON_LENGTH])
    return row is not None


_RECORD_WORKER_FAULT_SQL = """
UPDATE waiting_prompts wp SET chat_fault_reason = $2, chat_fault_rc = $3
  FROM processing_gens g
 WHERE g.id = $1 AND wp.id = g.wp_id
   AND g.generation IS NULL AND NOT g.faulted AND g.chat_refusal_rc IS NULL AND NOT g.fake
RETURNING wp.id
"""


async def record_chat_worker_fault(conn: Conn, generation_id: uuid.UUID, message: str, rc: str) -> bool:
    """Store a worker's known fault reason on the request (docs/native-api.md#worker-fault-reasons), only while the
    generation is pending, not a fake one, and no refusal of its reply was stored. True when it wrote."""
    row = await conn.fetchrow(
        _RECORD_WORKER_FAULT_SQL, generation_id, message[:MAX_CHAT_FAULT_REASON_LENGTH], rc
    )
    return row is not None


# --- Claim and settlement --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    """The columns the compare-and-set writes, all in one statement (docs/native-api.md#submit)."""

    generation: str
    message: dict[str, Any] | None
    finish_reason: str | None
    native_finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    charge_basis: str | None
    censored: bool
    state: str
    seed: int | None
    gen_metadata: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class Settlement:
    """The money of one stored generation.

    ``reward`` goes to the worker and, split by :func:`horde_submit.pricing.escrow_split`, to its owner
    (``owner_kudos`` spendable, ``owner_escrow`` into evaluating_kudos); ``charge`` is taken from the requester
    and added to the request's consumed_kudos; ``contribution_tokens`` is the charged token count and
    ``speed`` the worker speed sample.
    """

    reward: float
    owner_kudos: float
    owner_escrow: float
    charge: float
    contribution_tokens: int
    speed: float


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The outcome of :func:`claim_and_settle`: whether the claim won, and whether the request completed."""

    claimed: bool
    request_done: bool = False
    generations: int = 0


def _paid_ctes(source: str, *, owner: str, requester: str, owner_kudos: str, charge: str, escrow: str) -> str:
    """The ``locked``, ``paid`` and ``keyed`` CTEs of a settling statement, skipped for a fake generation.

    ``source`` names the CTE holding the settled generation (its ``wp_id`` and ``fake``); the others are the
    statement's parameters (``$N``): the worker owner's and the requester's user ids, the owner's kudos and
    escrow (evaluating kudos) and the requester's charge. The two user rows are locked in id order, the owner
    paid and the requester charged; a request sent with a shared key spends it as well: the key is debited the
    charge, floored at 0, and counts it as utilized; an unlimited key (-1) stays unlimited.
    """
    return f"""locked AS (
    SELECT u.id FROM users u, {source}
     WHERE u.id IN ({owner}, {requester}) AND NOT {source}.fake
     ORDER BY u.id FOR UPDATE OF u
), paid AS (
    UPDATE users u
       SET kudos = u.kudos + CASE WHEN u.id = {owner} THEN {owner_kudos}::float8 ELSE 0 END
                           - CASE WHEN u.id = {requester} THEN {charge}::float8 ELSE 0 END,
           evaluating_kudos = u.evaluating_kudos + CASE WHEN u.id = {owner} THEN {escrow}::float8 ELSE 0 END
      FROM locked WHERE u.id = locked.id
    RETURNING u.id
), keyed AS (
    UPDATE user_shared_keys k
       SET kudos = CASE WHEN k.kudos < 0 THEN k.kudos ELSE greatest(k.kudos - {charge}::float8, 0) END,
           utilized = k.utilized + {charge}::float8
      FROM {source}, waiting_prompts r
     WHERE r.id = {source}.wp_id AND k.id = r.shared_key_id AND NOT {source}.fake
    RETURNING k.id
)"""


_CLAIM_SQL = (
    """
WITH claim AS (
    UPDATE processing_gens g
       SET generation = $2, message = $3::jsonb, finish_reason = $4, native_finish_reason = $5,
           prompt_tokens = $6, completion_tokens = $7, reasoning_tokens = $8, charge_basis = $9,
           censored = $10, state = $22, seed = $11, gen_metadata = $12::jsonb, kudos = $13::float8,
           cancelled = false, completed_at = now()
     WHERE g.id = $1 AND g.generation IS NULL AND NOT g.faulted
       -- Not a reply to an aborted generation (GenerationContext.aborted, .cancel_settles): its request is
       -- not past its expiry, and a streamed request's cancel settles its generations instead.
       AND EXISTS (SELECT 1 FROM waiting_prompts r
                    WHERE r.id = g.wp_id AND r.expiry > now()
                      AND NOT (r.cancelled AND r.stream_progress AND NOT g.fake))
    RETURNING g.id, g.wp_id, g.worker_id, g.fake
), wp AS (
    UPDATE waiting_prompts w
       SET consumed_kudos = w.consumed_kudos + $14,
           expiry = greatest(w.expiry, now() + make_interval(secs => $20))
      FROM claim WHERE w.id = claim.wp_id AND NOT claim.fake
    RETURNING w.id
), recent AS (
    -- The newest 19 samples: with this one, workers.speed is the mean of the newest 20 (docs/native-api.md#kudos).
    SELECT p.performance FROM worker_performances p, claim
     WHERE p.worker_id = claim.worker_id AND NOT claim.fake
     ORDER BY p.created DESC LIMIT 19
), worker AS (
    UPDATE workers w
       SET kudos = w.kudos + $13, contributions = w.contributions + $15, fulfilments = w.fulfilments + 1,
           speed = ((SELECT COALESCE(sum(performance), 0) FROM recent) + $16::float8)
                   / ((SELECT count(*) FROM recent) + 1)
      FROM claim WHERE w.id = claim.worker_id AND NOT claim.fake
    RETURNING w.id
), perf AS (
    INSERT INTO worker_performances (worker_id, performance)
    SELECT worker_id, $16::float8 FROM claim WHERE NOT claim.fake
    RETURNING 1
), model_perf AS (
    INSERT INTO model_performances (model, performance)
    SELECT $23, $16::float8 FROM claim WHERE NOT claim.fake
    RETURNING 1
), """
    + _paid_ctes("claim", owner="$17", requester="$18", owner_kudos="$19", charge="$14", escrow="$21")
    + """, state AS (
    -- Only for a single-job request ($24): its completion read from this statement's snapshot is exact,
    -- since no other generation of it can be pending (see claim_and_settle).
    SELECT w.n, w.jobs, w.cancelled,
           1 + (SELECT count(*) FROM processing_gens o
                 WHERE o.wp_id = w.id AND o.id <> $1
                   AND o.generation IS NOT NULL AND NOT o.faulted AND NOT o.fake) AS finished,
           (SELECT count(*) FROM processing_gens o
             WHERE o.wp_id = w.id AND o.id <> $1
               AND o.generation IS NULL AND NOT o.faulted AND NOT o.fake) AS processing
      FROM waiting_prompts w, claim WHERE w.id = claim.wp_id AND NOT claim.fake AND $24
), done AS (
    SELECT (n <= 0 AND processing = 0 AND (finished >= jobs OR cancelled)) AS done, finished FROM state
), held AS (
    UPDATE kudos_holds h SET amount = greatest(h.amount - $14, 0)
      FROM claim
     WHERE h.wp_id = claim.wp_id AND NOT claim.fake AND NOT COALESCE((SELECT done FROM done), false)
    RETURNING h.wp_id
), released AS (
    DELETE FROM kudos_holds h USING claim
     WHERE h.wp_id = claim.wp_id AND COALESCE((SELECT done FROM done), false)
    RETURNING h.wp_id
)
SELECT (SELECT count(*) FROM claim) AS claimed,
       (SELECT bool_or(fake) FROM claim) AS fake,
       (SELECT done FROM done) AS done,
       (SELECT finished FROM done) AS finished,
       (SELECT count(*) FROM wp) + (SELECT count(*) FROM worker) + (SELECT count(*) FROM perf)
     + (SELECT count(*) FROM paid) + (SELECT count(*) FROM held) + (SELECT count(*) FROM released)
     + (SELECT count(*) FROM keyed) AS touched
"""
)

# A fresh statement (and so a fresh snapshot) after the claim: a concurrent submit of the same request waits
# on the request row the claim statement updated, so this count sees every committed result.
_COMPLETION_SQL = """
WITH state AS (
    SELECT wp.id, wp.n, wp.jobs, wp.faulted, wp.cancelled,
           count(g.id) FILTER (WHERE g.generation IS NOT NULL AND NOT g.faulted AND NOT g.fake) AS finished,
           count(g.id) FILTER (WHERE g.generation IS NULL AND NOT g.faulted AND NOT g.fake) AS processing
      FROM waiting_prompts wp LEFT JOIN processing_gens g ON g.wp_id = wp.id
     WHERE wp.id = $1
     GROUP BY wp.id
), released AS (
    DELETE FROM kudos_holds h USING state s
     WHERE h.wp_id = s.id AND s.n <= 0 AND s.processing = 0 AND (s.finished >= s.jobs OR s.cancelled)
    RETURNING h.wp_id
)
SELECT finished, (n <= 0 AND processing = 0 AND (finished >= jobs OR cancelled)) AS done,
       (SELECT count(*) FROM released) AS released
  FROM state
"""


async def claim_and_settle(
    conn: Conn,
    ctx: GenerationContext,
    claim: Claim,
    settlement: Settlement,
    *,
    single: bool = False,
) -> ClaimResult:
    """Compare-and-set the pending generation and settle it.

    One statement claims the generation (``generation IS NULL AND NOT faulted``, its request not past its
    expiry and, for a streamed request, not cancelled: see :attr:`GenerationContext.aborted` and
    :attr:`GenerationContext.cancel_settles`) writing every reply column, pays the worker and its owner,
    charges the requester kudos+1 (and the shared key the request was sent with, floored at 0), adds it to
    consumed_kudos, consumes the request's kudos hold, refreshes the
    request's expiry and records the speed sample (worker_performances, model_performances, and workers.speed
    as the mean of the newest 20 samples); a second statement reads whether the request completed (and
    releases its hold when it did). A fake generation is stored but neither paid nor charged. Returns
    ``claimed=False`` when the generation was no longer pending, or its reply is one to an aborted generation.

    A single-job request (every chat request: n is only 1) has no other pending generation, so the claim
    statement itself decides completion from its snapshot and the whole settlement is one autocommitted
    statement (``single=True``; run it outside a transaction). A request with several jobs needs the second
    statement, after the claim locked the request row, inside the caller's transaction.
    """
    row = await conn.fetchrow(
        _CLAIM_SQL,
        ctx.id,
        claim.generation,
        claim.message,
        claim.finish_reason,
        claim.native_finish_reason,
        claim.prompt_tokens,
        claim.completion_tokens,
        claim.reasoning_tokens,
        claim.charge_basis,
        claim.censored,
        claim.seed,
        claim.gen_metadata,
        settlement.reward,
        settlement.charge,
        settlement.contribution_tokens,
        settlement.speed,
        ctx.owner_id,
        ctx.requester_id,
        settlement.owner_kudos,
        float(CHAT_REQUEST_EXPIRY_SECONDS),
        settlement.owner_escrow,
        claim.state,
        ctx.served_model or "",
        single,
    )
    if row is None or not row["claimed"]:
        return ClaimResult(claimed=False)
    if row["fake"]:
        return ClaimResult(claimed=True)
    if single:
        return ClaimResult(
            claimed=True, request_done=bool(row["done"]), generations=int(row["finished"] or 0)
        )
    done = await conn.fetchrow(_COMPLETION_SQL, ctx.wp_id)
    if done is None:
        return ClaimResult(claimed=True)
    return ClaimResult(claimed=True, request_done=bool(done["done"]), generations=int(done["finished"]))


# --- Faults ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FaultResult:
    """The outcome of :func:`fault_and_restart`."""

    faulted: bool
    request_faulted: bool = False
    wp_id: uuid.UUID | None = None
    is_chat: bool = False
    streamed: bool = False
    over_capacity: bool = False
    max_length: int = 0
    worker_trusted: bool = False
    generations: int = 0
    fault_reason: str | None = None
    fault_rc: str | None = None
    #: The job went back to the queue (``n += 1``: the request was neither cancelled nor faulted, the
    #: generation not a fake one, and this fault did not fault the request); its request's models and
    #: context length (tokens) go into the queue announcement.
    restarted: bool = False
    models: tuple[str, ...] = ()
    max_context_length: int = 0


_FAULT_SQL = """
WITH g AS (
    UPDATE processing_gens SET faulted = true
     WHERE id = $1 AND generation IS NULL AND NOT faulted
    RETURNING id, wp_id, worker_id, fake, chat_refusal_rc, over_capacity_at_assignment
), wp AS (
    UPDATE waiting_prompts w
       SET n = w.n + CASE WHEN w.cancelled OR w.faulted OR g.fake THEN 0 ELSE 1 END
      FROM g WHERE w.id = g.wp_id
    RETURNING w.id, w.is_chat, w.stream_progress, w.max_length, w.models, w.max_context_length,
              NOT (w.cancelled OR w.faulted OR g.fake) AS restarted
), worker AS (
    UPDATE workers w
       SET nonconformant_replies = w.nonconformant_replies
               + CASE WHEN g.chat_refusal_rc = $2 THEN 1 ELSE 0 END,
           uncompleted_jobs = w.uncompleted_jobs + CASE WHEN g.chat_refusal_rc = $2 THEN 0 ELSE 1 END,
           aborted_jobs = CASE
               WHEN g.chat_refusal_rc = $2 THEN w.aborted_jobs
               WHEN w.last_aborted_job IS NULL OR w.last_aborted_job < now() - make_interval(secs => $3)
                   THEN 1
               WHEN w.aborted_jobs + 1 > $4 THEN 0
               ELSE w.aborted_jobs + 1 END,
           last_aborted_job = CASE
               WHEN g.chat_refusal_rc = $2 THEN w.last_aborted_job
               WHEN w.last_aborted_job IS NULL OR w.last_aborted_job < now() - make_interval(secs => $3)
                   THEN now()
               ELSE w.last_aborted_job END,
           maintenance = w.maintenance OR (
               g.chat_refusal_rc IS DISTINCT FROM $2
               AND w.last_aborted_job >= now() - make_interval(secs => $3)
               AND w.aborted_jobs + 1 > $4),
           maintenance_msg = CASE
               WHEN g.chat_refusal_rc IS DISTINCT FROM $2
                AND w.last_aborted_job >= now() - make_interval(secs => $3)
                AND w.aborted_jobs + 1 > $4 THEN $5
               ELSE w.maintenance_msg END
      FROM g WHERE w.id = g.worker_id AND NOT g.fake
    RETURNING w.user_id
)
SELECT g.wp_id, g.fake, g.over_capacity_at_assignment, wp.is_chat, wp.stream_progress, wp.max_length,
       wp.models, wp.max_context_length, wp.restarted, COALESCE(u.trusted, false) AS worker_trusted
  FROM g JOIN wp ON wp.id = g.wp_id
  LEFT JOIN worker ON true
  LEFT JOIN users u ON u.id = worker.user_id
"""

# Fresh snapshot after the fault: faults the request once more than FAULTED_GENERATIONS_LIMIT of its real
# generations faulted. A paused worker's fake generations never count (upstream counts them, which lets a paused
# worker fault anyone's request), nor does the fault of a fake run this statement. Concurrent faults of one
# request serialize on the request row the fault statement updated.
_FAULT_REQUEST_SQL = """
WITH counts AS (
    SELECT count(*) FILTER (WHERE faulted AND NOT fake) AS faulted_gens,
           count(*) FILTER (WHERE generation IS NOT NULL AND NOT faulted AND NOT fake) AS finished
      FROM processing_gens WHERE wp_id = $1
), flip AS (
    UPDATE waiting_prompts w SET faulted = true
      FROM counts WHERE w.id = $1 AND NOT w.faulted AND counts.faulted_gens > $2
    RETURNING w.id, w.chat_fault_reason, w.chat_fault_rc
)
SELECT (SELECT count(*) FROM flip) > 0 AS request_faulted,
       (SELECT chat_fault_reason FROM flip) AS fault_reason,
       (SELECT chat_fault_rc FROM flip) AS fault_rc,
       (SELECT finished FROM counts) AS finished
"""


async def fault_and_restart(conn: Conn, generation_id: uuid.UUID) -> FaultResult:
    """Fault a pending generation and restart its job (``n += 1``) unless its request was cancelled or
    faulted, update the worker's counters, and fault the request past FAULTED_GENERATIONS_LIMIT; all inside the
    caller's transaction, so the fault and the restart commit together.

    A fake generation (a paused worker's, docs/native-api.md#workers) is only marked faulted, whether its worker
    submitted the fault or its lease lapsed: it never took a job from n, so nothing is restarted, no worker
    counter moves, and it counts toward no request fault.

    Worker counters (docs/native-api.md#refusal-record): a generation whose reply was refused as
    ChatSubmitNonconformant increments nonconformant_replies; any other increments aborted_jobs (the hourly
    window of ``log_aborted_job``, which puts the worker into maintenance past 20) and uncompleted_jobs.
    Returns ``faulted=False`` when the generation was not pending.
    """
    row = await conn.fetchrow(
        _FAULT_SQL,
        generation_id,
        NONCONFORMANT_RC,
        float(DROPPED_JOB_WINDOW_SECONDS),
        DROPPED_JOB_THRESHOLD,
        DROPPED_JOBS_MAINTENANCE_MESSAGE,
    )
    if row is None:
        return FaultResult(faulted=False)
    if row["fake"]:
        return FaultResult(
            faulted=True,
            wp_id=row["wp_id"],
            is_chat=bool(row["is_chat"]),
            max_length=int(row["max_length"] or 0),
            worker_trusted=bool(row["worker_trusted"]),
        )
    after = await conn.fetchrow(_FAULT_REQUEST_SQL, row["wp_id"], FAULTED_GENERATIONS_LIMIT)
    assert after is not None
    return FaultResult(
        faulted=True,
        request_faulted=bool(after["request_faulted"]),
        wp_id=row["wp_id"],
        is_chat=bool(row["is_chat"]),
        streamed=bool(row["stream_progress"]) and not row["fake"],
        over_capacity=bool(row["over_capacity_at_assignment"]) and not row["fake"],
        max_length=int(row["max_length"] or 0),
        worker_trusted=bool(row["worker_trusted"]),
        generations=int(after["finished"] or 0),
        fault_reason=after["fault_reason"],
        fault_rc=after["fault_rc"],
        restarted=bool(row["restarted"]) and not bool(after["request_faulted"]),
        models=tuple(row["models"] or ()),
        max_context_length=int(row["max_context_length"] or 0),
    )


# --- Cancelled streamed generations ----------------------------------------------------------------------

_SETTLE_CANCELLED_SQL = (
    """
WITH g AS (
    UPDATE processing_gens
       SET faulted = true, cancelled = true, kudos = $2::float8, settled_character_count = $3,
           completed_at = now()
     WHERE id = $1 AND generation IS NULL AND NOT faulted
    RETURNING id, wp_id, worker_id, fake
), wp AS (
    UPDATE waiting_prompts w SET consumed_kudos = w.consumed_kudos + $4::float8
      FROM g WHERE w.id = g.wp_id AND NOT g.fake
    RETURNING w.id
), worker AS (
    UPDATE workers w SET kudos = w.kudos + $2::float8, contributions = w.contributions + $5
      FROM g WHERE w.id = g.worker_id AND NOT g.fake
    RETURNING w.id
), """
    + _paid_ctes("g", owner="$6", requester="$7", owner_kudos="$8", charge="$4", escrow="$9")
    + """, held AS (
    UPDATE kudos_holds h SET amount = greatest(h.amount - $4::float8, 0)
      FROM g WHERE h.wp_id = g.wp_id AND NOT g.fake
    RETURNING h.wp_id
)
SELECT (SELECT count(*) FROM g) AS settled,
       (SELECT count(*) FROM wp) + (SELECT count(*) FROM worker) + (SELECT count(*) FROM paid)
     + (SELECT count(*) FROM held) + (SELECT count(*) FROM keyed) AS touched
"""
)


async def settle_cancelled(
    conn: Conn, ctx: GenerationContext, characters: int, settlement: Settlement
) -> bool:
    """Settle a streamed generation still in flight at a cancel on the ``characters`` its worker posted, inside
    the caller's transaction (docs/native-api.md#pricing): pay the worker and its owner, charge the requester (and its
    shared key, as at submit) with the extra burn, record settled_character_count and fault the generation as cancelled (not restarted, not a
    dropped job); then release the request's hold when it is done. False when it was not pending."""
    settled = await conn.fetchval(
        _SETTLE_CANCELLED_SQL,
        ctx.id,
        settlement.reward,
        characters,
        settlement.charge,
        settlement.contribution_tokens,
        ctx.owner_id,
        ctx.requester_id,
        settlement.owner_kudos,
        settlement.owner_escrow,
    )
    if not settled:
        return False
    await conn.fetchrow(_COMPLETION_SQL, ctx.wp_id)
    return True
