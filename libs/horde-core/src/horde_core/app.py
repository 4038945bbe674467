"""FastAPI app factory: the Horde error envelope, ``/healthz``, ``/readyz`` and ``/metrics`` on every process.

Every service has the same skeleton: ``<service>.app.create_app(settings=None) -> FastAPI`` builds its app with
:func:`create_app` here (passing its settings and its lifespan), mounts its native routers with
:func:`include_native` (served at ``/api/v2/...``, the upstream AI Horde path existing clients and workers use,
and at ``/v2/...``, the spec's path) and installs its OpenAPI document. The lifespan opens the stores
(``horde_store.stores.open_stores``, which registers the ``database`` and ``redis`` readiness checks through
:func:`add_store_readiness`), puts one typed state dataclass on ``app.state.<service>`` (read by handlers
through the service's ``state.get_state``) and closes everything it opened. ``<service>.__main__`` serves the
app with :func:`horde_core.runner.serve`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from horde_contract.errors import RC, HordeError
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from horde_core.capacity import InFlightLimit
from horde_core.docs_policy import DocsPolicy
from horde_core.http_metrics import install_http_metrics, note_rc
from horde_core.metrics import gauge
from horde_core.ratelimit import RouteLimitMiddleware
from horde_core.request_id import install_request_id
from horde_core.settings import HordeSettings
from horde_core.tracing import instrument_app

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[object]]
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]

READINESS_TIMEOUT_SECONDS = 2.0
#: The ``store`` label of ``horde_store_up`` for each readiness check that pings a store.
STORE_OF_CHECK = {"database": "postgres", "redis": "redis", "s3": "s3"}

STORE_UP = gauge(
    "horde.store.up",
    "1 when the store answered this process's last /readyz ping within 2 s, else 0 (postgres, redis, s3)",
    ["horde.store"],
)
#: Where every process serves the Swagger UI and ReDoc assets its /docs and /redoc pages load (under /docs, so
#: the one horde URL's /docs route reaches the front's).
DOCS_ASSETS_URL = "/docs/assets"


def validation_message(exc: RequestValidationError) -> str:
    """One line naming the first failing field, e.g. ``"Input payload validation failed: body.max_tokens: ..."``."""
    errors = exc.errors()
    if not errors:
        return "Input payload validation failed"
    first = errors[0]
    loc = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    return f"Input payload validation failed: {loc or 'body'}: {first.get('msg', 'invalid value')}"


STORE_OUTAGE_RETRY_AFTER_SECONDS = 5


def store_outage_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean a store is down, unreachable or too slow (answered 503 ``ServiceUnavailable``):
    the stdlib's connection errors and ``TimeoutError`` (a pool acquire or a command past its timeout,
    horde_store.db), asyncpg's connection, shutdown and too-many-connections errors and redis-py's connection
    and timeout errors, for whichever of those clients the process has installed."""
    errors: list[type[Exception]] = [ConnectionError, TimeoutError]
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - the front has no asyncpg
        pass
    else:
        errors += [
            asyncpg.exceptions.PostgresConnectionError,
            asyncpg.exceptions.CannotConnectNowError,
            asyncpg.exceptions.TooManyConnectionsError,
        ]
    import redis.exceptions

    errors += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    return tuple(errors)


def install_horde_error_handlers(app: FastAPI) -> None:
    """Map every error to ``{"message", "rc"}`` with its status (docs/native-api.md#refusals)."""

    # Each handler notes its rc for the request counter (horde_core.http_metrics), which reads no body.
    @app.exception_handler(HordeError)
    async def _horde_error(request: Request, exc: HordeError) -> JSONResponse:
        note_rc(request.scope, exc.rc)
        return JSONResponse(status_code=exc.status, content=exc.to_body(), headers=exc.headers)

    async def _store_unreachable(request: Request, exc: Exception) -> JSONResponse:
        # A store that refuses or drops connections is an outage to retry, not a server bug.
        log.warning("store unreachable: %s: %s", type(exc).__name__, exc)
        note_rc(request.scope, RC.ServiceUnavailable)
        return JSONResponse(
            status_code=503,
            content={
                "message": "A store this service needs is unreachable; retry shortly.",
                "rc": RC.ServiceUnavailable,
            },
            headers={"Retry-After": str(STORE_OUTAGE_RETRY_AFTER_SECONDS)},
        )

    for outage in store_outage_errors():
        app.add_exception_handler(outage, _store_unreachable)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        note_rc(request.scope, RC.BadRequest)
        return JSONResponse(
            status_code=400, content={"message": validation_message(exc), "rc": RC.BadRequest}
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        rc = {404: RC.NotFound, 405: RC.MethodNotAllowed}.get(exc.status_code, RC.BadRequest)
        note_rc(request.scope, rc)
        return JSONResponse(status_code=exc.status_code, content={"message": str(exc.detail), "rc": rc})

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        note_rc(request.scope, RC.InternalServerError)
        return JSONResponse(
            status_code=500, content={"message": "Internal Server Error", "rc": RC.InternalServerError}
        )


def include_native(app: FastAPI, router: APIRouter) -> None:
    """Serve ``router`` (whose paths start with ``/v2``) at ``/api/v2/...`` and at ``/v2/...``."""
    app.include_router(router, prefix="/api")
    app.include_router(router, include_in_schema=False)


async def run_readiness(checks: Mapping[str, ReadinessCheck]) -> tuple[bool, dict[str, str]]:
    """Run each check with a timeout; returns ``(all_ok, {name: "ok" | error text})``."""
    results: dict[str, str] = {}

    async def one(name: str, check: ReadinessCheck) -> None:
        try:
            await asyncio.wait_for(check(), READINESS_TIMEOUT_SECONDS)
            results[name] = "ok"
        except Exception as exc:  # readiness reports every failure, whatever its type
            results[name] = f"{type(exc).__name__}: {exc}"[:200]

    await asyncio.gather(*(one(n, c) for n, c in checks.items()))
    return all(v == "ok" for v in results.values()), results


def add_store_readiness(
    app: FastAPI,
    *,
    pool: Any | None = None,
    redis_ping: ReadinessCheck | None = None,
    s3_ping: ReadinessCheck | None = None,
) -> None:
    """Register the readiness checks of a process's stores, named the same in every service: ``database``
    (``SELECT 1`` on the asyncpg ``pool``) and ``redis`` (``redis_ping``, e.g. a client's bound ``ping``). A
    store left None gets no check. ``s3_ping`` is a probe, not a check: ``/readyz`` runs it beside the checks
    for ``horde_store_up{store="s3"}`` only, so an object store outage never makes the pod unready (only
    requests with images or offloaded messages need it)."""
    if pool is not None:

        async def database() -> object:
            return await pool.fetchval("SELECT 1")

        app.state.readiness_checks["database"] = database
    if redis_ping is not None:
        app.state.readiness_checks["redis"] = redis_ping
    if s3_ping is not None:
        app.state.store_probes["s3"] = s3_ping


def create_app(
    service: str,
    *,
    title: str | None = None,
    version: str = "0.1.0",
    lifespan: Lifespan | None = None,
    horde_errors: bool = True,
    settings: HordeSettings | None = None,
    **fastapi_kwargs: Any,
) -> FastAPI:
    """Build a FastAPI app for ``service`` with health, readiness and metrics routes.

    - ``GET /healthz``: 200 ``{"status": "ok", "service": ...}`` while the process runs.
    - ``GET /readyz``: 200 when every check in ``app.state.readiness_checks`` passes within 2 s, else 503
      with each check's result; each store check's result, and each probe's of ``app.state.store_probes``
      (run beside them, never failing readiness), also sets ``horde_store_up{store}``.
    - ``GET /metrics``: the Prometheus text exposition of the default registry.
    - Every other request counted and timed by route template, status and rc
      (:mod:`horde_core.http_metrics`: ``horde_http_server_requests_total``,
      ``horde_http_server_request_duration_seconds``).
    - A client that disconnects while its body is read gets 499 and no error log.
    - With ``horde_errors``, the in-flight cap (:class:`horde_core.capacity.InFlightLimit`,
      HORDE_MAX_IN_FLIGHT_REQUESTS): 503 ServiceAtCapacity with Retry-After past it.
    - Upstream's rate limits of the read and worker routes (:data:`horde_core.ratelimit.ROUTE_LIMITS`), counted
      before routing with the service's ``settings`` (kept on ``app.state.settings``; none: nothing counted).

    ``horde_errors`` installs the Horde envelope handlers; the OpenAI front passes False and installs its own.
    """
    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from the package's bundled assets (served
    # under DOCS_ASSETS_URL) instead of a CDN, so they render in a cluster without internet access.
    # A process without a document (openapi_url=None) has no viewers either.
    if fastapi_kwargs.get("openapi_url", "/openapi.json") is None:
        app = FastAPI(
            title=title or f"Horde Chat {service}", version=version, lifespan=lifespan, **fastapi_kwargs
        )
    else:
        app = FastAPIOffline(
            title=title or f"Horde Chat {service}",
            version=version,
            lifespan=lifespan,
            static_url=DOCS_ASSETS_URL,
            **fastapi_kwargs,
        )
        # Same-origin only on the viewer pages: ReDoc's bundle still fetches its logo from a CDN otherwise
        # (horde_core.docs_policy).
        viewers = (fastapi_kwargs.get("docs_url", "/docs"), fastapi_kwargs.get("redoc_url", "/redoc"))
        app.add_middleware(DocsPolicy, paths=frozenset(p for p in viewers if p))
    app.state.service = service
    app.state.settings = settings
    app.state.readiness_checks = {}
    app.state.store_probes = {}
    app.add_middleware(RouteLimitMiddleware, state=app.state)
    if horde_errors:
        # Added last, so it runs first: a request past the cap costs no rate-limit round trip. The front has
        # its own cap, with OpenAI's error shape (horde_oai.capacity).
        app.add_middleware(InFlightLimit, state=app.state)
        install_horde_error_handlers(app)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(_: Request, __: ClientDisconnect) -> Response:
        # The client hung up in the middle of its body: nobody reads an answer, and it is not our error (a
        # generic handler would log a traceback anyone could trigger without a key).
        return Response(status_code=499)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": service}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        (ok, results), (_, probed) = await asyncio.gather(
            run_readiness(app.state.readiness_checks), run_readiness(app.state.store_probes)
        )
        # horde_store_up: set by these pings only (the kubelet's readiness probe polls them every few seconds).
        for name, result in {**results, **probed}.items():
            store = STORE_OF_CHECK.get(name)
            if store is not None:
                STORE_UP.labels(store).set(1 if result == "ok" else 0)
        return JSONResponse(
            status_code=200 if ok else 503,
            content={"status": "ready" if ok else "unready", "service": service, "checks": results},
        )

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    # Server spans when tracing is on (horde_core.tracing; the service's __main__ configured it): a no-op off.
    instrument_app(app)
    # Request counts and durations by route template, status and rc (horde_core.http_metrics), around
    # Starlette's error middleware so its 500s are counted; inside the request id.
    install_http_metrics(app)
    # X-Request-ID in and out, on every log line of the request (horde_core.request_id), around everything.
    install_request_id(app)
    return app


async def noop_lifespan(_: FastAPI) -> AsyncIterator[None]:  # pragma: no cover - trivial
    yield
