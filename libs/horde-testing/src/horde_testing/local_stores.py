"""``horde-local-stores``: the stores of ``make run`` (Procfile ``stores:`` line).

Starts, on 127.0.0.1, each store that no ``HORDE_*`` variable configures — embedded PostgreSQL (data in
``<data-dir>/postgres``), Valkey (``<data-dir>/valkey``, RDB snapshots) and moto's S3 server (in memory:
objects do not survive a restart) — creates the database and the buckets, runs the migrations, and
only then writes ``export HORDE_…=…`` lines to ``--env-file`` (atomically, mode 0600). It then stays in
the foreground until SIGTERM/SIGINT, stops what it started and removes the env file, so a reader never
sees URLs of stores that are not (or no longer) up.

Data persists between runs under ``--data-dir`` (default ``.local``). Preferred ports: PostgreSQL 7432,
Valkey 7379, S3 7333; a taken port is replaced by a free one (the env file has the real URLs).
Exit status: 0 after a clean stop, 1 when a store failed to start or migrate.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from horde_testing.stores import store_stack, write_env_file

log = logging.getLogger("horde_testing.local_stores")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horde-local-stores", description=__doc__.split("\n\n")[0])
    p.add_argument("--env-file", default=".local/stores.env", help="where to write the export lines")
    p.add_argument("--data-dir", default=".local", help="where the stores keep their data")
    p.add_argument("--database", default="horde", help="database name to create and migrate")
    p.add_argument("--pg-port", type=int, default=7432)
    p.add_argument("--redis-port", type=int, default=7379)
    p.add_argument("--s3-port", type=int, default=7333)
    p.add_argument("--no-migrate", action="store_true", help="do not run the migrations")
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=2.0,
        help="on SIGTERM, keep the stores up this long so the services' own shutdown can still use them",
    )
    p.add_argument(
        "--containers",
        action="store_true",
        help="use Docker containers instead of embedded servers when an engine answers",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s stores %(levelname)s %(message)s")
    env_file = Path(args.env_file).absolute()
    data = Path(args.data_dir).absolute()
    # A stale file from an earlier run would point readers at dead ports: remove it before anything.
    env_file.unlink(missing_ok=True)

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        # During start-up the signal aborts the start at once (KeyboardInterrupt unwinds the stack,
        # stopping what already runs); afterwards it ends the wait loop below.
        if getattr(on_signal, "starting", False):
            raise KeyboardInterrupt

    on_signal.starting = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    containers = bool(args.containers)
    t0 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            stores = stack.enter_context(
                store_stack(
                    data_dir=data,
                    persistent=True,
                    database=args.database,
                    pg_port=args.pg_port,
                    redis_port=args.redis_port,
                    s3_port=args.s3_port,
                    containers=containers,
                )
            )
            pg = stores.postgres
            if not args.no_migrate:
                from horde_store.migrate import migrate

                from horde_testing.pgadmin import run_sync

                applied = run_sync(migrate(pg.dsn))
                log.info("migrations applied: %s", ", ".join(applied) or "none (up to date)")
            values = stores.env()
            write_env_file(env_file, values)
            stack.callback(env_file.unlink, missing_ok=True)
            on_signal.starting = False  # type: ignore[attr-defined]
            print(f"stores ready in {time.monotonic() - t0:.1f}s (env: {env_file})", flush=True)
            for key, value in values.items():
                shown = value if "SECRET" not in key else "***"
                print(f"  {key}={_hide_password(shown)}", flush=True)
            while not stop.wait(1.0):
                pass
            # The services get the same signal: give their shutdown (a worker's last fault submit, a
            # janitor pass) a moment to reach the stores before they go (honcho kills after 5 s).
            time.sleep(args.drain_seconds)
            print("stopping stores", flush=True)
    except KeyboardInterrupt:
        print("start-up interrupted; stores stopped", file=sys.stderr)
        return 1
    except Exception as exc:
        log.error("stores failed: %s", exc)
        return 1
    finally:
        env_file.unlink(missing_ok=True)
    print("stores stopped", flush=True)
    return 0


def _hide_password(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return url


if __name__ == "__main__":
    sys.exit(main())
