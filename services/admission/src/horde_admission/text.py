"""Legacy text routes: ``POST /v2/generate/text/async``, ``GET/DELETE /v2/generate/text/status/{id}``.

Text path §1 (body, processing order, response) and §2 (status, cancel); the decisions of §14 (max_length
16–16384, real kudos estimate in the response, a cancelled request with nothing in flight is done).

Bounds upstream does not have (issue 9, item 4; horde_contract.limits): the prompt at most
MAX_TEXT_PROMPT_BYTES (1 MiB) of UTF-8, at most MAX_TEXT_MODEL_COUNT (200) models of at most
MAX_MODEL_NAME_LENGTH (255) characters, at most MAX_TEXT_WORKER_IDS (100) worker ids of at most
MAX_WORKER_ID_LENGTH (64) characters (the first 5 kept, as upstream), and params at most MAX_TEXT_PARAMS_BYTES
(256 KiB) as compact JSON; each refused with 400 BadRequest before authentication. A shared key's limits apply
as on the chat route (:func:`check_shared_key`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from horde_contract.limits import (
    MAX_MODEL_NAME_LENGTH,
    MAX_TEXT_MODEL_COUNT,
    MAX_TEXT_PARAMS_BYTES,
    MAX_TEXT_PROMPT_BYTES,
    MAX_TEXT_WORKER_IDS,
    MAX_TEXT_WORKERS_KEPT,
    MAX_WORKER_ID_LENGTH,
)
from horde_core.errors import HordeError

from horde_admission import contract, kudos, store
from horde_admission.auth import Requester, authenticate
from horde_admission.availability import Availability, RequestNeeds
from horde_admission.body import read_json_object
from horde_admission.chat import NO_WORKER_WARNING
from horde_admission.checks import (
    SHARED_KEY_KUDOS_REFUSALS,
    check_concurrency,
    check_shared_key,
    check_workers_exist,
    client_agent,
)
from horde_admission.creation import announce_request, free_allowance, horde_tax, needs_upfront
from horde_admission.lifecycle import cancel_and_report, read_status_body
from horde_admission.sizing import size_bucket
from horde_admission.state import AdmissionState, get_state

router = APIRouter()

MAX_TEXT_WORKERS = MAX_TEXT_WORKERS_KEPT
_BOOL_KEYS = (
    "worker_blacklist",
    "trusted_workers",
    "validated_backends",
    "slow_workers",
    "dry_run",
    "allow_downgrade",
)


def _bad(field: str, text: str) -> HordeError:
    return HordeError(400, "BadRequest", f"Input payload validation failed: {field}: {text}")


def _utf8_bytes(text: str) -> int:
    """The UTF-8 size of ``text`` (a character is 1 to 4 bytes; the body reader refused lone surrogates)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def parse_text_body(body: dict[str, Any]) -> dict[str, Any]:
    """Validate the text async body (text path §1); returns the values the route uses.

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
            400, "InvalidExtraSourceImages.", "Extra source images are not supported on text requests."
        )
    models = body.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise _bad("models", "has to be an array of strings")
    if len(models) > MAX_TEXT_MODEL_COUNT:
        raise _bad("models", f"lists {len(models)} models; at most {MAX_TEXT_MODEL_COUNT} are allowed")
    for index, model in enumerate(models):
        if len(model) > MAX_MODEL_NAME_LENGTH:
            raise _bad(
                f"models[{index}]",
                f"is {len(model)} characters long; a model name has at most {MAX_MODEL_NAME_LENGTH}",
            )
    workers = body.get("workers") or []
    if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
        raise _bad("workers", "has to be an array of worker ids")
    if len(workers) > MAX_TEXT_WORKER_IDS:
        raise _bad("workers", f"lists {len(workers)} worker ids; at most {MAX_TEXT_WORKER_IDS} are allowed")
    for index, worker in enumerate(workers):
        if len(worker) > MAX_WORKER_ID_LENGTH:
            raise _bad(f"workers[{index}]", "has to be a worker id")
    values: dict[str, Any] = {"prompt": prompt, "models": models, "workers": workers[:MAX_TEXT_WORKERS]}
    for key in _BOOL_KEYS:
        value = body.get(key)
        if value is not None and not isinstance(value, bool):
            raise _bad(key, "has to be a boolean")
        values[key] = value if value is not None else key == "slow_workers"
    params = body.get("params") or {}
    if isinstance(params, dict):
        size = len(
            json.dumps(params, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
        )
        if size > MAX_TEXT_PARAMS_BYTES:
            raise _bad("params", f"takes {size} bytes as JSON; at most {MAX_TEXT_PARAMS_BYTES} are allowed")
    values["params"] = contract.parse_text_params(params)
    return values


async def text_availability(
    state: AdmissionState, values: dict[str, Any], requester: Requester
) -> Availability | None:
    """Availability of the listed models' online workers; None without models or when dispatch is down.

    Simplified: WorkerPool answers for chat workers, which stand in for the text pool here.
    """
    if not values["models"]:
        return None
    params = values["params"]
    needs = RequestNeeds(
        models=values["models"],
        max_length=params.get("max_length", contract.TEXT_DEFAULT_MAX_LENGTH),
        max_context_length=params.get("max_context_length", contract.TEXT_DEFAULT_MAX_CONTEXT_LENGTH),
        only_worker_ids=[] if values["worker_blacklist"] else values["workers"],
        ignore_worker_ids=values["workers"] if values["worker_blacklist"] else [],
        trusted_workers=values["trusted_workers"],
        validated_backends=values["validated_backends"],
        slow_workers=values["slow_workers"],
        requester_user_id=requester.user_id,
    )
    try:
        return await state.availability_memo.get(
            state.worker_pool, needs, state.settings.availability_timeout_seconds
        )
    except HordeError:
        return None


@router.post("/v2/generate/text/async")
async def text_async(request: Request) -> JSONResponse:
    """Queue a legacy text request.

    Body: ``{prompt, params?, models?, workers?, worker_blacklist?, trusted_workers?, validated_backends?,
    slow_workers?, dry_run?, allow_downgrade?}``; header ``apikey``. 202 ``{id, kudos, message?}``; dry run
    200 ``{kudos}``. Errors: 429, 400 BadRequest / MissingPrompt / text params rc, 401 InvalidAPIKey, 403
    SharedKeyExpired / SharedKeyEmpty, 404 WorkerNotFound, 429 TooManyPrompts, 400 BadRequest above a shared
    key's max_text_tokens, 403 SharedKeyInsufficientKudos, 403 KudosUpfront.
    """
    state = get_state(request)
    settings = state.settings
    await state.limiter.check(request, "text_async")
    values = parse_text_body(await read_json_object(request, settings.body_read_timeout_seconds))
    params = values["params"]
    n = int(params.get("n", 1))
    async with state.pool.acquire() as conn:
        requester = await authenticate(conn, request.headers.get("apikey"), settings.secret_key)
        if not values["prompt"]:
            raise HordeError(400, "MissingPrompt", "You cannot specify an empty prompt.")
        await check_workers_exist(state, values["workers"])
        await check_concurrency(state, requester, values["models"], n, conn)

    max_length = int(params.get("max_length", contract.TEXT_DEFAULT_MAX_LENGTH))
    context = int(params.get("max_context_length", contract.TEXT_DEFAULT_MAX_CONTEXT_LENGTH))
    tax = horde_tax(settings)
    estimate = kudos.quote_request(
        values["models"], max_length, context, n, tax, reference=state.model_reference
    )
    if values["dry_run"]:
        return JSONResponse(status_code=200, content={"kudos": estimate})

    availability = await text_availability(state, values, requester)
    allowance = await free_allowance(state, values["models"], availability, requester, chat=False)
    buckets = (size_bucket(max_length), size_bucket(allowance))
    key_amount = 0.0
    if requester.shared_key_id is not None:
        # The shared key's limits, as on the chat route (text path §5): max_text_tokens, then its kudos
        # against the estimate at the highest multiplier across the list; expiry and emptiness were refused
        # at authentication.
        key_amount = float(
            kudos.shared_key_amount(
                values["models"], max_length, context, n, tax, reference=state.model_reference
            )
        )
        try:
            check_shared_key(requester, max_length, key_amount, None)
        except HordeError as exc:
            if exc.rc in SHARED_KEY_KUDOS_REFUSALS:
                kudos.FREE_ALLOWANCE_DECISIONS.labels(requester.kind, "refused", *buckets, "false").inc()
            raise
    workerlist = settings.upfront_kudos_on_workerlist and bool(values["workers"])
    needs_hold = needs_upfront(
        settings, max_length, allowance, values["slow_workers"], bool(values["workers"])
    )
    hold = (
        kudos.hold_amount(values["models"], max_length, n, reference=state.model_reference)
        if needs_hold
        else 0.0
    )

    def new_request(length: int, slow: bool) -> store.NewRequest:
        # What the shared key must cover, checked again under its row lock when the row is written.
        shared_amount = (
            key_amount
            if length == max_length or requester.shared_key_id is None
            else float(
                kudos.shared_key_amount(
                    values["models"], length, context, n, tax, reference=state.model_reference
                )
            )
        )
        return store.NewRequest(
            id=uuid.uuid4(),
            user_id=requester.user_id,
            is_chat=False,
            prompt=values["prompt"],
            submitted_prompt=values["prompt"],
            params=dict(params, max_length=length)
            if "max_length" in params or length != max_length
            else params,
            models=values["models"],
            max_length=length,
            max_context_length=context,
            n=n,
            trusted_workers=values["trusted_workers"],
            validated_backends=values["validated_backends"],
            slow_workers=slow,
            worker_ids=values["workers"],
            worker_blacklist=values["worker_blacklist"],
            shared_key_id=requester.shared_key_id,
            shared_key_amount=shared_amount,
            client_agent=client_agent(request),
            ipaddr=request.client.host if request.client else None,
            chat_conformance="strict",
            kudos_estimate=float(estimate),
            tax=tax,
            flagged_user=requester.flagged,
            ttl_seconds=settings.request_ttl_seconds,
        )

    outcome = "funded" if hold > 0 else "free"
    created = new_request(max_length, values["slow_workers"])
    try:
        try:
            async with state.pool.acquire() as conn:
                request_id = await store.create_request(conn, created, hold)
        except store.SharedKeyHoldRefused:
            raise
        except store.HoldRefused:
            if not values["allow_downgrade"] or workerlist:
                kudos.FREE_ALLOWANCE_DECISIONS.labels(requester.kind, "refused", *buckets, "false").inc()
                raise kudos.kudos_upfront_error(allowance, hold) from None
            # Downgrade: lowered to the allowance with slow workers allowed, which needs no hold.
            outcome = "downgraded"
            created = new_request(min(max_length, allowance), True)
            async with state.pool.acquire() as conn:
                request_id = await store.create_request(conn, created, 0.0)
    except store.SharedKeyHoldRefused as refused:
        # The key cannot cover it (a parallel request used its kudos since check_shared_key): no downgrade.
        kudos.FREE_ALLOWANCE_DECISIONS.labels(requester.kind, "refused", *buckets, "false").inc()
        raise kudos.shared_key_insufficient_error(refused.available, refused.amount) from None
    kudos.FREE_ALLOWANCE_DECISIONS.labels(requester.kind, outcome, *buckets, "false").inc()
    await announce_request(state, request_id, created)
    body: dict[str, Any] = {"id": str(request_id), "kudos": estimate}
    if availability is not None and availability.eligible_workers == 0:
        body["message"] = NO_WORKER_WARNING
    return JSONResponse(status_code=202, content=body)


@router.get("/v2/generate/text/status/{request_id}")
async def text_status(request_id: str, request: Request) -> JSONResponse:
    """The text request's status (text path §2). 404 RequestNotFound for unknown and chat ids."""
    return JSONResponse(await read_status_body(get_state(request), request_id, is_chat=False))


@router.delete("/v2/generate/text/status/{request_id}")
async def text_cancel(request_id: str, request: Request) -> JSONResponse:
    """Cancel the text request (n = 0; in-flight jobs finish) and return its status after the cancel."""
    return JSONResponse(await cancel_and_report(get_state(request), request_id, is_chat=False))
