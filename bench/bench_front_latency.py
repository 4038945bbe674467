"""Benchmark of the OpenAI front's own overhead: a completion the worker answers at once, end to end.

Run: ``uv run python bench/bench_front_latency.py`` (a quick run: 2 s of idle before the "first after idle"
requests); ``--idle 30`` for the real run (p50 under 150 ms, also for the first request after 30 s of
quiet). Admission, dispatch, submit and the OpenAI front (``python -m horde_oai``) run as processes on the real
PostgreSQL and Redis of horde_testing, on free ports, with the settings of ``make run`` (the front forwards its
clients' addresses to admission with a proxy passkey) except the rate limits (admission's chat and key limits,
dispatch's pop limit), which are raised so that back-to-back requests and tight-loop pops are never refused. This process is both the OpenAI client (the ``openai`` SDK,
``AsyncOpenAI``, ``max_retries=0``) and the worker:

- the client sends one request at a time (``POST /v1/chat/completions``); each request's user message carries a
  tag, so the worker can tell its job;
- the worker pops from dispatch in a tight loop (no sleep between empty pops) from the moment the client sends
  until it has the request's job, then submits the reply at once (a structured submit to submit's HTTP route,
  one keep-alive connection each for pops and submits). Its time, from the pop's response to the submit's
  answer, is known exactly; ``--pop-wait S`` sends ``wait_seconds: S`` with every pop (the long-poll pop,
  where dispatch supports it) instead of the tight loop.

Per request (one process, monotonic clock):

- ``e2e``: the SDK call, from just before it to its return;
- ``worker``: the popped job's pop response → the submit's answer (the worker's own time);
- ``overhead`` = e2e − worker: what the horde adds, i.e. the front (its checks, the native submit to
  admission, the wake-up on the completion signal, the status re-read, the reply) plus queue → pop;
- ``to pop``: just before the SDK call → the job's pop response (the front's work up to the native submit's
  commit, and the pop that found the job);
- ``after submit``: the submit's answer → the SDK call's return (the completion signal through Redis, the
  front's status re-read and its reply): the front's wake-up overhead alone.

The front's Prometheus ``/metrics`` are read before and after each case: ``horde_oai_native_duration`` gives the
native submit's and status read's mean time and the status reads per request. The front's CPU per request comes
from ``/proc/<pid>/stat`` over the case (an idle case's figure includes the idle loop during the quiet).

Cases: ``warm`` (``--requests`` back-to-back non-streamed completions, after a few warm-up ones), ``streamed``
(``--streamed`` back-to-back ``stream: true`` requests, read to ``[DONE]``: the relayed stream; e2e is to
``[DONE]``), and ``first after idle`` (``--idle-trials`` requests, each after ``--idle`` seconds without any
request; the worker does not pop during the quiet, as an idle worker long-polling would add nothing either).
Every completion must carry the worker's reply; any failure is counted and the script exits 1.

``PYTHONPATH`` reaches the service processes, so a copy of the front's package (e.g. a commit's
``services/oai-front/src``) can be measured without touching the tree: ``PYTHONPATH=/tmp/before/src uv run
python bench/bench_front_latency.py``. On a shared machine, compare side by side instead: ``--baseline DIR``
runs a second front, whose ``PYTHONPATH`` starts with DIR, beside the tree's, on the same admission, dispatch,
submit and stores; the two take turns every ``--block`` requests (5: each front still sees requests back to
back, which the signal hub's old 50 ms race needed), and every idle trial alternates. E.g.::

    git archive HEAD services/oai-front/src | tar -x -C /tmp/before
    uv run python bench/bench_front_latency.py --idle 30 --baseline /tmp/before/services/oai-front/src
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from _harness import (
    Service,
    bench_parser,
    bench_stores,
    exit_on_failures,
    percentile_ms,
    print_table,
    running_services,
    seed_client_and_owner,
)

MODEL = "bench/front-latency-7b"
WORKER_NAME = "bench-front-latency-worker"
TAG = re.compile(r"latencytag:([^;]+);")
PASSKEY = "bench-front-latency-passkey"
RAISED_LIMITS = {
    "HORDE_CHAT_REQUEST_2SEC_LIMIT_PER_IP": "100000/second",
    "HORDE_CHAT_REQUEST_90MIN_LIMIT_PER_IP": "100000/second",
    "HORDE_APIKEY_REQUEST_LIMIT": "100000/second",
    # The bench worker pops in a tight loop, far above the 60 pops a second of one address.
    "HORDE_POP_REQUEST_LIMIT_PER_IP": "100000/second",
    "HORDE_OAI_PROXY_PASSKEY": PASSKEY,
    "HORDE_PROXY_PASSKEYS": f'["{PASSKEY}"]',
}
METRIC_LINE = re.compile(
    r'^horde_oai_native_duration_(sum|count)\{(?=[^}]*route="(\w+)")[^}]*\}\s+([0-9.eE+-]+)$'
)


def reply_text(tag: str) -> str:
    return f"Reply to {tag}."


def pop_body(wait: float) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": WORKER_NAME,
        "models": [MODEL],
        "max_length": 1024,
        "max_context_length": 8192,
        "threads": 1,
        "amount": 1,
        "bridge_agent": "Horde Chat Worker:0.1.0:bench",
        "softprompts": [],
        "chat_jobs": True,
        "prompt_jobs": False,
        "chat_features": ["seed", "prompt_overflow_refused"],
        "chat_limits": {"max_context_length": 8192, "max_length": 1024},
        "model_id": MODEL,
        "image_transports": [],
    }
    if wait > 0:
        body["wait_seconds"] = wait
    return body


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        with open("/proc/loadavg") as f:
            return "loadavg " + f.read().strip()


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in os.environ (the service processes inherit it) for the block."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def running_stack(
    dsn: str, redis_url: str, baseline: str | None = None
) -> Iterator[tuple[list[tuple[str, Service]], Service, Service, Service]]:
    """dispatch and submit, then admission (pointed at their gRPC ports) and the front (at admission); with
    ``baseline``, a second front beside it whose ``PYTHONPATH`` starts with that directory. Yields
    ``([(label, front), ...], admission, dispatch, submit)``."""
    with ExitStack() as stack:
        stack.enter_context(environment(RAISED_LIMITS))
        [dispatch] = stack.enter_context(running_services("dispatch", dsn, redis_url, names=["dispatch"]))
        [submit] = stack.enter_context(running_services("submit", dsn, redis_url, names=["submit"]))
        stack.enter_context(
            environment(
                {
                    "HORDE_DISPATCH_GRPC_TARGET": f"127.0.0.1:{dispatch.process.env['HORDE_DISPATCH_GRPC_PORT']}",
                    "HORDE_SUBMIT_GRPC_TARGET": f"127.0.0.1:{submit.process.env['HORDE_SUBMIT_GRPC_PORT']}",
                }
            )
        )
        [admission] = stack.enter_context(running_services("admission", dsn, redis_url, names=["admission"]))
        stack.enter_context(environment({"HORDE_OAI_HORDE_URL": admission.url("/api")}))
        fronts: list[tuple[str, Service]] = []
        if baseline:
            path = os.pathsep.join(p for p in (baseline, os.environ.get("PYTHONPATH")) if p)
            with environment({"PYTHONPATH": path}):
                [front] = stack.enter_context(running_services("oai", dsn, redis_url, names=["oai-baseline"]))
            fronts.append(("baseline", front))
        [front] = stack.enter_context(running_services("oai", dsn, redis_url, names=["oai-front"]))
        fronts.append(("tree" if baseline else "front", front))
        yield fronts, admission, dispatch, submit


async def seed(dsn: str) -> tuple[str, str]:
    """The requester (kudos and concurrency to spare) and the worker owner: their API keys."""
    return await seed_client_and_owner(dsn, "latency", 1000)


@dataclass
class Sample:
    """One request's timeline (monotonic seconds)."""

    sent: float = 0.0
    popped: float = 0.0  # the pop response that carried the job
    pops: int = 0  # pops made for this request (empty ones included)
    submitted: float = 0.0  # the submit's answer
    returned: float = 0.0  # the SDK call's return ([DONE] for a stream)
    error: str = ""

    @property
    def e2e(self) -> float:
        return self.returned - self.sent

    @property
    def worker(self) -> float:
        return self.submitted - self.popped

    @property
    def to_pop(self) -> float:
        return self.popped - self.sent

    @property
    def after_submit(self) -> float:
        return self.returned - self.submitted


class Worker:
    """The bench worker: pops the job of one request, submits its reply at once."""

    def __init__(self, dispatch: Service, submit: Service, owner_key: str, pop_wait: float) -> None:
        self.pop_url = dispatch.url("/api/v2/generate/text/pop")
        self.submit_url = submit.url("/api/v2/generate/text/submit")
        self.headers = {"apikey": owner_key}
        self.pop_wait = pop_wait
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self.popper = httpx.AsyncClient(limits=limits, timeout=60.0, trust_env=False)
        self.submitter = httpx.AsyncClient(limits=limits, timeout=60.0, trust_env=False)

    async def aclose(self) -> None:
        await self.popper.aclose()
        await self.submitter.aclose()

    async def check_in(self) -> None:
        """One empty pop, so the worker is online and admission knows its model."""
        r = await self.popper.post(self.pop_url, json=pop_body(0), headers=self.headers)
        r.raise_for_status()

    async def serve(self, tag: str, sample: Sample, deadline: float) -> None:
        """Pop until the job of ``tag`` comes, then submit its reply."""
        while time.monotonic() < deadline:
            r = await self.popper.post(self.pop_url, json=pop_body(self.pop_wait), headers=self.headers)
            now = time.monotonic()
            sample.pops += 1
            if r.status_code != 200:
                sample.error = f"pop: {r.status_code} {r.text[:200]}"
                return
            job = r.json()
            if not job.get("id"):
                continue
            found = TAG.search(str(job.get("payload")))
            if found is None or found.group(1) != tag:
                sample.error = f"pop: a job of another request ({found.group(1) if found else None})"
                continue
            sample.popped = now
            body = {
                "id": job["id"],
                "message": {"role": "assistant", "content": reply_text(tag)},
                "finish_reason": "stop",
                "native_finish_reason": "eos",
                "model_id": MODEL,
            }
            r = await self.submitter.post(self.submit_url, json=body, headers=self.headers)
            sample.submitted = time.monotonic()
            if r.status_code != 200:
                sample.error = f"submit: {r.status_code} {r.text[:200]}"
            return
        sample.error = "pop: the job never came"


async def native_calls(client: httpx.AsyncClient, front: Service) -> dict[str, tuple[float, float]]:
    """The front's ``horde_oai_native_duration`` sum and count by route (every status class)."""
    r = await client.get(front.url("/metrics"))
    found: dict[str, tuple[float, float]] = {}
    for line in r.text.splitlines():
        m = METRIC_LINE.match(line)
        if m:
            kind, route, value = m.group(1), m.group(2), float(m.group(3))
            total, count = found.get(route, (0.0, 0.0))
            found[route] = (total + value, count) if kind == "sum" else (total, count + value)
    return found


@dataclass
class Case:
    name: str
    front: str = "front"
    samples: list[Sample] = field(default_factory=list)
    native: dict[str, tuple[float, float]] = field(default_factory=dict)  # route → (seconds, calls)
    front_cpu: float = 0.0  # the front process's CPU seconds over the case (its metrics reads included)

    def failures(self) -> list[str]:
        return [s.error for s in self.samples if s.error]

    def ok(self) -> list[Sample]:
        return [s for s in self.samples if not s.error]


class Bench:
    def __init__(self, front: Service, worker: Worker, client_key: str, *, verbose: bool = False) -> None:
        self.front = front
        self.verbose = verbose
        self.worker = worker
        self.sdk = openai.AsyncOpenAI(
            base_url=front.url("/v1"), api_key=client_key, max_retries=0, timeout=60.0
        )
        self.metrics = httpx.AsyncClient(timeout=30.0, trust_env=False)
        self.run = uuid.uuid4().hex[:8]
        self.seq = 0

    async def aclose(self) -> None:
        await self.sdk.close()
        await self.metrics.aclose()

    async def one(self, case: str, streamed: bool) -> Sample:
        self.seq += 1
        tag = f"{self.run}-{case}-{self.seq}"
        sample = Sample()
        messages: Any = [{"role": "user", "content": f"Answer the bench. latencytag:{tag};"}]
        sample.sent = time.monotonic()
        serving = asyncio.create_task(self.worker.serve(tag, sample, sample.sent + 30.0))
        asking = asyncio.create_task(self.ask(tag, sample, messages, streamed))
        await asyncio.wait({serving, asking}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done() and sample.error:
            # The worker failed: nobody will answer the request, so stop waiting for it.
            asking.cancel()
        elif asking.done() and sample.error:
            # The request failed: its job will never come.
            serving.cancel()
        await asyncio.gather(serving, asking, return_exceptions=True)
        return sample

    async def ask(self, tag: str, sample: Sample, messages: Any, streamed: bool) -> None:
        try:
            if streamed:
                stream = await self.sdk.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=64, stream=True
                )
                text = ""
                async for chunk in stream:
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
            else:
                completion = await self.sdk.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=64
                )
                text = completion.choices[0].message.content or ""
            sample.returned = time.monotonic()
            if text != reply_text(tag) and not sample.error:
                sample.error = f"{tag}: reply {text[:100]!r}"
        except openai.OpenAIError as exc:
            sample.returned = time.monotonic()
            sample.error = sample.error or f"{tag}: {type(exc).__name__}: {str(exc)[:300]}"

    async def native_calls(self) -> dict[str, tuple[float, float]]:
        return await native_calls(self.metrics, self.front)

    def cpu(self) -> float:
        proc = self.front.process.proc
        return process_cpu(proc.pid) if proc is not None else 0.0


async def run_case(
    benches: list[tuple[str, Bench]],
    name: str,
    count: int,
    *,
    streamed: bool = False,
    idle: float = 0.0,
    block: int = 1,
) -> list[Case]:
    """``count`` requests on each front, the fronts taking turns every ``block`` requests (so a noisy machine
    weighs on each alike, while each front still sees ``block`` requests back to back); with ``idle``, every
    request follows that many seconds without any request."""
    results = [Case(name, label) for label, _ in benches]
    before = [await bench.native_calls() for _, bench in benches]
    cpu_before = [bench.cpu() for _, bench in benches]
    for start in range(0, count, block):
        for (label, bench), result in zip(benches, results, strict=True):
            for _ in range(min(block, count - start)):
                if idle:
                    # Nothing may touch the stack during the quiet: the metrics are read outside it.
                    await asyncio.sleep(idle)
                sample = await bench.one(name.split()[0], streamed)
                result.samples.append(sample)
                if bench.verbose:
                    print(
                        f"{label} {name}: e2e {1000 * sample.e2e:.1f} ms, to pop {1000 * sample.to_pop:.1f} ms, "
                        f"worker {1000 * sample.worker:.1f} ms, after submit {1000 * sample.after_submit:.1f} ms, "
                        f"{sample.pops} pops; sent at {sample.sent:.4f} (monotonic) {sample.error}",
                        file=sys.stderr,
                    )
    for (_, bench), result, earlier, cpu in zip(benches, results, before, cpu_before, strict=True):
        result.front_cpu = bench.cpu() - cpu
        after = await bench.native_calls()
        result.native = {
            route: (total - earlier.get(route, (0.0, 0.0))[0], calls - earlier.get(route, (0.0, 0.0))[1])
            for route, (total, calls) in after.items()
        }
    return results


def ms_cells(values: list[float]) -> list[str]:
    if not values:
        return ["-"] * 3
    return [
        f"{percentile_ms(values, 0.5):.1f}",
        f"{percentile_ms(values, 0.9):.1f}",
        f"{1000 * max(values):.1f}",
    ]


def native_cells(case: Case) -> list[str]:
    requests = max(1, len(case.samples))
    cells = []
    for route in ("submit", "status"):
        total, calls = case.native.get(route, (0.0, 0.0))
        cells.append(f"{1000 * total / calls:.1f}" if calls else "-")
    _, reads = case.native.get("status", (0.0, 0.0))
    cells.append(f"{reads / requests:.1f}")
    return cells


def print_cases(cases: list[Case]) -> None:
    compare = len({c.front for c in cases}) > 1
    columns = [
        *(["front"] if compare else []),
        "case",
        "requests",
        "e2e p50 ms",
        "p90",
        "max",
        "overhead p50 ms",
        "p90",
        "max",
        "worker p50 ms",
        "to pop p50 ms",
        "after submit p50 ms",
        "p90",
        "native submit mean ms",
        "status read mean ms",
        "status reads/request",
        "front CPU ms/request",
        "pops/request",
    ]
    rows = []
    for case in cases:
        ok = case.ok()
        failures = case.failures()
        pops = sum(s.pops for s in ok) / len(ok) if ok else 0.0
        rows.append(
            (
                [
                    *([case.front] if compare else []),
                    case.name,
                    f"{len(ok)}/{len(case.samples)}",
                    *ms_cells([s.e2e for s in ok]),
                    *ms_cells([s.e2e - s.worker for s in ok]),
                    ms_cells([s.worker for s in ok])[0],
                    ms_cells([s.to_pop for s in ok])[0],
                    *ms_cells([s.after_submit for s in ok])[:2],
                    *native_cells(case),
                    f"{1000 * case.front_cpu / max(1, len(case.samples)):.1f}",
                    f"{pops:.1f}",
                ],
                failures[0] if failures else "",
            )
        )
    print_table(columns, rows, left=2 if compare else 1)


def main() -> None:
    parser = bench_parser(__doc__ or "", quick_help="fewer requests (10, 3 streamed, 2 after idle)")
    parser.add_argument("--requests", type=int, default=30, help="back-to-back non-streamed completions")
    parser.add_argument("--streamed", type=int, default=5, help="back-to-back streamed completions")
    parser.add_argument("--idle", type=float, default=2.0, help="seconds of quiet before each idle trial")
    parser.add_argument("--idle-trials", type=int, default=3, help="requests after --idle seconds of quiet")
    parser.add_argument(
        "--pop-wait",
        type=float,
        default=0.0,
        help="send wait_seconds with every pop (the long-poll pop) instead of popping in a tight loop",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also run a second front whose PYTHONPATH starts with DIR (e.g. an older services/oai-front/src); "
        "the two fronts take turns request by request, on the same admission, dispatch, submit and stores",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=5,
        help="with --baseline: back-to-back requests on one front before the other takes its turn",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print each request's timeline (monotonic clock) to stderr"
    )
    if parser.parse_args().quick:  # smaller defaults; arguments given explicitly still win
        parser.set_defaults(requests=10, streamed=3, idle_trials=2)
    args = parser.parse_args()
    load_before = uptime()
    with (
        bench_stores("horde_bench_front_latency") as (pg, rd, dsn),
        running_stack(dsn, rd.url, args.baseline) as (fronts, admission, dispatch, submit),
    ):

        async def run_all() -> list[Case]:
            client_key, owner_key = await seed(dsn)
            worker = Worker(dispatch, submit, owner_key, args.pop_wait)
            benches = [
                (label, Bench(front, worker, client_key, verbose=args.verbose)) for label, front in fronts
            ]
            try:
                await worker.check_in()
                await run_case(benches, "warm-up", 5)
                await run_case(benches, "warm-up", 2, streamed=True)
                cases = await run_case(benches, "warm", args.requests, block=args.block)
                cases += await run_case(benches, "streamed", args.streamed, streamed=True, block=args.block)
                cases += await run_case(
                    benches, f"first after {args.idle:g} s idle", args.idle_trials, idle=args.idle
                )
                # Grouped by front in the table.
                return sorted(cases, key=lambda c: [label for label, _ in fronts].index(c.front))
            finally:
                for _, bench in benches:
                    await bench.aclose()
                await worker.aclose()

        cases = asyncio.run(run_all())
        if any(c.failures() for c in cases):
            for service in [front for _, front in fronts] + [admission]:
                print(service.process.log_tail(40), file=sys.stderr)
    load_after = uptime()
    print(
        f"# front latency bench: Python {platform.python_version()}, {os.cpu_count()} cores, one process each of "
        f"admission, dispatch, submit and the front"
        + (f" (and a baseline front from {args.baseline}, taking turns)" if args.baseline else "")
        + f", {pg.source} postgres, {rd.source} redis; worker "
        + (f"long-polls (wait_seconds {args.pop_wait:g})" if args.pop_wait > 0 else "pops in a tight loop")
    )
    print(f"# load before: {load_before}")
    print(f"# load after:  {load_after}")
    print_cases(cases)
    exit_on_failures([{"failures": len(c.failures())} for c in cases])


if __name__ == "__main__":
    main()
