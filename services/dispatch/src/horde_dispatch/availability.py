"""Worker availability for a request: what ``WorkerPoolService.GetAvailability`` answers.

See docs/native-api.md#known-models (online = checked in within 300 s; a model is known while such a
chat worker serves it, paused or in maintenance included; count and largest chat limits of the chat workers
serving the models), docs/native-api.md#eligibility (rules 1–4), docs/native-api.md#job-lease (the speed gate, 10 tok/s for an unmeasured
worker), docs/native-api.md#impossible-reason (the declaration gap, naming ``image_transports`` only for a worker that declares
vision), docs/native-api.md#free-output-allowance (eligible threads and tokens per second, each worker counted once per
thread).

One statement reads the online chat workers serving any requested model (``ix_workers_chat_model_id``),
paused and in maintenance included, each flagged whether it serves this requester; the rules run here,
through ``horde_contract.chat_refusal_reasons``, as ``can_generate`` does upstream. The size limits are not
applied in SQL, so a worker below them is refused here and its refusal counts toward the gap.

A legacy text request (``prompt_jobs``) is asked about the text workers instead, as the queue query serves it
(docs/native-api.md#eligibility): online workers that take prompt jobs and list one of its models (any worker
for a request without models; ``ix_workers_models``), rule 4, and its max_length and max_context_length within
the worker's text limits. Legacy text jobs are not speed-gated, and a text request has no declaration gap.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import asyncpg
from horde_contract import (
    ONLINE_WORKER_SECONDS,
    ChatDeclaration,
    ChatFeature,
    chat_refusal_reasons,
    declaration_gap,
)
from horde_contract.bridges import is_validated_bridge
from horde_contract.requirements import IMAGE_TRANSPORTS_REASON
from horde_core.worker_pool import Availability, RequestNeeds
from horde_store.db import ConnOrPool

from .lease import effective_speed, lease_capacity
from .queue import SLOW_WORKER_SPEED

#: The refusal reason of the speed gate (TextWorker.can_generate_with_eligibility_inputs).
LEASE_SPEED_REASON = "lease_speed"


# Online chat workers serving any of the models, paused and in maintenance included (they keep the model
# known); ``serves`` is false for a worker in maintenance or paused unless the requester owns it, and for
# every worker of a flagged or deleted owner (their pops are refused: WorkerFlaggedMaintenance, DeletedUser),
# and only the workers that serve count as serving or eligible.
_ONLINE_CHAT_WORKERS = f"""
SELECT w.id, w.user_id, w.threads, w.speed, w.chat_model_id, w.chat_features, w.chat_max_context_length,
       w.chat_max_length, w.chat_tools_max_temperature, w.image_transports, w.bridge_agent, u.trusted,
       (NOT u.flagged AND NOT u.deleted
        AND ((NOT w.maintenance AND NOT w.paused) OR w.user_id = $2::bigint)) AS serves
FROM workers w JOIN users u ON u.id = w.user_id
WHERE w.accepts_chat_jobs
  AND w.chat_model_id = ANY($1::text[])
  AND w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})
"""


# Online workers taking prompt jobs that list any of the models ($1 empty: any), paused and in maintenance
# included as above.
_ONLINE_TEXT_WORKERS = f"""
SELECT w.id, w.user_id, w.threads, w.speed, w.max_length, w.max_context_length, w.bridge_agent, u.trusted,
       (NOT u.flagged AND NOT u.deleted
        AND ((NOT w.maintenance AND NOT w.paused) OR w.user_id = $2::bigint)) AS serves
FROM workers w JOIN users u ON u.id = w.user_id
WHERE w.accepts_prompt_jobs
  AND (cardinality($1::text[]) = 0 OR w.models && $1::text[])
  AND w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})
"""


def _declaration(row: asyncpg.Record) -> ChatDeclaration:
    features = tuple(row["chat_features"] or ())
    return ChatDeclaration(
        accepts_chat_jobs=True,
        chat_features=features,
        chat_max_context_length=row["chat_max_context_length"],
        chat_max_length=row["chat_max_length"],
        chat_tools_max_temperature=row["chat_tools_max_temperature"],
        chat_model_id=row["chat_model_id"],
        image_transports=tuple(row["image_transports"] or ()),
        feature_set=frozenset(features),
    )


def _passes_rule_4(row: asyncpg.Record, q: RequestNeeds) -> bool:
    """only/ignore, trusted, validated backends, slow workers (the queue query's rule 4)."""
    worker_id = str(row["id"])
    if q.only_worker_ids and worker_id not in q.only_worker_ids:
        return False
    if worker_id in q.ignore_worker_ids:
        return False
    if q.trusted_workers and not row["trusted"]:
        return False
    if q.validated_backends and not is_validated_bridge(row["bridge_agent"]):
        return False
    return q.slow_workers or effective_speed(row["speed"]) >= SLOW_WORKER_SPEED


def gap_reasons(reasons: Sequence[str], declaration: ChatDeclaration) -> list[str]:
    """A refused worker's reasons as the declaration gap counts them (docs/native-api.md#impossible-reason).

    ``image_transports`` is named only for a worker that declares vision: a worker without vision lacks
    ``vision`` (the feature a request with images needs), not a transport, so its ``image_transports``
    refusal counts as ``vision``. Eligibility itself is unchanged: the worker stays refused.
    """
    if IMAGE_TRANSPORTS_REASON not in reasons:
        return list(reasons)
    declares_vision = ChatFeature.vision.value in (declaration.feature_set or declaration.chat_features)
    if declares_vision:
        return list(reasons)
    out = [r for r in reasons if r != IMAGE_TRANSPORTS_REASON]
    if ChatFeature.vision.value not in out:
        out.insert(0, ChatFeature.vision.value)
    return out


def evaluate(rows: Sequence[asyncpg.Record], q: RequestNeeds) -> Availability:
    """Apply rules 1–4 and the speed gate to the online chat workers' rows (pure; see the module
    docstring). Every row counts toward ``known_workers``; only rows whose ``serves`` is true count as
    serving, give the largest chat limits and may be eligible."""
    result = Availability(known_workers=len(rows))
    rows = [row for row in rows if row["serves"]]
    result.serving_workers = len(rows)
    refusals: list[list[str]] = []
    for row in rows:
        result.max_chat_context_length = max(
            result.max_chat_context_length, row["chat_max_context_length"] or 0
        )
        result.max_chat_length = max(result.max_chat_length, row["chat_max_length"] or 0)
        if not _passes_rule_4(row, q):
            continue
        declaration = _declaration(row)
        reasons = chat_refusal_reasons(
            declaration=declaration,
            models=list(q.models),
            required_features=list(q.required_features),
            max_length=q.max_length,
            max_context_length=q.max_context_length,
            tools_temperature=q.tools_temperature,
            has_images=q.has_images,
        )
        if q.max_length > 0 and lease_capacity(row["speed"]) < q.max_length:
            reasons.append(LEASE_SPEED_REASON)
        if reasons:
            refusals.append(gap_reasons(reasons, declaration))
            continue
        _count_eligible(result, row)
    gap = declaration_gap(refusals) if result.eligible_workers == 0 and refusals else None
    if gap is not None:
        result.missing_declarations = gap["missing_declarations"]
        result.exceeded_limits = gap["exceeded_limits"]
    return result


def _count_eligible(result: Availability, row: asyncpg.Record) -> None:
    """Count one eligible worker: its threads, its speed once per thread, its id."""
    threads = int(row["threads"])
    result.eligible_workers += 1
    result.eligible_threads += threads
    result.tokens_per_second += effective_speed(row["speed"]) * threads
    result.eligible_worker_ids.append(str(row["id"]))


def evaluate_text(rows: Sequence[asyncpg.Record], q: RequestNeeds) -> Availability:
    """Rule 4 and the text limits on the online text workers' rows (pure): a legacy text request's
    availability. Every row counts toward ``known_workers``, rows whose ``serves`` is true toward
    ``serving_workers``; the chat limits and the declaration gap stay empty."""
    result = Availability(known_workers=len(rows))
    for row in rows:
        if not row["serves"]:
            continue
        result.serving_workers += 1
        if not _passes_rule_4(row, q):
            continue
        if q.max_length > int(row["max_length"]) or q.max_context_length > int(row["max_context_length"]):
            continue
        _count_eligible(result, row)
    return result


async def get_availability(conn: ConnOrPool, q: RequestNeeds) -> Availability:
    """The availability of ``q``'s models for its needs: the chat workers', or the text workers' for a legacy
    text request (``q.prompt_jobs``); one statement."""
    models = list(dict.fromkeys(q.models))
    if q.prompt_jobs:
        rows = await conn.fetch(_ONLINE_TEXT_WORKERS, models, q.requester_user_id)
        return evaluate_text(rows, q)
    if not models:
        return Availability()
    rows = await conn.fetch(_ONLINE_CHAT_WORKERS, models, q.requester_user_id)
    return evaluate(rows, q)


def parse_worker_ids(values: Sequence[str]) -> list[str]:
    """Worker ids normalised to canonical UUID text; malformed ids are kept verbatim (they match nothing)."""
    out = []
    for value in values:
        try:
            out.append(str(uuid.UUID(value)))
        except ValueError:
            out.append(value)
    return out
