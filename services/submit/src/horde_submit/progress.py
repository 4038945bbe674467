"""``POST /v2/generate/text/progress``: a streamed chat job's partial output (docs/native-api.md#progress,
docs/native-api.md#job-lease).

Body ``{id, seq, delta: {content?, reasoning_content?}}`` with the worker owner's ``apikey``. One Lua script
(``horde_core.chat_stream.APPEND_PROGRESS_SCRIPT``) authenticates the post against the generation's stream lease
(written by dispatch at pop), checks the sequence and the caps and appends the delta to the request's progress
stream, atomically, on the chat signal database; the route reads Postgres only for a post without a lease (to
tell ChatJobAborted from ChatProgressNotStreaming) and for a post that extends the job lease.

A request that expired ends its generations' progress: the janitor, when it claims the expiry and deletes the
request, ends each lease (so a later post finds no lease and no generation: ChatJobAborted), and a post whose
lease is still there, because its request is past its expiry but not yet deleted or the janitor could not reach
Redis, is answered ChatJobAborted by the renewal that every post extending its lease makes, which then ends the
lease itself.

Answers: 200 ``{"accepted_seq", "cancelled"}``; 400 BadRequest (empty delta or bad body); 403 WrongCredentials;
404 ChatJobAborted / ChatProgressNotStreaming; 409 ChatProgressOutOfSequence (+ ``expected_seq``); 413
ChatProgressCapReached; 503 ChatProgressUnavailable (Redis unreachable).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import redis.asyncio as redis
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from horde_contract.errors import HordeError
from horde_contract.limits import TEXT_JOB_LEASE_SECONDS
from horde_contract.progress import (
    ChatProgress,
    chat_job_aborted_error,
    parse_progress_body,
    progress_cap_reached_error,
    progress_not_streaming_error,
    progress_out_of_sequence_error,
    progress_unavailable_error,
)
from horde_contract.refusals import wrong_credentials_error
from horde_contract.reply import replace_nul
from horde_core.body import PROGRESS_BODY_LIMITS
from horde_core.chat_stream import (
    FLAG_ON,
    AppendResult,
    AppendStatus,
    LeaseField,
    ProgressAppender,
    delete_lease,
    end_stream,
    extend_lease,
    lease_key_check,
    stream_lease_key,
)
from horde_core.metrics import counter, flag
from horde_store.users import hash_api_key

from horde_submit import generations as gens
from horde_submit.body import read_submit_body
from horde_submit.state import get_state

log = logging.getLogger(__name__)

LEASE_RENEWALS = counter(
    "horde.text.lease_renewals",
    "Progress posts that extended a job lease, and posts that found it at its cap",
    ["horde.outcome", "horde.worker_trusted"],
)


# The renewal's one statement: extend the pending generation's job_ttl unless its request is past its expiry,
# and say which of gone / expired / extended it found.
_RENEW_SQL = """
WITH target AS (
    SELECT g.id, g.wp_id, w.expiry <= now() AS expired
      FROM processing_gens g JOIN waiting_prompts w ON w.id = g.wp_id
     WHERE g.id = $1
), extended AS (
    UPDATE processing_gens g SET job_ttl = $2
      FROM target t
     WHERE g.id = t.id AND NOT t.expired
       AND g.generation IS NULL AND NOT g.faulted AND g.job_ttl < $2
    RETURNING g.job_ttl
)
SELECT (SELECT wp_id FROM target) AS wp_id, (SELECT expired FROM target) AS expired,
       (SELECT job_ttl FROM extended) AS job_ttl
"""


def parse_progress(body: Any) -> ChatProgress:
    """The contract's progress body (400 BadRequest otherwise), with NUL stored as U+FFFD in the final reply;
    relaying it the same way keeps the stream its prefix."""
    post = parse_progress_body(body)
    reasoning = post.reasoning_content
    return ChatProgress(
        post.id, post.seq, replace_nul(post.content), replace_nul(reasoning) if reasoning else None
    )


@dataclass
class ProgressHandler:
    """The progress route's state: the signal-database client (leases and streams live there), the pool, the
    API-key salt, the job lease length in seconds (HORDE_TEXT_JOB_LEASE_SECONDS) a renewal extends to, and the
    longest a post's body may take to arrive (HORDE_BODY_READ_TIMEOUT_SECONDS)."""

    pool: asyncpg.Pool
    signal: redis.Redis
    salt: str
    lease_seconds: int = TEXT_JOB_LEASE_SECONDS
    read_timeout: float = 60.0
    _appender: ProgressAppender = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._appender = ProgressAppender(self.signal)

    async def post(self, body: Any, apikey: str | None) -> dict[str, Any]:
        """Handle one post (see the module docstring for the answers)."""
        post = parse_progress(body)
        check = lease_key_check(hash_api_key(apikey, self.salt)) if apikey else ""
        gen_uuid = gens.parse_uuid(post.id)
        try:
            result = await self._appender.append(
                post.id, key_check=check, seq=post.seq, content=post.content, reasoning=post.reasoning_content
            )
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise progress_unavailable_error() from exc
        if result.status is AppendStatus.nolease:
            raise await self._without_lease(post.id, gen_uuid)
        if result.status is AppendStatus.forbidden:
            raise wrong_credentials_error()
        if result.status is AppendStatus.sequence:
            raise progress_out_of_sequence_error(post.seq, result.expected_seq)
        if result.status is AppendStatus.cap:
            raise progress_cap_reached_error()
        if result.status is AppendStatus.ok and not result.cancelled and gen_uuid is not None:
            aborted = await self._renew(gen_uuid, post.id, result)
            if aborted is not None:
                raise aborted
        return {"accepted_seq": post.seq, "cancelled": result.cancelled}

    async def _without_lease(self, gen_id: str, gen_uuid: Any) -> HordeError:
        """No lease: one read of the generation and its request tells the answer. ChatJobAborted when the
        generation is aborted, which its submit would be answered AbortedGen for: not stored (its request
        expired and was deleted), faulted, pending with its request past its expiry, or pending in a cancelled
        streamed request (the cancel settles it); otherwise (stored and not aborted) ChatProgressNotStreaming."""
        row = None
        if gen_uuid is not None:
            async with self.pool.acquire() as conn:
                row = await conn.fetchrow(
                    """
                    SELECT g.faulted
                           OR (g.generation IS NULL
                               AND (w.expiry <= now() OR (w.cancelled AND w.stream_progress AND NOT g.fake)))
                           AS aborted
                      FROM processing_gens g JOIN waiting_prompts w ON w.id = g.wp_id
                     WHERE g.id = $1
                    """,
                    gen_uuid,
                )
        if row is None or row["aborted"]:
            return chat_job_aborted_error(gen_id)
        return progress_not_streaming_error(gen_id)

    async def _renew(self, gen_uuid: Any, gen_id: str, lease: AppendResult) -> HordeError | None:
        """Extend the job lease to ``lease_seconds`` after this post, rounded up to whole seconds and capped at
        the lease's ``lease_cap`` from the pop (docs/native-api.md#job-lease). A post after the lease lapsed does not
        extend it. Writes Postgres only when it extends, then the stream lease (best effort).

        The extending statement also reads the generation's request: when the generation is no longer stored
        (its request expired and was deleted) or its request is past its expiry, nothing is extended, the
        generation's stream gets its ended entry and the lease is deleted (best effort), and the post is
        answered 404 ChatJobAborted (returned, for the caller to raise; docs/native-api.md#progress)."""
        started, job_ttl, lease_cap = lease.started, lease.job_ttl, lease.lease_cap
        now = time.time()
        if started <= 0 or now > started + job_ttl:
            return None
        wanted = math.ceil(now - started + self.lease_seconds)
        cap = lease_cap if lease_cap > 0 else wanted
        new_ttl = min(wanted, cap)
        if new_ttl <= job_ttl:
            if wanted > cap:
                LEASE_RENEWALS.labels("at_cap", flag(lease.trusted)).inc()
            return None
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(_RENEW_SQL, gen_uuid, new_ttl)
        if row is None or row["wp_id"] is None or row["expired"]:
            await self._end_expired(gen_id, row["wp_id"] if row is not None else None)
            return chat_job_aborted_error(gen_id)
        if row["job_ttl"] is None:
            return None
        await extend_lease(self.signal, gen_id, started=started, job_ttl=new_ttl)
        LEASE_RENEWALS.labels("granted", flag(lease.trusted)).inc()
        return None

    async def _end_expired(self, gen_id: str, request_id: Any) -> None:
        """End the progress of a generation whose request expired: its ended entry on the request's stream (the
        request id from the row, else from the lease; none for a fake lease, as at a cancel) and the lease
        deleted; best effort, never raises."""
        rid = str(request_id) if request_id is not None else None
        fake = False
        try:
            raw_rid, raw_fake = await self.signal.hmget(
                stream_lease_key(gen_id), [LeaseField.request.value, LeaseField.fake.value]
            )
            if rid is None and raw_rid is not None:
                rid = raw_rid.decode() if isinstance(raw_rid, bytes) else str(raw_rid)
            fake = (raw_fake.decode() if isinstance(raw_fake, bytes) else raw_fake) == FLAG_ON
        except Exception:
            log.warning("stream lease read failed", extra={"generation_id": gen_id}, exc_info=True)
        if rid and not fake:
            await end_stream(self.signal, rid, gen_id)
        else:
            await delete_lease(self.signal, gen_id)


router = APIRouter(tags=["progress"])


@router.post("/v2/generate/text/progress")
async def progress_route(request: Request, apikey: str | None = Header(default=None)) -> JSONResponse:
    """Post a streamed chat job's progress: 200 ``{"accepted_seq": int, "cancelled": bool}``.

    The body is read by horde_core's body reader within PROGRESS_BODY_LIMITS (413 ChatProgressCapReached past
    MAX_PROGRESS_BODY_BYTES, 2 MiB, which no post under the cap reaches; 408 RequestBodyTimeout when it
    trickles; 400 BadRequest past 1024 elements or 64 levels, checked before any object is built) and parsed
    by the contract's JSON reader (400 BadRequest for invalid JSON, lone surrogates)."""
    handler = (await get_state(request)).progress
    too_large = progress_cap_reached_error(post_too_large=True)
    body = await read_submit_body(request, PROGRESS_BODY_LIMITS, handler.read_timeout, too_large=too_large)
    return JSONResponse(await handler.post(body, apikey))
