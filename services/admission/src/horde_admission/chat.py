"""Chat routes: ``POST /v2/generate/chat/async``, ``GET/DELETE /v2/generate/chat/status/{id}``.

See docs/native-api.md#routes (processing order), #known-models, #operation-key, #admission-flag,
#rate-limits, #request-body, #context-adjustments, #free-output-allowance, #completion-signal.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

import horde_contract as contract
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from horde_store.users import AuthenticatedUser

from horde_admission import images, kudos, offload, store
from horde_admission.auth import Requester, admit, authenticate, operation_key_owner, resolve_api_key
from horde_admission.availability import (
    RequestNeeds,
    cache_availability,
    check_models,
    refresh_availability,
)
from horde_admission.body import read_json_object
from horde_admission.checks import (
    check_concurrency,
    check_hold_before_images,
    check_shared_key,
    check_workers_exist,
    client_agent,
)
from horde_admission.creation import Funding, create_or_refuse, free_allowance, horde_tax, upfront_hold
from horde_admission.lifecycle import cancel_and_report, read_status_body
from horde_admission.operator_controls import check_ip_timeout, check_maintenance, moderate_messages
from horde_admission.sizing import Sized, lower_max_length, size_context
from horde_admission.state import AdmissionState, get_state

log = logging.getLogger(__name__)

router = APIRouter()

#: The largest value of an int32 field of the WorkerPool requests.
MAX_PROTO_INT32 = 2**31 - 1

NO_WORKER_WARNING = (
    "Warning: No available workers can fulfill this request. It will expire in 20 minutes. "
    "Consider reducing the amount of tokens to generate."
)


def _repeated(claim: Any, fingerprint: str) -> JSONResponse:
    """200 with the first request's ``{id, kudos}``, or 400 OperationKeyConflict for another fingerprint."""
    if claim["operation_fingerprint"] != fingerprint:
        raise contract.operation_key_conflict_error()
    return JSONResponse(
        status_code=200, content={"id": str(claim["id"]), "kudos": round(claim["kudos"] or 0)}
    )


def request_needs(
    chat: contract.ChatRequest,
    requester: Requester,
    max_length: int,
    context: int,
    kept_images: list[images.ImagePart] | None = None,
) -> RequestNeeds:
    """The GetAvailability request for a chat request at the given budgets; with ``kept_images`` (the image
    parts sizing kept), the request as sized: without vision when truncate_oldest dropped every image."""
    features = list(chat.required_features)
    has_images = chat.image_count > 0
    if kept_images is not None:
        features = images.kept_image_features(features, kept_images)
        has_images = bool(kept_images)
    return RequestNeeds(
        models=list(chat.models),
        required_features=features,
        max_length=max_length,
        # An explicit horde.max_context_length is only checked for its range after sizing (route step 8); the
        # availability query's field is an int32, and no worker declares a context past it.
        max_context_length=min(context, MAX_PROTO_INT32),
        tools_temperature=chat.tools_temperature,
        has_images=has_images,
        only_worker_ids=list(chat.horde.only or []),
        ignore_worker_ids=list(chat.horde.ignore or []),
        trusted_workers=chat.horde.trusted_workers,
        validated_backends=chat.horde.validated_backends,
        slow_workers=chat.horde.slow_workers,
        requester_user_id=requester.user_id,
    )


def sized_params(
    chat: contract.ChatRequest, body: dict[str, Any], sized: Sized, requested_context: int
) -> dict[str, Any]:
    """The text params stored for the sized request, checked on the sized values (route step 8): max_length
    always, max_context_length when the body set it or sizing changed it. A refusal names the body's length
    key (max_completion_tokens when it was sent, else max_tokens)."""
    params = dict(chat.text_params, max_length=sized.max_length)
    if chat.max_context_length is not None or sized.max_context_length != requested_context:
        params["max_context_length"] = sized.max_context_length
    length_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return contract.validate_chat_text_params(params, length_key=length_key)


async def _operation_claim(
    state: AdmissionState, chat: contract.ChatRequest, apikey: str | None, op_key: str | None
) -> tuple[AuthenticatedUser | None, str | None, JSONResponse | None]:
    """The operation key's lookup (docs/native-api.md#operation-key): the key's user, the body's fingerprint and
    the answer for a repeated key (None when the key is new or absent; all None without a key).

    The claim belongs to the key's user (a shared key's owner), found before the auth step: a retry is
    answered even when the first submit used up or outlived its shared key. Nothing is created on this path;
    a submission without a claim is admitted with every refusal."""
    if not op_key:
        return None, None, None
    fingerprint = contract.build_operation_fingerprint(chat)
    async with state.pool.acquire() as conn:
        found = await resolve_api_key(conn, apikey, state.settings.secret_key)
        owner = operation_key_owner(found)
        if owner is not None:
            claim = await store.find_operation_claim(conn, owner, op_key)
            if claim is not None:
                return found, fingerprint, _repeated(claim, fingerprint)
    return found, fingerprint, None


@router.post("/v2/generate/chat/async")
async def chat_async(request: Request) -> JSONResponse:
    """Queue a chat request.

    Body: the native chat body (docs/native-api.md#request-body); header ``apikey``. 202 ``{id, kudos, message?,
    warnings}``; 200 ``{id, kudos}`` for a repeated operation key; dry run 200 ``{kudos, ...}``.
    Errors in route order: 429 rate limit, 413 RequestTooLarge, 400 contract refusals, 400
    OperationKeyConflict, 503 ChatAdmissionDisabled, 400 MaintenanceMode, 401 InvalidAPIKey, 429
    TooManyPrompts, 403 TimeoutIP, 400 CorruptPrompt, 404 UnknownChatModel, 403 NoEligibleWorker, 400
    PromptExceedsContext / TokenOverflow / range errors, 400 ChatKudosCapExceeded, 403 KudosUpfront.
    """
    state = get_state(request)
    settings = state.settings
    await state.limiter.check(request, "chat_async")
    body = await read_json_object(request, settings.body_read_timeout_seconds)
    chat = contract.parse_chat_request(body, defer_length_limits=True)
    horde = chat.horde
    apikey = request.headers.get("apikey")

    requester: Requester
    op_key = horde.operation_key if not horde.dry_run else None
    found, fingerprint, repeated = await _operation_claim(state, chat, apikey, op_key)
    if repeated is not None:
        return repeated

    if not settings.chat_admission_enabled:
        raise contract.chat_admission_disabled_error()
    controls = state.operator_controls
    await check_maintenance(controls, state.pool, settings)
    if op_key:
        requester = admit(found)
    else:
        async with state.pool.acquire() as conn:
            requester = await authenticate(conn, apikey, settings.secret_key)
    await check_workers_exist(state, list(horde.only or horde.ignore or []))
    await check_concurrency(state, requester, chat.models)
    # Countermeasures, then moderation: the replacement filter's rewrite is mirrored onto the messages before
    # sizing, so truncate_oldest trims the rewritten ones (docs/native-api.md#flattened-prompt).
    await check_ip_timeout(state.redis, request, settings)
    submitted_messages = chat.messages
    moderated = await moderate_messages(
        controls, settings, requester, list(chat.models), state.model_reference, chat.messages
    )
    if moderated is not chat.messages:
        chat = dataclasses.replace(chat, messages=moderated)

    # Known models and availability (steps 6-7), before sizing, any row and the tax.
    requested_context = chat.max_context_length or contract.TEXT_DEFAULT_MAX_CONTEXT_LENGTH
    needs = request_needs(chat, requester, chat.max_length, requested_context)
    availability = await check_models(
        state.worker_pool,
        needs,
        chat.model_key == "model",
        settings.availability_timeout_seconds,
        state.model_reference,
    )
    adjustments: list[dict[str, Any]] = []
    max_length, lowered = lower_max_length(chat.max_length, availability.max_chat_length, horde.dry_run)
    if lowered:
        adjustments.append(lowered)

    # Context sizing (step 8), then the final params check on the sized values.
    sized = size_context(
        chat.messages,
        chat.tools,
        max_length,
        requested_context,
        availability.max_chat_context_length,
        horde.context_fit.value,
    )
    adjustments.extend(sized.adjustments)
    params = sized_params(chat, body, sized, requested_context)

    # Images in turns truncate_oldest dropped are neither fetched, stored, charged nor required of a worker.
    parts = images.image_parts(sized.messages)
    required_features = images.kept_image_features(chat.required_features, parts)
    if (
        sized.max_length != chat.max_length
        or sized.max_context_length != requested_context
        or len(parts) != chat.image_count
    ):
        # The sized request can differ from the one availability was measured for.
        needs = request_needs(chat, requester, sized.max_length, sized.max_context_length, parts)
        availability = await refresh_availability(
            state.worker_pool, needs, availability, settings.availability_timeout_seconds
        )

    tax = horde_tax(settings, len(parts))
    estimate = kudos.quote_request(
        chat.models, sized.max_length, sized.max_context_length, 1, tax, reference=state.model_reference
    )
    if horde.max_kudos is not None and estimate > horde.max_kudos:
        raise contract.kudos_cap_exceeded_error(estimate, horde.max_kudos)
    trusted_images = requester.trusted or requester.patron
    if horde.dry_run:
        if parts:  # the data URLs only: a dry run fetches nothing
            await images.load_chat_images(parts, trusted=trusted_images, dry_run=True, fetcher=state.fetcher)
        return JSONResponse(
            status_code=200,
            content={
                "kudos": estimate,
                "estimated_prompt_tokens": sized.prompt_tokens,
                "resolved": {
                    "max_length": sized.max_length,
                    "max_context_length": sized.max_context_length,
                    "context_fit": "reject" if horde.context_fit.value == "reject" else "grow",
                },
                "context_adjustments": adjustments or None,
            },
        )

    allowance = await free_allowance(state, list(chat.models), availability, requester, chat=True)
    lists_workers = bool(horde.only or horde.ignore)
    hold = upfront_hold(
        state, list(chat.models), sized.max_length, allowance, horde.slow_workers, lists_workers
    )
    funding = Funding(requester, chat.max_length, allowance, hold, chat=True, availability=availability)
    key_amount = check_shared_key(
        state, funding, list(chat.models), sized.max_length, sized.max_context_length, 1, tax
    )
    # The images are fetched and decoded only once every other check has passed (docs/native-api.md#images), the hold
    # included; the creating transaction checks the hold again under the user's row lock.
    jpegs: list[bytes] = []
    if parts:
        await check_hold_before_images(state, funding)
        jpegs = await images.load_chat_images(
            parts, trusted=trusted_images, dry_run=False, fetcher=state.fetcher
        )
    request_uuid = uuid.uuid4()
    # The row holds horde-r2:// references, never image bytes or the submitted URL.
    messages = images.reference_images(sized.messages, parts, request_uuid) if parts else sized.messages
    # Measured as a base64 worker would receive them; stored with the images, before activation.
    offloaded = await offload.plan(settings, messages, request_uuid, jpegs)
    new = store.NewRequest(
        id=request_uuid,
        user_id=requester.user_id,
        is_chat=True,
        prompt=contract.flatten_messages(messages, chat.tools),
        submitted_prompt=contract.flatten_messages(submitted_messages, chat.tools),
        params=params,
        models=list(chat.models),
        max_length=sized.max_length,
        max_context_length=sized.max_context_length,
        messages=messages,
        trusted_workers=horde.trusted_workers,
        validated_backends=horde.validated_backends,
        slow_workers=horde.slow_workers,
        worker_ids=list(horde.only or horde.ignore or []),
        worker_blacklist=horde.ignore is not None,
        shared_key_id=requester.shared_key_id,
        shared_key_amount=key_amount,
        client_agent=client_agent(request),
        ipaddr=request.client.host if request.client else None,
        operation_key=op_key,
        operation_fingerprint=fingerprint,
        context_adjustments=adjustments or None,
        chat_extras=chat.chat_extras,
        chat_required_features=required_features,
        chat_conformance=chat.conformance.value,
        chat_tools_temperature=chat.tools_temperature,
        kudos_estimate=float(estimate),
        tax=tax,
        flagged_user=requester.flagged,
        stream_progress=chat.stream,
        has_images=bool(parts),
        ttl_seconds=settings.request_ttl_seconds,
        chat_messages_offloaded=offloaded is not None,
    )
    try:
        request_id = await create_or_refuse(state, new, funding, jpegs, offloaded=offloaded)
    except store.OperationKeyRace:
        assert op_key is not None and fingerprint is not None
        async with state.pool.acquire() as conn:
            claim = await store.find_operation_claim(conn, requester.user_id, op_key)
        if claim is None:  # the winner vanished (expired) between the race and the lookup
            raise contract.operation_key_conflict_error() from None
        return _repeated(claim, fingerprint)
    await cache_availability(state.redis, str(request_id), availability, settings.availability_cache_seconds)
    accepted: dict[str, Any] = {"id": str(request_id), "kudos": estimate, "warnings": []}
    if availability.eligible_workers == 0:
        accepted["message"] = NO_WORKER_WARNING
    return JSONResponse(status_code=202, content=accepted)


@router.get("/v2/generate/chat/status/{request_id}")
async def chat_status(request_id: str, request: Request) -> JSONResponse:
    """The chat request's full status with each finished generation's structured reply.

    404 RequestNotFound for an unknown id and for a text request's id.
    """
    return JSONResponse(await read_status_body(get_state(request), request_id, is_chat=True))


@router.delete("/v2/generate/chat/status/{request_id}")
async def chat_cancel(request_id: str, request: Request) -> JSONResponse:
    """Cancel the chat request (n = 0; in-flight jobs finish, streamed ones are settled) and return its
    status after the cancel. Publishes ``cancelled`` on the completion signal when this call claimed it."""
    return JSONResponse(await cancel_and_report(get_state(request), request_id, is_chat=True))
