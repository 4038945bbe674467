"""A real PgBouncer in front of a test PostgreSQL (tests/e2e/test_pgbouncer_e2e.py).

:func:`pgbouncer_binary` finds the ``pgbouncer`` executable and, when it is missing, installs Debian's package
(``apt-get install -y pgbouncer``, as root, once per machine: :mod:`horde_testing.apt`): PyPI has no PgBouncer
binary. :class:`PgBouncer` runs one on a free loopback port, through the one
process launcher (:class:`horde_testing.launcher.ServiceProcess`), with its own config in a temp directory:

    with PgBouncer(database_url, pool_mode="transaction", pool_size=2) as bouncer:
        bouncer.dsn  # postgresql://postgres@127.0.0.1:<port>/<database of database_url>

Every client is let in without a password (``auth_type = any``); PgBouncer logs in to PostgreSQL with the
user and password of ``database_url``. As root it switches to the ``postgres`` system user (``-u``; the
package creates it), since PgBouncer refuses to run as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote, urlsplit, urlunsplit

from horde_testing.apt import DebianPackageUnavailable, debian_binary, find_binary
from horde_testing.launcher import ServiceError, ServiceProcess, free_port

#: Where Debian's package puts the binary (not on a non-root PATH).
DEBIAN_BINARY = "/usr/sbin/pgbouncer"

PgBouncerUnavailable = DebianPackageUnavailable


def find_pgbouncer() -> str | None:
    """The path of an installed ``pgbouncer`` binary, or None."""
    return find_binary("pgbouncer", [DEBIAN_BINARY])


def pgbouncer_binary() -> str:
    """The ``pgbouncer`` binary, installed with ``apt-get`` on first use (root only; horde_testing.apt). Raises
    :class:`PgBouncerUnavailable` when it is missing and cannot be installed."""
    return debian_binary("pgbouncer", "pgbouncer", [DEBIAN_BINARY])


def _wait_port(port: int, process: ServiceProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not process.running:
            raise ServiceError(f"pgbouncer exited with {process.returncode}\n{process.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"pgbouncer not listening on {port} after {timeout:.0f}s\n{process.log_tail()}"
            )
        time.sleep(0.05)


class PgBouncer:
    """One PgBouncer on ``127.0.0.1:<port>`` in front of the server of ``upstream_dsn`` (see the module).

    ``pool_mode``: ``transaction`` (the case that matters), ``session`` or ``statement``. ``pool_size``: server
    connections per database and user; small, so many clients share few server connections and a client's
    consecutive transactions land on different ones (what breaks session state and named prepared statements).
    """

    def __init__(
        self,
        upstream_dsn: str,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 2,
        max_client_conn: int = 500,
    ) -> None:
        parts = urlsplit(upstream_dsn)
        self.database = unquote(parts.path.lstrip("/")) or "postgres"
        self.user = unquote(parts.username or "postgres")
        self.port = free_port()
        self._upstream = parts
        self._dir = Path(tempfile.mkdtemp(prefix="horde-pgbouncer-"))
        self._dir.chmod(0o755)  # read by the postgres user once pgbouncer drops root
        password = unquote(parts.password or "")
        target = [f"host={parts.hostname or '127.0.0.1'}", f"port={parts.port or 5432}", f"user={self.user}"]
        if password:
            target.append(f"password={password}")
        config = self._dir / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = {' '.join(target)}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = any",
                    f"pool_mode = {pool_mode}",
                    f"default_pool_size = {pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    f"max_client_conn = {max_client_conn}",
                    "max_db_connections = 0",
                    "server_reset_query =",
                    "ignore_startup_parameters = extra_float_digits,options",
                    "admin_users = postgres",
                    "",
                ]
            )
        )
        config.chmod(0o644)
        argv = [pgbouncer_binary(), "-v", str(config)]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", "postgres"]
        self.process = ServiceProcess("pgbouncer", argv, {}, None)

    @property
    def dsn(self) -> str:
        """The DSN of the upstream database through this PgBouncer (no password: ``auth_type = any``)."""
        return urlunsplit(("postgresql", f"{self.user}@127.0.0.1:{self.port}", f"/{self.database}", "", ""))

    def dsn_for(self, database: str) -> str:
        return urlunsplit(("postgresql", f"{self.user}@127.0.0.1:{self.port}", f"/{database}", "", ""))

    def start(self, timeout: float = 30.0) -> PgBouncer:
        self.process.start()
        _wait_port(self.port, self.process, timeout)
        return self

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_text(self) -> str:
        return self.process.log_text()

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
