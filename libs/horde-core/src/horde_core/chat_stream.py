"""The progress-stream wire format, in one place for dispatch, submit, admission and the front.

See docs/native-api.md#progress, #job-lease; docs/openai-front.md#streaming. Leases and streams
live on the chat signal database (``CHAT_SIGNAL_DB``, 7; pass a :func:`horde_core.redis_keys.signal_client`
to every helper here):

- ``horde:chat:lease:<generation id>``: a hash of :class:`LeaseField`, written at pop, authenticated and
  appended through by the progress route, flagged ``cancelled`` by the cancel route, deleted at submit/fault.
- ``horde:chat:stream:<request id>``: a stream of entries with :class:`EntryField` fields. A delta entry has
  gen, seq, content, reasoning_content (only when the delta carries reasoning), worker and model (when the lease
  has them); an ended marker has gen and ``ended: 1``.

Both Lua scripts (:data:`APPEND_PROGRESS_SCRIPT`, :data:`FLAG_CANCELLED_LEASES_SCRIPT`) are formatted from the
Python names below, so a key prefix, a field name or a flag value is spelled once, here.

The writes a service makes on a lease or a stream outside the progress route (pop, submit, fault, cancel) are
best effort by spec: those helpers log a Redis failure and report it in their return value, never raise. The
progress route's append and the settlement reads raise, so their callers map the failure.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import redis.asyncio as redis
from horde_contract.limits import (
    CHAT_PROGRESS_BYTES_PER_TOKEN,
    CHAT_PROGRESS_LEASE_GRACE_SECONDS,
    CHAT_PROGRESS_STREAM_MAX_ENTRIES,
    CHAT_PROGRESS_STREAM_TTL_SECONDS,
    MAX_CHAT_PROGRESS_ENTRIES,
)

log = logging.getLogger(__name__)

LEASE_KEY_PREFIX = "horde:chat:lease:"
STREAM_KEY_PREFIX = "horde:chat:stream:"
#: The value of ``ended`` on an ended marker.
ENDED_MARKER = "1"
#: A set lease flag (``cancelled``, ``fake``, ``trusted``); :data:`FLAG_OFF` is a clear one.
FLAG_ON = "1"
FLAG_OFF = "0"


def stream_lease_key(generation_id: str) -> str:
    """``horde:chat:lease:<generation id>``: the stream lease hash of one streamed generation."""
    return f"{LEASE_KEY_PREFIX}{generation_id}"


def progress_stream_key(request_id: str) -> str:
    """``horde:chat:stream:<request id>``: the progress stream of one chat request."""
    return f"{STREAM_KEY_PREFIX}{request_id}"


def request_id_of_stream(key: str) -> str:
    """The request id of a ``horde:chat:stream:<request id>`` key."""
    return key[len(STREAM_KEY_PREFIX) :] if key.startswith(STREAM_KEY_PREFIX) else key


class LeaseField(StrEnum):
    """Fields of the stream lease hash."""

    request = "request"
    worker = "worker"
    model = "model"
    owner = "owner"
    key = "key"
    max_bytes = "max_bytes"
    fake = "fake"
    started = "started"
    job_ttl = "job_ttl"
    lease_cap = "lease_cap"
    trusted = "trusted"
    cancelled = "cancelled"
    # Kept by the append script.
    last_seq = "last_seq"
    bytes = "bytes"
    last_content = "last_content"
    last_reasoning = "last_reasoning"


class EntryField(StrEnum):
    """Fields of a progress stream entry."""

    gen = "gen"
    seq = "seq"
    content = "content"
    reasoning_content = "reasoning_content"
    worker = "worker"
    model = "model"
    ended = "ended"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One entry of a progress stream, decoded.

    ``id`` is the stream id (``<ms>-<n>``); ``seq`` is None on an ended marker; ``reasoning`` is None when the
    delta carried no reasoning.
    """

    id: str
    gen: str
    seq: int | None
    content: str
    reasoning: str | None
    worker: str | None
    model: str | None
    ended: bool

    @property
    def time_seconds(self) -> float:
        """The entry's stream id time, in Unix seconds."""
        return int(self.id.partition("-")[0]) / 1000.0

    @classmethod
    def from_fields(cls, entry_id: str | bytes, fields: Mapping[Any, Any]) -> StreamEntry:
        """Decode an XREAD/XRANGE entry (str or bytes keys and values). Unknown fields are ignored."""
        f = {_text(k): _text(v) for k, v in (fields or {}).items()}
        seq_text = f.get(EntryField.seq)
        try:
            seq = int(seq_text) if seq_text is not None else None
        except ValueError:
            seq = None
        return cls(
            id=_text(entry_id) or "0-0",
            gen=f.get(EntryField.gen) or "",
            seq=seq,
            content=f.get(EntryField.content) or "",
            reasoning=f.get(EntryField.reasoning_content),
            worker=f.get(EntryField.worker),
            model=f.get(EntryField.model),
            ended=f.get(EntryField.ended) == ENDED_MARKER,
        )


# --- Lua ------------------------------------------------------------------------------------------------------

_LUA_SAFE = re.compile(r"[A-Za-z0-9_:.\-]*")


def _lua_string(value: str) -> str:
    # Every value here is a Python constant of this module; refusing anything that would need escaping keeps
    # the generated script trivially correct.
    if not _LUA_SAFE.fullmatch(value):
        raise ValueError(f"not a plain Lua string literal: {value!r}")
    return f"'{value}'"


def _lua_table(name: str, members: Iterable[StrEnum]) -> str:
    return f"local {name} = {{" + ", ".join(f"{m.name} = {_lua_string(m.value)}" for m in members) + "}"


class AppendStatus(StrEnum):
    """The first element of the append script's reply (see :class:`AppendResult`)."""

    ok = "ok"
    retry = "retry"
    sequence = "sequence"
    cap = "cap"
    forbidden = "forbidden"
    nolease = "nolease"


# The scripts read every name below from these locals; the values come from the Python constants above.
_LUA_PRELUDE = "\n".join(
    [
        _lua_table("LEASE", LeaseField),
        _lua_table("ENTRY", EntryField),
        _lua_table("STATUS", AppendStatus),
        f"local LEASE_PREFIX = {_lua_string(LEASE_KEY_PREFIX)}",
        f"local STREAM_PREFIX = {_lua_string(STREAM_KEY_PREFIX)}",
        f"local ENDED = {_lua_string(ENDED_MARKER)}",
        f"local ON = {_lua_string(FLAG_ON)}",
        f"local OFF = {_lua_string(FLAG_OFF)}",
    ]
)

#: Check and append one progress post, atomically (docs/native-api.md#progress).
#:
#: KEYS[1]: the lease. The request's stream key is built from the lease's ``request`` field. ARGV: key check,
#: seq, content, reasoning ('' when none), has_reasoning (ON/OFF), stream max entries, stream TTL seconds,
#: entry cap. Replies ``{status, ...}``: ``{nolease}``, ``{forbidden}``, ``{sequence, expected seq}``,
#: ``{cap}``, ``{retry, seq, cancelled}``, ``{ok, seq, cancelled, started, job_ttl, lease_cap, trusted}``
#: (all strings; see :meth:`AppendResult.from_reply`). The lease keeps the last accepted seq, the bytes accepted
#: and the last content and reasoning, so a retry of the last post is recognised; a fake lease is answered as a
#: real one and appends nothing.
APPEND_PROGRESS_SCRIPT = (
    _LUA_PRELUDE
    + """
local flat = redis.call('HGETALL', KEYS[1])
if #flat == 0 then return {STATUS.nolease} end
local f = {}
for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
if f[LEASE.key] ~= ARGV[1] then return {STATUS.forbidden} end
local seq = tonumber(ARGV[2])
local last = tonumber(f[LEASE.last_seq] or '0') or 0
local cancelled = f[LEASE.cancelled] == ON and ON or OFF
if seq == last and last > 0 then
  if f[LEASE.last_content] == ARGV[3] and (f[LEASE.last_reasoning] or '') == ARGV[4] then
    return {STATUS.retry, tostring(seq), cancelled}
  end
  return {STATUS.sequence, tostring(last + 1)}
end
if seq ~= last + 1 then return {STATUS.sequence, tostring(last + 1)} end
local used = tonumber(f[LEASE.bytes] or '0') or 0
local size = string.len(ARGV[3]) + string.len(ARGV[4])
local max_bytes = tonumber(f[LEASE.max_bytes] or '0') or 0
if last >= tonumber(ARGV[8]) or (max_bytes > 0 and used + size > max_bytes) then
  return {STATUS.cap}
end
if f[LEASE.fake] ~= ON then
  local entry = {ENTRY.gen, string.sub(KEYS[1], string.len(LEASE_PREFIX) + 1), ENTRY.seq, tostring(seq),
                 ENTRY.content, ARGV[3]}
  if ARGV[5] == ON then
    table.insert(entry, ENTRY.reasoning_content); table.insert(entry, ARGV[4])
  end
  if f[LEASE.worker] then table.insert(entry, ENTRY.worker); table.insert(entry, f[LEASE.worker]) end
  if f[LEASE.model] then table.insert(entry, ENTRY.model); table.insert(entry, f[LEASE.model]) end
  local stream = STREAM_PREFIX .. (f[LEASE.request] or '')
  redis.call('XADD', stream, 'MAXLEN', '~', ARGV[6], '*', unpack(entry))
  redis.call('EXPIRE', stream, tonumber(ARGV[7]))
end
redis.call('HSET', KEYS[1], LEASE.last_seq, tostring(seq), LEASE.bytes, tostring(used + size),
           LEASE.last_content, ARGV[3], LEASE.last_reasoning, ARGV[4])
return {STATUS.ok, tostring(seq), cancelled, f[LEASE.started] or '0', f[LEASE.job_ttl] or '0',
        f[LEASE.lease_cap] or '0', f[LEASE.trusted] or '0'}
"""
)

#: Flag the leases of a cancelled request (docs/native-api.md#progress).
#:
#: KEYS[1]: the request's progress stream; KEYS[2..]: the leases; ARGV[1..n]: their generation ids, ARGV[n+1]:
#: stream max entries, ARGV[n+2]: stream TTL seconds. Only leases that still exist are written (``cancelled``
#: set, and the generation's ended marker appended unless the lease is fake). Replies how many were flagged.
FLAG_CANCELLED_LEASES_SCRIPT = (
    _LUA_PRELUDE
    + """
local n = #KEYS - 1
local flagged = 0
for i = 1, n do
  local lease = KEYS[i + 1]
  if redis.call('EXISTS', lease) == 1 then
    redis.call('HSET', lease, LEASE.cancelled, ON)
    if redis.call('HGET', lease, LEASE.fake) ~= ON then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[n + 1], '*', ENTRY.gen, ARGV[i], ENTRY.ended, ENDED)
      redis.call('EXPIRE', KEYS[1], ARGV[n + 2])
    end
    flagged = flagged + 1
  end
end
return flagged
"""
)


# --- The lease ------------------------------------------------------------------------------------------------


def lease_key_check(stored_key_hash: str | None) -> str:
    """The lease's ``key``: SHA-256 hex of the owner's *stored* API key hash (``users.api_key`` as
    ``horde_store.users.hash_api_key`` makes it). Dispatch writes it at pop; the progress route compares the
    posting key's value, so the route authenticates from the lease alone (docs/native-api.md#progress)."""
    return hashlib.sha256((stored_key_hash or "").encode("utf-8")).hexdigest()


def lease_expiry_seconds(job_ttl: int) -> int:
    """Seconds from the pop until the lease expires: the job's TTL plus CHAT_PROGRESS_LEASE_GRACE_SECONDS (90),
    which covers the stale-generation sweep's tick."""
    return job_ttl + CHAT_PROGRESS_LEASE_GRACE_SECONDS


@dataclass(frozen=True, slots=True)
class StreamLease:
    """The lease a pop writes for one generation carrying the stream hint (docs/native-api.md#progress).

    ``key_check`` is :func:`lease_key_check` of the owner's stored key hash; ``max_bytes`` the byte cap of
    content plus reasoning; ``started`` the job lease's start in Unix seconds; ``job_ttl`` and ``lease_cap`` in
    seconds from ``started``.
    """

    request_id: str
    worker_id: str
    model: str
    owner_id: int
    key_check: str
    max_bytes: int
    started: int
    job_ttl: int
    lease_cap: int
    trusted: bool
    fake: bool = False

    @classmethod
    def at_pop(
        cls,
        *,
        request_id: str,
        worker_id: str,
        model: str,
        owner_id: int,
        owner_key_hash: str | None,
        max_length: int,
        started: datetime,
        job_ttl: int,
        lease_cap: int,
        trusted: bool,
        fake: bool = False,
    ) -> StreamLease:
        """The lease of a job popped at ``started`` with ``max_length`` tokens and a ``job_ttl`` second job
        lease: ``max_bytes`` is CHAT_PROGRESS_BYTES_PER_TOKEN (16) per token."""
        return cls(
            request_id=request_id,
            worker_id=worker_id,
            model=model,
            owner_id=owner_id,
            key_check=lease_key_check(owner_key_hash),
            max_bytes=CHAT_PROGRESS_BYTES_PER_TOKEN * max_length,
            started=int(started.timestamp()),
            job_ttl=job_ttl,
            lease_cap=lease_cap,
            trusted=trusted,
            fake=fake,
        )

    def fields(self) -> dict[str, str | int]:
        """The hash as written (field name → string or integer; Redis stores both as strings)."""
        return {
            LeaseField.request.value: self.request_id,
            LeaseField.worker.value: self.worker_id,
            LeaseField.model.value: self.model,
            LeaseField.owner.value: self.owner_id,
            LeaseField.key.value: self.key_check,
            LeaseField.max_bytes.value: self.max_bytes,
            LeaseField.fake.value: FLAG_ON if self.fake else FLAG_OFF,
            LeaseField.started.value: self.started,
            LeaseField.job_ttl.value: self.job_ttl,
            LeaseField.lease_cap.value: self.lease_cap,
            LeaseField.trusted.value: FLAG_ON if self.trusted else FLAG_OFF,
        }


async def write_stream_leases(client: redis.Redis | None, leases: Mapping[str, StreamLease]) -> bool:
    """Write each ``{generation id: lease}``, replacing any earlier hash, expiring
    :func:`lease_expiry_seconds` of its ``job_ttl`` from now; one transaction. Best effort: False (logged) on a
    Redis failure, and False without a client or leases; never raises."""
    if client is None or not leases:
        return False
    try:
        async with client.pipeline(transaction=True) as pipe:
            for generation_id, lease in leases.items():
                key = stream_lease_key(generation_id)
                pipe.delete(key)
                pipe.hset(key, mapping=lease.fields())  # type: ignore[arg-type]
                pipe.expire(key, lease_expiry_seconds(lease.job_ttl))
            await pipe.execute()
    except Exception:
        log.warning("stream lease write failed", extra={"generations": list(leases)}, exc_info=True)
        return False
    return True


#: Renew a lease that still exists (a submit may have deleted it since the post was appended: writing a field
#: would recreate a partial hash that answers later posts 403 instead of 404). KEYS[1]: the lease; ARGV: job_ttl,
#: the new expiry (Unix seconds). Replies 1 when renewed, 0 when the lease is gone.
EXTEND_LEASE_SCRIPT = (
    _LUA_PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], LEASE.job_ttl, ARGV[1])
redis.call('EXPIREAT', KEYS[1], tonumber(ARGV[2]))
return 1
"""
)


async def extend_lease(client: redis.Redis | None, generation_id: str, *, started: int, job_ttl: int) -> bool:
    """Record a renewed job lease on the stream lease, when it still exists: ``job_ttl`` (seconds from
    ``started``, Unix seconds) and the expiry moved to ``started + job_ttl`` plus the grace (see
    docs/native-api.md#job-lease). Best effort: False when the lease is gone, or (logged) on a Redis failure; never raises."""
    if client is None:
        return False
    key = stream_lease_key(generation_id)
    try:
        renewed = await client.eval(
            EXTEND_LEASE_SCRIPT, 1, key, job_ttl, started + lease_expiry_seconds(job_ttl)
        )
    except Exception:
        log.warning("stream lease renewal failed", extra={"generation_id": generation_id}, exc_info=True)
        return False
    return bool(renewed)


async def delete_lease(client: redis.Redis | None, generation_id: str) -> bool:
    """Delete the generation's lease after a stored submit; the stream is left to expire, so a reader can
    reconcile what it relayed with the reply. Best effort: False (logged) on a Redis failure; never raises."""
    if client is None:
        return False
    try:
        await client.delete(stream_lease_key(generation_id))
    except Exception:
        log.warning("stream lease delete failed", extra={"generation_id": generation_id}, exc_info=True)
        return False
    return True


async def end_stream(client: redis.Redis | None, request_id: str, generation_id: str) -> bool:
    """A streamed generation faulted: append its ended marker (``gen``, ``ended: 1``) to the request's stream,
    refresh the stream's TTL and delete the lease, in one transaction. Best effort: False (logged) on a Redis
    failure; never raises."""
    if client is None:
        return False
    key = progress_stream_key(request_id)
    try:
        async with client.pipeline(transaction=True) as pipe:
            pipe.xadd(
                key,
                {EntryField.gen.value: generation_id, EntryField.ended.value: ENDED_MARKER},
                maxlen=CHAT_PROGRESS_STREAM_MAX_ENTRIES,
                approximate=True,
            )
            pipe.expire(key, CHAT_PROGRESS_STREAM_TTL_SECONDS)
            pipe.delete(stream_lease_key(generation_id))
            await pipe.execute()
    except Exception:
        log.warning(
            "progress stream end failed",
            extra={"request_id": request_id, "generation_id": generation_id},
            exc_info=True,
        )
        return False
    return True


async def flag_cancelled_leases(
    client: redis.Redis | None, request_id: str, generation_ids: Sequence[str]
) -> int:
    """Tell the workers streaming a cancelled request to stop: ``cancelled`` on each of these generations'
    leases that still exists and, unless the lease is fake, the generation's ended marker on the request's
    stream, atomically (:data:`FLAG_CANCELLED_LEASES_SCRIPT`). The leases are kept, so a worker's next post is
    still answered, with cancelled true. Returns how many leases were flagged; best effort: 0 (logged) on a
    Redis failure, never raises."""
    if client is None or not generation_ids:
        return 0
    keys = [progress_stream_key(request_id), *(stream_lease_key(g) for g in generation_ids)]
    args: list[str | int] = [
        *generation_ids,
        CHAT_PROGRESS_STREAM_MAX_ENTRIES,
        CHAT_PROGRESS_STREAM_TTL_SECONDS,
    ]
    try:
        flagged = await client.register_script(FLAG_CANCELLED_LEASES_SCRIPT)(keys=keys, args=args)
    except Exception:
        log.warning("cancel: lease flagging failed", extra={"request_id": request_id}, exc_info=True)
        return 0
    return int(flagged)


# --- Appending and reading progress ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The append script's answer to one post.

    - ``ok``: appended (not on a fake lease); ``seq`` accepted, ``cancelled`` from the lease, and the lease's
      ``started`` (Unix seconds), ``job_ttl``, ``lease_cap`` (seconds from ``started``) and ``trusted`` for the
      renewal.
    - ``retry``: the post repeats the last accepted one; nothing appended; ``seq`` and ``cancelled`` set.
    - ``sequence``: out of sequence; ``expected_seq`` is the next seq.
    - ``cap``: the entry or byte cap is reached.
    - ``forbidden``: the key check does not match the lease.
    - ``nolease``: the generation has no lease.
    """

    status: AppendStatus
    seq: int | None = None
    expected_seq: int | None = None
    cancelled: bool = False
    started: int = 0
    job_ttl: int = 0
    lease_cap: int = 0
    trusted: bool = False

    @property
    def accepted(self) -> bool:
        """True for ``ok`` and ``retry`` (the route answers 200)."""
        return self.status in (AppendStatus.ok, AppendStatus.retry)

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> AppendResult:
        """Decode :data:`APPEND_PROGRESS_SCRIPT`'s reply (str or bytes elements). ValueError on an unknown
        status."""
        values = [_text(v) or "" for v in reply]
        status = AppendStatus(values[0])
        if status is AppendStatus.sequence:
            return cls(status, expected_seq=int(values[1]))
        if status is AppendStatus.retry:
            return cls(status, seq=int(values[1]), cancelled=values[2] == FLAG_ON)
        if status is AppendStatus.ok:
            return cls(
                status,
                seq=int(values[1]),
                cancelled=values[2] == FLAG_ON,
                started=int(values[3] or 0),
                job_ttl=int(values[4] or 0),
                lease_cap=int(values[5] or 0),
                trusted=values[6] == FLAG_ON,
            )
        return cls(status)


class ProgressAppender:
    """:data:`APPEND_PROGRESS_SCRIPT` registered on one client (the signal client), so a post costs one
    EVALSHA."""

    def __init__(self, client: redis.Redis) -> None:
        self._script = client.register_script(APPEND_PROGRESS_SCRIPT)

    async def append(
        self,
        generation_id: str,
        *,
        key_check: str,
        seq: int,
        content: str,
        reasoning: str | None = None,
        entry_cap: int = MAX_CHAT_PROGRESS_ENTRIES,
        stream_max_entries: int = CHAT_PROGRESS_STREAM_MAX_ENTRIES,
        stream_ttl_seconds: int = CHAT_PROGRESS_STREAM_TTL_SECONDS,
    ) -> AppendResult:
        """Check and append one post of ``generation_id`` (seq from 1; ``reasoning`` None when the delta has
        none; the byte cap counts content plus reasoning in UTF-8 bytes). ``key_check`` is
        :func:`lease_key_check` of the posting key's stored hash, '' without a key. ``entry_cap`` is the posts
        per generation (MAX_CHAT_PROGRESS_ENTRIES); the stream is trimmed to about ``stream_max_entries`` and
        expires ``stream_ttl_seconds`` after the append. Raises the client's Redis errors (a ConnectionError
        when Redis cannot be reached)."""
        reply = await self._script(
            keys=[stream_lease_key(generation_id)],
            args=[
                key_check,
                seq,
                content,
                reasoning or "",
                FLAG_ON if reasoning is not None else FLAG_OFF,
                stream_max_entries,
                stream_ttl_seconds,
                entry_cap,
            ],
        )
        return AppendResult.from_reply(reply)


async def read_generation_entries(
    client: redis.Redis, request_id: str, generation_id: str
) -> list[StreamEntry]:
    """The delta entries ``generation_id`` appended to the request's stream, in seq order (ended markers and
    other generations' entries left out; empty when the stream is gone or was trimmed of them). Raises the
    client's Redis errors."""
    raw: Sequence[tuple[Any, Any]] = await client.xrange(progress_stream_key(request_id)) or ()
    entries = [StreamEntry.from_fields(entry_id, fields or {}) for entry_id, fields in raw]
    mine = [e for e in entries if e.gen == generation_id and not e.ended and e.seq is not None]
    return sorted(mine, key=lambda e: e.seq or 0)


async def read_accepted_bytes(client: redis.Redis, generation_id: str) -> int | None:
    """The bytes of content plus reasoning the generation's lease accepted (the ``bytes`` field the append
    script keeps); None when there is no count (no lease, or no post appended). Raises the client's Redis
    errors."""
    value = _text(await client.hget(stream_lease_key(generation_id), LeaseField.bytes.value))
    return int(value) if value is not None else None
