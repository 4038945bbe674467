"""Real traffic of unmodified AI Horde text workers, replayed through the one horde URL.

``../shared/fixtures/legacy-worker-traffic.jsonl`` (copied to ``tests/e2e/fixtures/``) holds what the scribe
bridge (KoboldAI and OpenAI modes), KoboldCpp's embedded worker, the Belarrius and the Medusa bridges sent
to the horde, and what they got. Every request is sent again, as recorded, through the local proxy of
``make run`` (Caddy, :mod:`horde_testing.local_proxy`) in front of every service as its own process. What a
replay cannot reuse is replaced, and only that:

* the masked ``<owner api key>`` becomes the key of a trusted worker owner of this stack;
* a submit's job id becomes that of a job this stack handed out: before each submit, a text request is
  queued and popped with the body of the last pop recorded from the same client (by User-Agent), the way the
  recorded worker popped the job it submitted;
* a worker id in a path becomes the id this stack gave the worker of that name.

Each answer must be what the horde answered then, except the routes that were not served when the traffic
was recorded (404 and 405 then): those are 2xx now. No answer is a 404 or a 405.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from horde_testing.launcher import ServiceProcess, free_port

from .conftest import Stack

TRAFFIC = Path(__file__).parent / "fixtures" / "legacy-worker-traffic.jsonl"
MASKED_KEY = "<owner api key>"


def _load() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TRAFFIC.read_text().splitlines() if line.strip()]


def _header(headers: dict[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


@pytest.fixture(scope="module")
def proxy(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The one horde URL in front of the stack's services, started as ``make run`` starts it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path_factory.mktemp("replay-proxy") / "Caddyfile"
    with ServiceProcess(
        "local-proxy",
        [
            *(sys.executable, "-m", "horde_testing.local_proxy"),
            *("--config", str(config), "--listen", f"127.0.0.1:{port}"),
        ],
        env=stack.env,
        health_url=f"{url}/api/v2/status/models?type=text",
        stop_timeout=5,
    ):
        yield url


class Replay:
    """Sends recorded exchanges through the proxy with the substitutions of the module docstring."""

    def __init__(self, stack: Stack, client: httpx.Client) -> None:
        self.stack = stack
        self.client = client
        self.last_pop: dict[str, dict[str, Any]] = {}
        self.worker_names: dict[str, str] = {}

    def headers(self, recorded: dict[str, str]) -> dict[str, str]:
        return {k: (self.stack.worker_key if v == MASKED_KEY else v) for k, v in recorded.items()}

    def send(self, exchange: dict[str, Any]) -> httpx.Response:
        method, path = exchange["method"], exchange["path"]
        headers = self.headers(exchange["request_headers"])
        body: str | None = exchange["request_body"] or None
        agent = _header(headers, "User-Agent") or ""
        if path.endswith("/generate/text/pop"):
            self.last_pop[agent] = json.loads(body or "{}")
        elif path.endswith("/generate/text/submit"):
            submitted = json.loads(body or "{}")
            submitted["id"] = self.queue_and_pop(headers, self.last_pop[agent])
            body = json.dumps(submitted)
        for recorded_id, name in self.worker_names.items():
            path = path.replace(recorded_id, self.worker_id(name))
        return self.client.request(method, path, headers=headers, content=body)

    def learn_worker(self, exchange: dict[str, Any]) -> None:
        """Remember the recorded id of a worker whose details were read, to address it by name later."""
        if exchange["method"] == "GET" and "/workers/" in exchange["path"] and exchange["status"] == 200:
            details = json.loads(exchange["response_body"])
            self.worker_names[details["id"]] = details["name"]

    def worker_id(self, name: str) -> str:
        r = self.client.get(f"/api/v2/workers/name/{name}")
        assert r.status_code == 200, r.text
        return str(r.json()["id"])

    def queue_and_pop(self, headers: dict[str, str], pop: dict[str, Any]) -> str:
        """A job for the worker that sent ``pop``: a text request for its first model, popped with its body."""
        queued = self.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": self.stack.client_key},
            json={
                "prompt": "Once upon a time",
                "params": {"max_length": 40, "max_context_length": min(1024, pop["max_context_length"])},
                "models": [pop["models"][0]],
            },
        )
        assert queued.status_code == 202, queued.text
        popped = self.client.post("/api/v2/generate/text/pop", headers=headers, json=pop)
        assert popped.status_code == 200, popped.text
        job = popped.json()
        assert job["id"] is not None, job
        return str(job["id"])


def _expected(exchange: dict[str, Any]) -> int:
    """The status the horde answers now: the recorded one, or 200 for a route not served when recorded."""
    return 200 if exchange["status"] in (404, 405) else int(exchange["status"])


def test_every_recorded_request_replays_through_the_one_url(stack: Stack, proxy: str) -> None:
    exchanges = _load()
    assert len(exchanges) == 25
    with httpx.Client(base_url=proxy, timeout=30, trust_env=False) as client:
        replay = Replay(stack, client)
        answers: list[tuple[str, int, int, str]] = []
        for exchange in exchanges:
            replay.learn_worker(exchange)
            response = replay.send(exchange)
            answers.append(
                (
                    f"{exchange['method']} {exchange['path']}",
                    _expected(exchange),
                    response.status_code,
                    response.text,
                )
            )
    wrong = [a for a in answers if a[1] != a[2] or a[2] in (404, 405)]
    paid = [json.loads(text) for what, _, got, text in answers if what.endswith("/submit") and got == 200]
    assert len(paid) == 6 and all(isinstance(p["reward"], float | int) and p["reward"] >= 0 for p in paid), (
        paid
    )
    assert not wrong, "\n".join(
        f"{what}: expected {exp}, got {got}: {text[:300]}" for what, exp, got, text in wrong
    )


def test_replayed_refusals_carry_upstreams_rc(stack: Stack, proxy: str) -> None:
    """A worker that submits ``generation: null`` (the scribe and KoboldCpp after a backend failure) gets 400
    BadRequest naming the field, as recorded."""
    refused = [e for e in _load() if e["status"] == 400]
    assert refused
    with httpx.Client(base_url=proxy, timeout=30, trust_env=False) as client:
        replay = Replay(stack, client)
        for exchange in _load():
            if exchange["path"].endswith("/generate/text/pop"):
                replay.send(exchange)
        for exchange in refused:
            response = replay.send(exchange)
            assert response.status_code == 400
            assert response.json() == json.loads(exchange["response_body"])
