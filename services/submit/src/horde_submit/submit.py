"""``POST /v2/generate/text/submit``: structured chat submits, legacy text submits and faulted submits.

See docs/native-api.md#submit, #reasoning, #reply-verification,
#refusal-record, #worker-fault-reasons, #pricing, #completion-signal; docs/native-api.md#submit, #kudos, #text-route.

Order of a submit:

1. The body is parsed (``horde_contract.parse_submit_body``). A body the parser refuses (400 ChatSubmitInvalid /
   BadRequest) that names a generation of the caller's own worker (the id resolves, the apikey is the owner's)
   gets the state answers of step 5 first, so a malformed reply to an aborted generation is 400 AbortedGen and
   is neither refused for its content nor recorded; otherwise a refused chat body naming a pending generation of
   the caller's worker is recorded as a refusal, then the parser's 400 is sent.
2. The generation is read with its worker, owner and request: 404 InvalidJobID when it is not stored (as after
   its request expired and was deleted: docs/native-api.md#expiry).
3. The apikey must be the worker owner's: 401 InvalidAPIKey (unknown key), 403 WrongCredentials (another key).
4. A pending generation of a cancelled streamed request (the cancel's settlement did not get through) is
   settled as cancelled on its posted content now (``horde_submit.settle.settle_cancelled_context``), so the
   rest of the submit sees it faulted as cancelled.
5. A faulted submit (``state: faulted``) faults a pending generation and restarts the job: 200
   ``{"reward": 0}`` (and writes nothing for a generation that is no longer pending).
6. A reply to an aborted generation (faulted: lapsed lease, faulted by its worker or settled at a cancel; or
   pending with its request past its expiry): 400 AbortedGen; to a stored one: 400 DuplicateGen. Both come
   before the reply is checked, so they never store a refusal nor count toward any worker counter.
7. A reply longer than its job allows (content and tool calls, or a text job's generation, over 16 UTF-8 bytes
   per max_length token): 400 ChatSubmitInvalid. A chat reply: 400 ChatModelMismatch, then
   ``verify_chat_reply`` (400 ChatSubmitInvalid / ChatSubmitNonconformant; a strict schema's check runs off the
   event loop, bounded: :func:`verify_reply`); each refusal is recorded in its own commit before the 400.
8. Compare-and-set claim and settlement in one transaction; after the commit the ``horde.job_submit.done`` log
   record (every stored reply: chat, text and fake), then the ``generation`` and ``done`` signals.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as redis
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from horde_contract import TextModelReference, answer_chat_extras
from horde_contract.errors import RC, HordeError
from horde_contract.limits import CHAT_CHARGE_BASIS_OUTPUT_ESTIMATE
from horde_contract.reply import (
    ChatSubmit,
    SubmitBody,
    TextSubmit,
    VerifiedReply,
    build_stored_reply,
    chat_reply_characters,
    check_chat_reply_size,
    check_text_reply_size,
    parse_submit_body,
    replace_nul,
    reply_validates_schema,
    stored_generation,
    submit_invalid,
    verify_chat_reply,
)
from horde_contract.vocab import chat_worker_fault_label, chat_worker_fault_message
from horde_core.body import SUBMIT_BODY_LIMITS
from horde_core.chat_stream import delete_lease
from horde_core.metrics import flag, size_bucket
from horde_core.signals import ChatSignal, publish_chat_signals

from horde_submit import generations as gens
from horde_submit import pricing
from horde_submit.auth import authenticate_owner
from horde_submit.body import read_submit_body
from horde_submit.faults import apply_fault
from horde_submit.metrics import (
    EMPTY_GENERATIONS,
    GATE_SHADOW_OUTCOMES,
    GATE_SHADOW_SERVICE_SECONDS,
    SUBMIT_OUTCOMES,
    WORKER_FAULTS,
)
from horde_submit.settle import (
    generation_reward,
    price_settlement,
    record_settled_kudos,
    settle_cancelled_context,
)
from horde_submit.state import get_state

log = logging.getLogger(__name__)

REFUSAL_RCS = frozenset({RC.ChatSubmitInvalid, RC.ChatSubmitNonconformant, RC.ChatModelMismatch})

#: Threads that validate replies against JSON schemas, off the event loop. Each check stops at the contract's
#: bounds (horde_contract.reply_schema: 500,000 steps, 2 s of its thread's CPU); more checks wait their turn.
VERIFY_THREADS = 2
_verify_pool: ThreadPoolExecutor | None = None


def _verify_executor() -> ThreadPoolExecutor:
    global _verify_pool
    if _verify_pool is None:
        _verify_pool = ThreadPoolExecutor(max_workers=VERIFY_THREADS, thread_name_prefix="horde-verify")
    return _verify_pool


async def verify_reply(parsed: ChatSubmit, chat_extras: Any, conformance: str) -> VerifiedReply:
    """``verify_chat_reply`` (docs/native-api.md#reply-verification). A reply it validates against a strict JSON schema
    is checked in the verify threads, so the event loop keeps answering (health, gRPC, other submits) while it
    runs; a check past the contract's bounds refuses the reply as ChatSubmitNonconformant. Any other reply is
    checked inline: its checks are linear in the reply, which the job bounds (``check_chat_reply_size``)."""
    if not reply_validates_schema(chat_extras, conformance):
        return verify_chat_reply(parsed, chat_extras, conformance)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _verify_executor(), functools.partial(verify_chat_reply, parsed, chat_extras, conformance)
    )


def invalid_job(job_id: Any) -> HordeError:
    """404 InvalidJobID (docs/native-api.md#submit)."""
    return HordeError(404, RC.InvalidJobID, f"Processing Job with ID {job_id} does not exist.")


def duplicate_gen(gen_id: Any) -> HordeError:
    """400 DuplicateGen (docs/native-api.md#submit)."""
    return HordeError(400, RC.DuplicateGen, f"Processing Generation with ID {gen_id} already submitted.")


def aborted_gen(ctx: gens.GenerationContext) -> HordeError:
    """400 AbortedGen for a reply to an aborted generation (:attr:`GenerationContext.aborted`), stating why:
    its request was cancelled (a faulted generation of a cancelled request), its request expired (a pending
    generation of a request past its expiry), or otherwise the job's lease (docs/native-api.md#job-lease,
    docs/native-api.md#submit)."""
    if ctx.faulted and ctx.request_cancelled:
        text = f"Processing Generation with ID {ctx.id} has been aborted because its request was cancelled."
    elif not ctx.faulted and ctx.request_expired:
        text = f"Processing Generation with ID {ctx.id} has been aborted because its request expired."
    else:
        text = (
            f"Processing Generation with ID {ctx.id} took too long to process and has been aborted! "
            f"Please submit within {ctx.job_ttl} seconds of the pop (the job's ttl)."
        )
    return HordeError(400, RC.AbortedGen, text)


def model_mismatch(model_id: Any, assigned: str) -> HordeError:
    """400 ChatModelMismatch (docs/native-api.md#submit)."""
    return HordeError(
        400,
        RC.ChatModelMismatch,
        f"The submit's model_id '{model_id}' is not the model this job was assigned to, '{assigned}'.",
    )


@dataclass
class Submitter:
    """The submit route's state: the pool, the signal client, the text model reference (which prices a
    generation at its served model's multiplier) and the longest a body may take to arrive."""

    pool: asyncpg.Pool
    signal: redis.Redis | None
    salt: str
    models: TextModelReference
    read_timeout: float = 60.0

    # -- entry point --------------------------------------------------------------------------------------

    async def submit(self, body: Any, apikey: str | None) -> dict[str, Any]:
        """Handle one submit (the module docstring gives the order); returns ``{"reward": float}`` or raises
        HordeError / HordeError."""
        try:
            parsed = parse_submit_body(body)
        except HordeError as exc:
            await self._unparsed(body, apikey, exc)
            SUBMIT_OUTCOMES.labels("invalid").inc()
            raise
        gen_id = gens.parse_uuid(parsed.id)
        if gen_id is None:
            raise invalid_job(parsed.id)
        async with self.pool.acquire() as conn:
            ctx = await gens.load_context(conn, gen_id)
            if ctx is None:
                raise invalid_job(parsed.id)
            await authenticate_owner(conn, apikey, self.salt, ctx.owner_id, ctx.owner_key_hash)
        faulted = parsed.state == "faulted"
        ctx = await self._settle_if_cancelled(ctx, "fault" if faulted else "submit")
        if faulted:
            return await self._fault(parsed, ctx)
        error = self._state_error(ctx)
        if error is not None:
            raise error
        if ctx.is_chat:
            return await self._chat_reply(parsed, ctx)
        return await self._text_reply(parsed, ctx)

    async def _settle_if_cancelled(self, ctx: gens.GenerationContext, via: str) -> gens.GenerationContext:
        """Settle a pending generation of a cancelled streamed request as cancelled
        (:attr:`GenerationContext.cancel_settles`) and return its context as it is now; any other context is
        returned unchanged."""
        if not ctx.cancel_settles:
            return ctx
        await settle_cancelled_context(self.pool, self.signal, self.models, ctx, via=via)
        async with self.pool.acquire() as conn:
            now = await gens.load_context(conn, ctx.id)
        if now is None:
            raise invalid_job(ctx.id)
        return now

    # -- refusals -----------------------------------------------------------------------------------------

    async def _record_refusal(self, ctx: gens.GenerationContext, exc: HordeError) -> None:
        """Store the refusal in its own commit before the 400 is sent; a failed write is logged only."""
        SUBMIT_OUTCOMES.labels("refused").inc()
        if not ctx.is_chat or not ctx.pending:
            return
        try:
            async with self.pool.acquire() as conn:
                await gens.record_chat_refusal(conn, ctx.id, exc.rc, exc.message)
        except Exception:
            log.warning("chat refusal record failed", extra={"generation_id": str(ctx.id)}, exc_info=True)

    async def _unparsed(self, body: Any, apikey: str | None, exc: HordeError) -> None:
        """A body the parser refused (``exc``) that names a generation of the caller's own worker (the id
        resolves and the apikey passes the route's ownership check, so nobody else learns or writes anything):

        - a reply (any state but faulted) to an aborted or stored generation raises 400 AbortedGen / DuplicateGen
          in place of ``exc``, before the reply's content counts (docs/native-api.md#submit); a pending
          generation of a cancelled streamed request is settled as cancelled first;
        - otherwise a chat refusal (ChatSubmitInvalid, ChatSubmitNonconformant, ChatModelMismatch) of a reply to
          a pending chat generation is recorded (docs/native-api.md#refusal-record).

        Returns normally when ``exc`` stands; a store failure is logged and leaves ``exc`` standing."""
        if not isinstance(body, dict):
            return
        gen_id = gens.parse_uuid(body.get("id"))
        if gen_id is None or not apikey:
            return
        try:
            async with self.pool.acquire() as conn:
                ctx = await gens.load_context(conn, gen_id)
                if ctx is None:
                    return
                await authenticate_owner(conn, apikey, self.salt, ctx.owner_id, ctx.owner_key_hash)
            if body.get("state") != "faulted":
                ctx = await self._settle_if_cancelled(ctx, "submit")
        except HordeError:
            return
        except Exception:
            log.warning(
                "refused submit: state read failed", extra={"generation_id": str(gen_id)}, exc_info=True
            )
            return
        if body.get("state") != "faulted":
            error = self._state_error(ctx)
            if error is not None:
                raise error
        if exc.rc not in REFUSAL_RCS or not ctx.is_chat or not ctx.pending:
            return
        try:
            async with self.pool.acquire() as conn:
                await gens.record_chat_refusal(conn, ctx.id, exc.rc, exc.message)
        except Exception:
            log.warning("chat refusal record failed", extra={"generation_id": str(gen_id)}, exc_info=True)

    def _state_error(self, ctx: gens.GenerationContext) -> HordeError | None:
        """400 AbortedGen for a reply to an aborted generation, 400 DuplicateGen for one already stored, None for
        a pending one (counted in ``horde.submit.outcomes``)."""
        if ctx.aborted:
            SUBMIT_OUTCOMES.labels("aborted").inc()
            return aborted_gen(ctx)
        if ctx.submitted:
            SUBMIT_OUTCOMES.labels("duplicate").inc()
            return duplicate_gen(ctx.id)
        return None

    # -- replies ------------------------------------------------------------------------------------------

    async def _chat_reply(self, parsed: SubmitBody, ctx: gens.GenerationContext) -> dict[str, Any]:
        """A chat job's reply to a pending generation: model check, verification, then the claim."""
        if not isinstance(parsed, ChatSubmit) or parsed.message is None:
            exc = submit_invalid(
                "A chat job is submitted with message, finish_reason and model_id instead of generation.",
                "message",
            )
            await self._record_refusal(ctx, exc)
            raise exc
        try:
            check_chat_reply_size(parsed.message, ctx.max_length)
        except HordeError as too_long:
            await self._record_refusal(ctx, too_long)
            raise
        assigned = ctx.served_model
        if assigned is not None and parsed.model_id != assigned:
            exc = model_mismatch(parsed.model_id, assigned)
            await self._record_refusal(ctx, exc)
            raise exc
        try:
            verified = await verify_reply(parsed, answer_chat_extras(ctx.chat_extras), ctx.chat_conformance)
        except HordeError as exc:
            if exc.rc in REFUSAL_RCS:
                await self._record_refusal(ctx, exc)
            raise
        message = build_stored_reply(verified.message)
        characters = chat_reply_characters(message)
        claim = gens.Claim(
            generation=stored_generation(message),
            message=message,
            finish_reason=verified.finish_reason,
            native_finish_reason=parsed.native_finish_reason,
            prompt_tokens=parsed.prompt_tokens,
            completion_tokens=parsed.completion_tokens,
            reasoning_tokens=parsed.reasoning_tokens,
            charge_basis=CHAT_CHARGE_BASIS_OUTPUT_ESTIMATE,
            censored=parsed.state in ("censored", "csam"),
            state=parsed.state if parsed.state in ("censored", "csam") else "ok",
            seed=None,
            gen_metadata=None,
        )
        return await self._settle(ctx, claim, characters, verified.dropped_tool_calls)

    async def _text_reply(self, parsed: SubmitBody, ctx: gens.GenerationContext) -> dict[str, Any]:
        """A text job's reply to a pending generation: the claim (a chat-form body is ChatSubmitInvalid)."""
        if not isinstance(parsed, TextSubmit):
            SUBMIT_OUTCOMES.labels("invalid").inc()
            raise submit_invalid(
                "A text job is submitted with generation; message belongs to chat jobs.", "message"
            )
        try:
            check_text_reply_size(parsed.generation, ctx.max_length)
        except HordeError:
            SUBMIT_OUTCOMES.labels("invalid").inc()
            raise
        text = replace_nul(parsed.generation)
        claim = gens.Claim(
            generation=text,
            message=None,
            finish_reason=None,
            native_finish_reason=None,
            prompt_tokens=None,
            completion_tokens=None,
            reasoning_tokens=None,
            charge_basis=None,
            censored=parsed.state in ("censored", "csam"),
            state=parsed.state if parsed.state in ("censored", "csam") else "ok",
            seed=parsed.seed,
            gen_metadata=parsed.gen_metadata,
        )
        return await self._settle(ctx, claim, len(text))

    async def _settle(
        self, ctx: gens.GenerationContext, claim: gens.Claim, characters: int, dropped_tool_calls: int = 0
    ) -> dict[str, Any]:
        """Price, claim and settle in one transaction; after the commit, write the ``horde.job_submit.done``
        record (:meth:`_log_done`) and publish the signals. A lost claim answers the generation's state as it
        is now (AbortedGen, DuplicateGen; InvalidJobID when it is gone)."""
        settlement = price_settlement(
            ctx,
            characters,
            self.models,
            censored=claim.censored,
            speed=pricing.speed_sample(characters, ctx.max_length, ctx.elapsed_seconds),
        )
        reward = settlement.reward
        if ctx.jobs == 1:
            async with self.pool.acquire() as conn:
                result = await gens.claim_and_settle(conn, ctx, claim, settlement, single=True)
        else:
            async with self.pool.acquire() as conn, conn.transaction():
                result = await gens.claim_and_settle(conn, ctx, claim, settlement)
        if not result.claimed:
            # Lost the compare-and-set: to a fault (lapsed lease, cancel) or to another submit.
            async with self.pool.acquire() as conn:
                now = await gens.load_context(conn, ctx.id)
            if now is None:
                raise invalid_job(ctx.id)
            now = await self._settle_if_cancelled(now, "submit")
            raise self._state_error(now) or duplicate_gen(ctx.id)
        SUBMIT_OUTCOMES.labels("stored").inc()
        # Committed (the single statement, or the transaction above): count the kudos it moved.
        record_settled_kudos(ctx, settlement)
        self._log_done(ctx, claim, result, reward, characters, dropped_tool_calls)
        if not ctx.fake:
            if claim.generation == "" and not (claim.message or {}).get("tool_calls"):
                EMPTY_GENERATIONS.labels(ctx.served_model or "").inc()
            if ctx.over_capacity and not ctx.is_chat:
                labels = (flag(ctx.owner_trusted), size_bucket(ctx.max_length))
                GATE_SHADOW_OUTCOMES.labels(*labels, "completed").inc()
                GATE_SHADOW_SERVICE_SECONDS.labels(*labels).observe(ctx.elapsed_seconds)
        if ctx.streamed:
            await delete_lease(self.signal, str(ctx.id))
        if ctx.is_chat and not ctx.fake:
            signals = [ChatSignal(str(ctx.wp_id), "generation", result.generations)]
            if result.request_done:
                signals.append(ChatSignal(str(ctx.wp_id), "done", result.generations))
            await publish_chat_signals(self.signal, signals)
        if ctx.fake:
            # Answered as a real job would be (upstream), so a paused worker cannot tell; nothing was paid.
            return {"reward": generation_reward(ctx, characters, self.models)}
        return {"reward": reward}

    @staticmethod
    def _log_done(
        ctx: gens.GenerationContext,
        claim: gens.Claim,
        result: gens.ClaimResult,
        reward: float,
        characters: int,
        dropped_tool_calls: int,
    ) -> None:
        """The ``horde.job_submit.done`` INFO record, written once for every submit that stored its reply
        (chat and text jobs, fake generations included), after the commit.

        Fields: ``generation_id``, ``request_id``, ``worker_id`` (UUID strings), ``chat``, ``fake`` (bools),
        ``model`` (the served model), ``state`` (ok, censored, csam), ``finish_reason`` (the stored one; None
        for a text job), ``reply_characters`` (the priced characters), ``kudos`` (the worker's reward; 0 for a
        fake generation), ``elapsed_seconds`` (pop to submit), ``request_done`` (this submit completed the
        request) and, when the single-call reduction dropped tool calls, ``dropped_tool_calls`` (how many;
        docs/native-api.md#reply-verification).
        """
        extra: dict[str, Any] = {
            "generation_id": str(ctx.id),
            "request_id": str(ctx.wp_id),
            "worker_id": str(ctx.worker_id),
            "chat": ctx.is_chat,
            "fake": ctx.fake,
            "model": ctx.served_model,
            "state": claim.state,
            "finish_reason": claim.finish_reason,
            "reply_characters": characters,
            "kudos": reward,
            "elapsed_seconds": round(ctx.elapsed_seconds, 3),
            "request_done": result.request_done,
        }
        if dropped_tool_calls:
            extra["dropped_tool_calls"] = dropped_tool_calls
        log.info("horde.job_submit.done", extra=extra)

    # -- faults -------------------------------------------------------------------------------------------

    async def _fault(self, parsed: SubmitBody, ctx: gens.GenerationContext) -> dict[str, Any]:
        """A faulted submit (docs/native-api.md#worker-fault-reasons, #submit): 200 ``{"reward": 0}``.

        Only a pending generation is faulted (restart, worker counters, the request's fault past the limit; a
        fake one is only marked faulted, its fault reason not stored on the request); one that is no longer
        pending (faulted, stored, or settled as cancelled at its request's cancel, possibly just now by
        :meth:`_settle_if_cancelled`) is left as it is and counts toward no worker counter."""
        reason = parsed.fault_reason if ctx.is_chat and isinstance(parsed, ChatSubmit) else None
        if ctx.is_chat:
            # Counted before the fault is applied, so a repeated fault submit is counted again.
            WORKER_FAULTS.labels(chat_worker_fault_label(reason), flag(ctx.owner_trusted)).inc()
        SUBMIT_OUTCOMES.labels("faulted").inc()
        if not ctx.pending:
            return {"reward": 0}
        message = chat_worker_fault_message(reason) if ctx.is_chat else None
        if message is not None:
            try:
                async with self.pool.acquire() as conn:
                    await gens.record_chat_worker_fault(conn, ctx.id, message, RC.ChatWorkerFault)
            except Exception:
                log.warning(
                    "chat worker fault record failed", extra={"generation_id": str(ctx.id)}, exc_info=True
                )
        await apply_fault(self.pool, self.signal, ctx.id)
        return {"reward": 0}


router = APIRouter(tags=["submit"])


@router.post("/v2/generate/text/submit")
async def submit_route(request: Request, apikey: str | None = Header(default=None)) -> JSONResponse:
    """Submit a generated reply (chat: ``message``/``finish_reason``/``model_id``; text: ``generation``).

    200 ``{"reward": kudos}``; 400 ChatSubmitInvalid, ChatSubmitNonconformant, ChatModelMismatch, DuplicateGen,
    AbortedGen, BadRequest; 401 InvalidAPIKey; 403 WrongCredentials; 404 InvalidJobID. The body is read by
    horde_core's body reader within SUBMIT_BODY_LIMITS (413 RequestTooLarge past 8 MiB, the largest legal
    reply; 408 RequestBodyTimeout; 400 BadRequest past 16,384 elements or 64 levels, before any object is built).
    """
    submitter = (await get_state(request)).submitter
    body = await read_submit_body(request, SUBMIT_BODY_LIMITS, submitter.read_timeout)
    return JSONResponse(await submitter.submit(body, apikey))
