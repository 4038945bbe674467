"""Legacy text routes: ``POST /v2/generate/text/async``, ``GET/DELETE /v2/generate/text/status/{id}``.

docs/native-api.md#text-route (body, processing order, response) and #status-and-cancel (status, cancel); the decisions of #text-route (max_length
16–16384, real kudos estimate in the response, a cancelled request with nothing in flight is done).

Bounds upstream does not have (horde_contract.limits): the prompt at most
MAX_TEXT_PROMPT_BYTES (1 MiB) of UTF-8, at most MAX_TEXT_MODEL_COUNT (200) models of at most
MAX_MODEL_NAME_LENGTH (255) characters, at most MAX_TEXT_WORKER_IDS (100) worker ids of at most
MAX_WORKER_ID_LENGTH (64) characters (the first 5 kept, as upstream), and params at most MAX_TEXT_PARAMS_BYTES
(256 KiB) as compact JSON; each refused with 400 BadRequest before authentication. A shared key's limits apply
as on the chat route (:func:`check_shared_key`).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any

import horde_contract as contract
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from horde_contract.errors import RC, HordeError
from horde_contract.limits import (
    MAX_MODEL_NAME_LENGTH,
    MAX_TEXT_MODEL_COUNT,
    MAX_TEXT_PARAMS_BYTES,
    MAX_TEXT_PROMPT_BYTES,
    MAX_TEXT_WORKER_IDS,
    MAX_TEXT_WORKERS_KEPT,
    MAX_WORKER_ID_LENGTH,
)

from horde_admission import kudos, store
from horde_admission.auth import Requester, authenticate
from horde_admission.availability import Availability, RequestNeeds
from horde_admission.body import read_json_object
from horde_admission.chat import NO_WORKER_WARNING
from horde_admission.checks import check_concurrency, check_shared_key, check_workers_exist, client_agent
from horde_admission.creation import Funding, create_or_refuse, free_allowance, horde_tax, upfront_hold
from horde_admission.lifecycle import cancel_and_report, read_status_body
from horde_admission.operator_controls import check_ip_timeout, check_maintenance, moderate_prompt
from horde_admission.settings import AdmissionSettings
from horde_admission.state import AdmissionState, get_state

router = APIRouter()

MAX_TEXT_WORKERS = MAX_TEXT_WORKERS_KEPT
#: The body's boolean keys (:class:`TextRequest`'s flags), in the order they are checked.
_FLAGS = (
    "worker_blacklist",
    "trusted_workers",
    "validated_backends",
    "slow_workers",
    "dry_run",
    "allow_downgrade",
)


def _bad(field: str, text: str) -> HordeError:
    return HordeError(400, RC.BadRequest, f"Input payload validation failed: {field}: {text}")


def _utf8_bytes(text: str) -> int:
    """The UTF-8 size of ``text`` (a character is 1 to 4 bytes; the body reader refused lone surrogates)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class TextRequest:
    """A validated legacy text body (:func:`parse_text_body`).

    ``params`` are the text params as sent (unset keys left out, :func:`contract.parse_text_params`);
    ``workers`` the listed worker ids (the first MAX_TEXT_WORKERS_KEPT), only those workers when
    ``worker_blacklist`` is false, all but them when true. The flags default to false except
    ``slow_workers`` (true).
    """

    prompt: str
    params: dict[str, Any]
    models: list[str]
    workers: list[str]
    worker_blacklist: bool
    trusted_workers: bool
    validated_backends: bool
    slow_workers: bool
    dry_run: bool
    allow_downgrade: bool

    @property
    def n(self) -> int:
        """Generations asked for (params.n, default 1)."""
        return int(self.params.get("n", 1))

    @property
    def max_length(self) -> int:
        """Tokens to generate per generation (params.max_length, default TEXT_DEFAULT_MAX_LENGTH)."""
        return int(self.params.get("max_length", contract.TEXT_DEFAULT_MAX_LENGTH))

    @property
    def max_context_length(self) -> int:
        """Context tokens (params.max_context_length, default TEXT_DEFAULT_MAX_CONTEXT_LENGTH)."""
        return int(self.params.get("max_context_length", contract.TEXT_DEFAULT_MAX_CONTEXT_LENGTH))

    def params_at(self, max_length: int) -> dict[str, Any]:
        """The params stored for the request at ``max_length`` tokens: the body's own unless it lowers an
        explicit or a default max_length (then ``max_length`` is written in)."""
        if "max_length" in self.params or max_length != self.max_length:
            return dict(self.params, max_length=max_length)
        return self.params


def _flag(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(key, "has to be a boolean")
    return value


def _string_list(body: dict[str, Any], key: str, what: str) -> list[str]:
    values = body.get(key) or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise _bad(key, f"has to be an array of {what}")
    return values


def parse_text_body(body: dict[str, Any]) -> TextRequest:
    """Validate the text async body (docs/native-api.md#text-route) into a :class:`TextRequest`.

    400 MissingPrompt for an empty prompt, 400 InvalidExtraSourceImages. for extra_source_images, 400
    BadRequest for wrong types and for params outside the text params model (parse_text_params, with the
    TokenOverflow, MissingFullSamplerOrder, TooManyStopSequences and ExcessiveStopSequence checks), and for
    the bounds of the module docstring (a prompt, models, workers or params too large).
    """
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("prompt", "'prompt' is a required property")
    if not isinstance(prompt, str):
        raise _bad("prompt", "has to be a string")
    if len(prompt) > MAX_TEXT_PROMPT_BYTES // 4 and (size := _utf8_bytes(prompt)) > MAX_TEXT_PROMPT_BYTES:
        raise _bad("prompt", f"takes {size} bytes of UTF-8; at most {MAX_TEXT_PROMPT_BYTES} are allowed")
    if body.get("extra_source_images") is not None:
        raise HordeError(
            400, RC.InvalidExtraSourceImages, "Extra source images are not supported on text requests."
        )
    models = _string_list(body, "models", "strings")
    if len(models) > MAX_TEXT_MODEL_COUNT:
        raise _bad("models", f"lists {len(models)} models; at most {MAX_TEXT_MODEL_COUNT} are allowed")
    for index, model in enumerate(models):
        if len(model) > MAX_MODEL_NAME_LENGTH:
            raise _bad(
                f"models[{index}]",
                f"is {len(model)} characters long; a model name has at most {MAX_MODEL_NAME_LENGTH}",
            )
    workers = _string_list(body, "workers", "worker ids")
    if len(workers) > MAX_TEXT_WORKER_IDS:
        raise _bad("workers", f"lists {len(workers)} worker ids; at most {MAX_TEXT_WORKER_IDS} are allowed")
    for index, worker in enumerate(workers):
        if len(worker) > MAX_WORKER_ID_LENGTH:
            raise _bad(f"workers[{index}]", "has to be a worker id")
    # The flags are checked in this order (the first wrong one is the one reported), before the params.
    flags = {key: _flag(body, key, default=key == "slow_workers") for key in _FLAGS}
    params = body.get("params") or {}
    if isinstance(params, dict):
        size = len(
            json.dumps(params, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
        )
        if size > MAX_TEXT_PARAMS_BYTES:
            raise _bad("params", f"takes {size} bytes as JSON; at most {MAX_TEXT_PARAMS_BYTES} are allowed")
    return TextRequest(
        prompt=prompt,
        params=contract.parse_text_params(params),
        models=models,
        workers=workers[:MAX_TEXT_WORKERS],
        **flags,
    )


async def text_availability(
    state: AdmissionState, text: TextRequest, requester: Requester
) -> Availability | None:
    """Availability of the online text workers for the request: those taking prompt jobs that list one of its
    models (any model when it lists none) within their text limits, rule 4 applied (the WorkerPool's
    ``prompt_jobs`` needs); None when dispatch is down.
    """
    needs = RequestNeeds(
        prompt_jobs=True,
        models=text.models,
        max_length=text.max_length,
        max_context_length=text.max_context_length,
        only_worker_ids=[] if text.worker_blacklist else text.workers,
        ignore_worker_ids=text.workers if text.worker_blacklist else [],
        trusted_workers=text.trusted_workers,
        validated_backends=text.validated_backends,
        slow_workers=text.slow_workers,
        requester_user_id=requester.user_id,
    )
    try:
        return await state.availability_memo.get(
            state.worker_pool, needs, state.settings.availability_timeout_seconds
        )
    except HordeError:
        return None


def new_text_request(
    text: TextRequest,
    requester: Requester,
    request: Request,
    settings: AdmissionSettings,
    estimate: int,
    tax: float,
    shared_key_amount: float,
) -> store.NewRequest:
    """The row of a text request at its full max_length; ``shared_key_amount`` is what its shared key must
    cover (:func:`check_shared_key`)."""
    return store.NewRequest(
        id=uuid.uuid4(),
        user_id=requester.user_id,
        is_chat=False,
        prompt=text.prompt,
        submitted_prompt=text.prompt,
        params=text.params_at(text.max_length),
        models=text.models,
        max_length=text.max_length,
        max_context_length=text.max_context_length,
        n=text.n,
        trusted_workers=text.trusted_workers,
        validated_backends=text.validated_backends,
        slow_workers=text.slow_workers,
        worker_ids=text.workers,
        worker_blacklist=text.worker_blacklist,
        shared_key_id=requester.shared_key_id,
        shared_key_amount=shared_key_amount,
        client_agent=client_agent(request),
        ipaddr=request.client.host if request.client else None,
        chat_conformance="strict",
        kudos_estimate=float(estimate),
        tax=tax,
        flagged_user=requester.flagged,
        ttl_seconds=settings.request_ttl_seconds,
    )


def downgraded(text: TextRequest, new: store.NewRequest, max_length: int) -> store.NewRequest:
    """``new`` downgraded (allow_downgrade): a new id, lowered to ``max_length`` tokens with slow workers
    allowed, which needs no hold; what its shared key must cover is priced again at creation."""
    return dataclasses.replace(
        new,
        id=uuid.uuid4(),
        params=text.params_at(max_length),
        max_length=max_length,
        slow_workers=True,
        shared_key_amount=0.0,
    )


@router.post("/v2/generate/text/async")
async def text_async(request: Request) -> JSONResponse:
    """Queue a legacy text request.

    Body: ``{prompt, params?, models?, workers?, worker_blacklist?, trusted_workers?, validated_backends?,
    slow_workers?, dry_run?, allow_downgrade?}``; header ``apikey``. 202 ``{id, kudos, message?}``; dry run
    200 ``{kudos}``. Errors: 429, 400 BadRequest / MissingPrompt / text params rc, 400 MaintenanceMode, 401
    InvalidAPIKey, 403 SharedKeyExpired / SharedKeyEmpty, 404 WorkerNotFound, 429 TooManyPrompts, 403
    TimeoutIP, 400 CorruptPrompt, 400 BadRequest above a shared key's max_text_tokens, 403
    SharedKeyInsufficientKudos, 403 KudosUpfront.
    """
    state = get_state(request)
    settings = state.settings
    await state.limiter.check(request, "text_async")
    text = parse_text_body(await read_json_object(request, settings.body_read_timeout_seconds))
    controls = state.operator_controls
    async with state.pool.acquire() as conn:
        await check_maintenance(controls, conn, settings)
        requester = await authenticate(conn, request.headers.get("apikey"), settings.secret_key)
        if not text.prompt:
            raise HordeError(400, RC.MissingPrompt, "You cannot specify an empty prompt.")
        await check_workers_exist(state, text.workers)
        await check_concurrency(state, requester, text.models, text.n, conn)
    # Countermeasures and moderation, as upstream: the address's timeout, then the replacement filter.
    await check_ip_timeout(state.redis, request, settings)
    submitted_prompt = text.prompt
    prompt = await moderate_prompt(
        controls, settings, requester, text.models, state.model_reference, text.prompt
    )
    if prompt is not text.prompt:
        text = dataclasses.replace(text, prompt=prompt)

    max_length, context, n = text.max_length, text.max_context_length, text.n
    tax = horde_tax(settings)
    estimate = kudos.quote_request(text.models, max_length, context, n, tax, reference=state.model_reference)
    if text.dry_run:
        return JSONResponse(status_code=200, content={"kudos": estimate})

    availability = await text_availability(state, text, requester)
    allowance = await free_allowance(state, text.models, availability, requester, chat=False)
    lists_workers = bool(text.workers)
    hold = upfront_hold(state, text.models, max_length, allowance, text.slow_workers, lists_workers, n)
    funding = Funding(requester, max_length, allowance, hold, chat=False)
    # The shared key's limits, as on the chat route: max_text_tokens, then its kudos against the estimate at
    # the highest multiplier across the list; expiry and emptiness were refused at authentication. What the
    # key must cover is checked again under its row lock when the row is written.
    key_amount = check_shared_key(state, funding, text.models, max_length, context, n, tax)
    created = new_text_request(text, requester, request, settings, estimate, tax, key_amount)
    created.submitted_prompt = submitted_prompt  # as sent, before the replacement filter
    may_downgrade = text.allow_downgrade and not (settings.upfront_kudos_on_workerlist and lists_workers)

    def downgrade() -> store.NewRequest:
        return downgraded(text, created, min(max_length, allowance))

    request_id = await create_or_refuse(
        state, created, funding, downgrade=downgrade if may_downgrade else None
    )
    body: dict[str, Any] = {"id": str(request_id), "kudos": estimate}
    if availability is not None and availability.eligible_workers == 0:
        body["message"] = NO_WORKER_WARNING
    return JSONResponse(status_code=202, content=body)


@router.get("/v2/generate/text/status/{request_id}")
async def text_status(request_id: str, request: Request) -> JSONResponse:
    """The text request's status (docs/native-api.md#status-and-cancel). 404 RequestNotFound for unknown and chat ids."""
    return JSONResponse(await read_status_body(get_state(request), request_id, is_chat=False))


@router.delete("/v2/generate/text/status/{request_id}")
async def text_cancel(request_id: str, request: Request) -> JSONResponse:
    """Cancel the text request (n = 0; in-flight jobs finish) and return its status after the cancel."""
    return JSONResponse(await cancel_and_report(get_state(request), request_id, is_chat=False))
