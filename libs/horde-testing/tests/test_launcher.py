"""ServiceProcess: start, health, stop, kill, restart, failure reporting, and no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from horde_testing.launcher import ServiceError, ServiceProcess, free_port

# A tiny HTTP service that also starts a grandchild, to check that the whole process group goes.
SERVICE = textwrap.dedent(
    """
    import http.server, os, subprocess, sys
    port = int(os.environ["SVC_PORT"])
    if os.environ.get("SVC_GRANDCHILD"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        print("grandchild", child.pid, flush=True)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()
            self.wfile.write(str(os.getpid()).encode())
        def log_message(self, *a):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is as good as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _grandchild(svc: ServiceProcess) -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in svc.log_text().splitlines():
            if line.startswith("grandchild "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError("no grandchild line in the log")


def _service(tmp_path: Path) -> tuple[ServiceProcess, int]:
    script = tmp_path / "svc.py"
    script.write_text(SERVICE)
    port = free_port()
    svc = ServiceProcess(
        "tiny",
        [sys.executable, str(script)],
        env={"SVC_PORT": str(port), "SVC_GRANDCHILD": "1"},
        health_url=f"http://127.0.0.1:{port}/healthz",
        stop_timeout=5,
    )
    return svc, port


def test_start_healthy_stop_leaves_no_process(tmp_path: Path) -> None:
    svc, port = _service(tmp_path)
    with svc:
        assert svc.running
        pid = svc.pid
        assert pid is not None
        assert os.getpgid(pid) == pid  # its own process group
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False).text == str(pid)
        grandchild = _grandchild(svc)
    assert not svc.running
    assert _wait_gone(pid) and _wait_gone(grandchild)
    assert not svc.log_path.exists()


def test_kill_and_restart(tmp_path: Path) -> None:
    svc, port = _service(tmp_path)
    with svc:
        first = svc.pid
        assert svc.kill() == -signal.SIGKILL
        assert not svc.running and _wait_gone(first)  # type: ignore[arg-type]
        svc.restart()
        assert svc.running and svc.pid != first and svc.starts == 2
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False).status_code == 200
        second = svc.pid
        svc.restart()
        assert _wait_gone(second)  # type: ignore[arg-type]
        assert "--- start #3" in svc.log_text()


def test_a_failing_service_reports_its_log(tmp_path: Path) -> None:
    svc = ServiceProcess(
        "broken",
        [sys.executable, "-c", "import sys; print('boom: bad config', flush=True); sys.exit(3)"],
        health_url=f"http://127.0.0.1:{free_port()}/healthz",
    )
    with pytest.raises(ServiceError) as err, svc:
        pass
    assert "exited with 3" in str(err.value) and "boom: bad config" in str(err.value)

    slow = ServiceProcess(
        "silent",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        health_url=f"http://127.0.0.1:{free_port()}/healthz",
        startup_timeout=0.5,
    )
    with pytest.raises(ServiceError, match="not healthy"), slow:
        pass
    assert not slow.running


def test_services_die_with_a_killed_test_process(tmp_path: Path) -> None:
    """SIGKILL of the process that launched a service (no cleanup code runs) still ends the service."""
    script = tmp_path / "svc.py"
    script.write_text(SERVICE)
    port = free_port()
    parent_code = textwrap.dedent(
        f"""
        import sys, time
        from horde_testing.launcher import ServiceProcess
        svc = ServiceProcess("tiny", [sys.executable, {str(script)!r}], env={{"SVC_PORT": "{port}"}},
                             health_url="http://127.0.0.1:{port}/healthz")
        svc.start(); svc.wait_healthy()
        print(svc.pid, svc.log_path, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid_text, log_path = parent.stdout.readline().split()
        pid = int(pid_text)
        assert _alive(pid)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    assert _wait_gone(pid)
    Path(log_path).unlink()  # the killed parent could not remove it


def test_env_url_and_wait_log(tmp_path: Path) -> None:
    """``env`` goes on top of ours; ``url`` is kept; ``wait_log`` returns once a line (or a test) is in the log,
    and the log as it is when the wait ends without it."""
    script = tmp_path / "late.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, time
            print("env", os.environ["SVC_VALUE"], "PATH" in os.environ, flush=True)
            time.sleep(0.3)
            print("ready later", flush=True)
            time.sleep(300)
            """
        )
    )
    svc = ServiceProcess("late", [sys.executable, str(script)], env={"SVC_VALUE": "v1"}, url="http://svc")
    with svc:
        assert svc.url == "http://svc"
        assert "ready later" in svc.wait_log("ready later", timeout=30)
        assert "env v1 True" in svc.wait_log(lambda text: "env v1" in text, timeout=30)
        assert "never" not in svc.wait_log("never", timeout=0.1)
    with pytest.raises(ServiceError, match="no url"):
        _ = ServiceProcess("nameless", [sys.executable, "-c", "pass"]).url
