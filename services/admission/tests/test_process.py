"""``python -m horde_admission`` runs as its own process: ready on its stores, native paths mounted."""

from __future__ import annotations

import sys

import httpx
from horde_testing.launcher import ServiceProcess, free_port


def test_process_serves_health_and_refuses_bad_keys(admission_env: dict[str, str]) -> None:
    port = free_port()
    env = {
        **admission_env,
        "HORDE_ADMISSION_HTTP_PORT": str(port),
        "HORDE_DISPATCH_GRPC_TARGET": "127.0.0.1:9",
    }
    with ServiceProcess(
        "admission", [sys.executable, "-m", "horde_admission"], env, f"http://127.0.0.1:{port}/readyz"
    ):
        base = f"http://127.0.0.1:{port}"
        ready = httpx.get(f"{base}/readyz", timeout=5)
        assert ready.json()["checks"] == {"database": "ok", "redis": "ok"}
        r = httpx.post(
            f"{base}/api/v2/generate/chat/async",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"apikey": "nope"},
            timeout=5,
        )
        assert r.status_code == 401 and r.json()["rc"] == "InvalidAPIKey"
        assert httpx.get(f"{base}/metrics", timeout=5).status_code == 200
