"""``horde.dispatch.v1.WorkerPoolService`` values: a request's needs and the worker pool's availability.

Admission builds :class:`RequestNeeds` and reads :class:`Availability`; dispatch reads :class:`RequestNeeds`
and answers :class:`Availability`. Each converts to and from its message here, so both ends read the wire the
same way (``GetAvailabilityRequest``, ``GetAvailabilityResponse``; proto/horde/dispatch/v1/worker_pool.proto).
See docs/native-api.md#known-models, #context-adjustments, #impossible-reason, #free-output-allowance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from horde.dispatch.v1 import worker_pool_pb2
from horde_contract import declaration_gap_reason


@dataclass(slots=True)
class RequestNeeds:
    """What a request needs of a worker: the ``GetAvailabilityRequest`` fields.

    ``models``: any of them may serve it. ``required_features``: sorted chat_required_features (features and
    guarantees). ``max_length``/``max_context_length``: tokens, 0 skips the check. ``tools_temperature``: the
    temperature a job carries when it forwards tools, else None. ``only_worker_ids``/``ignore_worker_ids``,
    ``trusted_workers``, ``validated_backends``, ``slow_workers``: the request's ``horde`` worker choice.
    ``requester_user_id``: a worker in maintenance or paused still serves its owner. ``prompt_jobs``: a legacy
    text request, served by the workers that take prompt jobs and list one of its models (any model when
    ``models`` is empty), within their text limits; the chat fields do not apply to it.
    """

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
    prompt_jobs: bool = False

    def to_proto(self) -> worker_pool_pb2.GetAvailabilityRequest:
        """The request message; ``tools_temperature`` None leaves the optional field unset."""
        return worker_pool_pb2.GetAvailabilityRequest(
            models=self.models,
            required_features=self.required_features,
            max_length=self.max_length,
            max_context_length=self.max_context_length,
            tools_temperature=self.tools_temperature,
            has_images=self.has_images,
            only_worker_ids=self.only_worker_ids,
            ignore_worker_ids=self.ignore_worker_ids,
            trusted_workers=self.trusted_workers,
            validated_backends=self.validated_backends,
            slow_workers=self.slow_workers,
            requester_user_id=self.requester_user_id,
            prompt_jobs=self.prompt_jobs,
        )

    @classmethod
    def from_proto(cls, r: worker_pool_pb2.GetAvailabilityRequest) -> RequestNeeds:
        """The needs a request message carries; a negative size limit reads as 0 (not constrained) and an
        unset ``tools_temperature`` as None. Worker ids are kept as sent."""
        return cls(
            models=list(r.models),
            required_features=list(r.required_features),
            max_length=max(0, r.max_length),
            max_context_length=max(0, r.max_context_length),
            tools_temperature=r.tools_temperature if r.HasField("tools_temperature") else None,
            has_images=r.has_images,
            only_worker_ids=list(r.only_worker_ids),
            ignore_worker_ids=list(r.ignore_worker_ids),
            trusted_workers=r.trusted_workers,
            validated_backends=r.validated_backends,
            slow_workers=r.slow_workers,
            requester_user_id=r.requester_user_id,
            prompt_jobs=r.prompt_jobs,
        )


@dataclass(slots=True)
class Availability:
    """The ``GetAvailabilityResponse`` as plain values (``dataclasses.asdict`` gives a JSON-ready dict).

    ``known_workers``: online chat workers (checked in within 300 s) serving a requested model, paused or in
    maintenance included (the model is known). ``serving_workers``: those that serve this requester (the
    model is served); the largest chat limits (tokens), the eligible workers, their threads and their speed
    (tokens per second, each worker counted once per thread) count only those. ``missing_declarations`` and
    ``exceeded_limits``: the declaration gap (sorted), non-empty only when no worker is eligible and every
    serving worker was refused for a declaration. ``eligible_worker_ids``: the eligible workers' ids, whose
    queue the request would join (the free output allowance's competing requests).

    For a legacy text request (``RequestNeeds.prompt_jobs``) the workers are the online workers that take
    prompt jobs and list a requested model; the chat limits and the declaration gap stay empty.
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
    eligible_worker_ids: list[str] = field(default_factory=list)

    @property
    def model_known(self) -> bool:
        """Whether an online chat worker serves a requested model, paused or in maintenance included (a
        served model is known even from a dispatch that does not report ``known_workers``)."""
        return self.known_workers > 0 or self.serving_workers > 0

    def impossible_reason(self) -> dict[str, Any] | None:
        """The ``impossible_reason`` when every serving worker was refused for a declaration:
        ``{"kind": "declaration_gap", "missing_declarations": [...], "exceeded_limits": [...]}``, else None."""
        if self.eligible_workers > 0 or not (self.missing_declarations or self.exceeded_limits):
            return None
        return declaration_gap_reason(self.missing_declarations, self.exceeded_limits)

    def to_proto(self) -> worker_pool_pb2.GetAvailabilityResponse:
        """The response message; ``declaration_gap`` is set only when the gap names something."""
        response = worker_pool_pb2.GetAvailabilityResponse(
            known_workers=self.known_workers,
            serving_workers=self.serving_workers,
            max_chat_context_length=self.max_chat_context_length,
            max_chat_length=self.max_chat_length,
            eligible_workers=self.eligible_workers,
            eligible_threads=self.eligible_threads,
            tokens_per_second=self.tokens_per_second,
            eligible_worker_ids=self.eligible_worker_ids,
        )
        if self.missing_declarations or self.exceeded_limits:
            response.declaration_gap.missing_declarations.extend(self.missing_declarations)
            response.declaration_gap.exceeded_limits.extend(self.exceeded_limits)
        return response

    @classmethod
    def from_proto(cls, r: worker_pool_pb2.GetAvailabilityResponse) -> Availability:
        """The availability a response message carries."""
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
            eligible_worker_ids=list(r.eligible_worker_ids),
        )
