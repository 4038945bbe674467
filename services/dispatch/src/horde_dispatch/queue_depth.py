"""The queue depth gauge: jobs waiting to be handed out, horde-wide, for dashboards and autoscaling
(docs/operator-guide.md#scaling; deploy/k8s/components/autoscaling-queue scales dispatch on it).

Every dispatch process reads the depth from PostgreSQL every ``HORDE_QUEUE_DEPTH_REFRESH_SECONDS`` (one
``sum(n)`` over the pop's partial index ``ix_waiting_prompts_queue``) and sets ``horde_text_queue_jobs``. The
value is the whole horde's, so every replica reports the same number: aggregate it with ``max``, not ``sum``.
A failed read keeps the last value (a store outage must not look like an empty queue and scale dispatch in).
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from horde_core.app import store_outage_errors
from horde_core.metrics import gauge

log = logging.getLogger(__name__)

QUEUE_JOBS = gauge(
    "horde.text.queue.jobs",
    "Jobs waiting in the queue to be handed out (the whole horde's: n of every active, unfaulted request), "
    "as this process last read it",
)

#: The pop's queue (active, n > 0, not faulted: ix_waiting_prompts_queue), the jobs still to hand out.
QUEUE_DEPTH_SQL = """
SELECT coalesce(sum(n), 0)::bigint FROM waiting_prompts WHERE active AND n > 0 AND NOT faulted
"""


async def read_queue_depth(pool: asyncpg.Pool) -> int:
    """The jobs waiting in the queue (a count; raises the store's errors)."""
    async with pool.acquire() as conn:
        return int(await conn.fetchval(QUEUE_DEPTH_SQL))


async def refresh_queue_depth(pool: asyncpg.Pool, interval_seconds: float) -> None:
    """Set :data:`QUEUE_JOBS` now and every ``interval_seconds`` until cancelled; a store outage is logged and
    the last value kept."""
    outages: tuple[type[BaseException], ...] = (*store_outage_errors(), OSError, asyncpg.PostgresError)
    while True:
        try:
            QUEUE_JOBS.set(await read_queue_depth(pool))
        except outages as exc:
            log.warning("queue depth not read: %s: %s", type(exc).__name__, exc)
        await asyncio.sleep(interval_seconds)
