"""The worker's long-poll pop (docs/worker-guide.md#long-poll): ``pop_wait_seconds`` (HORDE_WORKER_POP_WAIT_SECONDS,
default 10) goes out as the pop's ``wait_seconds``; after an empty long poll the loop pops again at once, after
an early empty answer (a horde that does not hold pops) or with 0 it backs off as before; a stop abandons a
held poll; the pop's HTTP timeout outlasts the wait."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import pytest
from horde_worker.backends.scripted import ScriptedBackend
from horde_worker.config import WorkerSettings, load_settings
from horde_worker.worker import Timings, Worker
from pydantic import ValidationError
from worker_standin import StandInHorde, chat_job

MODEL = "scripted-model"


class LongPollHorde(StandInHorde):
    """The stand-in horde holding an empty pop for its ``wait_seconds``, answering as soon as a job is added.
    ``arrived`` counts pops as they arrive (``pops`` records them when answered)."""

    arrived = 0
    closing = False

    def add(self, *jobs: dict[str, Any]) -> None:
        with self.changed:
            self.jobs.extend(jobs)
            self.changed.notify_all()

    def stop(self) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        super().stop()

    def _pop(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        deadline = time.monotonic() + float(body.get("wait_seconds") or 0)
        with self.changed:
            self.arrived += 1
            self.changed.notify_all()
            while (
                not self.jobs
                and not self.pop_script
                and not self.closing
                and (left := deadline - time.monotonic()) > 0
            ):
                self.changed.wait(left)
        return super()._pop(body, headers)


def make_worker(horde: StandInHorde, timings: Timings, **kw: Any) -> Worker:
    settings = WorkerSettings(
        api_key="worker-key", name="test-worker", horde_url=horde.url, model_id=MODEL, **kw
    )
    return Worker(settings, ScriptedBackend(), timings=timings)


def test_the_setting_defaults_to_ten_seconds_and_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().pop_wait_seconds == 10
    monkeypatch.setenv("HORDE_WORKER_POP_WAIT_SECONDS", "0")
    assert WorkerSettings().pop_wait_seconds == 0
    assert load_settings(["--pop-wait-seconds", "2.5"]).pop_wait_seconds == 2.5
    for bad in (-1, 21):
        with pytest.raises(ValidationError):
            WorkerSettings(pop_wait_seconds=bad)


async def test_the_pop_carries_wait_seconds_unless_it_is_zero() -> None:
    with StandInHorde() as horde:
        assert make_worker(horde, Timings()).pop_body()["wait_seconds"] == 10
        assert make_worker(horde, Timings(), pop_wait_seconds=1.5).pop_body()["wait_seconds"] == 1.5
        assert "wait_seconds" not in make_worker(horde, Timings(), pop_wait_seconds=0).pop_body()


async def test_after_an_empty_long_poll_the_worker_pops_again_at_once() -> None:
    # A classic empty-pop delay of 5 s would show in the gaps; a long poll must not sleep it.
    timings = Timings(empty_pop=(5.0, 5.0, 5.0))
    with LongPollHorde() as horde:
        worker = make_worker(horde, timings, pop_wait_seconds=0.3)
        task = asyncio.create_task(worker.run())
        try:
            assert await asyncio.to_thread(horde.wait_for, lambda h: len(h.pops) >= 4, 5)
            at = [p["at"] for p in horde.pops[:4]]
            assert all(0.25 <= b - a < 0.6 for a, b in itertools.pairwise(at)), at
            assert all(p["body"]["wait_seconds"] == 0.3 for p in horde.pops)
            # a job queued during a held poll is answered at once
            added = time.monotonic()
            horde.add(chat_job("j1", "quick"))
            assert await asyncio.to_thread(horde.wait_for, lambda h: bool(h.submits_for("j1")), 5)
            assert horde.submits_for("j1")[0]["at"] - added < 0.3
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 5)


async def test_an_early_empty_answer_backs_off_as_a_classic_pop() -> None:
    """A horde that ignores wait_seconds (upstream) answers empty at once: the loop does not spin."""
    with StandInHorde() as horde:
        worker = make_worker(horde, Timings(empty_pop=(0.3, 0.3, 0.3)), pop_wait_seconds=10)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        worker.request_stop()
        await asyncio.wait_for(task, 5)
        assert 2 <= len(horde.pops) <= 5


async def test_zero_keeps_the_classic_backoff() -> None:
    with LongPollHorde() as horde:
        worker = make_worker(horde, Timings(empty_pop=(0.3, 0.3, 0.3)), pop_wait_seconds=0)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        worker.request_stop()
        await asyncio.wait_for(task, 5)
        assert 2 <= len(horde.pops) <= 5
        assert all("wait_seconds" not in p["body"] for p in horde.pops)


async def test_a_stop_abandons_a_held_long_poll() -> None:
    with LongPollHorde() as horde:
        worker = make_worker(horde, Timings(), pop_wait_seconds=15)
        task = asyncio.create_task(worker.run())
        assert await asyncio.to_thread(horde.wait_for, lambda _: horde.arrived >= 1, 5)
        worker.request_stop()
        await asyncio.wait_for(task, 30)  # a hang guard
        # Stopped within POP_STOP_GRACE_SECONDS, not after the 15 s wait: the held pop is still unanswered.
        assert horde.pops == []
        assert horde.arrived == 1


async def test_the_pop_timeout_outlasts_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    with StandInHorde() as horde:
        worker = make_worker(horde, Timings(), pop_wait_seconds=20)
        seen: list[Any] = []

        async def post(url: str, **kwargs: Any) -> httpx.Response:
            seen.append(kwargs.get("timeout"))
            return httpx.Response(200, json={"payload": {}, "id": None, "ids": [], "skipped": {}})

        monkeypatch.setattr(worker.http, "post", post)
        await worker._pop(horde.url + "/api/v2/generate/text/pop")
        (timeout,) = seen
        assert isinstance(timeout, httpx.Timeout) and timeout.read is not None and timeout.read > 20
        await worker.http.aclose()
