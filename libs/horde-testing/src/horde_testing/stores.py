"""Real stores for tests and the local stack: an env URL, else a container when a Docker engine answers,
else an embedded server (README.md#architecture; no in-memory fakes).

Each store is a context manager yielding where it is; whatever it started is stopped on exit (and, for
processes, when we die: see :mod:`horde_testing._proc`).

* :func:`postgres_store` -> :class:`PostgresStore` (a superuser-ish DSN to one database)
* :func:`redis_store` -> :class:`RedisStore` (``redis://host:port/0``)
* :func:`s3_store` -> :class:`S3Endpoint` (a ``str`` of the endpoint URL, carrying credentials and
  bucket names; the buckets exist)

The source is chosen per store: the first set variable of ``env_vars``; else ``HORDE_TESTING_STORES``
(``auto`` default, ``container``, ``embedded``) decides, ``auto`` meaning "container when
:func:`docker_available`, embedded otherwise". A container that fails to start falls back to embedded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from horde_testing._proc import free_port, wait_until
from horde_testing.embedded import (
    S3_ACCESS_KEY_ID,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    EmbeddedPostgres,
    EmbeddedS3,
    EmbeddedValkey,
    http_ok,
    redis_ping,
)

log = logging.getLogger("horde_testing.stores")

Source = Literal["env", "container", "embedded"]

DEFAULT_IMAGE_BUCKET = "horde-chat-images"
POSTGRES_IMAGE = "postgres:16-alpine"
VALKEY_IMAGE = "valkey/valkey:8-alpine"
MINIO_IMAGE = "minio/minio:latest"


@dataclass(frozen=True)
class PostgresStore:
    """A PostgreSQL server. ``dsn`` points at ``database`` with a role that may CREATE DATABASE."""

    dsn: str
    source: Source
    startup_seconds: float = 0.0

    def dsn_for(self, database: str) -> str:
        """The same server and credentials, another database."""
        parts = urlsplit(self.dsn)
        return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


@dataclass(frozen=True)
class RedisStore:
    """A Redis-protocol server; ``url`` selects db 0 (the completion signals use db 7)."""

    url: str
    source: Source
    startup_seconds: float = 0.0

    def url_for(self, db: int) -> str:
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


class S3Endpoint(str):
    """The S3 endpoint URL (the ``str`` value), with what a client needs to use it."""

    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    region: str
    image_bucket: str
    messages_bucket: str
    source: Source
    startup_seconds: float

    def __new__(
        cls,
        endpoint_url: str,
        *,
        access_key_id: str,
        secret_access_key: str,
        region: str = S3_REGION,
        image_bucket: str = DEFAULT_IMAGE_BUCKET,
        messages_bucket: str | None = None,
        source: Source = "embedded",
        startup_seconds: float = 0.0,
    ) -> S3Endpoint:
        self = super().__new__(cls, endpoint_url)
        self.endpoint_url = endpoint_url
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.region = region
        self.image_bucket = image_bucket
        self.messages_bucket = messages_bucket or image_bucket
        self.source = source
        self.startup_seconds = startup_seconds
        return self

    def env(self) -> dict[str, str]:
        """The ``HORDE_S3_*`` variables for this endpoint."""
        return {
            "HORDE_S3_ENDPOINT_URL": self.endpoint_url,
            "HORDE_S3_ACCESS_KEY_ID": self.access_key_id,
            "HORDE_S3_SECRET_ACCESS_KEY": self.secret_access_key,
            "HORDE_S3_REGION": self.region,
            "HORDE_S3_IMAGE_BUCKET": self.image_bucket,
            "HORDE_S3_MESSAGES_BUCKET": self.messages_bucket,
        }

    def client(self) -> Any:
        """A boto3 S3 client for this endpoint (path-style)."""
        from horde_store.objects import make_s3_client

        return make_s3_client(
            endpoint_url=self.endpoint_url,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            region=self.region,
        )


# --- source selection ------------------------------------------------------------------------------


def _env_value(env: Mapping[str, str], names: Sequence[str]) -> str | None:
    for name in names:
        value = env.get(name)
        if value:
            return value
    return None


def docker_available(timeout: float = 1.0) -> bool:
    """True when a Docker engine answers ``GET /_ping`` within ``timeout`` seconds (``DOCKER_HOST``
    ``unix://``/``tcp://``, else ``/var/run/docker.sock``)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            path = host[len("unix://") :]
            if not os.path.exists(path):
                return False
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(path)
        elif host.startswith("tcp://"):
            parts = urlsplit(host)
            sock = socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 2375), timeout=timeout
            )
            sock.settimeout(timeout)
        else:
            return False
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(256)
    except OSError:
        return False


def _use_containers(containers: bool | None) -> bool:
    if containers is not None:
        return containers
    mode = os.environ.get("HORDE_TESTING_STORES", "auto").strip().lower()
    if mode == "embedded":
        return False
    if mode == "container":
        return True
    return docker_available()


def _local_docker() -> bool:
    return os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")


def _start_container(image: str, container_port: int, configure: Any) -> tuple[Any, str, int]:
    """Start ``image`` with ``container_port`` published (on 127.0.0.1 for a local engine)."""
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image)
    configure(container)
    if _local_docker():
        # docker-py takes (host_ip, host_port): publish on loopback only, never 0.0.0.0.
        container.ports[f"{container_port}/tcp"] = ("127.0.0.1", free_port())  # type: ignore[assignment]
    else:
        container.with_exposed_ports(container_port)
    container.start()
    host = container.get_container_host_ip()
    if host in ("localhost", "0.0.0.0"):
        host = "127.0.0.1"
    return container, host, int(container.get_exposed_port(container_port))


# --- PostgreSQL ------------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_store(
    *,
    env_vars: Sequence[str] = ("HORDE_TEST_DATABASE_URL", "HORDE_DATABASE_URL"),
    environ: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    persistent: bool = False,
    port: int | None = None,
    database: str | None = None,
    containers: bool | None = None,
) -> Iterator[PostgresStore]:
    """Yield a PostgreSQL server (see the module docstring for the source order).

    Embedded: data under ``root`` (temp dir when None, removed after), ``persistent`` keeps it and
    fsync on; ``port`` is preferred when free. ``database`` is created if missing and is the DSN's
    database (default ``postgres``). An env URL is used as given.
    """
    env = os.environ if environ is None else environ
    url = _env_value(env, env_vars)
    if url:
        from horde_store.db import normalize_dsn

        yield PostgresStore(dsn=normalize_dsn(url), source="env")
        return
    if _use_containers(containers):
        started = _postgres_container(database)
        if started is not None:
            container, store = started
            try:
                yield store
            finally:
                with contextlib.suppress(Exception):
                    container.stop()
            return
    server = EmbeddedPostgres(root, port=port, persistent=persistent, database=database)
    server.start()
    try:
        yield PostgresStore(
            dsn=server.dsn(), source="embedded", startup_seconds=server.startup_seconds or 0.0
        )
    finally:
        server.stop()


def _postgres_container(database: str | None) -> tuple[Any, PostgresStore] | None:
    import secrets

    password = secrets.token_urlsafe(18)
    db = database or "postgres"
    t0 = time.monotonic()
    try:
        container, host, port = _start_container(
            POSTGRES_IMAGE,
            5432,
            lambda c: (
                c.with_env("POSTGRES_PASSWORD", password)
                .with_env("POSTGRES_DB", db)
                .with_command("postgres -c max_connections=400 -c fsync=off -c synchronous_commit=off")
            ),
        )
    except Exception as exc:  # no image, no network, …: fall back to embedded
        log.warning("PostgreSQL container failed (%s); using the embedded server", exc)
        return None
    dsn = f"postgresql://postgres:{password}@{host}:{port}/{db}"

    def ready() -> bool:
        from horde_testing.pgadmin import run_sync

        async def ping() -> bool:
            import asyncpg

            conn = await asyncpg.connect(dsn, timeout=2)
            try:
                return bool(await conn.fetchval("SELECT 1"))
            finally:
                await conn.close()

        return run_sync(ping())

    try:
        wait_until(ready, timeout=60, interval=0.25, what="postgres container")
    except Exception:
        with contextlib.suppress(Exception):
            container.stop()
        raise
    return container, PostgresStore(dsn=dsn, source="container", startup_seconds=time.monotonic() - t0)


# --- Redis / Valkey --------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_store(
    *,
    env_vars: Sequence[str] = ("HORDE_TEST_REDIS_URL", "HORDE_REDIS_URL"),
    environ: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    persistent: bool = False,
    port: int | None = None,
    containers: bool | None = None,
) -> Iterator[RedisStore]:
    """Yield a Redis-protocol server (env URL, Valkey container, or embedded Valkey)."""
    env = os.environ if environ is None else environ
    url = _env_value(env, env_vars)
    if url:
        yield RedisStore(url=url, source="env")
        return
    if _use_containers(containers):
        t0 = time.monotonic()
        try:
            container, host, cport = _start_container(VALKEY_IMAGE, 6379, lambda c: None)
        except Exception as exc:
            log.warning("Valkey container failed (%s); using the embedded server", exc)
        else:
            try:
                wait_until(lambda: redis_ping(host, cport), timeout=30, what="valkey container")
                yield RedisStore(
                    url=f"redis://{host}:{cport}/0", source="container", startup_seconds=time.monotonic() - t0
                )
            finally:
                with contextlib.suppress(Exception):
                    container.stop()
            return
    server = EmbeddedValkey(root, port=port, persistent=persistent)
    server.start()
    try:
        yield RedisStore(url=server.url(0), source="embedded", startup_seconds=server.startup_seconds or 0.0)
    finally:
        server.stop()


# --- S3 ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def s3_store(
    *,
    env_vars: Sequence[str] = ("HORDE_TEST_S3_ENDPOINT_URL", "HORDE_S3_ENDPOINT_URL"),
    environ: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    persistent: bool = False,
    port: int | None = None,
    containers: bool | None = None,
    image_bucket: str | None = None,
    messages_bucket: str | None = None,
    create_buckets: bool = True,
) -> Iterator[S3Endpoint]:
    """Yield an S3 API endpoint with its buckets created (env URL, MinIO container, or moto's server).

    Buckets: ``image_bucket`` (default ``HORDE_S3_IMAGE_BUCKET`` or ``horde-chat-images``) and
    ``messages_bucket`` (default ``HORDE_S3_MESSAGES_BUCKET`` or the image bucket). With an env URL
    the credentials and region come from ``HORDE_S3_ACCESS_KEY_ID``/``…_SECRET_ACCESS_KEY``/``…_REGION``.
    """
    env = os.environ if environ is None else environ
    image_bucket = image_bucket or env.get("HORDE_S3_IMAGE_BUCKET") or DEFAULT_IMAGE_BUCKET
    messages_bucket = messages_bucket or env.get("HORDE_S3_MESSAGES_BUCKET") or image_bucket
    url = _env_value(env, env_vars)

    def endpoint(
        u: str,
        key: str,
        secret: str,
        region: str,
        source: Source,
        secs: float,
        server: EmbeddedS3 | None = None,
    ) -> S3Endpoint:
        ep = S3Endpoint(
            u,
            access_key_id=key,
            secret_access_key=secret,
            region=region,
            image_bucket=image_bucket,
            messages_bucket=messages_bucket,
            source=source,
            startup_seconds=secs,
        )
        if create_buckets and server is not None:
            server.create_buckets([ep.image_bucket, ep.messages_bucket])
        elif create_buckets:
            from horde_store.objects import ensure_buckets

            ensure_buckets(ep.client(), [ep.image_bucket, ep.messages_bucket])
        return ep

    if url:
        yield endpoint(
            url,
            env.get("HORDE_S3_ACCESS_KEY_ID") or S3_ACCESS_KEY_ID,
            env.get("HORDE_S3_SECRET_ACCESS_KEY") or S3_SECRET_ACCESS_KEY,
            env.get("HORDE_S3_REGION") or S3_REGION,
            "env",
            0.0,
        )
        return
    if _use_containers(containers):
        t0 = time.monotonic()
        try:
            container, host, cport = _start_container(
                MINIO_IMAGE,
                9000,
                lambda c: (
                    c.with_env("MINIO_ROOT_USER", S3_ACCESS_KEY_ID)
                    .with_env("MINIO_ROOT_PASSWORD", S3_SECRET_ACCESS_KEY)
                    .with_command("server /data")
                ),
            )
        except Exception as exc:
            log.warning("MinIO container failed (%s); using moto's server", exc)
        else:
            try:
                base = f"http://{host}:{cport}"
                wait_until(lambda: http_ok(base + "/minio/health/live"), timeout=60, what="minio container")
                yield endpoint(
                    base,
                    S3_ACCESS_KEY_ID,
                    S3_SECRET_ACCESS_KEY,
                    S3_REGION,
                    "container",
                    time.monotonic() - t0,
                )
            finally:
                with contextlib.suppress(Exception):
                    container.stop()
            return
    server = EmbeddedS3(root, port=port, persistent=persistent)
    server.start()
    try:
        yield endpoint(
            server.endpoint_url,
            S3_ACCESS_KEY_ID,
            S3_SECRET_ACCESS_KEY,
            S3_REGION,
            "embedded",
            server.startup_seconds or 0.0,
            server,
        )
    finally:
        server.stop()


@dataclass(frozen=True)
class Stores:
    """The three stores of one stack."""

    postgres: PostgresStore
    redis: RedisStore
    s3: S3Endpoint

    def env(self) -> dict[str, str]:
        """``HORDE_DATABASE_URL``, ``HORDE_REDIS_URL`` and the ``HORDE_S3_*`` variables."""
        return {"HORDE_DATABASE_URL": self.postgres.dsn, "HORDE_REDIS_URL": self.redis.url, **self.s3.env()}


@contextlib.contextmanager
def store_stack(
    *,
    data_dir: str | os.PathLike[str] | None = None,
    persistent: bool = False,
    database: str | None = None,
    pg_port: int | None = None,
    redis_port: int | None = None,
    s3_port: int | None = None,
    environ: Mapping[str, str] | None = None,
    env_prefixes: Sequence[str] = ("HORDE_",),
    containers: bool | None = None,
) -> Iterator[Stores]:
    """All three stores; the embedded ones boot in parallel (moto's ~1.5 s import overlaps initdb).

    A store named by ``<prefix>DATABASE_URL`` / ``REDIS_URL`` / ``S3_ENDPOINT_URL`` (first prefix
    that has it) is used as is. Embedded data goes under ``data_dir``/{postgres,valkey,s3} (temp dirs
    when None). Must run on a long-lived thread (see :func:`horde_testing._proc.spawn`).
    """
    env = os.environ if environ is None else environ
    root = Path(data_dir).absolute() if data_dir is not None else None

    def names(suffix: str) -> tuple[str, ...]:
        return tuple(prefix + suffix for prefix in env_prefixes)

    use_containers = _use_containers(containers)
    with contextlib.ExitStack() as stack:
        embedded: list[EmbeddedPostgres | EmbeddedValkey | EmbeddedS3] = []
        pg_server = redis_server = s3_server = None
        if not _env_value(env, names("DATABASE_URL")) and not use_containers:
            pg_server = EmbeddedPostgres(
                root / "postgres" if root else None, port=pg_port, persistent=persistent, database=database
            )
            embedded.append(pg_server)
        if not _env_value(env, names("REDIS_URL")) and not use_containers:
            redis_server = EmbeddedValkey(
                root / "valkey" if root else None, port=redis_port, persistent=persistent
            )
            embedded.append(redis_server)
        if not _env_value(env, names("S3_ENDPOINT_URL")) and not use_containers:
            s3_server = EmbeddedS3(root / "s3" if root else None, port=s3_port, persistent=persistent)
            embedded.append(s3_server)
        # Launch the slowest first: moto's import, then Valkey, then initdb (which blocks in start()).
        for server in reversed(embedded):
            stack.callback(server.stop)
            server.start(wait=False)
        for server in embedded:
            server.wait_ready()

        if pg_server is not None:
            pg = PostgresStore(
                dsn=pg_server.dsn(), source="embedded", startup_seconds=pg_server.startup_seconds or 0.0
            )
        else:
            pg = stack.enter_context(
                postgres_store(
                    env_vars=names("DATABASE_URL"), environ=env, database=database, containers=containers
                )
            )
        if redis_server is not None:
            redis = RedisStore(
                url=redis_server.url(0),
                source="embedded",
                startup_seconds=redis_server.startup_seconds or 0.0,
            )
        else:
            redis = stack.enter_context(
                redis_store(env_vars=names("REDIS_URL"), environ=env, containers=containers)
            )
        if s3_server is not None:
            s3 = S3Endpoint(
                s3_server.endpoint_url,
                access_key_id=S3_ACCESS_KEY_ID,
                secret_access_key=S3_SECRET_ACCESS_KEY,
                region=S3_REGION,
                image_bucket=env.get("HORDE_S3_IMAGE_BUCKET") or DEFAULT_IMAGE_BUCKET,
                messages_bucket=env.get("HORDE_S3_MESSAGES_BUCKET") or None,
                source="embedded",
                startup_seconds=s3_server.startup_seconds or 0.0,
            )
            s3_server.create_buckets([s3.image_bucket, s3.messages_bucket])
        else:
            s3 = stack.enter_context(
                s3_store(env_vars=names("S3_ENDPOINT_URL"), environ=env, containers=containers)
            )
        yield Stores(postgres=pg, redis=redis, s3=s3)


def write_env_file(path: str | os.PathLike[str], values: Mapping[str, str]) -> None:
    """Write ``export KEY='value'`` lines to ``path`` atomically (temp file + rename), mode 0600."""
    import shlex

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        for key, value in values.items():
            fh.write(f"export {key}={shlex.quote(value)}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
