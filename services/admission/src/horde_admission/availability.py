"""Worker availability from dispatch's WorkerPool over gRPC, and the rules admission derives from it.

Spec: chat-requests.md **Known models** (404 UnknownChatModel, 403 NoEligibleWorker), **Context adjustments**
(max_length lowering, growth bound), **Impossible reason**, **Free output allowance** (eligible threads and
speed). The text model reference (``HORDE_TEXT_MODEL_REFERENCE``, loaded at process start) is in memory; the
worker pool is asked about a model only when the reference does not list it. A model is known while an
online chat worker (checked in within 300 s) serves it, paused or in maintenance included; it is served only
by the workers that take this requester's jobs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import grpc
from async_lru import alru_cache
from horde.dispatch.v1 import worker_pool_pb2
from horde_contract import TextModelReference
from horde_core.errors import HordeError

log = logging.getLogger(__name__)


@dataclass
class RequestNeeds:
    """What a request needs of a worker: the GetAvailabilityRequest fields."""

    models: list[str]
    required_features: list[str] = field(default_factory=list)
    max_length: int = 0
    max_context_length: int = 0
    tools_temperature: float | None = None
    has_images: bool = False
    only_worker_ids: list[str] = field(default_factory=list)
    ignore_worker_ids: list[str] = field(default_factory=list)
    trusted_workers: bool = False
    validated_backends: bool = False
    slow_workers: bool = True
    requester_user_id: int = 0

    def to_proto(self) -> worker_pool_pb2.GetAvailabilityRequest:
        kwargs: dict[str, Any] = {k: v for k, v in asdict(self).items() if k != "tools_temperature"}
        if self.tools_temperature is not None:
            kwargs["tools_temperature"] = self.tools_temperature
        return worker_pool_pb2.GetAvailabilityRequest(**kwargs)


@dataclass
class Availability:
    """GetAvailabilityResponse as plain values (JSON-cacheable).

    ``known_workers``: online chat workers serving a requested model, paused or in maintenance included (the
    model is known); ``serving_workers``: those that serve this requester (the model is served).
    """

    serving_workers: int = 0
    max_chat_context_length: int = 0
    max_chat_length: int = 0
    eligible_workers: int = 0
    eligible_threads: int = 0
    tokens_per_second: float = 0.0
    missing_declarations: list[str] = field(default_factory=list)
    exceeded_limits: list[str] = field(default_factory=list)
    known_workers: int = 0

    @property
    def model_known(self) -> bool:
        """Whether an online chat worker serves a requested model, paused or in maintenance included (a
        served model is known even from a dispatch that does not report ``known_workers``)."""
        return self.known_workers > 0 or self.serving_workers > 0

    @classmethod
    def from_proto(cls, r: worker_pool_pb2.GetAvailabilityResponse) -> Availability:
        gap = r.declaration_gap if r.HasField("declaration_gap") else None
        return cls(
            known_workers=r.known_workers,
            serving_workers=r.serving_workers,
            max_chat_context_length=r.max_chat_context_length,
            max_chat_length=r.max_chat_length,
            eligible_workers=r.eligible_workers,
            eligible_threads=r.eligible_threads,
            tokens_per_second=r.tokens_per_second,
            missing_declarations=list(gap.missing_declarations) if gap else [],
            exceeded_limits=list(gap.exceeded_limits) if gap else [],
        )

    def impossible_reason(self) -> dict[str, Any] | None:
        """The spec's ``impossible_reason`` when every serving worker was refused for a declaration."""
        if self.eligible_workers > 0 or not (self.missing_declarations or self.exceeded_limits):
            return None
        return {
            "kind": "declaration_gap",
            "missing_declarations": sorted(self.missing_declarations),
            "exceeded_limits": sorted(self.exceeded_limits),
        }


def worker_pool_unavailable() -> HordeError:
    """503 when dispatch's WorkerPool cannot be reached: admission cannot tell whether a model is served."""
    return HordeError(503, "WorkerPoolUnavailable", "The worker pool could not be reached. Retry later.")


async def get_availability(stub: Any, needs: RequestNeeds, deadline: float) -> Availability:
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
    """Recent GetAvailability answers by needs, for ``memo_seconds`` (issue 10: the text route asked dispatch
    once per request, about 1 ms of CPU in each process for an answer that changes when workers check in).

    async-lru's TTL cache: concurrent lookups of the same needs share one call, a failed call is not kept, at
    most ``max_entries`` needs are kept (least recently used first out). ``memo_seconds`` 0 turns it off.
    """

    def __init__(self, memo_seconds: float, max_entries: int = 1024) -> None:
        self.memo_seconds = memo_seconds

        async def fetch(stub: Any, needs: RequestNeeds, deadline: float) -> Availability:
            return await get_availability(stub, needs, deadline)

        self._fetch = alru_cache(
            maxsize=max_entries,
            ttl=memo_seconds,
            key=lambda stub, needs, deadline: (id(stub), needs_key(needs)),
        )(fetch)

    async def get(self, stub: Any, needs: RequestNeeds, deadline: float) -> Availability:
        """The memoised answer for ``needs``, or a fresh :func:`get_availability` (503 WorkerPoolUnavailable
        when dispatch does not answer, as there)."""
        if self.memo_seconds <= 0:
            return await get_availability(stub, needs, deadline)
        return await self._fetch(stub, needs, deadline)


async def refresh_availability(
    stub: Any, needs: RequestNeeds, fallback: Availability, deadline: float
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
    """403 NoEligibleWorker for known models without an online chat worker (spec: Known models)."""
    if single_model_key or len(models) == 1:
        message = f"No worker is currently serving the model '{models[0]}'."
    else:
        message = f"No worker is currently serving any of the models {_quote_list(models)}."
    return HordeError(403, "NoEligibleWorker", message)


def unknown_model_error(model: str, index: int | None) -> HordeError:
    """404 UnknownChatModel; under ``models`` the message starts with the entry's quoted path."""
    text = f"The model '{model}' is not known: no text model reference entry or online chat worker lists it."
    if index is not None:
        return HordeError(404, "UnknownChatModel", f"'models[{index}]': {text}")
    return HordeError(404, "UnknownChatModel", text)


async def check_models(
    stub: Any,
    needs: RequestNeeds,
    single_model_key: bool,
    deadline: float,
    reference: TextModelReference,
) -> Availability:
    """Refuse unknown or unserved models, then return the request's availability (spec: Known models).

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


def _cache_key(request_id: str) -> str:
    return f"horde:admission:availability:{request_id}"


async def cache_availability(redis: Any, request_id: str, availability: Availability, seconds: float) -> None:
    """Keep a request's availability for its status reads (spec: Impossible reason, 60 s). Best effort."""
    if seconds <= 0:
        return
    try:
        await redis.set(_cache_key(request_id), json.dumps(asdict(availability)), ex=max(1, int(seconds)))
    except Exception:
        log.warning("availability cache write failed", exc_info=True)


async def cached_availability(redis: Any, request_id: str) -> Availability | None:
    """The cached availability of a request, or None. Best effort."""
    try:
        raw = await redis.get(_cache_key(request_id))
    except Exception:
        log.warning("availability cache read failed", exc_info=True)
        return None
    if not raw:
        return None
    names = {f.name for f in fields(Availability)}
    return Availability(**{k: v for k, v in json.loads(raw).items() if k in names})
