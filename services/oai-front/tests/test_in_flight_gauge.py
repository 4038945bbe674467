"""``horde_oai_completions_in_flight`` (the front's autoscaling signal) counts the completions a front process
holds open, and a request refused at the cap does not count."""

from __future__ import annotations

import socket
import threading

import httpx

from .conftest import start_front

DEADLINE_SECONDS = 30


def in_flight(url: str) -> str:
    """The gauge's sample line on the front's /metrics."""
    metrics = httpx.get(f"{url}/metrics", timeout=10)
    assert metrics.status_code == 200
    [line] = [x for x in metrics.text.splitlines() if x.startswith("horde_oai_completions_in_flight ")]
    return line


def test_gauge_counts_completions_held_open():
    # A native horde that accepts a connection and answers nothing keeps the request in flight.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.settimeout(DEADLINE_SECONDS)
        front = start_front(
            {
                "HORDE_OAI_HORDE_URL": f"http://127.0.0.1:{silent.getsockname()[1]}/api",
                "HORDE_OAI_REDIS_URL": "",
                "HORDE_OAI_SUBMIT_RETRIES": "0",
                "HORDE_OAI_MAX_IN_FLIGHT_PER_ADDRESS": "1",
            }
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": "Bearer k"}
        held: dict[str, httpx.Response] = {}
        first = threading.Thread(
            target=lambda: held.setdefault(
                "r",
                httpx.post(f"{front.url}/v1/chat/completions", json=body, headers=headers, timeout=60),
            )
        )
        try:
            assert in_flight(front.url) == "horde_oai_completions_in_flight 0.0"
            first.start()
            native, _ = silent.accept()  # the request passed the cap and is calling the horde
            with native:
                assert in_flight(front.url) == "horde_oai_completions_in_flight 1.0"
                refused = httpx.post(f"{front.url}/v1/chat/completions", json=body, headers=headers)
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "FrontAtCapacity"
                assert in_flight(front.url) == "horde_oai_completions_in_flight 1.0"
            first.join(DEADLINE_SECONDS)  # the horde hung up: the request ends (502)
            assert held["r"].status_code == 502, held["r"].text
            assert held["r"].json()["error"]["code"] is not None
            assert in_flight(front.url) == "horde_oai_completions_in_flight 0.0"
        finally:
            front.stop()
