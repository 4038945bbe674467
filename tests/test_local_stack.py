"""The local stack's supervisor config (horde_testing.local_stack) and replica rule (horde_testing.replicas),
generated from the real Procfile without starting anything: one program per replica on base port + 10·i, the
gRPC target lists, the front's admission URL, restarts, the stop order, and refusals. The processes themselves
(start, kill -9, restart, Ctrl-C) are tests/e2e/test_replicas_local.py; one stack is started here, to run the
OpenAI-SDK line the setup step prints as printed, without uv."""

from __future__ import annotations

import configparser
import io
import socket
from pathlib import Path

import pytest
from horde_testing.local_logs import serve
from horde_testing.local_stack import (
    _free_offset,
    busy_ports,
    main,
    programs,
    read_procfile,
    stack_env,
    supervisor_config,
)
from horde_testing.replicas import SERVICE_PORTS, default_port, grpc_target, http_ports, replica_counts

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = read_procfile(ROOT / "Procfile")


def _config(env: dict[str, str], tmp_path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser()
    parser.read_string(supervisor_config(programs(ENTRIES, env), tmp_path, ROOT))
    return parser


def test_the_procfile_lists_the_stack() -> None:
    assert [name for name, _ in ENTRIES] == [
        "stores",
        "setup",
        "admission",
        "dispatch",
        "submit",
        "janitor",
        "oai",
        "proxy",
        "worker",
    ]


def test_one_replica_each_is_todays_stack(tmp_path: Path) -> None:
    """REPLICAS unset: one program per Procfile line, today's ports, no gRPC lists, the front calls admission
    directly, and the scripts get today's health ports and banner lines."""
    progs = programs(ENTRIES, {})
    assert [p.name for p in progs] == [
        "stores",
        "setup",
        "admission-0",
        "dispatch-0",
        "submit-0",
        "janitor-0",
        "oai-0",
        "proxy",
        "worker",
    ]
    assert progs[3].env == {"HORDE_DISPATCH_HTTP_PORT": "7102", "HORDE_DISPATCH_GRPC_PORT": "7202"}
    env = stack_env({}, tmp_path)
    assert not {"HORDE_DISPATCH_GRPC_TARGET", "HORDE_SUBMIT_GRPC_TARGET", "HORDE_OAI_HORDE_URL"} & set(env)
    assert env["LOCAL_STACK_HEALTH_PORTS"] == "7101 7102 7103 7104 7002"  # local-setup.sh's old list
    assert env["LOCAL_STACK_DIRECT"] == "front :7002, admission :7101, dispatch :7102, submit :7103"
    assert env["LOCAL_STACK_JANITOR"] == "http://127.0.0.1:7104/metrics"
    assert env["LOCAL_STACK_URL"] == "http://127.0.0.1:7000"


def test_replicas_get_their_own_ports_and_the_callers_the_lists(tmp_path: Path) -> None:
    env = {"REPLICAS": "2", "REPLICAS_DISPATCH": "3"}
    assert replica_counts(env) == {"admission": 2, "dispatch": 3, "submit": 2, "janitor": 2, "oai": 2}
    config = _config(env, tmp_path)
    assert config.get("program:dispatch-2", "environment") == (
        'HORDE_DISPATCH_HTTP_PORT="7122",HORDE_DISPATCH_GRPC_PORT="7222"'
    )
    assert config.get("program:oai-1", "environment") == 'HORDE_OAI_HTTP_PORT="7012"'
    assert config.get("program:janitor-1", "environment") == 'HORDE_JANITOR_HTTP_PORT="7114"'
    assert http_ports("admission", env) == [7101, 7111]
    extra = stack_env(env, tmp_path, "127.0.0.1:7000")
    assert extra["HORDE_DISPATCH_GRPC_TARGET"] == "ipv4:127.0.0.1:7202,127.0.0.1:7212,127.0.0.1:7222"
    assert (
        extra["HORDE_SUBMIT_GRPC_TARGET"]
        == grpc_target("submit", env)
        == "ipv4:127.0.0.1:7203,127.0.0.1:7213"
    )
    assert extra["HORDE_OAI_HORDE_URL"] == "http://127.0.0.1:7000/api"  # balanced by the proxy
    assert extra["LOCAL_STACK_HEALTH_PORTS"].split() == [
        *("7101", "7111", "7102", "7112", "7122", "7103", "7113", "7104", "7114", "7002", "7012")
    ]
    assert extra["LOCAL_STACK_DIRECT"].startswith("front :7002 :7012, admission :7101 :7111, dispatch :7102")
    # A setting already made wins (an operator pointing the front elsewhere).
    assert "HORDE_OAI_HORDE_URL" not in stack_env({**env, "HORDE_OAI_HORDE_URL": "http://x/api"}, tmp_path)


def test_every_process_is_restarted_and_stopped_in_order(tmp_path: Path) -> None:
    config = _config({"REPLICAS": "2"}, tmp_path)
    names = [s.removeprefix("program:") for s in config.sections() if s.startswith("program:")]
    assert len(names) == 4 + 2 * 5
    for name in names:
        assert config.get(f"program:{name}", "autorestart") == "true", name
        assert config.get(f"program:{name}", "killasgroup") == "true", name
        assert config.get(f"program:{name}", "directory") == str(ROOT)
    # Stopped in reverse priority: the worker, then the services with the proxy and setup, the stores last.
    assert config.get("program:worker", "priority") == "300"
    assert config.get("group:horde", "priority") == "200"
    assert config.get("program:stores", "priority") == "100"
    assert config.get("program:stores", "stopasgroup") == "false"  # it stops PostgreSQL itself
    assert set(config.get("group:horde", "programs").split(",")) == set(names) - {"stores", "worker"}
    assert config.get("program:admission-1", "command") == (
        "/bin/sh -c 'exec scripts/with-stores.sh .venv/bin/horde-admission'"
    )
    assert config.get("supervisord", "nodaemon") == "true"


def test_bad_counts_and_busy_ports_are_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a count from 1 to 10"):
        replica_counts({"REPLICAS_JANITOR": "11"})
    with pytest.raises(ValueError, match="REPLICAS_ADMISSION / REPLICAS='two' is not a number"):
        programs(ENTRIES, {"REPLICAS": "two"})
    with pytest.raises(ValueError, match="unknown service"):
        http_ports("nobody", {})
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        busy = busy_ports({"HORDE_SUBMIT_HTTP_PORT": str(port - 10), "REPLICAS": "2"}, "127.0.0.1:1")
        assert f"{port} (submit-1 HORDE_SUBMIT_HTTP_PORT)" in busy  # (others: a make run of this machine)


def test_run_writes_the_config_or_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run --no-exec`` (what make run execs, without the exec): the config and a fresh state directory."""
    monkeypatch.setenv("REPLICAS", "2")
    # Free ports (run refuses ports in use, and a make run may hold the default ones).
    offset = _free_offset({"REPLICAS": "2"})
    for ports in SERVICE_PORTS.values():
        for setting in ports:
            monkeypatch.setenv(setting, str(default_port(setting) + offset))
    monkeypatch.setenv("LOCAL_STACK_LISTEN", f"127.0.0.1:{7000 + offset}")
    (tmp_path / "ready").write_text("")
    assert main(["run", "--dir", str(tmp_path), "--root", str(ROOT), "--no-exec"]) == 0
    assert "admission x2" in capsys.readouterr().out
    # A port in use: refused, nothing written.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 7101 + offset))
        held.listen()
        assert main(["run", "--dir", str(tmp_path / "x"), "--root", str(ROOT), "--no-exec"]) == 1
    assert f"ports in use: {7101 + offset} (admission-0 HORDE_ADMISSION_HTTP_PORT)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert not (tmp_path / "ready").exists()
    assert (tmp_path / "proxy-passkey").read_text().strip()
    written = tmp_path / "supervisor" / "supervisord.conf"
    assert "[program:oai-1]" in written.read_text()
    # The control socket asks a password, and the config holding it is the owner's only.
    config = configparser.RawConfigParser()
    config.read(written)
    assert config.get("unix_http_server", "password") == config.get("supervisorctl", "password") != ""
    assert written.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("REPLICAS", "0")
    assert main(["run", "--dir", str(tmp_path), "--root", str(ROOT), "--no-exec"]) == 2
    assert "a count from 1 to 10" in capsys.readouterr().err


def _event(name: str, data: str, eventname: str = "PROCESS_LOG_STDOUT") -> str:
    """An event as supervisor sends it: ``len`` counts the payload's characters (supervisor's process.py)."""
    payload = f"processname:{name} groupname:horde pid:42 channel:stdout\n{data}"
    header = (
        f"ver:3.0 server:supervisor serial:1 pool:logs poolserial:1 eventname:{eventname} len:{len(payload)}"
    )
    return header + "\n" + payload


def test_the_console_prefixes_each_line_with_its_process() -> None:
    """The event listener (horde_testing.local_logs) answers supervisor's protocol and writes whole lines,
    a partial line held until its newline, each with the process's name."""
    stdin = io.StringIO(
        _event("admission-1", "one\ntw")
        + _event("dispatch-0", "ünï 👋\n")
        + _event("admission-1", "o\n")
        + _event("x", "", eventname="TICK_5")
    )
    stdout, out = io.StringIO(), io.StringIO()
    serve(stdin, stdout, out)
    assert stdout.getvalue() == "READY\n" + "RESULT 2\nOKREADY\n" * 4
    lines = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]  # without the time
    assert lines == ["admission-1  | one", "dispatch-0   | ünï 👋", "admission-1  | two"]


def test_the_printed_python_snippet_runs_as_printed_without_uv(
    horde_settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The OpenAI-SDK line ``make run`` prints (scripts/local-setup.sh) runs as printed, from another directory,
    with a PATH that has no ``uv``: it names the checkout's interpreter by its absolute path. Started as ``make
    run`` starts the stack (one of each, on free ports and this module's stores)."""
    import os
    import re
    import shutil
    import subprocess
    import time

    import httpx
    from horde_testing.local_stack import LocalStack

    stack = LocalStack(1, directory=tmp_path_factory.mktemp("ls"), env=horde_settings_env, root=ROOT)
    with stack:
        log = stack.log_text()
        assert "Horde Chat is up." in log
        (line,) = [ln for ln in log.splitlines() if "-c 'from openai import OpenAI" in ln]
        snippet = line.split("|", 1)[1].strip()  # the console's "<time> setup | " prefix off
        assert "uv run" not in snippet
        assert snippet.startswith(str(ROOT / ".venv" / "bin" / "python")), snippet
        assert stack.listen in snippet  # the stack's own URL, not make run's default
        # Until the worker checks in its model is unknown (README: wait for /v1/models to list it).
        deadline = time.monotonic() + 60
        while (
            "scripted/echo" not in httpx.get(f"{stack.urls.front}/models", timeout=10, trust_env=False).text
        ):
            assert time.monotonic() < deadline, "the worker's model was never listed"
            time.sleep(0.2)
        path = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if os.path.isdir(p))
        assert shutil.which("uv", path=path) is None, f"uv is on {path}: pick a PATH without it"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HORDE_", "VIRTUAL_ENV", "UV_"))}
        env["PATH"] = path
        result = subprocess.run(
            ["bash", "-c", snippet],
            cwd=tmp_path_factory.mktemp("elsewhere"),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert re.fullmatch(r"Hello from the scripted backend: Hello, horde!\s*", result.stdout), (
            result.stdout
        )
