"""The local stack of ``make run``: the Procfile's processes under supervisord, each service replicated.

``make run`` (``REPLICAS=N``, ``REPLICAS_<SERVICE>=N``: :mod:`horde_testing.replicas`) execs
``python -m horde_testing.local_stack run``, which

1. reads the ``Procfile`` (the stack's layout: one ``name: command`` line per process type);
2. expands each service line (admission, dispatch, submit, janitor, oai) into one program per replica,
   ``<service>-<i>``, whose ``HORDE_<X>_HTTP_PORT`` / ``HORDE_<X>_GRPC_PORT`` are the base ports plus ``10·i``;
3. gives every process what the replicas change: gRPC callers ``HORDE_DISPATCH_GRPC_TARGET`` /
   ``HORDE_SUBMIT_GRPC_TARGET`` in grpcio's list form (``ipv4:127.0.0.1:7202,127.0.0.1:7212``, balanced by
   horde_core.grpc) when a service runs several replicas; the front ``HORDE_OAI_HORDE_URL`` = the local
   proxy's ``/api`` when admission runs several (so the front's native calls are balanced and fail over as a
   client's are; Caddy passes its ``Proxy-Authorization`` / ``Proxied-For`` through, so the per-address limits
   still count the front's clients; with one admission it calls it directly, on its port when that is not
   the default); the scripts the
   ports to wait for and to print (``LOCAL_STACK_*``). A variable already set in the environment wins;
4. writes ``<dir>/supervisor/supervisord.conf`` and execs ``supervisord -n`` on it (same pid: ``make run``'s
   ``.local/run.pid`` stays right).

supervisord (supervisor, from PyPI) restarts any process that exits (``autorestart``), as a Kubernetes
Deployment would, instead of honcho's stop-everything rule. SIGINT (Ctrl-C) or SIGTERM stops everything in
order: the reference worker first, then the services, the proxy and the setup step together, the stores last
(``stopwaitsecs`` each, then SIGKILL of the process's whole group); supervisord exits 0 when nothing is left.
Every process's output goes to supervisord's standard output, each line prefixed with the time and the
process's name as honcho did (:mod:`horde_testing.local_logs`), and to ``<dir>/supervisor/<name>.log``;
supervisord's own log is ``<dir>/supervisor/supervisord.log``. ``run`` exits 2 for a bad count or port
setting and 1 when a port the stack needs is in use, before anything starts.

From Python (tests, the failover e2e), :class:`LocalStack` starts the same command in its own session, on a
block of free ports, with the stores its ``env`` names::

    with LocalStack(2, directory=tmp, env=horde_settings_env) as stack:   # two of every service
        stack.urls.horde                     # "http://127.0.0.1:<port>": the one URL (stack.urls.front: /v1)
        stack.urls.replicas["dispatch"][1]   # replica 1's own base URL (its /metrics, /healthz)
        old = stack.kill("dispatch", 1)      # kill -9 replica 1 (any signal: sig=); returns its pid
        stack.wait_replica("dispatch", 1, not_pid=old)   # restarted (new pid) and healthy again
        stack.processes()                    # {"dispatch-1": "RUNNING", "worker": "RUNNING", ...}
        stack.log_text()                     # the console: supervisord's lines ("exited: dispatch-1
                                             # (terminated by SIGKILL; not expected)") and every process's
    # stopped on exit: SIGINT, as Ctrl-C; stack.stop() returns supervisord's exit code (0) and
    # stack.leftovers() the pids of its session still alive ([])

See README.md#quick-start ("make run") and docs/operator-guide.md#scaling.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import http.client
import os
import random
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, cast

import httpx

from horde_testing._proc import port_is_free, register_cleanup, spawn, tail, unregister_cleanup
from horde_testing.local_proxy import DEFAULT_LISTEN
from horde_testing.replicas import (
    SERVICE_PORTS,
    default_port,
    grpc_target,
    http_ports,
    replica_counts,
    replica_ports,
)

#: Supervisor groups, in start order (stopped in reverse): the console first and last, then the stores, the
#: reference worker last and first (its shutdown may still fault a job through the services), everything else
#: together between.
PRIORITY: Final = {"logs": 1, "stores": 100, "horde": 200, "worker": 300}
#: The Procfile lines that are neither in the "horde" group nor replicated.
OWN_GROUP: Final = ("stores", "worker")
#: Seconds between SIGTERM and SIGKILL: the services' graceful shutdown is 10 s (shutdown_grace_seconds); the
#: stores wait 2 s for the services, then stop PostgreSQL.
STOP_WAIT: Final = {"stores": 30, "default": 15}
#: The user of supervisord's control socket (supervisorctl, :class:`LocalStack`).
RPC_USER: Final = "horde"
#: The Procfile commands run from the checkout (they are shell lines: ``sh -c 'exec …'``, same pid).
SHELL: Final = "/bin/sh"


@dataclass(frozen=True)
class Program:
    """One supervised process: ``name`` (``admission-1``), its shell ``command``, extra ``env`` and group."""

    name: str
    command: str
    group: str
    env: dict[str, str] = field(default_factory=dict)


def read_procfile(path: Path) -> list[tuple[str, str]]:
    """The ``(name, command)`` lines of a Procfile, in order (comments and blank lines skipped). Raises
    ValueError for a line that is not ``name: command``."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, command = line.partition(":")
        if not sep or not name.strip().replace("-", "").replace("_", "").isalnum() or not command.strip():
            raise ValueError(f"{path}:{number}: not a 'name: command' line")
        entries.append((name.strip(), command.strip()))
    return entries


def programs(entries: Sequence[tuple[str, str]], env: Mapping[str, str]) -> list[Program]:
    """The supervised processes of ``entries`` (:func:`read_procfile`): one per replica of each service (its
    port settings in ``env``), one for every other line."""
    counts = replica_counts(env)
    out = []
    for name, command in entries:
        if name in SERVICE_PORTS:
            for i in range(counts[name]):
                ports = {k: str(v) for k, v in replica_ports(name, i, env).items()}
                out.append(Program(f"{name}-{i}", command, "horde", ports))
        else:
            out.append(Program(name, command, name if name in OWN_GROUP else "horde"))
    return out


def stack_env(env: Mapping[str, str], directory: Path, listen: str = DEFAULT_LISTEN) -> dict[str, str]:
    """What supervisord's environment adds to ``env`` for every process (module docstring, step 3)."""
    counts = replica_counts(env)
    out = {
        "LOCAL_STACK_DIR": str(directory),
        "LOCAL_STACK_LISTEN": listen,
        "LOCAL_STACK_URL": f"http://{listen}",
        "LOCAL_STACK_HEALTH_PORTS": " ".join(str(p) for s in SERVICE_PORTS for p in http_ports(s, env)),
        "LOCAL_STACK_DIRECT": ", ".join(
            f"{label} {' '.join(f':{p}' for p in http_ports(service, env))}"
            for label, service in (("front", "oai"), *((s, s) for s in ("admission", "dispatch", "submit")))
        ),
        "LOCAL_STACK_JANITOR": ", ".join(f"http://127.0.0.1:{p}/metrics" for p in http_ports("janitor", env)),
        "PYTHONUNBUFFERED": "1",
    }
    for service in ("dispatch", "submit"):
        key = f"HORDE_{service.upper()}_GRPC_TARGET"
        if counts[service] > 1 and not env.get(key):
            out[key] = grpc_target(service, env)
    if not env.get("HORDE_OAI_HORDE_URL"):
        admission = http_ports("admission", env)[0]
        if counts["admission"] > 1:
            out["HORDE_OAI_HORDE_URL"] = f"http://{listen}/api"
        elif admission != default_port("HORDE_ADMISSION_HTTP_PORT"):
            # One admission off its default port (LocalStack's port offset): the front's default names 7101.
            out["HORDE_OAI_HORDE_URL"] = f"http://127.0.0.1:{admission}/api"
    return out


def _quote(value: str) -> str:
    """A supervisor config value: ``%`` is its expansion character."""
    return value.replace("%", "%%")


def supervisor_config(progs: Sequence[Program], directory: Path, root: Path, password: str = "") -> str:
    """supervisord.conf for ``progs``, run from ``root``, state under ``directory/supervisor``; its control
    socket takes user ``horde`` with ``password`` (none when empty)."""
    auth = [f"username={RPC_USER}", f"password={_quote(password)}"] if password else []
    state = directory / "supervisor"
    lines = [
        "; Generated by horde_testing.local_stack from the Procfile: do not edit.",
        "[supervisord]",
        "nodaemon=true",
        # As root (a container, this sandbox) say so, rather than a CRIT line on every start.
        *(["user=root"] if os.geteuid() == 0 else []),
        f"logfile={_quote(str(state / 'supervisord.log'))}",
        "logfile_maxbytes=10MB",
        "logfile_backups=1",
        f"pidfile={_quote(str(state / 'supervisord.pid'))}",
        f"childlogdir={_quote(str(state))}",
        "",
        "[unix_http_server]",
        f"file={_quote(str(socket_path(directory)))}",
        "chmod=0700",
        *auth,
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{_quote(str(socket_path(directory)))}",
        *auth,
    ]
    for prog in progs:
        env = ",".join(f'{k}="{_quote(v)}"' for k, v in prog.env.items())
        own = prog.group != "horde"
        lines += [
            "",
            f"[program:{prog.name}]",
            f"command={_quote(shlex.join([SHELL, '-c', 'exec ' + prog.command]))}",
            f"directory={_quote(str(root))}",
            *([f"environment={env}"] if env else []),
            *([f"priority={PRIORITY[prog.group]}"] if own else []),
            "autostart=true",
            "autorestart=true",
            "startsecs=1",
            "startretries=20",
            "stopsignal=TERM",
            f"stopwaitsecs={STOP_WAIT.get(prog.name, STOP_WAIT['default'])}",
            # The stores stop their own servers (PostgreSQL must not get SIGTERM before them); every other
            # command's group holds only what it started.
            f"stopasgroup={'false' if prog.name == 'stores' else 'true'}",
            "killasgroup=true",
            "redirect_stderr=true",
            # Each process's own log file, and its lines on the console through the listener below.
            f"stdout_logfile={_quote(str(state / prog.name))}.log",
            "stdout_logfile_maxbytes=10MB",
            "stdout_logfile_backups=1",
            "stdout_events_enabled=true",
        ]
    members = [p.name for p in progs if p.group == "horde"]
    lines += ["", "[group:horde]", f"programs={','.join(members)}", f"priority={PRIORITY['horde']}"]
    lines += [
        "",
        # The console (horde_testing.local_logs): started first and stopped last, so no line is lost.
        "[eventlistener:logs]",
        f"command={_quote(shlex.join([sys.executable, '-m', 'horde_testing.local_logs']))}",
        f"directory={_quote(str(root))}",
        "events=PROCESS_LOG_STDOUT",
        "buffer_size=10000",
        f"priority={PRIORITY['logs']}",
        "autorestart=true",
        "startsecs=0",
        "stderr_logfile=/dev/stdout",
        "stderr_logfile_maxbytes=0",
        "",
    ]
    return "\n".join(lines)


def socket_path(directory: Path) -> Path:
    """supervisord's XML-RPC socket (supervisorctl, :class:`LocalStack`)."""
    return directory / "supervisor" / "supervisor.sock"


def process_name(prog: Program) -> str:
    """supervisor's ``group:name`` of a program."""
    return f"{prog.group}:{prog.name}"


def busy_ports(env: Mapping[str, str], listen: str) -> list[str]:
    """The ports the stack's services and proxy need that something already holds, described."""
    needed = [(f"the proxy ({listen})", int(listen.rpartition(":")[2]))]
    for service, count in replica_counts(env).items():
        for i in range(count):
            needed += [(f"{service}-{i} {k}", port) for k, port in replica_ports(service, i, env).items()]
    return [f"{port} ({what})" for what, port in needed if not port_is_free(port)]


def supervisord_binary() -> str:
    """``supervisord`` beside this Python (the supervisor package of horde-testing)."""
    return str(Path(sys.executable).parent / "supervisord")


def prepare(directory: Path) -> None:
    """A fresh state directory: no stale store URLs or ready marker; a proxy passkey kept across runs."""
    (directory / "supervisor").mkdir(parents=True, exist_ok=True)
    for stale in ("stores.env", "ready"):
        (directory / stale).unlink(missing_ok=True)
    passkey = directory / "proxy-passkey"
    if not passkey.exists() or not passkey.read_text().strip():
        passkey.write_text(secrets.token_urlsafe(24) + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m horde_testing.local_stack", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="write the supervisor config and exec supervisord (make run)")
    run.add_argument("--dir", type=Path, default=Path(".local"), help="state directory (default .local)")
    run.add_argument("--root", type=Path, default=Path("."), help="the checkout holding the Procfile")
    run.add_argument("--no-exec", action="store_true", help="write the config and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring. Does not return unless ``--no-exec`` or an error."""
    args = _parser().parse_args(argv)
    root: Path = args.root.absolute()
    directory: Path = args.dir if args.dir.is_absolute() else root / args.dir
    listen = os.environ.get("LOCAL_STACK_LISTEN") or DEFAULT_LISTEN
    try:
        progs = programs(read_procfile(root / "Procfile"), os.environ)
        extra = stack_env(os.environ, directory, listen)
    except ValueError as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 2
    busy = busy_ports(os.environ, listen)
    if busy:
        print(f"make run: ports in use: {', '.join(busy)}; stop what holds them", file=sys.stderr)
        return 1
    prepare(directory)
    config = directory / "supervisor" / "supervisord.conf"
    # The control socket is the owner's only (chmod 0700) and asks a password too (supervisord warns without).
    config.touch(mode=0o600)
    config.chmod(0o600)
    config.write_text(supervisor_config(progs, directory, root, secrets.token_urlsafe(18)))
    counts = replica_counts(os.environ)
    if any(n > 1 for n in counts.values()):
        shown = ", ".join(f"{s} x{n}" for s, n in counts.items())
        print(f"local stack: {shown} behind http://{listen} (supervisord, {config})", flush=True)
    if args.no_exec:
        return 0
    argv_sup = [supervisord_binary(), "-n", "-c", str(config)]
    os.chdir(root)
    os.execve(argv_sup[0], argv_sup, {**os.environ, **extra})
    return 1  # not reached


# -- from Python ------------------------------------------------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10)
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        # Kept where the base class keeps its connection, so ServerProxy's close (its ``with``) closes it.
        # The base class takes the Authorization header out of "user:password@host" here.
        _, self._extra_headers, _ = self.get_host_info(host)
        connection = self._connection[1]
        if connection is None:
            connection = _UnixConnection(self._path)
            self._connection = (host, connection)
        return connection


@dataclass(frozen=True)
class Urls:
    """Where a :class:`LocalStack` answers: ``horde`` the one URL (the proxy), ``front`` its ``/v1``, and each
    replica's own base URL by service (``replicas["dispatch"][1]``)."""

    horde: str
    front: str
    replicas: dict[str, list[str]]


class LocalStack:
    """The ``make run`` stack, started from Python through the same entry point (``python -m
    horde_testing.local_stack run``), for tests.

    ``replicas``: a count for every service, or ``{service: count}`` (the rest 1); services are the Procfile's
    (:data:`horde_testing.replicas.SERVICE_PORTS`). ``directory``: the state directory (``.local`` of
    ``make run``; keep its path short: it holds a Unix socket). ``env``: variables on top of this process's
    environment (e.g. the ``horde_settings_env`` fixture's store URLs: the stores line then starts none).
    ``port_offset``: added to every default port (0: make run's own 7000, 7101, …); None picks a block of free
    ports. ``root``: the checkout with the Procfile (default: the current directory).

    :meth:`start` returns once the setup step wrote ``ready`` and every replica and the proxy answer;
    :meth:`stop` sends SIGINT (Ctrl-C), waits, and returns supervisord's exit code; :meth:`leftovers` lists
    the pids of the stack's session still alive. Errors: :class:`RuntimeError` (with the stack's log tail)
    when it does not come up or a wait times out. The stack is stopped at interpreter exit at the latest.
    """

    def __init__(
        self,
        replicas: int | Mapping[str, int] = 1,
        *,
        directory: Path,
        env: Mapping[str, str] | None = None,
        port_offset: int | None = None,
        root: Path | None = None,
    ) -> None:
        counts = dict.fromkeys(SERVICE_PORTS, replicas) if isinstance(replicas, int) else dict(replicas)
        self.directory = directory.absolute()
        self.root = (root or Path.cwd()).absolute()
        base = {k: v for k, v in os.environ.items() if not k.startswith(("REPLICAS", "LOCAL_STACK_"))}
        env = {**base, **(env or {}), **{f"REPLICAS_{s.upper()}": str(n) for s, n in counts.items()}}
        self.counts = replica_counts(env)
        offset = _free_offset(env) if port_offset is None else port_offset
        for ports in SERVICE_PORTS.values():
            for setting in ports:
                env[setting] = str(default_port(setting) + offset)
        host, _, port = DEFAULT_LISTEN.rpartition(":")
        self.listen = f"{host}:{int(port) + offset}"
        env["LOCAL_STACK_LISTEN"] = self.listen
        self.env = env
        self.log_path = self.directory / "stack.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.urls = Urls(
            horde=f"http://{self.listen}",
            front=f"http://{self.listen}/v1",
            replicas={s: [f"http://127.0.0.1:{p}" for p in http_ports(s, env)] for s in SERVICE_PORTS},
        )

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> LocalStack:
        """Start the stack and wait until it serves (class docstring). Returns self."""
        self.directory.mkdir(parents=True, exist_ok=True)
        prepare(self.directory)  # (run does it too) a ready marker of an earlier run must not count
        argv = [sys.executable, "-m", "horde_testing.local_stack", "run", "--dir", str(self.directory)]
        with open(self.log_path, "ab") as log:
            self.proc = spawn([*argv, "--root", str(self.root)], env=self.env, cwd=self.root, log=log)
        register_cleanup(self, self._cleanup_at_exit)
        self._wait(lambda: (self.directory / "ready").exists(), timeout, "the setup step's ready marker")
        for service in SERVICE_PORTS:
            for i in range(self.counts[service]):
                self.wait_replica(service, i, timeout=timeout)
        self._wait(lambda: _answers(f"{self.urls.horde}/api/v2/status/heartbeat"), timeout, "the proxy")
        return self

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120.0) -> int | None:
        """Send ``sig`` to supervisord (as Ctrl-C does) and wait for it to exit; SIGKILL the session's
        processes after ``timeout`` s. Returns supervisord's exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_session()
                self.proc.wait(10)
        unregister_cleanup(self)
        return self.proc.returncode

    def __enter__(self) -> LocalStack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            self._kill_session()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            print(self.log_tail(), file=sys.stderr)
        self.stop()
        self._kill_session()

    # -- replicas ----------------------------------------------------------------------------------------

    def rpc(self) -> xmlrpc.client.ServerProxy:
        """supervisord's XML-RPC interface (supervisor's API), to use as a context manager:
        ``with stack.rpc() as server: server.supervisor.getAllProcessInfo()``."""
        config = configparser.RawConfigParser()
        config.read(self.directory / "supervisor" / "supervisord.conf")
        password = config.get("supervisorctl", "password", fallback="")
        return xmlrpc.client.ServerProxy(
            f"http://{RPC_USER}:{password}@localhost" if password else "http://localhost",
            transport=_UnixTransport(str(socket_path(self.directory))),
        )

    def info(self, service: str, index: int = 0) -> dict[str, Any]:
        """supervisor's process info of replica ``index`` of ``service`` (``pid``, ``statename``, …), or of a
        non-replicated process (``setup``, ``proxy``, ``worker``, ``stores``) with any index."""
        name = f"horde:{service}-{index}" if service in SERVICE_PORTS else _plain_name(service)
        with self.rpc() as server:
            return cast(dict[str, Any], server.supervisor.getProcessInfo(name))

    def processes(self) -> dict[str, str]:
        """Every supervised process's state by name: ``{"admission-1": "RUNNING", "stores": "RUNNING", …}``."""
        with self.rpc() as server:
            infos = cast(list[dict[str, Any]], server.supervisor.getAllProcessInfo())
        return {str(i["name"]): str(i["statename"]) for i in infos}

    def pid(self, service: str, index: int = 0) -> int:
        """The running pid of a process (:meth:`info`); 0 while it is not running."""
        return int(self.info(service, index)["pid"])

    def kill(self, service: str, index: int = 0, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` (default SIGKILL: a crash) to a process; returns the pid it had."""
        pid = self.pid(service, index)
        if not pid:
            raise RuntimeError(f"{service}-{index} is not running")
        os.kill(pid, sig)
        return pid

    def wait_replica(
        self, service: str, index: int = 0, *, not_pid: int | None = None, timeout: float = 60.0
    ) -> int:
        """Wait until the process runs (under another pid than ``not_pid``) and, for a service, its
        ``/healthz`` answers 200. Returns its pid."""

        def ready() -> bool:
            info = self.info(service, index)
            if info["statename"] != "RUNNING" or info["pid"] in (0, not_pid):
                return False
            return service not in SERVICE_PORTS or _answers(f"{self.urls.replicas[service][index]}/healthz")

        self._wait(ready, timeout, f"{service}-{index} running and healthy")
        return self.pid(service, index)

    def leftovers(self) -> list[int]:
        """The pids still alive in the stack's session (supervisord's; its children keep it): [] after a
        clean stop."""
        if self.proc is None:
            return []
        return _session_pids(self.proc.pid)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 80) -> str:
        return f"--- local stack log ({self.log_path}), last {lines} lines ---\n{tail(self.log_path, lines)}"

    # -- helpers -----------------------------------------------------------------------------------------

    def _wait(self, probe: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            try:
                if probe():
                    return
                last = "not yet"
            except (OSError, xmlrpc.client.Error, httpx.HTTPError) as exc:  # not up yet, or restarting
                last = repr(exc)
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"the local stack exited ({self.proc.returncode}) before {what}\n{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise RuntimeError(f"waited {timeout:.0f}s for {what} (last: {last})\n{self.log_tail()}")
            time.sleep(0.2)

    def _kill_session(self) -> None:
        if self.proc is not None:
            for pid in _session_pids(self.proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _cleanup_at_exit(self) -> None:
        self.stop(signal.SIGTERM, timeout=60)
        self._kill_session()


def _plain_name(name: str) -> str:
    return f"{name}:{name}" if name in OWN_GROUP else f"horde:{name}"


def _answers(url: str) -> bool:
    return httpx.get(url, timeout=2, trust_env=False).status_code == 200


def _session_pids(sid: int) -> list[int]:
    """Live processes whose session is ``sid`` (Linux /proc), zombies excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) != sid:
                continue
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(pid)
    return found


def _free_offset(env: Mapping[str, str]) -> int:
    """A multiple of 1000 that moves every port of the stack (proxy, every replica) onto free ports below the
    ephemeral range."""
    rng = random.Random()
    shifted = dict(env)
    for offset in rng.sample(range(13_000, 25_000, 1_000), 12):
        for ports in SERVICE_PORTS.values():
            for setting in ports:
                shifted[setting] = str(default_port(setting) + offset)
        host, _, port = DEFAULT_LISTEN.rpartition(":")
        if not busy_ports(shifted, f"{host}:{int(port) + offset}"):
            return offset
    raise RuntimeError("no block of free ports for a local stack")


if __name__ == "__main__":
    sys.exit(main())
