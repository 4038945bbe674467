"""``horde-admin``: the operator CLI (migrations, users, shared keys).

    horde-admin [--database-url URL] migrate
    horde-admin user create --username NAME [--kudos N] [--trusted] [--patron] [--concurrency N]
    horde-admin user show --username NAME
    horde-admin user set --username NAME [--kudos N] [--trusted/--no-trusted] [--patron/--no-patron]
                         [--concurrency N] [--flagged/--no-flagged] [--min-kudos N] [--deleted/--no-deleted]
                         [--moderator/--no-moderator]
    horde-admin shared-key create --username NAME [--kudos N] [--expiry-days N] [--max-text-tokens N]
                                  [--name S]
    horde-admin worker set --name NAME [--maintenance/--no-maintenance] [--maintenance-msg S]
                           [--paused/--no-paused]
    horde-admin modes show
    horde-admin modes maintenance on|off
    horde-admin ip-timeout ADDRESS [--minutes N | --clear]

Every command prints one JSON object on stdout. The database is ``--database-url`` or
``HORDE_DATABASE_URL``; Redis (IP timeouts, and the completion signals of the requests ``maintenance on``
aborts) is ``--redis-url`` or ``HORDE_REDIS_URL``; the API-key salt is ``HORDE_SECRET_KEY`` (the dev salt
when unset); ``HORDE_DATABASE_STATEMENT_CACHE_SIZE=0`` behind a transaction-mode PgBouncer, as for the services
(``migrate`` needs PostgreSQL itself: horde_store.db). Exit status: 0 success, 1 a refused operation (unknown user, taken username, database or Redis
error), 2 bad usage. The operator controls are docs/operator-guide.md#operator-controls.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import asyncpg
import redis.asyncio as redis
from horde_core.redis_keys import redis_client, signal_client

from horde_store import modes, users
from horde_store.db import DEFAULT_STATEMENT_CACHE_SIZE, connect
from horde_store.migrate import MigrationError, migrate


class AdminError(Exception):
    """A refused operation: printed as ``horde-admin: error: …`` with exit status 1."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horde-admin", description="Horde Chat operator commands.")
    p.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL URL (default: $HORDE_DATABASE_URL)",
    )
    p.add_argument("--redis-url", default=None, help="Redis URL (default: $HORDE_REDIS_URL)")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("migrate", help="apply pending schema migrations (idempotent)")

    user = sub.add_parser("user", help="create or change users").add_subparsers(dest="action", required=True)
    create = user.add_parser("create", help="create a user and print its new API key")
    create.add_argument("--username", required=True)
    create.add_argument("--kudos", type=float, default=0.0)
    create.add_argument("--trusted", action="store_true")
    create.add_argument("--patron", action="store_true")
    create.add_argument("--concurrency", type=int, default=30)
    create.add_argument(
        "--rotate-if-exists",
        action="store_true",
        help="if the user exists, give it a new API key (the old one stops working) instead of failing",
    )

    show = user.add_parser("show", help="a user's balance, flags and requests of the last 24 hours")
    show.add_argument("--username", required=True)

    upd = user.add_parser("set", help="change a user's kudos and flags")
    upd.add_argument("--username", required=True)
    upd.add_argument("--kudos", type=float, default=None, help="set the balance to N")
    upd.add_argument("--min-kudos", type=float, default=None)
    upd.add_argument("--concurrency", type=int, default=None)
    for flag in ("trusted", "patron", "flagged", "deleted", "moderator"):
        upd.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None)

    worker = sub.add_parser("worker", help="change workers").add_subparsers(dest="action", required=True)
    wset = worker.add_parser("set", help="take a worker out of (or into) maintenance, pause or resume it")
    wset.add_argument("--name", required=True, help="the worker's name")
    wset.add_argument("--maintenance", action=argparse.BooleanOptionalAction, default=None)
    wset.add_argument("--maintenance-msg", default=None)
    wset.add_argument("--paused", action=argparse.BooleanOptionalAction, default=None)

    modes = sub.add_parser("modes", help="horde-wide modes").add_subparsers(dest="action", required=True)
    modes.add_parser("show", help="the modes as stored")
    maint = modes.add_parser(
        "maintenance",
        help="switch maintenance mode: on refuses new requests and aborts queued ones (in-flight jobs finish)",
    )
    maint.add_argument("state", choices=("on", "off"))

    ipt = sub.add_parser(
        "ip-timeout", help="refuse new requests from a client address for a while (403 TimeoutIP)"
    )
    ipt.add_argument(
        "address",
        help="IPv4 or IPv6 address, as the rate limits count it (an IPv6 address times out its /64)",
    )
    how = ipt.add_mutually_exclusive_group()
    how.add_argument("--minutes", type=int, default=None, help="time the address out for N minutes")
    how.add_argument("--clear", action="store_true", help="lift the address's timeout")

    key = sub.add_parser("shared-key", help="shared keys").add_subparsers(dest="action", required=True)
    kc = key.add_parser("create", help="create a shared key for a user and print it")
    kc.add_argument("--username", required=True)
    kc.add_argument("--kudos", type=float, default=5000, help="kudos the key may spend; -1 = unlimited")
    kc.add_argument("--expiry-days", type=int, default=None, help="days until it expires; -1/omitted = never")
    kc.add_argument("--max-text-tokens", type=int, default=-1, help="max_length cap; -1 = unlimited")
    kc.add_argument("--name", default=None)
    return p


def _statement_cache_size() -> int:
    """``HORDE_DATABASE_STATEMENT_CACHE_SIZE`` (asyncpg's statement cache; 0 behind a transaction pooler)."""
    value = os.environ.get("HORDE_DATABASE_STATEMENT_CACHE_SIZE", "").strip()
    return int(value) if value else DEFAULT_STATEMENT_CACHE_SIZE


def _salt() -> str:
    return os.environ.get("HORDE_SECRET_KEY") or users.DEV_SECRET_KEY


async def _run(args: argparse.Namespace, dsn: str, redis_url: str | None) -> dict[str, Any]:
    if args.command == "ip-timeout":
        assert redis_url is not None  # main() refuses the command without one
        return await _ip_timeout(args, redis_url)
    if args.command == "modes" and args.action == "maintenance":
        return await _maintenance(args.state == "on", dsn, redis_url)
    if args.command == "migrate":
        try:
            applied = await migrate(dsn)
        except MigrationError as exc:
            raise AdminError(str(exc)) from exc
        return {"applied": applied}

    conn = await connect(dsn, statement_cache_size=_statement_cache_size())
    try:
        try:
            return await _run_on(conn, args)
        except asyncpg.UndefinedTableError as exc:
            raise AdminError(f"{exc} (run `horde-admin migrate` first)") from exc
    finally:
        await conn.close()


#: The user columns ``user create`` sets, and sets again when ``--rotate-if-exists`` finds the user.
_USER_PROFILE = ("kudos", "trusted", "patron", "concurrency")


def _options(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The parsed options ``names`` as keyword arguments (the users functions take the options' names)."""
    return {name: getattr(args, name) for name in names}


async def _run_on(conn: asyncpg.Connection, args: argparse.Namespace) -> dict[str, Any]:
    salt = _salt()
    try:
        if args.command == "user" and args.action == "create":
            try:
                user, key = await users.create_user(
                    conn, args.username, salt=salt, **_options(args, *_USER_PROFILE)
                )
            except users.UserExists:
                if not args.rotate_if_exists:
                    raise
                key = users.generate_api_key()
                async with conn.transaction():
                    await conn.execute(
                        "UPDATE users SET api_key_hash = $2 WHERE username = $1",
                        args.username,
                        users.hash_api_key(key, salt),
                    )
                    user = await users.set_user(conn, args.username, **_options(args, *_USER_PROFILE))
            return {"id": user.id, "username": user.username, "api_key": key}
        if args.command == "user" and args.action == "show":
            return await _show_user(conn, args.username)
        if args.command == "user" and args.action == "set":
            user = await users.set_user(
                conn,
                args.username,
                **_options(args, *_USER_PROFILE, "min_kudos", "flagged", "deleted", "moderator"),
            )
            return user.to_json()
        if args.command == "worker" and args.action == "set":
            return await _set_worker(conn, args)
        if args.command == "modes" and args.action == "show":
            return dataclasses.asdict(await modes.read_modes(conn))
        if args.command == "shared-key" and args.action == "create":
            shared = await users.create_shared_key(
                conn, args.username, **_options(args, "kudos", "expiry_days", "max_text_tokens", "name")
            )
            return {"key": str(shared.id), "username": args.username, **shared.to_json()}
    except (users.UserNotFound, users.UserExists, ValueError) as exc:
        raise AdminError(str(exc)) from exc
    raise AdminError(f"unknown command {args.command} {getattr(args, 'action', '')}")


async def _show_user(conn: asyncpg.Connection, username: str) -> dict[str, Any]:
    """``user show``: the user (no key hash) and its chat and text requests of the last 24 hours, newest first
    (at most 20): id, created, model list, kudos quote, consumed kudos, cancelled, faulted, finished replies."""
    user = await users.get_user(conn, username=username)
    rows = await conn.fetch(
        """
        SELECT w.id, w.created, w.is_chat, w.kudos, w.consumed_kudos, w.cancelled, w.faulted,
               (SELECT count(*) FROM processing_gens p WHERE p.wp_id = w.id AND p.faulted = false AND NOT p.fake
                  AND p.generation IS NOT NULL) AS finished
        FROM waiting_prompts w
        WHERE w.user_id = $1 AND w.created > now() - interval '24 hours'
        ORDER BY w.created DESC
        LIMIT 20
        """,
        user.id,
    )
    requests = [{**dict(row), "id": str(row["id"]), "created": row["created"].isoformat()} for row in rows]
    return {**user.to_json(), "requests": requests}


async def _set_worker(conn: asyncpg.Connection, args: argparse.Namespace) -> dict[str, Any]:
    """``worker set``: the operator's way out of the automatic maintenance a worker enters after too many
    dropped jobs (docs/native-api.md#workers); unset flags are left as they are."""
    row = await conn.fetchrow(
        """
        UPDATE workers SET
            maintenance = COALESCE($2, maintenance),
            maintenance_msg = CASE WHEN $2 IS FALSE THEN NULL ELSE COALESCE($3, maintenance_msg) END,
            paused = COALESCE($4, paused)
        WHERE name = $1
        RETURNING id, name, maintenance, maintenance_msg, paused
        """,
        args.name,
        args.maintenance,
        args.maintenance_msg,
        args.paused,
    )
    if row is None:
        raise AdminError(f"no worker named {args.name!r}")
    return {**dict(row), "id": str(row["id"])}


async def _maintenance(on: bool, dsn: str, redis_url: str | None) -> dict[str, Any]:
    """``modes maintenance on|off`` (:func:`horde_store.modes.set_maintenance`): the switch, the requests it
    aborted and the completion signals published. Without a Redis URL no signal goes out (said on stderr):
    waiting clients then learn of the abort on their next status read."""
    signals = signal_client(redis_url) if redis_url else None
    if on and signals is None:
        print("horde-admin: warning: no Redis URL; aborted requests are not signalled", file=sys.stderr)
    conn = await connect(dsn, statement_cache_size=_statement_cache_size())
    try:
        try:
            change = await modes.set_maintenance(conn, on, signals)
        except asyncpg.UndefinedTableError as exc:
            raise AdminError(f"{exc} (run `horde-admin migrate` first)") from exc
    finally:
        await conn.close()
        if signals is not None:
            await signals.aclose()
    return change.to_json()


async def _ip_timeout(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    """``ip-timeout ADDRESS [--minutes N | --clear]``: set, lift or show (no option) an address's timeout."""
    client = redis_client(redis_url)
    try:
        if args.minutes is not None:
            address = await modes.set_ip_timeout(client, args.address, args.minutes * 60)
            return {"address": address, "seconds": args.minutes * 60}
        if args.clear:
            cleared = await modes.clear_ip_timeout(client, args.address)
            return {"address": modes.timeout_target(args.address), "cleared": cleared}
        address = modes.normalize_address(args.address)
        return {"address": address, "seconds": await modes.ip_timeout_seconds(client, address)}
    except ValueError as exc:
        raise AdminError(str(exc)) from exc
    except redis.RedisError as exc:
        raise AdminError(f"redis: {exc}") from exc
    finally:
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``horde-admin``; returns the exit status (see the module docstring)."""
    parser = _parser()
    args = parser.parse_args(argv)
    dsn = args.database_url or os.environ.get("HORDE_DATABASE_URL") or ""
    redis_url = args.redis_url or os.environ.get("HORDE_REDIS_URL") or None
    if args.command == "ip-timeout":
        if not redis_url:
            parser.error("no Redis: pass --redis-url or set HORDE_REDIS_URL")
    elif not dsn:
        parser.error("no database: pass --database-url or set HORDE_DATABASE_URL")
    try:
        result = asyncio.run(_run(args, dsn, redis_url))
    except AdminError as exc:
        print(f"horde-admin: error: {exc}", file=sys.stderr)
        return 1
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        print(f"horde-admin: error: database: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
