"""The queue depth gauge (horde_dispatch.queue_depth): ``horde_text_queue_jobs`` follows the jobs still to hand
out (n of active, unfaulted requests), on /metrics, read by the app's background task."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from horde_dispatch.queue_depth import read_queue_depth
from horde_dispatch.settings import DispatchSettings
from prometheus_client import REGISTRY

pytestmark = pytest.mark.asyncio(loop_scope="session")

Harness = Any
#: The bound on waiting for the reader (it reads every 0.05 s here): generous, never asserted as a time.
DEADLINE_SECONDS = 30.0


@pytest.fixture(scope="module")
def dispatch_settings(dispatch_settings: DispatchSettings) -> DispatchSettings:
    return dispatch_settings.model_copy(update={"queue_depth_refresh_seconds": 0.05})


async def gauge_reaches(h: Harness, expected: float) -> float | None:
    """Wait until the gauge reads ``expected``; the last value read (None: never set)."""
    value = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_SECONDS
    while loop.time() < deadline:
        value = REGISTRY.get_sample_value("horde_text_queue_jobs")
        if value == expected:
            break
        await asyncio.sleep(0.02)
    return value


async def test_gauge_counts_the_jobs_still_to_hand_out(h: Harness) -> None:
    requester, _ = await h.user()
    _, worker_key = await h.user()
    await h.request(user_id=requester, n=3)
    await h.request(user_id=requester, is_chat=False, n=2, models=[h.TEXT_MODEL])
    await h.request(user_id=requester, n=4, faulted=True)
    await h.request(user_id=requester, n=5, active=False)
    await h.request(user_id=requester, n=0)
    assert await read_queue_depth(h.app.state.dispatch.pool) == 5
    assert await gauge_reaches(h, 5) == 5

    r = await h.pop(worker_key, h.chat_body("w-depth"))
    assert r.status_code == 200, r.text
    assert r.json()["id"] is not None
    assert await h.db.fetchval("SELECT sum(n) FROM waiting_prompts WHERE active AND NOT faulted") == 4
    assert await gauge_reaches(h, 4) == 4

    metrics = await h.client.get("/metrics")
    assert metrics.status_code == 200
    assert "\nhorde_text_queue_jobs 4.0\n" in metrics.text

    await h.clear()
    assert await gauge_reaches(h, 0) == 0
