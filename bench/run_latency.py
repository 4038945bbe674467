"""Completion latency through a running ``make run`` stack.

Run ``make run`` in one terminal, then ``uv run python bench/run_latency.py`` in another. The OpenAI SDK sends
``--count`` sequential non-streamed completions to the front (the demo key and model of ``make run``; the
scripted worker answers at once), one every ``--interval`` seconds at most (0.6 s: the default rate limits allow
2 requests a second per key and per address), then, ``--rounds`` times, waits ``--quiet`` seconds and sends one
more: the first request after a quiet spell. Prints p50/p90/max of each group in milliseconds; each figure is
one request's own time, the pacing is not in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from openai import OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:7002/v1")
    p.add_argument("--key-file", default=".local/demo-user.json")
    p.add_argument("--model", default="scripted/echo")
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--quiet", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.6, help="seconds from one request's start to the next")
    args = p.parse_args()
    key = json.loads(Path(args.key_file).read_text())["api_key"]
    client = OpenAI(base_url=args.base_url, api_key=key, max_retries=0)

    def one(text: str) -> float:
        start = time.perf_counter()
        reply = client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": text}], max_tokens=16
        )
        elapsed = (time.perf_counter() - start) * 1000
        assert reply.choices[0].message.content is not None
        return elapsed

    def paced(text: str) -> float:
        elapsed = one(text)
        time.sleep(max(0.0, args.interval - elapsed / 1000))
        return elapsed

    paced("warm up")
    back_to_back = [paced(f"hello {i}") for i in range(args.count)]
    after_quiet = []
    for i in range(args.rounds):
        time.sleep(args.quiet)
        after_quiet.append(one(f"after quiet {i}"))

    def row(name: str, values: list[float]) -> str:
        # "inclusive": never beyond the largest value, also for a handful of values
        cut = statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
        return f"| {name} | {len(values)} | {statistics.median(values):.0f} | {cut:.0f} | {max(values):.0f} |"

    print("| case | n | p50 ms | p90 ms | max ms |\n|---|---:|---:|---:|---:|")
    print(row("sequential", back_to_back))
    print(row(f"first after {args.quiet:g} s quiet", after_quiet))


if __name__ == "__main__":
    main()
