"""Worker availability from dispatch's WorkerPool over gRPC, and the rules admission derives from it.

See docs/native-api.md#known-models (404 UnknownChatModel, 403 NoEligibleWorker), #context-adjustments
(max_length lowering, growth bound), #impossible-reason, #free-output-allowance (eligible threads and
speed). The text model reference (``HORDE_TEXT_MODEL_REFERENCE``, loaded at process start) is in memory; the
worker pool is asked about a model only when the reference does not list it. A model is known while an
online chat worker (checked in within 300 s) serves it, paused or in maintenance included; it is served only
by the workers that take this requester's jobs. A legacy text request's availability (``RequestNeeds.prompt_jobs``)
counts the text workers instead: those taking prompt jobs that list one of its models, within their text limits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from dataclasses import asdict, fields
from typing import Any, Protocol

import grpc
from async_lru import alru_cache
from horde.dispatch.v1 import worker_pool_pb2
from horde_contract import TextModelReference
from horde_contract.errors import RC, HordeError
from horde_core.redis_keys import availability_cache_key
from horde_core.worker_pool import Availability, RequestNeeds

__all__ = [
    "Availability",
    "AvailabilityMemo",
    "RequestNeeds",
    "WorkerPoolClient",
    "cache_availability",
    "cached_availability",
    "check_models",
    "get_availability",
    "needs_key",
    "no_serving_worker_error",
    "refresh_availability",
    "unknown_model_error",
    "worker_pool_unavailable",
]

log = logging.getLogger(__name__)


class WorkerPoolClient(Protocol):
    """What admission calls on dispatch's WorkerPool: the aio ``WorkerPoolServiceStub`` (or a wrapper)."""

    def GetAvailability(
        self, request: worker_pool_pb2.GetAvailabilityRequest, *, timeout: float
    ) -> Awaitable[worker_pool_pb2.GetAvailabilityResponse]: ...


def worker_pool_unavailable() -> HordeError:
    """503 when dispatch's WorkerPool cannot be reached: admission cannot tell whether a model is served."""
    return HordeError(503, RC.WorkerPoolUnavailable, "The worker pool could not be reached. Retry later.")


async def get_availability(stub: WorkerPoolClient, needs: RequestNeeds, deadline: float) -> Availability:
    """One GetAvailability call. Raises 503 WorkerPoolUnavailable when dispatch does not answer."""
    try:
        response = await stub.GetAvailability(needs.to_proto(), timeout=deadline)
    except grpc.aio.AioRpcError as exc:
        log.warning("GetAvailability failed: %s %s", exc.code(), exc.details())
        raise worker_pool_unavailable() from None
    return Availability.from_proto(response)


_NEEDS_FIELDS = fields(RequestNeeds)


def needs_key(needs: RequestNeeds) -> tuple[Any, ...]:
    """``needs`` as a hashable key (not dataclasses.asdict: it deep-copies, 3 % of the text route's CPU)."""
    return tuple(
        tuple(value) if isinstance(value, list) else value
        for value in (getattr(needs, f.name) for f in _NEEDS_FIELDS)
    )


class AvailabilityMemo:
    """Recent GetAvailability answers by needs, for ``memo_seconds`` (the text route asked dispatch
    once per request, about 1 ms of CPU in each process for an answer that changes when workers check in).

    async-lru's TTL cache: concurrent lookups of the same needs share one call, a failed call is not kept, at
    most ``max_entries`` needs are kept (least recently used first out). ``memo_seconds`` 0 turns it off.
    """

    def __init__(self, memo_seconds: float, max_entries: int = 1024) -> None:
        self.memo_seconds = memo_seconds

        async def fetch(stub: WorkerPoolClient, needs: RequestNeeds, deadline: float) -> Availability:
            return await get_availability(stub, needs, deadline)

        self._fetch = alru_cache(
            maxsize=max_entries,
            ttl=memo_seconds,
            key=lambda stub, needs, deadline: (id(stub), needs_key(needs)),
        )(fetch)

    async def get(self, stub: WorkerPoolClient, needs: RequestNeeds, deadline: float) -> Availability:
        """The memoised answer for ``needs``, or a fresh :func:`get_availability` (503 WorkerPoolUnavailable
        when dispatch does not answer, as there)."""
        if self.memo_seconds <= 0:
            return await get_availability(stub, needs, deadline)
        return await self._fetch(stub, needs, deadline)


async def refresh_availability(
    stub: WorkerPoolClient, needs: RequestNeeds, fallback: Availability, deadline: float
) -> Availability:
    """Availability for the sized request (max_length lowered, context grown); ``fallback`` when dispatch
    does not answer the second call."""
    try:
        return await get_availability(stub, needs, deadline)
    except HordeError:
        return fallback


def _quote_list(models: list[str]) -> str:
    return ", ".join(f"'{m}'" for m in models)


def no_serving_worker_error(models: list[str], single_model_key: bool) -> HordeError:
    """403 NoEligibleWorker for known models without an online chat worker (docs/native-api.md#known-models)."""
    if single_model_key or len(models) == 1:
        message = f"No worker is currently serving the model '{models[0]}'."
    else:
        message = f"No worker is currently serving any of the models {_quote_list(models)}."
    return HordeError(403, RC.NoEligibleWorker, message)


def unknown_model_error(model: str, index: int | None) -> HordeError:
    """404 UnknownChatModel; under ``models`` the message starts with the entry's quoted path."""
    text = f"The model '{model}' is not known: no text model reference entry or online chat worker lists it."
    if index is not None:
        return HordeError(404, RC.UnknownChatModel, f"'models[{index}]': {text}")
    return HordeError(404, RC.UnknownChatModel, text)


async def check_models(
    stub: WorkerPoolClient,
    needs: RequestNeeds,
    single_model_key: bool,
    deadline: float,
    reference: TextModelReference,
) -> Availability:
    """Refuse unknown or unserved models, then return the request's availability (docs/native-api.md#known-models).

    A model is known when ``reference`` lists it or an online chat worker (checked in within 300 s) serves
    it, paused or in maintenance included: 404 UnknownChatModel only without either. A known model without a
    worker that serves this requester is 403 NoEligibleWorker. One GetAvailability for the whole request (the
    growth bound, lowering and allowance inputs, and whether any requested model is known and served). With
    several models it also asks, concurrently, about each entry the reference does not list, so the first
    unknown entry is refused with its path; an unknown entry is never dropped. 503 WorkerPoolUnavailable when
    dispatch does not answer.
    """
    whole = await get_availability(stub, needs, deadline)
    models = needs.models
    if len(models) == 1:
        if whole.serving_workers == 0:
            if not whole.model_known and not reference.is_known(models[0]):
                raise unknown_model_error(models[0], None if single_model_key else 0)
            raise no_serving_worker_error(models, single_model_key)
        return whole
    unlisted = [(index, model) for index, model in enumerate(models) if not reference.is_known(model)]
    per_model = await asyncio.gather(
        *(get_availability(stub, RequestNeeds(models=[model]), deadline) for _, model in unlisted)
    )
    for (index, model), found in zip(unlisted, per_model, strict=True):
        if not found.model_known:
            raise unknown_model_error(model, index)
    if whole.serving_workers == 0:
        raise no_serving_worker_error(models, single_model_key)
    return whole


async def cache_availability(redis: Any, request_id: str, availability: Availability, seconds: float) -> None:
    """Keep a request's availability for its status reads (docs/native-api.md#impossible-reason, 60 s). Best effort."""
    if seconds <= 0:
        return
    kept = asdict(availability)
    # The status reads counts and the gap; the ids only size the allowance, already decided.
    kept.pop("eligible_worker_ids", None)
    try:
        await redis.set(availability_cache_key(request_id), json.dumps(kept), ex=max(1, int(seconds)))
    except Exception:
        log.warning("availability cache write failed", exc_info=True)


async def cached_availability(redis: Any, request_id: str) -> Availability | None:
    """The cached availability of a request, or None. Best effort."""
    try:
        raw = await redis.get(availability_cache_key(request_id))
    except Exception:
        log.warning("availability cache read failed", exc_info=True)
        return None
    if not raw:
        return None
    names = {f.name for f in fields(Availability)}
    return Availability(**{k: v for k, v in json.loads(raw).items() if k in names})
