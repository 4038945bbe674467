"""Launch the processes tests need (services, workers, model servers): each its own process group, logs to
a temp file, health polled over HTTP, stopped with SIGTERM then SIGKILL, and never left behind (not even
when the test process is killed: see :mod:`horde_testing._proc`). Every test that starts a process starts it
through :class:`ServiceProcess`.

    with ServiceProcess("admission", [sys.executable, "-m", "horde_admission"],
                        env={**horde_settings_env, "HORDE_ADMISSION_HTTP_PORT": str(port)},
                        health_url=f"http://127.0.0.1:{port}/healthz",
                        url=f"http://127.0.0.1:{port}") as svc:
        ...  # started and healthy here; stopped on exit (log tail printed if the block raised)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from horde_testing._proc import free_port, register_cleanup, spawn, stop_process, tail, unregister_cleanup

__all__ = ["ServiceError", "ServiceProcess", "free_port"]


class ServiceError(RuntimeError):
    """A service did not start, exited early or did not become healthy; the message ends with the
    tail of its log."""


class ServiceProcess:
    """One service process.

    ``argv``: the command (``[sys.executable, "-m", "horde_admission"]``). ``env``: variables set on top
    of ``os.environ`` (``inherit_env=False``: the whole environment). ``health_url``: polled by
    :meth:`wait_healthy` until it answers 200 (None: only "still running" is checked). ``url``: the
    service's base URL (``http://127.0.0.1:<port>``), kept for the test's requests. ``stop_timeout``:
    seconds between SIGTERM and SIGKILL in :meth:`stop`; ``startup_timeout``: the default of
    :meth:`wait_healthy`. stdout and stderr both go to :attr:`log_path` (:meth:`log_text`,
    :meth:`log_tail`, :meth:`wait_log`).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        health_url: str | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        inherit_env: bool = True,
        stop_timeout: float = 10.0,
        startup_timeout: float = 30.0,
        url: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env or {})
        self.health_url = health_url
        self._url = url
        self.cwd = cwd
        self.inherit_env = inherit_env
        self.stop_timeout = stop_timeout
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        fd, path = tempfile.mkstemp(prefix=f"horde-svc-{name}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)
        self._log: IO[Any] | None = None
        self.starts = 0

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> ServiceProcess:
        """Spawn the process (no-op if it is running). Returns self."""
        if self.running:
            return self
        env = {**os.environ, **self.env} if self.inherit_env else dict(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log = open(self.log_path, "ab")
        self.starts += 1
        self._log.write(f"--- start #{self.starts}: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.proc = spawn(self.argv, env=env, cwd=self.cwd, log=self._log, death_signal=signal.SIGTERM)
        register_cleanup(self, self._cleanup_at_exit)
        return self

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Poll ``health_url`` until it answers 200. Raises ServiceError (with the log tail) when the
        process exits first or ``timeout`` seconds (default ``startup_timeout``) pass."""
        timeout = self.startup_timeout if timeout is None else timeout
        if self.proc is None:
            raise ServiceError(f"{self.name}: not started")
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise ServiceError(
                        f"{self.name} exited with {code} before it was healthy\n{self.log_tail()}"
                    )
                if self.health_url is None:
                    return
                try:
                    if client.get(self.health_url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    raise ServiceError(
                        f"{self.name} not healthy at {self.health_url} after {timeout:.0f}s\n{self.log_tail()}"
                    )
                time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` s (default ``stop_timeout``).
        Returns the exit code (None if it was never started)."""
        if self.proc is None:
            return None
        code = stop_process(
            self.proc, first=signal.SIGTERM, timeout=self.stop_timeout if timeout is None else timeout
        )
        self._close_log()
        return code

    def kill(self) -> int | None:
        """SIGKILL the process group at once (a crash); returns the exit code."""
        if self.proc is None:
            return None
        code = stop_process(self.proc, first=signal.SIGKILL, timeout=5)
        self._close_log()
        return code

    def restart(self, *, wait: bool = True, timeout: float | None = None) -> ServiceProcess:
        """:meth:`stop`, :meth:`start` and (``wait``) :meth:`wait_healthy`."""
        self.stop()
        self.start()
        if wait:
            self.wait_healthy(timeout)
        return self

    # -- inspection ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL given at construction (ServiceError if none was)."""
        if self._url is None:
            raise ServiceError(f"{self.name}: no url was given")
        return self._url

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def log_text(self) -> str:
        """The whole log so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 80) -> str:
        return f"--- {self.name} log ({self.log_path}), last {lines} lines ---\n{tail(self.log_path, lines)}"

    def wait_log(self, found: Callable[[str], bool] | str, timeout: float = 10.0) -> str:
        """The whole log once ``found`` (a substring, or a test of the whole log) holds, or as it is after
        ``timeout`` seconds (the caller asserts on it): a service may write a line a moment after the
        response it describes (a logging thread, a buffered stream)."""
        test: Callable[[str], bool] = (lambda text: found in text) if isinstance(found, str) else found
        deadline = time.monotonic() + timeout
        text = self.log_text()
        while not test(text) and time.monotonic() < deadline:
            time.sleep(0.02)
            text = self.log_text()
        return text

    # -- context manager -----------------------------------------------------------------------------

    def __enter__(self) -> ServiceProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and not isinstance(exc, ServiceError):
            print(self.log_tail(), file=sys.stderr)
        self.stop()
        unregister_cleanup(self)
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _cleanup_at_exit(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, first=signal.SIGTERM, timeout=self.stop_timeout)
        self._close_log()
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def __repr__(self) -> str:
        return f"ServiceProcess({self.name!r}, pid={self.pid}, running={self.running})"
