"""Streaming progress (docs/native-api.md#progress, #job-lease): the worker loop with the scripted backend's
paced replies against the stand-in horde's progress route, over real HTTP.

Covers the posts themselves (seq from 1, merged deltas about once an interval, reasoning apart from content,
never empty, the streamed text equal to the submitted reply), every answer of the route (resend unchanged,
409 resync, 413 and 404 ChatProgressNotStreaming stop posting, 403, cancelled and ChatJobAborted abort the
generation without a submit), posting that does not hold up generation, and the local lease renewed by
accepted posts.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from horde_worker.backends.scripted import GREETING, ScriptedBackend
from horde_worker.config import WorkerSettings
from horde_worker.metrics import WorkerMetrics
from horde_worker.progress import JobLease
from horde_worker.worker import Timings, Worker
from worker_standin import StandInHorde, chat_job, serve

MODEL = "scripted-model"
INTERVAL = 0.1
TIMINGS = Timings(
    empty_pop=(0.02, 0.02, 0.02),
    pop_error=0.02,
    connect_error=0.02,
    submit_backoff=(0.02, 0.05),
    submit_attempts=5,
    lease_margin=5.0,
    progress_resends=2,
    progress_resend_delay=0.02,
    progress_flush=2.0,
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def stream_job(job_id: str, text: str, **payload: Any) -> dict[str, Any]:
    """A chat job carrying the stream hint."""
    return chat_job(job_id, text, stream_progress=True, **{"max_length": 128, **payload})


def make_worker(horde: StandInHorde, timings: Timings = TIMINGS, **kw: Any) -> Worker:
    settings = WorkerSettings(
        api_key="worker-key", horde_url=horde.url, model_id=MODEL, progress_interval=INTERVAL, **kw
    )
    return Worker(settings, ScriptedBackend(), timings=timings)


def submitted(*job_ids: str) -> Any:
    return lambda h: all(h.submits_for(j) for j in job_ids)


def posts(horde: StandInHorde, job_id: str = "j1") -> list[dict[str, Any]]:
    return horde.progress_for(job_id)


def counted(metrics: WorkerMetrics, outcome: str) -> float:
    return float(metrics.progress_posts.labels(outcome)._value.get())


def reply_of(horde: StandInHorde, job_id: str = "j1") -> tuple[str, str]:
    """``(content, reasoning)`` of the submitted reply."""
    message = horde.final(job_id)["message"]
    return message["content"], message.get("reasoning_content") or ""


# -- the posts ------------------------------------------------------------------------------------------------------


async def test_a_streamed_job_posts_its_deltas_then_submits(horde: StandInHorde) -> None:
    horde.add(stream_job("j1", "tell me [[think]] [[pace:1.0]] [[words:40]]"))
    worker = make_worker(horde)
    await serve(worker, horde, submitted("j1"))

    sent = posts(horde)
    assert len(sent) >= 6 and all(p["status"] == 200 for p in sent)
    assert [p["body"]["seq"] for p in sent] == list(range(1, len(sent) + 1))
    assert all(p["body"]["id"] == "j1" for p in sent)
    deltas = [p["body"]["delta"] for p in sent]
    assert all(d.get("content") or d.get("reasoning_content") for d in deltas)  # never empty
    assert all(set(d) <= {"content", "reasoning_content"} for d in deltas)
    # the reasoning comes first, and never inside content
    kinds = ["r" if "reasoning_content" in d else "c" for d in deltas]
    assert (
        kinds[0] == "r"
        and kinds[-1] == "c"
        and "<think>" not in "".join(d.get("content", "") for d in deltas)
    )
    # the accepted deltas concatenated are the submitted reply
    content, reasoning = reply_of(horde)
    assert horde.streamed("j1") == (content, reasoning)
    assert (
        content.startswith(f"{GREETING} tell me alpha") and reasoning == "Scripted reasoning about: tell me"
    )
    # about one post an interval (the first at once; the last, the rest, at once when the backend is done)
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(sent[:-1])]
    assert all(gap >= INTERVAL * 0.8 for gap in gaps), gaps
    assert counted(worker.metrics, "accepted") == len(sent)
    assert horde.submits_for("j1")[0]["status"] == 200


async def test_jobs_without_the_hint_or_with_tools_do_not_post(horde: StandInHorde) -> None:
    horde.add(
        chat_job("plain", "no hint [[pace:0.3]]"),
        stream_job("tool", "[[tool]] [[pace:0.3]]", tools=[WEATHER], tool_choice="auto"),
    )
    await serve(make_worker(horde), horde, submitted("plain", "tool"))
    assert horde.progress == []
    assert horde.final("tool")["finish_reason"] == "tool_calls"


async def test_progress_can_be_turned_off(horde: StandInHorde) -> None:
    horde.add(stream_job("j1", "quiet [[pace:0.3]]"))
    await serve(make_worker(horde, progress=False), horde, submitted("j1"))
    assert horde.progress == [] and horde.submits_for("j1")[0]["status"] == 200


async def test_posting_does_not_hold_up_generation(horde: StandInHorde) -> None:
    horde.progress_delay = 0.4  # each answer takes 0.4 s: deltas pile up and are merged
    horde.add(stream_job("j1", "busy [[pace:1.0]] [[words:40]]"))
    worker = make_worker(horde)
    started = time.monotonic()
    await serve(worker, horde, submitted("j1"))
    took = horde.submits_for("j1")[0]["at"] - started
    sent = posts(horde)
    assert took < 2.6, took  # 1 s of generation, plus the post in flight and the last one
    assert 2 <= len(sent) <= 5
    assert max(len(p["body"]["delta"].get("content", "").split()) for p in sent) >= 10
    assert horde.streamed("j1") == reply_of(horde)


# -- answers that keep the job --------------------------------------------------------------------------------------


async def test_an_unanswered_post_is_resent_unchanged(horde: StandInHorde) -> None:
    horde.script_progress(
        "j1",
        (503, {"message": "The progress store cannot be reached.", "rc": "ChatProgressUnavailable"}),
        (0, {}),  # no answer at all
    )
    horde.add(stream_job("j1", "retry [[pace:0.6]] [[words:10]]"))
    worker = make_worker(horde)
    await serve(worker, horde, submitted("j1"))
    sent = posts(horde)
    assert [p["status"] for p in sent[:3]] == [503, 0, 200]
    assert sent[0]["body"] == sent[1]["body"] == sent[2]["body"]  # same seq, same delta
    assert sent[3]["body"]["seq"] == 2
    assert horde.streamed("j1") == reply_of(horde)
    assert counted(worker.metrics, "unavailable") == 1 and counted(worker.metrics, "error") == 1


async def test_a_lost_answer_is_resent_and_answered_again(horde: StandInHorde) -> None:
    horde.script_progress("j1", (-1, {}))  # accepted, then the connection drops before the answer
    horde.add(stream_job("j1", "lost [[pace:0.5]] [[words:10]]"))
    await serve(make_worker(horde), horde, submitted("j1"))
    sent = posts(horde)
    assert sent[0]["body"] == sent[1]["body"] and sent[1]["status"] == 200
    assert [p["body"]["seq"] for p in sent[1:]] == list(range(1, len(sent)))
    assert horde.streamed("j1") == reply_of(horde)  # the repeat did not append twice


async def test_posting_gives_up_after_the_resends_and_still_submits(horde: StandInHorde) -> None:
    unavailable = (503, {"message": "down", "rc": "ChatProgressUnavailable"})
    horde.script_progress("j1", unavailable, unavailable, unavailable)
    horde.add(stream_job("j1", "down [[pace:0.6]] [[words:10]]"))
    worker = make_worker(horde)
    await serve(worker, horde, submitted("j1"))
    sent = posts(horde)
    assert len(sent) == 3 and all(p["body"] == sent[0]["body"] for p in sent)  # 1 post + 2 resends
    assert horde.submits_for("j1")[0]["status"] == 200
    assert reply_of(horde)[0].endswith("juliett")


async def test_out_of_sequence_resyncs_to_the_expected_seq(horde: StandInHorde) -> None:
    # the horde already holds 4 posts of this generation (say, from before a restart)
    horde.progress_state["j1"] = {
        "last_seq": 4,
        "last_content": "x",
        "last_reasoning": "",
        "bytes": 1,
        "entries": [],
    }
    horde.add(stream_job("j1", "resync [[pace:0.6]] [[words:10]]"))
    worker = make_worker(horde)
    await serve(worker, horde, submitted("j1"))
    sent = posts(horde)
    assert sent[0]["status"] == 409 and sent[0]["answer"]["expected_seq"] == 5
    assert [p["body"]["seq"] for p in sent[1:]] == list(range(5, 5 + len(sent) - 1))
    assert all(p["status"] == 200 for p in sent[1:])
    # the refused delta went into the post at seq 5: nothing was lost
    assert sent[1]["body"]["delta"]["content"].startswith(sent[0]["body"]["delta"]["content"])
    assert horde.streamed("j1") == reply_of(horde)
    assert counted(worker.metrics, "out_of_sequence") == 1


async def test_cap_reached_stops_posting_and_the_job_still_submits(horde: StandInHorde) -> None:
    horde.progress_max_entries = 2
    horde.add(stream_job("j1", "capped [[pace:0.8]] [[words:20]]"))
    worker = make_worker(horde)
    await serve(worker, horde, submitted("j1"))
    assert [p["status"] for p in posts(horde)] == [200, 200, 413]
    assert horde.submits_for("j1")[0]["status"] == 200
    assert reply_of(horde)[0].endswith("tango")
    assert counted(worker.metrics, "cap_reached") == 1


async def test_not_streaming_and_forbidden_stop_posting(horde: StandInHorde) -> None:
    horde.script_progress(
        "j1", (404, {"message": "does not stream progress", "rc": "ChatProgressNotStreaming"})
    )
    horde.script_progress("j2", (403, {"message": "wrong key", "rc": "WrongCredentials"}))
    horde.add(
        stream_job("j1", "one [[pace:0.5]] [[words:8]]"), stream_job("j2", "two [[pace:0.5]] [[words:8]]")
    )
    worker = make_worker(horde, threads=2)
    await serve(worker, horde, submitted("j1", "j2"))
    assert [p["status"] for p in posts(horde, "j1")] == [404]
    assert [p["status"] for p in posts(horde, "j2")] == [403]
    assert all(horde.submits_for(j)[0]["status"] == 200 for j in ("j1", "j2"))
    assert counted(worker.metrics, "not_streaming") == 1 and counted(worker.metrics, "forbidden") == 1


# -- answers that end the job ---------------------------------------------------------------------------------------


async def run_until_job_ends(horde: StandInHorde, worker: Worker) -> float:
    """Run the worker (one thread) until j2, queued behind j1, is submitted; returns the seconds from the
    horde's stop answer (the last post of j1) to the pop that followed j1's end."""
    await serve(worker, horde, submitted("j2"))
    last_post = posts(horde)[-1]["at"]
    next_pop = next(p["at"] for p in horde.pops if p["at"] > last_post)
    return float(next_pop - last_post)


async def test_a_cancelled_job_stops_generating_and_is_not_submitted(horde: StandInHorde) -> None:
    def cancel_after_two(h: StandInHorde, record: dict[str, Any]) -> None:
        if record["body"]["id"] == "j1" and len(h.progress_for("j1")) == 2:
            h.cancel("j1")

    horde.on_progress = cancel_after_two
    horde.add(stream_job("j1", "long [[pace:8]] [[words:60]]"), chat_job("j2", "next"))
    worker = make_worker(horde)
    after = await run_until_job_ends(horde, worker)
    sent = posts(horde)
    assert len(sent) == 3 and sent[-1]["answer"] == {"accepted_seq": 3, "cancelled": True}
    assert after < 0.3  # the pace (8 s) was interrupted at once
    assert horde.submits_for("j1") == []
    assert counted(worker.metrics, "cancelled") == 1
    assert worker.metrics.jobs.labels("chat", "cancelled")._value.get() == 1
    assert horde.final("j2")["message"]["content"] == f"{GREETING} next"


async def test_an_aborted_job_stops_generating_and_is_not_submitted(horde: StandInHorde) -> None:
    def abort_after_one(h: StandInHorde, record: dict[str, Any]) -> None:
        if record["body"]["id"] == "j1":
            h.aborted.add("j1")

    horde.on_progress = abort_after_one
    horde.add(stream_job("j1", "long [[pace:8]] [[words:60]]"), chat_job("j2", "next"))
    worker = make_worker(horde)
    after = await run_until_job_ends(horde, worker)
    sent = posts(horde)
    assert [p["status"] for p in sent] == [200, 404] and sent[-1]["answer"]["rc"] == "ChatJobAborted"
    assert after < 0.3
    assert horde.submits_for("j1") == []
    assert counted(worker.metrics, "aborted") == 1
    assert worker.metrics.jobs.labels("chat", "cancelled")._value.get() == 1


# -- the lease ------------------------------------------------------------------------------------------------------


def lease_timings(**kw: Any) -> Timings:
    """A job lease of 0 s + 0.3 s margin, renewed for 0.3 s by each accepted post."""
    base = {
        "empty_pop": (0.02, 0.02, 0.02),
        "submit_backoff": (0.02,),
        "lease_margin": 0.3,
        "lease_renewal": 0.3,
        "progress_resends": 0,
    }
    return Timings(**{**base, **kw})


async def test_accepted_posts_renew_the_local_lease(horde: StandInHorde) -> None:
    job = stream_job("j1", "renewed [[pace:1.5]] [[words:30]]")
    job["ttl"] = 0
    plain = chat_job("j2", "not renewed [[pace:1.5]]")
    plain["ttl"] = 0
    horde.add(job, plain)
    await serve(make_worker(horde, lease_timings(), threads=2), horde, submitted("j1", "j2"))
    assert horde.submits_for("j1")[0]["status"] == 200  # 1.5 s of generation on a 0.3 s lease
    assert horde.streamed("j1") == reply_of(horde)
    assert horde.final("j2")["fault_reason"] == "generation_error"  # no posts: faulted at 0.3 s


async def test_the_lease_lapses_once_posting_stops(horde: StandInHorde) -> None:
    horde.progress_max_entries = 3
    job = stream_job("j1", "capped [[pace:3]] [[words:30]]")
    job["ttl"] = 0
    horde.add(job)
    await serve(make_worker(horde, lease_timings()), horde, submitted("j1"))
    sent = posts(horde)
    assert [p["status"] for p in sent] == [200, 200, 200, 413]
    assert horde.final("j1")["fault_reason"] == "generation_error"
    # faulted one renewal (0.3 s) plus the margin (0.3 s) after the last accepted post
    lapse = horde.submits_for("j1")[0]["at"] - sent[2]["at"]
    assert 0.5 <= lapse < 1.2, lapse


def test_job_lease_renewal_is_capped_from_the_pop() -> None:
    lease = JobLease(started=100.0, deadline=100.0 + 150 + 60, margin=60)
    lease.renew(now=200.0)
    assert lease.deadline == 200.0 + 150 + 60
    lease.renew(now=650.0)  # 650 + 150 is past the 600 s cap from the pop
    assert lease.deadline == 100.0 + 600 + 60
    lease.renew(now=120.0)  # never moves back
    assert lease.deadline == 100.0 + 600 + 60
