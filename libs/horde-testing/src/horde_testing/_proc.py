"""Child-process plumbing shared by the embedded stores and the e2e launcher.

Every server we start must die with us, however we die:

* normal exit / Ctrl-C: the owner's context manager or the :func:`atexit` registry stops it;
* SIGTERM: :func:`install_sigterm_interrupt` turns it into ``KeyboardInterrupt`` so the above runs;
* SIGKILL of our process: the child was started through a tiny exec shim that sets
  ``PR_SET_PDEATHSIG`` (Linux) so the kernel signals it when its parent thread dies.

The shim runs as *our* user and only then drops privileges, because (as root) the unprivileged
server user may not be able to read the Python interpreter (e.g. a pyenv under ``/root``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# argv after "-c": <signal> <uid> <gid> <expected parent pid> <program> <args...>
_SHIM = r"""
import os, sys, warnings
a = sys.argv[1:]
sig, uid, gid, ppid = int(a[0]), int(a[1]), int(a[2]), int(a[3])
argv = a[4:]
try:
    import ctypes
    prctl = ctypes.CDLL(None, use_errno=True).prctl
except Exception:
    prctl = None
if "/" not in argv[0]:
    import shutil
    argv[0] = shutil.which(argv[0]) or argv[0]
# Everything is imported before the privilege drop: the new user may not read our stdlib.
if uid >= 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
if prctl is not None:
    prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG; after setuid, which clears it
if os.getppid() != ppid:  # the parent died before prctl took effect
    sys.exit(70)
os.execv(argv[0], argv)
"""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports this process has handed out: a server that has not bound yet must not get a twin.
_HANDED_OUT: set[int] = set()
_PORT_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` now and lies below the kernel's ephemeral range.

    Port 0 would hand back an ephemeral port, which the very next outgoing connection of any process
    on the machine may take before our server binds it ("address already in use"). Ports below the
    range are never chosen by the kernel for outgoing connections, so the only contenders are other
    servers; a port is never handed out twice by this process.
    """
    low = min(_ephemeral_low(), 65536)
    first = 20000 if low > 21000 else 1024
    rng = random.Random()
    with _PORT_LOCK:
        for _ in range(200):
            port = rng.randrange(first, low)
            if port not in _HANDED_OUT and port_is_free(port, host):
                _HANDED_OUT.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: fall back
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``host:port`` can be bound right now by a server (which sets SO_REUSEADDR, so
    TIME_WAIT leftovers of an earlier run do not count as taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log: IO[Any] | int | None = None,
    death_signal: int = signal.SIGTERM,
    user: tuple[int, int] | None = None,
    new_session: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` so that it dies with this process.

    ``death_signal`` is what the kernel sends the child if our spawning thread dies; ``user`` is a
    ``(uid, gid)`` to drop to (requires root). The child gets its own session/process group
    (``new_session``) so a terminal Ctrl-C reaches only us and we stop children in order.
    stdout and stderr both go to ``log`` (a file or ``subprocess.DEVNULL``).

    Call it from a thread that lives as long as the child (normally the main thread): Linux sends
    the death signal when the *thread* that forked the child exits, not only the process.
    """
    uid, gid = user if user is not None else (-1, -1)
    full = [
        sys.executable,
        "-S",
        "-I",
        "-c",
        _SHIM,
        str(int(death_signal)),
        str(uid),
        str(gid),
        str(os.getpid()),
        *argv,
    ]
    return subprocess.Popen(
        full,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
        start_new_session=new_session,
        close_fds=True,
    )


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the child's process group (falls back to the child alone)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def stop_process(
    proc: subprocess.Popen[bytes],
    *,
    first: int = signal.SIGTERM,
    timeout: float = 10.0,
    group: bool = True,
) -> int | None:
    """Stop ``proc``: send ``first``, wait ``timeout`` seconds, then SIGKILL. Returns the exit code."""
    if proc.poll() is None:
        if group:
            signal_group(proc, first)
        else:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(first)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            if group:
                signal_group(proc, signal.SIGKILL)
            else:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            proc.wait(10)
    # The group may still hold grandchildren (a server's workers): reap them too.
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


def wait_until(
    probe: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.05,
    alive: Callable[[], bool] | None = None,
    what: str = "condition",
) -> None:
    """Poll ``probe`` until it returns True; raise TimeoutError after ``timeout`` seconds.

    ``alive`` (e.g. "the server process is still running") aborts the wait early with RuntimeError.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if probe():
                return
        except Exception:
            pass
        if alive is not None and not alive():
            raise RuntimeError(f"{what}: the process exited before it was ready")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:.1f}s")
        time.sleep(interval)


def tail(path: str | os.PathLike[str], lines: int = 60) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    text = data[-64_000:].decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


# --- registry: stop whatever is still running at interpreter exit ----------------------------------

_live: dict[int, Callable[[], None]] = {}
_live_lock = threading.Lock()


def register_cleanup(token: object, stop: Callable[[], None]) -> None:
    """Run ``stop`` at interpreter exit unless :func:`unregister_cleanup` is called first."""
    with _live_lock:
        _live[id(token)] = stop


def unregister_cleanup(token: object) -> None:
    with _live_lock:
        _live.pop(id(token), None)


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        stops = list(_live.values())[::-1]
        _live.clear()
    for stop in stops:
        with contextlib.suppress(Exception):
            stop()


def install_sigterm_interrupt() -> bool:
    """Make SIGTERM raise ``KeyboardInterrupt`` (as Ctrl-C does) when SIGTERM is still at its default
    disposition and we are on the main thread, so ``finally`` blocks, pytest's teardown and atexit
    cleanup run. (``SystemExit`` would not do for pytest: it fails the running test and goes on.)
    Returns True if the handler was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    return True
