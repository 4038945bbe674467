"""pytest fixtures yielding real stores (registered for every pytest run in the workspace through the
``pytest11`` entry point of horde-testing).

Session-scoped (started once, on first use, stopped at the end of the run):

* ``pg_server`` -> :class:`~horde_testing.stores.PostgresStore`: the server; its ``dsn`` may CREATE DATABASE.
* ``pg_template`` -> ``str``: name of a database migrated once per session; never connect to it
  (PostgreSQL cannot copy a database that has connections).
* ``pg_dsn`` -> ``str``: DSN of one migrated database shared by the whole session.
* ``make_database`` -> ``Callable[[], str]``: a factory of fresh migrated databases (DSN), for tests
  needing one of their own (function scope isolation); an env server's are dropped at session end, an
  embedded/container server is deleted whole.
* ``redis_server`` -> :class:`~horde_testing.stores.RedisStore`.
* ``s3_endpoint`` -> :class:`~horde_testing.stores.S3Endpoint`: a ``str`` (the endpoint URL) with
  ``access_key_id``, ``secret_access_key``, ``region``, ``image_bucket``, ``messages_bucket``,
  ``env()`` and ``client()``; the buckets exist.

Module-scoped (fresh per test module):

* ``database_url`` -> ``str``: DSN of a database cloned from the migrated template (a few ms), dropped
  (WITH FORCE) after the module.
* ``redis_url`` -> ``str``: ``redis://127.0.0.1:<port>/0`` of the session's server, FLUSHALLed before
  the module (all dbs, the completion-signal db 7 included).
* ``signal_redis`` -> an asyncio Redis client on the chat signal database (7), where signals, stream leases
  and progress streams live.
* ``url_redis`` -> an asyncio Redis client on the database ``redis_url`` names (not 7), for asserting that
  nothing of the signal database lands there.
* ``horde_settings_env`` -> ``dict[str, str]``: ``HORDE_DATABASE_URL`` (= ``database_url``),
  ``HORDE_REDIS_URL``, ``HORDE_S3_*`` and ``HORDE_SECRET_KEY`` (:data:`TEST_SECRET_KEY`), ready to be
  passed to a launched service or to ``HordeSettings``.

Sources: ``HORDE_TEST_<X>`` then ``HORDE_<X>`` env URLs (DATABASE_URL, REDIS_URL, S3_ENDPOINT_URL),
then a container when Docker answers, then embedded servers (see :mod:`horde_testing.stores`). An env
PostgreSQL role needs CREATEDB; an env Redis is flushed only when it came from
``HORDE_TEST_REDIS_URL`` (declared disposable), so a dev Redis named by ``HORDE_REDIS_URL`` is never
wiped.
"""

from __future__ import annotations

import http.server
import itertools
import os
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from horde_testing.stores import PostgresStore, RedisStore, S3Endpoint

#: The API-key salt the fixtures' env gives services; create test users with the same salt.
TEST_SECRET_KEY = "horde-chat-test-salt"

_counter = itertools.count(1)
_session_tag = f"{os.getpid()}_{secrets.token_hex(3)}"


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (CI timeouts, a supervisor) must still stop the servers and remove their temp dirs.
    from horde_testing._proc import install_sigterm_interrupt

    install_sigterm_interrupt()


def _db_name(kind: str) -> str:
    return f"horde_{kind}_{_session_tag}_{next(_counter)}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresStore]:
    """The session's PostgreSQL server."""
    from horde_testing.stores import postgres_store

    with postgres_store() as store:
        yield store


@pytest.fixture(scope="session")
def pg_template(pg_server: PostgresStore) -> Iterator[str]:
    """A database migrated once per session, cloned by the other database fixtures."""
    from horde_store.migrate import migrate

    from horde_testing.pgadmin import create_database_sync, drop_database_sync, run_sync

    name = f"horde_tpl_{_session_tag}"
    create_database_sync(pg_server.dsn, name)
    try:
        run_sync(migrate(pg_server.dsn_for(name)))
        yield name
    finally:
        if pg_server.source == "env":  # a server of our own is deleted whole
            drop_database_sync(pg_server.dsn, name)


@pytest.fixture(scope="session")
def make_database(pg_server: PostgresStore, pg_template: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh migrated databases; returns each one's DSN. Dropped at session end."""
    from horde_testing.pgadmin import create_database_sync, drop_database_sync

    made: list[str] = []

    def make() -> str:
        name = _db_name("t")
        create_database_sync(pg_server.dsn, name, template=pg_template)
        made.append(name)
        return pg_server.dsn_for(name)

    yield make
    if pg_server.source == "env":  # a server of our own is deleted whole
        for name in made:
            drop_database_sync(pg_server.dsn, name)


@pytest.fixture(scope="session")
def pg_dsn(make_database: Callable[[], str]) -> str:
    """One migrated database shared by the session (tests using it see each other's rows)."""
    return make_database()


@pytest.fixture(scope="module")
def database_url(pg_server: PostgresStore, pg_template: str) -> Iterator[str]:
    """A fresh migrated database for this test module (DSN); dropped WITH (FORCE) afterwards."""
    from horde_testing.pgadmin import create_database_sync, drop_database_sync

    name = _db_name("m")
    create_database_sync(pg_server.dsn, name, template=pg_template)
    try:
        yield pg_server.dsn_for(name)
    finally:
        drop_database_sync(pg_server.dsn, name)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisStore]:
    """The session's Redis-protocol server."""
    from horde_testing.stores import redis_store

    with redis_store() as store:
        yield store


@pytest.fixture(scope="module")
def redis_url(redis_server: RedisStore) -> str:
    """The session's Redis URL (db 0), flushed (every db) before this module when disposable."""
    disposable = redis_server.source != "env" or bool(os.environ.get("HORDE_TEST_REDIS_URL"))
    if disposable:
        import redis

        client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()
    return redis_server.url


@pytest.fixture(scope="module")
async def signal_redis(redis_url: str) -> AsyncIterator[Any]:
    """A client on the chat signal database (7) of ``redis_url``'s server."""
    from horde_core.redis_keys import signal_client

    client = signal_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
async def url_redis(redis_url: str) -> AsyncIterator[Any]:
    """A client on the database ``redis_url`` names, which is not the signal database."""
    from horde_core.redis_keys import CHAT_SIGNAL_DB, redis_client

    client = redis_client(redis_url)
    assert client.connection_pool.connection_kwargs["db"] != CHAT_SIGNAL_DB
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[Any]:
    """A real ``redis-server`` with ``requirepass`` and a TLS port only (:class:`horde_testing.redis_tls.TlsRedis`;
    Debian's package, installed on first use): ``.url()`` is its ``rediss://`` URL with the CA. Fails, never
    skips, where it cannot be had."""
    from horde_testing.redis_tls import TlsRedis  # makes certificates with cryptography: only when asked for

    with TlsRedis() as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """The session's S3 endpoint, with its buckets created."""
    from horde_testing.stores import s3_store

    with s3_store() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def horde_settings_env(database_url: str, redis_url: str, s3_endpoint: S3Endpoint) -> dict[str, str]:
    """``HORDE_*`` variables pointing at this module's database, the Redis and the S3 endpoint."""
    return {
        "HORDE_DATABASE_URL": database_url,
        "HORDE_REDIS_URL": redis_url,
        **s3_endpoint.env(),
        "HORDE_SECRET_KEY": TEST_SECRET_KEY,
    }


class _RecordingSchemaHandler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a small JSON schema and records the path it was asked for."""

    hits: list[str] = []  # noqa: RUF012 - replaced per server

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        body = b'{"type": "integer"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server serving a JSON schema at any path: ``(base URL, paths requested)``. Tests that a
    remote ``$ref`` is never fetched assert the list stays empty."""
    hits: list[str] = []
    handler: type[_RecordingSchemaHandler] = type(
        "RecordingSchemaHandler", (_RecordingSchemaHandler,), {"hits": hits}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hung_redis() -> Iterator[str]:
    """A Redis URL whose server accepts connections and never answers: a hung store."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()
