"""The front's one reader of progress streams (docs/openai-front.md#streaming).

:class:`DeltaStreamReader` is one background task per process. Every relayed request registers a
:class:`DeltaFeed`; the task reads ``horde:chat:stream:<request id>`` of every registered request with one
``XREAD BLOCK 250`` on ``HORDE_OAI_STREAM_REDIS_DB`` and queues each stream's entries, as one batch per read,
on its feed. Recovery:

- a read that takes longer than :data:`DELTA_READ_TIMEOUT_SECONDS` is abandoned and made again (a connection
  left unresponsive by a network fault); the reader sends no PING;
- a failed read is made again after :data:`DELTA_READ_RETRY_SECONDS` from the last entry read, so nothing is
  skipped (the stream retains its entries);
- a deleted or expired stream yields nothing, and a stream recreated with ids below the last id read yields
  nothing either: XREAD only returns ids above the one asked for.

Tracing (docs/openai-front.md#telemetry): each non-empty read is one ``horde.oai.delta_read`` span, a root span
(the reader serves every request, so it belongs to none of their traces) from the read's start until its entries
are queued, with counts as attributes (:data:`DELTA_READ_SPAN`) and a link to the span of each request whose stream had
entries (its server span, current when it registered). An empty read makes no span.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as redis
from horde_core.chat_stream import StreamEntry, progress_stream_key, request_id_of_stream
from horde_core.redis_keys import relay_record_key
from horde_core.tasks import stop_task
from opentelemetry import context as otel_context
from opentelemetry import trace

from horde_oai.metrics import DELTA_READS

log = logging.getLogger(__name__)

DELTA_READ_BLOCK_MILLISECONDS = 250
DELTA_READ_TIMEOUT_SECONDS = 5.0
DELTA_READ_RETRY_SECONDS = 2.0
# Entries taken per stream and read; a generation posts about once a second, so this is never the bound.
DELTA_READ_COUNT = 500
FIRST_ID = "0-0"

#: The span of one non-empty read; its attributes are bounded counts (no request ids):
#: ``horde.oai.delta_read.streams`` (the streams the read asked for), ``…streams_with_entries`` (those that
#: answered with entries) and ``…entries`` (the entries read).
DELTA_READ_SPAN = "horde.oai.delta_read"
# A proxy until the process configures tracing (horde_core.tracing); non-recording spans while tracing is off.
_tracer = trace.get_tracer(__name__)


class DeltaFeed:
    """One registered connection: batches of :class:`StreamEntry` in stream order, one batch per read."""

    def __init__(self, request_id: str, start_id: str = FIRST_ID) -> None:
        self.request_id = request_id
        self.key = progress_stream_key(request_id)
        self.last_id = start_id
        self.batches: asyncio.Queue[list[StreamEntry]] = asyncio.Queue()
        # The registering request's span (invalid while tracing is off): the delta_read spans link to it.
        self.span_context = trace.get_current_span().get_span_context()


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


class DeltaStreamReader:
    """The process-wide reader. ``client`` None (no Redis) makes every feed silent."""

    def __init__(
        self,
        client: redis.Redis | None,
        *,
        block_ms: int = DELTA_READ_BLOCK_MILLISECONDS,
        read_timeout: float = DELTA_READ_TIMEOUT_SECONDS,
        retry_seconds: float = DELTA_READ_RETRY_SECONDS,
    ) -> None:
        self.client = client
        self.block_ms = block_ms
        self.read_timeout = read_timeout
        self.retry_seconds = retry_seconds
        self._feeds: dict[str, list[DeltaFeed]] = {}  # stream key -> the connections reading it
        self._have_feeds = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.client is not None

    @property
    def registered(self) -> int:
        """How many requests are being read."""
        return len(self._feeds)

    async def start(self) -> None:
        if self.client is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="horde-oai-delta-reader")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    def register(self, request_id: str, start_id: str = FIRST_ID) -> DeltaFeed:
        """Read ``request_id``'s stream from after ``start_id`` (its start by default). Several connections
        of one request (a resume beside the original) each get every entry after their own start."""
        feed = DeltaFeed(request_id, start_id)
        self._feeds.setdefault(feed.key, []).append(feed)
        self._have_feeds.set()
        return feed

    def unregister(self, feed: DeltaFeed) -> None:
        feeds = self._feeds.get(feed.key, [])
        if feed in feeds:
            feeds.remove(feed)
        if not feeds:
            self._feeds.pop(feed.key, None)
        if not self._feeds:
            self._have_feeds.clear()

    async def _run(self) -> None:
        while True:
            await self._have_feeds.wait()
            # One position per stream: the earliest of its connections; each skips what it already had.
            positions = {
                key: min((f.last_id for f in feeds), key=_id_key) for key, feeds in self._feeds.items()
            }
            if not positions:
                continue
            started = time.monotonic()
            started_ns = time.time_ns()
            try:
                result = await asyncio.wait_for(self._read(positions), self.read_timeout)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                DELTA_READS.labels(outcome="abandoned").inc()
                log.warning("delta read took over %.0f s; abandoned and made again", self.read_timeout)
                continue
            except Exception:
                DELTA_READS.labels(outcome="failed").inc()
                log.warning("delta read failed; retrying in %.0f s", self.retry_seconds, exc_info=True)
                await asyncio.sleep(self.retry_seconds)
                continue
            if result:
                DELTA_READS.labels(outcome="entries").inc()
                with trace.use_span(self._read_span(started_ns, len(positions), result), end_on_exit=True):
                    self._deliver(result)
            elif time.monotonic() - started < self.block_ms / 2000:
                # XREAD BLOCK answered at once with nothing (e.g. every key missing on some servers): don't spin.
                await asyncio.sleep(self.block_ms / 1000)

    async def _read(self, positions: dict[str, str]) -> Any:
        assert self.client is not None
        return await self.client.xread(positions, count=DELTA_READ_COUNT, block=self.block_ms)  # type: ignore[arg-type]

    def _read_span(self, started_ns: int, streams: int, result: Any) -> trace.Span:
        """The :data:`DELTA_READ_SPAN` of one non-empty read of ``streams`` streams that started at
        ``started_ns`` (a root span, linked to the requests whose streams had entries)."""
        items = list(result.items() if isinstance(result, dict) else result)
        answered = [(key.decode() if isinstance(key, bytes) else str(key), entries) for key, entries in items]
        links = [
            trace.Link(feed.span_context)
            for key, entries in answered
            if entries
            for feed in self._feeds.get(key, [])
            if feed.span_context.is_valid
        ]
        return _tracer.start_span(
            DELTA_READ_SPAN,
            context=otel_context.Context(),  # a root span, whatever is current
            start_time=started_ns,
            attributes={
                "horde.oai.delta_read.streams": streams,
                "horde.oai.delta_read.streams_with_entries": sum(1 for _, entries in answered if entries),
                "horde.oai.delta_read.entries": sum(len(entries or ()) for _, entries in answered),
            },
            links=links,
        )

    def _deliver(self, result: Any) -> None:
        items = result.items() if isinstance(result, dict) else result
        for key, entries in items:
            key_text = key.decode() if isinstance(key, bytes) else str(key)
            batch = [StreamEntry.from_fields(entry_id, fields) for entry_id, fields in entries or ()]
            # A connection that unregistered during the read is no longer listed: nothing is queued for it.
            for feed in self._feeds.get(key_text, []):
                after = _id_key(feed.last_id)
                mine = [entry for entry in batch if _id_key(entry.id) > after]
                if mine:
                    feed.last_id = mine[-1].id
                    feed.batches.put_nowait(mine)
            log.debug(
                "delta read", extra={"request_id": request_id_of_stream(key_text), "entries": len(batch)}
            )


# --- resumable streams (beyond the spec; docs/openai-front.md#resumable-streams) ---------------------------------------------

# The stream keeps its entries 900 s after the last append; the record lives as long.
RELAY_RECORD_TTL_SECONDS = 900


# Connections one relayed stream may have at once (the original and its resumes), so one paid request cannot
# pin an unbounded number of connections and status waits on a front.
MAX_STREAM_CONNECTIONS = 4
# KEYS[1]: the record; ARGV[1]: MAX_STREAM_CONNECTIONS. nil for a closed or missing record, -1 when the stream
# has its most connections, else the new attach count (live connections go up by one).
ATTACH_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'closed') == '1' then return nil end
if tonumber(redis.call('HGET', KEYS[1], 'live') or '0') >= tonumber(ARGV[1]) then return -1 end
redis.call('HINCRBY', KEYS[1], 'live', 1)
return redis.call('HINCRBY', KEYS[1], 'attach', 1)
"""
# KEYS[1]: the record; ARGV[1]: 1 to close the stream when this was its last connection. Returns 1 when
# connections remain (the stream goes on), 0 when none does, nil when the record is gone.
DETACH_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return nil end
if redis.call('HINCRBY', KEYS[1], 'live', -1) > 0 then return 1 end
if ARGV[1] == '1' then redis.call('HSET', KEYS[1], 'closed', '1') end
return 0
"""


class StreamBusy(Exception):
    """The stream already has :data:`MAX_STREAM_CONNECTIONS` connections."""


class RelayRecords:
    """The records that let a client re-attach to a relayed stream (any front replica): a hash of ``key``
    (SHA-256 of the API key), ``body`` (the request's digest), ``submitted_at`` (Unix seconds), ``attach``
    (connections attached so far), ``live`` (connections attached now, a dropped one until its resume grace
    ends) and ``closed`` (1 once the last connection dropped for good, and the request was cancelled). Every operation is best effort: a Redis
    failure makes a stream not resumable, never fails it."""

    def __init__(self, client: redis.Redis | None, ttl_seconds: int = RELAY_RECORD_TTL_SECONDS) -> None:
        self.client = client
        self.ttl_seconds = ttl_seconds

    async def save(self, request_id: str, key_digest: str, body_digest: str, submitted_at: float) -> None:
        if self.client is None:
            return
        key = relay_record_key(request_id)
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hset(
                    key,
                    mapping={
                        "key": key_digest,
                        "body": body_digest,
                        "submitted_at": submitted_at,
                        "attach": 1,
                        "live": 1,
                    },
                )
                pipe.expire(key, self.ttl_seconds)
                await pipe.execute()
        except Exception:
            log.warning("relay record write failed", extra={"request_id": request_id}, exc_info=True)

    async def load(self, request_id: str) -> dict[str, str] | None:
        """The record, or None when absent or unreadable."""
        if self.client is None:
            return None
        try:
            raw = await self.client.hgetall(relay_record_key(request_id))
        except Exception:
            log.warning("relay record read failed", extra={"request_id": request_id}, exc_info=True)
            return None
        return {str(k): str(v) for k, v in raw.items()} or None

    async def attach(self, request_id: str) -> int | None:
        """Attach one more connection and return the attach count; None when the stream was closed (its
        request cancelled after a drop), the record is gone, or Redis fails. Raises :class:`StreamBusy` when
        the stream has :data:`MAX_STREAM_CONNECTIONS` connections."""
        if self.client is None:
            return None
        try:
            found = await self.client.eval(
                ATTACH_SCRIPT, 1, relay_record_key(request_id), MAX_STREAM_CONNECTIONS
            )
        except Exception:
            log.warning("relay record attach failed", extra={"request_id": request_id}, exc_info=True)
            return None
        if found is not None and int(found) < 0:
            raise StreamBusy(request_id)
        return int(found) if found is not None else None

    async def detach(self, request_id: str, *, close_if_last: bool) -> bool:
        """One connection ended: True when others remain attached. A dropped connection is detached only once
        its resume grace ended, so a resume within the grace keeps the stream alive; with ``close_if_last``
        the last one closes the record, so no later resume can attach to its cancelled request. Atomic with
        :meth:`attach`. A Redis failure or a missing record returns False."""
        if self.client is None:
            return False
        try:
            found = await self.client.eval(
                DETACH_SCRIPT, 1, relay_record_key(request_id), "1" if close_if_last else "0"
            )
        except Exception:
            log.warning("relay record detach failed", extra={"request_id": request_id}, exc_info=True)
            return False
        return bool(found == 1)

    async def history(self, request_id: str) -> list[StreamEntry]:
        """The request's progress stream so far (at most CHAT_PROGRESS_STREAM_MAX_ENTRIES entries)."""
        if self.client is None:
            return []
        entries: Any = await self.client.xrange(progress_stream_key(request_id))
        return [StreamEntry.from_fields(entry_id, fields) for entry_id, fields in entries or ()]
