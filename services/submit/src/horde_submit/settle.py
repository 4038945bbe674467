"""Settlement of a streamed generation still in flight when its request is cancelled (docs/native-api.md#pricing,
docs/native-api.md#progress, #submit; ``SettlementService.SettleCancelledGeneration``).

The characters priced are the content the worker posted (``read_posted_progress``: the generation's content
entries from the request's stream in seq order, reasoning aside). When the stream does not hold its entries the
lease's accepted bytes stand in; a Redis failure settles on the floor (20 tokens).

The cancel route asks for the settlement right after it claims the cancellation. When that call fails (submit
unreachable, a timeout), the generation is still pending while its worker was told to stop; the settlement then
happens at whichever comes first of the worker's reply (answered 400 AbortedGen), its faulted submit, the lapse
of its lease (``FaultGeneration``) or the janitor's next sweep (``SettleCancelledGeneration``), always through
:func:`settle_cancelled_context`, so the worker is paid for what it posted and is never counted as having
dropped the job (:attr:`horde_submit.generations.GenerationContext.cancel_settles`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import asyncpg
import redis.asyncio as redis
from horde_contract import TextModelReference
from horde_core.chat_stream import read_accepted_bytes, read_generation_entries
from horde_core.metrics import record_kudos

from horde_submit import generations as gens
from horde_submit import pricing

log = logging.getLogger(__name__)


async def read_posted_progress(client: redis.Redis | None, request_id: str, generation_id: str) -> int:
    """The characters of content the worker posted for the generation: its delta entries' content, in seq
    order, reasoning aside; the lease's accepted bytes when the stream no longer holds them; 0 without a
    client or when Redis fails (logged), which settles on the floor."""
    if client is None:
        return 0
    try:
        entries = await read_generation_entries(client, request_id, generation_id)
        if entries:
            return len("".join(entry.content for entry in entries))
        return await read_accepted_bytes(client, generation_id) or 0
    except Exception:
        log.warning("posted progress read failed", extra={"generation_id": generation_id}, exc_info=True)
        return 0


@dataclass(frozen=True, slots=True)
class CancelSettlement:
    """The outcome of :func:`settle_cancelled_generation`."""

    settled: bool
    character_count: int = 0
    kudos: float = 0.0


async def settle_cancelled_generation(
    pool: asyncpg.Pool, signal: redis.Redis | None, models: TextModelReference, generation_id: uuid.UUID
) -> CancelSettlement:
    """Price the posted content, pay and charge, and fault the generation as cancelled (one transaction);
    ``settled=False`` when it is not stored or no longer pending."""
    async with pool.acquire() as conn:
        ctx = await gens.load_context(conn, generation_id)
    if ctx is None:
        return CancelSettlement(settled=False)
    return await settle_cancelled_context(pool, signal, models, ctx)


def generation_reward(ctx: gens.GenerationContext, characters: int, models: TextModelReference) -> float:
    """The worker's reward for ``characters`` of reply (:func:`pricing.generation_kudos` at the served model),
    fake or not: a fake generation's submit is answered with it though nothing is paid (as upstream, so a
    paused worker cannot tell its jobs are fake; docs/native-api.md#workers)."""
    return pricing.generation_kudos(
        pricing.PricingInputs(
            reply_characters=characters,
            prompt_characters=ctx.prompt_characters,
            max_length=ctx.max_length,
            max_context_length=ctx.max_context_length,
            parameters_billion=models.parameters_billion(ctx.served_model),
            bridge_agent=ctx.bridge_agent,
            owner_trusted=ctx.owner_trusted,
        )
    )


def price_settlement(
    ctx: gens.GenerationContext,
    characters: int,
    models: TextModelReference,
    *,
    censored: bool = False,
    speed: float = 0.0,
) -> gens.Settlement:
    """What settling the generation of ``ctx`` on ``characters`` of reply moves, at a submit or a cancel: its
    reward (:func:`pricing.generation_kudos` at its served model; 0 for a fake generation), the owner's share
    and escrow (:func:`pricing.escrow_split`), the requester's charge (:func:`pricing.requester_charge`: the
    burn alone for a ``censored`` reply) and the contributed tokens; ``speed`` is the speed sample (tokens per
    second; 0 records none)."""
    reward = 0.0 if ctx.fake else generation_reward(ctx, characters, models)
    owner_kudos, owner_escrow = pricing.escrow_split(reward, ctx.owner_trusted, ctx.owner_id == 0)
    return gens.Settlement(
        reward=reward,
        owner_kudos=owner_kudos,
        owner_escrow=owner_escrow,
        charge=pricing.requester_charge(reward, censored),
        contribution_tokens=pricing.charged_tokens(characters, ctx.max_length),
        speed=speed,
    )


def record_settled_kudos(ctx: gens.GenerationContext, settlement: gens.Settlement) -> None:
    """Count what a committed settlement moved on ``horde.kudos.transferred``: the worker's reward (to its
    owner) and the requester's charge; a fake generation moves nothing. Never call it before the commit."""
    if ctx.fake:
        return
    record_kudos("worker_reward", settlement.reward)
    record_kudos("requester_charge", settlement.charge)


async def settle_cancelled_context(
    pool: asyncpg.Pool,
    signal: redis.Redis | None,
    models: TextModelReference,
    ctx: gens.GenerationContext,
    *,
    via: str = "cancel",
) -> CancelSettlement:
    """Settle the generation of ``ctx`` as cancelled (docs/native-api.md#pricing): price the characters its worker
    posted (:func:`read_posted_progress`; kudos by the text formula at its served model, the floor of 20 tokens
    before any post), pay the worker and its owner (escrow split as at submit), charge the requester (and the
    shared key the request was sent with: docs/native-api.md#submit, #kudos) the reward plus the extra burn of 1, record ``settled_character_count`` and fault the generation as cancelled:
    not restarted, no worker counter (aborted_jobs, uncompleted_jobs) touched. A fake generation is faulted
    as cancelled at 0 kudos. One compare-and-set, so it settles at most once; ``settled=False`` when the
    generation is no longer pending. ``via`` names the caller in the log line (cancel, submit, fault, lapse).
    """
    if not ctx.pending:
        return CancelSettlement(settled=False)
    characters = await read_posted_progress(signal, str(ctx.wp_id), str(ctx.id))
    settlement = price_settlement(ctx, characters, models)
    reward = settlement.reward
    async with pool.acquire() as conn, conn.transaction():
        settled = await gens.settle_cancelled(conn, ctx, characters, settlement)
    if not settled:
        return CancelSettlement(settled=False)
    record_settled_kudos(ctx, settlement)
    log.info(
        "cancelled generation settled",
        extra={
            "generation_id": str(ctx.id),
            "request_id": str(ctx.wp_id),
            "worker_id": str(ctx.worker_id),
            "character_count": characters,
            "kudos": reward,
            "via": via,
        },
    )
    return CancelSettlement(settled=True, character_count=characters, kudos=reward)
