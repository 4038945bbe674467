"""The worker loop against the stand-in horde over real HTTP: replies, faults, retries, drops, shutdown."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from horde_testing.launcher import ServiceProcess, free_port
from horde_worker import __version__
from horde_worker.backends.scripted import GREETING, ScriptedBackend
from horde_worker.config import WorkerSettings
from horde_worker.worker import Timings, Worker, api_url, empty_pop_delay
from worker_standin import StandInHorde, chat_job, serve, text_job

MODEL = "scripted-model"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def make_worker(horde: StandInHorde, fast: Timings, **kw: Any) -> Worker:
    settings = WorkerSettings(
        api_key="worker-key", name="test-worker", horde_url=horde.url, model_id=MODEL, **kw
    )
    return Worker(settings, ScriptedBackend(), timings=fast)


def submitted(*job_ids: str, count: int = 1) -> Any:
    return lambda h: all(len(h.submits_for(j)) >= count for j in job_ids)


# -- replies --------------------------------------------------------------------------------------------------------


async def test_plain_reply_and_the_pop_body(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "Say hi"))
    worker = make_worker(horde, fast, threads=1, max_length=256, max_context_length=4096)
    await serve(worker, horde, submitted("j1"))

    assert horde.final("j1") == {
        "id": "j1",
        "message": {"role": "assistant", "content": f"{GREETING} Say hi"},
        "finish_reason": "stop",
        "native_finish_reason": "stop",
        "prompt_tokens": 2,
        "completion_tokens": 7,
        "model_id": MODEL,
    }
    assert horde.submits_for("j1")[0]["status"] == 200
    pop = horde.pops[0]
    body = pop["body"]
    assert body["name"] == "test-worker"
    assert body["models"] == [MODEL]
    assert body["model_id"] == MODEL
    assert (body["max_length"], body["max_context_length"], body["threads"], body["amount"]) == (
        256,
        4096,
        1,
        1,
    )
    assert body["bridge_agent"] == f"Horde Chat Worker:{__version__}:horde-chat"
    assert body["chat_jobs"] is True and body["prompt_jobs"] is True
    assert body["chat_limits"] == {"max_context_length": 4096, "max_length": 256}
    assert "tool_choice_enforced" in body["chat_features"] and "vision" not in body["chat_features"]
    assert body["image_transports"] == []
    headers = {k.lower(): v for k, v in pop["headers"].items()}
    assert headers["apikey"] == "worker-key"
    assert headers["client-agent"] == body["bridge_agent"]
    # the declaration goes with every pop, empty ones included
    assert all(p["body"]["chat_jobs"] is True for p in horde.pops)


async def test_tool_call_reply(horde: StandInHorde, fast: Timings) -> None:
    horde.add(
        chat_job("j1", 'weather? [[tool:get_weather:{"city":"Paris"}]]', tools=[WEATHER], tool_choice="auto")
    )
    await serve(make_worker(horde, fast), horde, submitted("j1"))
    body = horde.final("j1")
    assert body["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    assert body["finish_reason"] == "tool_calls"
    assert horde.submits_for("j1")[-1]["status"] == 200


async def test_reasoning_reply(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "2+2? [[think]]"), chat_job("j2", "long [[think:unclosed]]"))
    await serve(make_worker(horde, fast), horde, submitted("j1", "j2"))
    first = horde.final("j1")
    assert first["message"]["content"] == f"{GREETING} 2+2?"
    assert first["message"]["reasoning_content"] == "Scripted reasoning about: 2+2?"
    assert first["reasoning_tokens"] == 4
    cut = horde.final("j2")
    assert cut["message"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Scripted reasoning about: long",
    }
    assert cut["finish_reason"] == "length"


async def test_legacy_text_job(horde: StandInHorde, fast: Timings) -> None:
    horde.add(text_job("t1", "A story.\nOnce upon a time", sampler_seed=77))
    await serve(make_worker(horde, fast), horde, submitted("t1"))
    assert horde.final("t1") == {
        "id": "t1",
        "generation": f"{GREETING} Once upon a time",
        "state": "ok",
        "seed": 77,
    }
    assert horde.submits_for("t1")[0]["status"] == 200


async def test_strict_json_schema_reply(horde: StandInHorde, fast: Timings) -> None:
    rf = {
        "type": "json_schema",
        "json_schema": {"name": "w", "strict": True, "schema": WEATHER["function"]["parameters"]},
    }
    horde.add(chat_job("j1", "json please", response_format=rf))
    await serve(make_worker(horde, fast), horde, submitted("j1"))
    assert json.loads(horde.final("j1")["message"]["content"]) == {"city": "scripted"}


async def test_messages_url_is_fetched_with_gzip(horde: StandInHorde, fast: Timings) -> None:
    messages = [{"role": "user", "content": "from the offload"}]
    url = horde.serve(
        "/offload/j1.json", gzip.compress(json.dumps(messages).encode()), {"Content-Encoding": "gzip"}
    )
    job = chat_job("j1", "unused")
    del job["payload"]["messages"]
    job["payload"]["messages_url"] = url
    horde.add(job, chat_job("j2", "x"))
    job2 = horde.jobs[-1]
    del job2["payload"]["messages"]
    job2["payload"]["messages_url"] = horde.url + "/offload/missing.json"
    await serve(make_worker(horde, fast), horde, submitted("j1", "j2"))
    assert horde.final("j1")["message"]["content"] == f"{GREETING} from the offload"
    # a failed fetch is faulted without a reason
    assert horde.final("j2") == {"id": "j2", "state": "faulted", "model_id": MODEL}


# -- faults -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("marker", "reason"),
    [
        ("[[fault:prompt_overflow]]", "prompt_overflow"),
        ("[[fault:unbuildable_grammar]]", "unbuildable_grammar"),
        ("[[fault:tool_violation]]", "tool_violation"),
        ("[[fault:generation_error]]", "generation_error"),
        ("[[fault:crash]]", "generation_error"),
        ("[[fault:reply_refused]]", "reply_refused"),
    ],
)
async def test_each_fault_reason_reaches_submit(
    horde: StandInHorde, fast: Timings, marker: str, reason: str
) -> None:
    horde.add(chat_job("j1", f"please {marker}", tools=[WEATHER], tool_choice="auto"))
    until = (lambda h: len(h.submits_for("j1")) >= 2) if reason == "reply_refused" else submitted("j1")
    await serve(make_worker(horde, fast), horde, until)
    subs = horde.submits_for("j1")
    if reason == "reply_refused":
        # the reply went first and was refused with a 400; then the fault followed
        assert subs[0]["status"] == 400 and "message" in subs[0]["body"]
    else:
        assert len(subs) == 1
    assert subs[-1]["body"] == {"id": "j1", "state": "faulted", "model_id": MODEL, "fault_reason": reason}
    assert subs[-1]["status"] == 200
    assert worker_fault_count(horde) == 1


def worker_fault_count(horde: StandInHorde) -> int:
    return sum(1 for s in horde.submits if s["body"].get("state") == "faulted")


async def test_prompt_overflow_counted_before_generating(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "word " * 200, max_length=64, max_context_length=128))
    await serve(make_worker(horde, fast), horde, submitted("j1"))
    assert horde.final("j1")["fault_reason"] == "prompt_overflow"


async def test_fault_without_reason_and_text_fault(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "[[fault:none]]"), text_job("t1", "[[fault:generation_error]]"))
    await serve(make_worker(horde, fast), horde, submitted("j1", "t1"))
    assert horde.final("j1") == {"id": "j1", "state": "faulted", "model_id": MODEL}
    assert horde.final("t1") == {"id": "t1", "state": "faulted", "generation": "faulted", "seed": -1}


async def test_reply_refused_after_any_other_400(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "hello"))
    horde.script_submit("j1", (400, {"message": "not a JSON object", "rc": "ChatSubmitNonconformant"}))
    await serve(make_worker(horde, fast), horde, submitted("j1", count=2))
    subs = horde.submits_for("j1")
    assert [s["status"] for s in subs] == [400, 200]
    assert "message" in subs[0]["body"]
    assert subs[1]["body"] == {
        "id": "j1",
        "state": "faulted",
        "model_id": MODEL,
        "fault_reason": "reply_refused",
    }


# -- retries and drops ------------------------------------------------------------------------------------------------


async def test_retries_on_5xx_and_lost_connections(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "hello"))
    horde.script_submit("j1", (500, {"message": "boom", "rc": "InternalServerError"}), (0, {}), (503, {}))
    await serve(
        make_worker(horde, fast), horde, lambda h: any(s["status"] == 200 for s in h.submits_for("j1"))
    )
    subs = horde.submits_for("j1")
    assert [s["status"] for s in subs] == [500, 0, 503, 200]
    assert all(s["body"] == subs[0]["body"] for s in subs)  # the same reply, resent unchanged
    assert subs[-1]["at"] - subs[0]["at"] >= 0.02 * 3  # with backoff


async def test_fault_submits_retry_too(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "[[fault:generation_error]]"))
    horde.script_submit("j1", (502, {}))
    await serve(make_worker(horde, fast), horde, submitted("j1", count=2))
    assert [s["status"] for s in horde.submits_for("j1")] == [502, 200]


@pytest.mark.parametrize(
    "answer",
    [
        (404, {"message": "no such job", "rc": "InvalidJobID"}),
        (
            400,
            {
                "message": "Processing Generation with ID j1 does not exist within 150 seconds",
                "rc": "AbortedGen",
            },
        ),
        (400, {"message": "already submitted", "rc": "DuplicateGen"}),
    ],
)
async def test_drops(horde: StandInHorde, fast: Timings, answer: tuple[int, dict[str, Any]]) -> None:
    horde.add(chat_job("j1", "hello"), chat_job("j2", "next"))
    horde.script_submit("j1", answer)
    await serve(make_worker(horde, fast), horde, submitted("j2"))
    assert len(horde.submits_for("j1")) == 1  # no retry, no fault
    assert horde.submits_for("j2")[0]["status"] == 200
    assert worker_fault_count(horde) == 0


async def test_pop_errors_do_not_stop_the_loop(horde: StandInHorde, fast: Timings) -> None:
    horde.pop_script.extend(
        [(500, {"message": "x", "rc": "InternalServerError"}), (0, {}), (403, {"rc": "WorkerMaintenance"})]
    )
    horde.add(chat_job("j1", "hello"))
    await serve(make_worker(horde, fast), horde, submitted("j1"))
    assert len(horde.pops) >= 4


async def test_unreachable_horde_is_retried(fast: Timings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings = WorkerSettings(horde_url=dead, model_id=MODEL)
    worker = Worker(settings, ScriptedBackend(), timings=fast)
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(0.3)
    assert worker.metrics.pops.labels("error")._value.get() >= 2
    worker.request_stop()
    await asyncio.wait_for(task, 5)


def test_empty_pop_backoff_counts() -> None:
    assert [empty_pop_delay(n) for n in (1, 10, 11, 25, 26, 1000)] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


async def test_empty_pops_back_off(horde: StandInHorde) -> None:
    timings = Timings(empty_pop=(0.01, 0.05, 0.1))
    worker = make_worker(horde, timings)
    task = asyncio.create_task(worker.run())
    await asyncio.to_thread(horde.wait_for, lambda h: len(h.pops) >= 13, 10)
    worker.request_stop()
    await asyncio.wait_for(task, 5)
    # gaps between pops are not asserted (timing jitter); the count rule is tested above
    assert worker.metrics.pops.labels("empty")._value.get() >= 13


def test_api_url() -> None:
    assert api_url("http://h:1/", "/api/v2/generate/text/pop") == "http://h:1/api/v2/generate/text/pop"
    assert api_url("https://h/api", "/api/v2/generate/text/pop") == "https://h/api/v2/generate/text/pop"


async def test_dispatch_and_submit_urls_are_separate(fast: Timings) -> None:
    with StandInHorde() as dispatch, StandInHorde() as submit:
        dispatch.add(chat_job("j1", "hello"))
        submit.assigned["j1"] = {"model": MODEL, "chat": True}
        settings = WorkerSettings(dispatch_url=dispatch.url, submit_url=submit.url, model_id=MODEL)
        worker = Worker(settings, ScriptedBackend(), timings=fast)
        await serve(worker, submit, submitted("j1"))
        assert submit.submits_for("j1")[0]["status"] == 200
        assert dispatch.submits == [] and submit.pops == []


# -- concurrency and shutdown -----------------------------------------------------------------------------------------


async def test_threads_run_jobs_concurrently(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "a [[sleep:0.5]]"), chat_job("j2", "b [[sleep:0.5]]"))
    worker = make_worker(horde, fast, threads=2)
    started = time.monotonic()
    await serve(worker, horde, submitted("j1", "j2"))
    assert time.monotonic() - started < 0.95
    assert horde.pops[0]["body"]["threads"] == 2


async def test_shutdown_lets_a_held_job_finish(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "slow [[sleep:0.4]]"))
    worker = make_worker(horde, fast)
    task = asyncio.create_task(worker.run())
    await asyncio.to_thread(horde.wait_for, lambda h: len(h.pops) >= 1, 5)
    worker.request_stop()
    assert worker.state == "stopping"
    await asyncio.wait_for(task, 5)
    assert horde.final("j1")["message"]["content"] == f"{GREETING} slow"
    pops = len(horde.pops)
    await asyncio.sleep(0.1)
    assert len(horde.pops) == pops and worker.state == "stopped"


async def test_shutdown_faults_a_job_past_the_grace(horde: StandInHorde, fast: Timings) -> None:
    horde.add(chat_job("j1", "hang [[sleep:30]]"))
    worker = make_worker(horde, fast, shutdown_grace=0.2)
    task = asyncio.create_task(worker.run())
    await asyncio.to_thread(horde.wait_for, lambda h: len(h.pops) >= 1, 5)
    worker.request_stop()
    await asyncio.wait_for(task, 60)  # a hang guard
    # Faulted, not submitted after its 30 s: the grace ended it.
    assert horde.final("j1") == {"id": "j1", "state": "faulted", "model_id": MODEL}


async def test_second_stop_faults_at_once(horde: StandInHorde, fast: Timings) -> None:
    horde.add(text_job("t1", "hang [[sleep:30]]"))
    worker = make_worker(horde, fast, shutdown_grace=60)
    task = asyncio.create_task(worker.run())
    await asyncio.to_thread(horde.wait_for, lambda h: len(h.pops) >= 1, 5)
    worker.request_stop()
    await asyncio.sleep(0.1)
    worker.request_stop()
    await asyncio.wait_for(task, 5)
    assert horde.final("t1")["state"] == "faulted"


async def test_a_hung_backend_is_faulted_after_the_lease(horde: StandInHorde) -> None:
    job = chat_job("j1", "hang [[sleep:30]]")
    job["ttl"] = 0
    horde.add(job)
    worker = make_worker(horde, Timings(lease_margin=0.3, empty_pop=(0.02, 0.02, 0.02)))
    await serve(worker, horde, submitted("j1"))
    assert horde.final("j1")["fault_reason"] == "generation_error"


# -- metrics and the process ------------------------------------------------------------------------------------------


async def test_metrics_and_healthz(horde: StandInHorde, fast: Timings) -> None:
    port = free_port()
    horde.add(chat_job("j1", "hello"), chat_job("j2", "[[fault:prompt_overflow]]"))
    worker = make_worker(horde, fast, metrics_port=port)
    task = asyncio.create_task(worker.run())
    await asyncio.to_thread(horde.wait_for, submitted("j1", "j2"), 10)
    async with httpx.AsyncClient() as client:
        health = await client.get(f"http://127.0.0.1:{port}/healthz")
        metrics = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    worker.request_stop()
    await asyncio.wait_for(task, 5)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert 'horde_worker_jobs_total{kind="chat",outcome="submitted"} 1.0' in metrics
    assert 'horde_worker_faults_total{reason="prompt_overflow"} 1.0' in metrics
    assert 'horde_worker_pops_total{outcome="job"} 2.0' in metrics


def test_console_script_runs_and_stops_on_sigterm(horde: StandInHorde) -> None:
    horde.add(chat_job("j1", "from the process"))
    script = Path(sys.executable).with_name("horde-worker")
    env = {
        "HORDE_WORKER_HORDE_URL": horde.url,
        "HORDE_WORKER_MODEL_ID": MODEL,
        "HORDE_WORKER_API_KEY": "proc-key",
    }
    with ServiceProcess(
        "worker", [str(script), "--name", "proc-worker", "--threads", "1"], env=env, stop_timeout=10
    ) as proc:
        assert horde.wait_for(submitted("j1"), 20), proc.log_tail()
        code = proc.stop()  # SIGTERM, SIGKILL only after 10 s
        log = proc.log_text()
    assert code == 0, log
    assert horde.final("j1")["message"]["content"] == f"{GREETING} from the process"
    assert horde.pops[0]["body"]["name"] == "proc-worker"


def test_help_exits_cleanly() -> None:
    script = Path(sys.executable).with_name("horde-worker")
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for flag in (
        "--api-key",
        "--dispatch-url",
        "--submit-url",
        "--backend",
        "--metrics-port",
        "--prompt-jobs",
    ):
        assert flag in out.stdout
