"""``POST /v2/generate/text/progress``: a streamed chat job's partial output (spec: **Streaming progress**,
**Job lease**).

Body ``{id, seq, delta: {content?, reasoning_content?}}`` with the worker owner's ``apikey``. One Lua script
authenticates the post against the stream lease ``horde:chat:lease:<generation>`` (written by dispatch at pop),
checks the sequence and the caps and appends the delta to ``horde:chat:stream:<request>``, atomically; the
route reads Postgres only for a post without a lease (to tell ChatJobAborted from ChatProgressNotStreaming) and
for a post that extends the job lease.

Answers: 200 ``{"accepted_seq", "cancelled"}``; 400 BadRequest (empty delta or bad body); 403 WrongCredentials;
404 ChatJobAborted / ChatProgressNotStreaming; 409 ChatProgressOutOfSequence (+ ``expected_seq``); 413
ChatProgressCapReached; 503 ChatProgressUnavailable (Redis unreachable).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as redis
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from horde_contract import RC
from horde_contract.limits import (
    CHAT_PROGRESS_LEASE_GRACE_SECONDS,
    CHAT_PROGRESS_STREAM_MAX_ENTRIES,
    CHAT_PROGRESS_STREAM_TTL_SECONDS,
    MAX_CHAT_PROGRESS_ENTRIES,
    TEXT_JOB_LEASE_SECONDS,
)
from horde_core.errors import HordeError
from horde_core.metrics import counter
from horde_core.redis_keys import stream_lease_key
from horde_store.users import hash_api_key

from horde_submit import generations as gens
from horde_submit.auth import WRONG_CREDENTIALS_MESSAGE
from horde_submit.metrics import flag

log = logging.getLogger(__name__)

LEASE_RENEWALS = counter(
    "horde.text.lease_renewals",
    "Progress posts that extended a job lease, and posts that found it at its cap",
    ["horde.outcome", "horde.worker_trusted"],
)

# KEYS: lease. The request's stream key is read from the lease (horde:chat:stream:<request>). ARGV: key check, seq, content, reasoning, has_reasoning, stream max entries, stream ttl,
# entry cap. Returns {status, a, b, ...}: see _interpret. The lease hash keeps the last accepted seq (last_seq),
# the bytes accepted (bytes) and the last content and reasoning (last_content, last_reasoning).
APPEND_PROGRESS_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'nolease'} end
local f = redis.call('HMGET', KEYS[1], 'key', 'last_seq', 'bytes', 'max_bytes', 'last_content',
                     'last_reasoning', 'cancelled', 'fake', 'request', 'worker', 'model', 'started', 'job_ttl',
                     'lease_cap', 'trusted')
if f[1] ~= ARGV[1] then return {'forbidden'} end
local seq = tonumber(ARGV[2])
local last = tonumber(f[2] or '0') or 0
local cancelled = f[7] == '1' and '1' or '0'
if seq == last and last > 0 then
  if f[5] == ARGV[3] and (f[6] or '') == ARGV[4] then
    return {'retry', tostring(seq), cancelled}
  end
  return {'sequence', tostring(last + 1)}
end
if seq ~= last + 1 then return {'sequence', tostring(last + 1)} end
local used = tonumber(f[3] or '0') or 0
local size = string.len(ARGV[3]) + string.len(ARGV[4])
local max_bytes = tonumber(f[4] or '0') or 0
if last >= tonumber(ARGV[8]) or (max_bytes > 0 and used + size > max_bytes) then
  return {'cap'}
end
if f[8] ~= '1' then
  local entry = {'gen', string.sub(KEYS[1], string.len('horde:chat:lease:') + 1), 'seq', tostring(seq),
                 'content', ARGV[3]}
  if ARGV[5] == '1' then table.insert(entry, 'reasoning_content'); table.insert(entry, ARGV[4]) end
  if f[10] then table.insert(entry, 'worker'); table.insert(entry, f[10]) end
  if f[11] then table.insert(entry, 'model'); table.insert(entry, f[11]) end
  local stream = 'horde:chat:stream:' .. (f[9] or '')
  redis.call('XADD', stream, 'MAXLEN', '~', ARGV[6], '*', unpack(entry))
  redis.call('EXPIRE', stream, tonumber(ARGV[7]))
end
redis.call('HSET', KEYS[1], 'last_seq', tostring(seq), 'bytes', tostring(used + size),
           'last_content', ARGV[3], 'last_reasoning', ARGV[4])
return {'ok', tostring(seq), cancelled, f[12] or '0', f[13] or '0', f[14] or '0', f[15] or '0'}
"""


def lease_key_check(apikey: str, salt: str) -> str:
    """What the lease's ``key`` field holds for the owner's key: SHA-256 hex of the stored key hash."""
    return hashlib.sha256(hash_api_key(apikey, salt).encode("utf-8")).hexdigest()


def bad_request(text: str) -> HordeError:
    return HordeError(400, RC.BadRequest, text)


@dataclass(frozen=True, slots=True)
class ProgressPost:
    """A validated progress body."""

    id: str
    seq: int
    content: str
    reasoning: str | None


def parse_progress(body: Any) -> ProgressPost:
    """Validate ``{id, seq, delta: {content?, reasoning_content?}}``; 400 BadRequest otherwise."""
    if not isinstance(body, dict):
        raise bad_request("Input payload validation failed: body: must be an object")
    gen_id = body.get("id")
    if not isinstance(gen_id, str) or not gen_id:
        raise bad_request("Input payload validation failed: id: has to be the generation id (a string)")
    seq = body.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise bad_request("Input payload validation failed: seq: has to be an integer of at least 1")
    delta = body.get("delta")
    if not isinstance(delta, dict):
        raise bad_request("Input payload validation failed: delta: has to be an object")
    content = delta.get("content")
    reasoning = delta.get("reasoning_content")
    for name, value in (("content", content), ("reasoning_content", reasoning)):
        if value is not None and not isinstance(value, str):
            raise bad_request(f"Input payload validation failed: delta.{name}: has to be a string")
    if not content and not reasoning:
        raise bad_request("The delta carries neither content nor reasoning_content.")
    return ProgressPost(gen_id, seq, content or "", reasoning if reasoning else None)


@dataclass
class ProgressHandler:
    """The progress route's state: the signal-database client (leases and streams live there) and the pool."""

    pool: asyncpg.Pool
    signal: redis.Redis
    salt: str

    def __post_init__(self) -> None:
        self._script = self.signal.register_script(APPEND_PROGRESS_SCRIPT)

    async def post(self, body: Any, apikey: str | None) -> dict[str, Any]:
        """Handle one post (see the module docstring for the answers)."""
        post = parse_progress(body)
        check = lease_key_check(apikey, self.salt) if apikey else ""
        lease = stream_lease_key(post.id)
        gen_uuid = gens.parse_uuid(post.id)
        try:
            result = await self._script(
                keys=[lease],
                args=[
                    check,
                    post.seq,
                    post.content,
                    post.reasoning or "",
                    "1" if post.reasoning is not None else "0",
                    CHAT_PROGRESS_STREAM_MAX_ENTRIES,
                    CHAT_PROGRESS_STREAM_TTL_SECONDS,
                    MAX_CHAT_PROGRESS_ENTRIES,
                ],
            )
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise HordeError(
                503, RC.ChatProgressUnavailable, "The progress store cannot be reached."
            ) from exc
        status = result[0]
        if status == "nolease":
            raise await self._without_lease(post.id, gen_uuid)
        if status == "forbidden":
            raise HordeError(403, RC.WrongCredentials, WRONG_CREDENTIALS_MESSAGE)
        if status == "sequence":
            expected = int(result[1])
            raise HordeError(
                409,
                RC.ChatProgressOutOfSequence,
                f"seq {post.seq} is out of sequence; the next post of this generation is seq {expected}.",
                expected_seq=expected,
            )
        if status == "cap":
            raise HordeError(
                413,
                RC.ChatProgressCapReached,
                "This generation reached its progress cap. Stop posting progress; still submit the reply.",
            )
        cancelled = result[2] == "1"
        if status == "ok" and not cancelled and gen_uuid is not None:
            await self._renew(
                gen_uuid, lease, int(result[3]), int(result[4]), int(result[5]), result[6] == "1"
            )
        return {"accepted_seq": post.seq, "cancelled": cancelled}

    async def _without_lease(self, gen_id: str, gen_uuid: Any) -> HordeError:
        """No lease: faulted or gone → ChatJobAborted; stored and not faulted → ChatProgressNotStreaming."""
        row = None
        if gen_uuid is not None:
            async with self.pool.acquire() as conn:
                row = await conn.fetchrow("SELECT faulted FROM processing_gens WHERE id = $1", gen_uuid)
        if row is None or row["faulted"]:
            return HordeError(
                404,
                RC.ChatJobAborted,
                f"Generation {gen_id} was aborted. Stop generating and do not submit it.",
            )
        return HordeError(
            404,
            RC.ChatProgressNotStreaming,
            f"Generation {gen_id} does not stream progress. Stop posting progress; still submit the reply.",
        )

    async def _renew(
        self, gen_id: Any, lease: str, started: int, job_ttl: int, lease_cap: int, trusted: bool
    ) -> None:
        """Extend the job lease to 150 s after this post, capped at ``lease_cap`` from the pop (spec: **Job
        lease**). A post after the lease lapsed does not extend it. Writes Postgres only when it extends."""
        now = time.time()
        if started <= 0 or now > started + job_ttl:
            return
        wanted = math.ceil(now - started + TEXT_JOB_LEASE_SECONDS)
        cap = lease_cap if lease_cap > 0 else wanted
        new_ttl = min(wanted, cap)
        if new_ttl <= job_ttl:
            if wanted > cap:
                LEASE_RENEWALS.labels("at_cap", flag(trusted)).inc()
            return
        async with self.pool.acquire() as conn:
            extended = await conn.fetchval(
                """
                UPDATE processing_gens SET job_ttl = $2
                 WHERE id = $1 AND generation IS NULL AND NOT faulted AND job_ttl < $2
                RETURNING job_ttl
                """,
                gen_id,
                new_ttl,
            )
        if extended is None:
            return
        try:
            async with self.signal.pipeline(transaction=True) as pipe:
                pipe.hset(lease, "job_ttl", new_ttl)
                pipe.expireat(lease, started + new_ttl + CHAT_PROGRESS_LEASE_GRACE_SECONDS)
                await pipe.execute()
        except Exception:
            log.warning("stream lease renewal failed", extra={"generation_id": str(gen_id)}, exc_info=True)
        LEASE_RENEWALS.labels("granted", flag(trusted)).inc()


router = APIRouter(tags=["progress"])


@router.post("/v2/generate/text/progress")
async def progress_route(request: Request, apikey: str | None = Header(default=None)) -> JSONResponse:
    """Post a streamed chat job's progress: 200 ``{"accepted_seq": int, "cancelled": bool}``."""
    try:
        body = await request.json()
    except ValueError as exc:
        raise bad_request("Input payload validation failed: body: invalid JSON") from exc
    handler: ProgressHandler = request.app.state.progress
    return JSONResponse(await handler.post(body, apikey))
