"""``POST /v1/chat/completions``: the OpenAI chat completion over the native chat routes.

Flow (docs/openai-front.md; docs/native-api.md#completion-signal): read the body (413 over the bound; 400
BadRequest for non-JSON or NaN/Infinity) → Bearer key → screen and validate (``schema``) → the shared
contract rules → the call's operation (``operations``: a retry of the same call joins its first attempt's
``horde.operation_key``) → ``POST /v2/generate/chat/async`` → wait on the signal (``waiter``) →
``chat.completion``, or for ``stream: true`` the buffered or relayed stream. Every refusal is an OpenAI error;
every admitted request logs one finished line. A client that leaves before its request ends has it cancelled
after a grace in which a retry of the call or a resume of its relayed stream may take it over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from horde_contract import ANONYMOUS_API_KEY, HordeError, invalid_api_key_error, parse_chat_request
from horde_contract.errors import RC
from horde_core.body import (
    CHAT_BODY_LIMITS,
    BodyReadTimeout,
    BodyTooLarge,
    JsonStructureError,
    read_bounded_body,
)
from horde_core.body import parse_json_body as parse_bounded_json

from horde_oai.completion import (
    build_completion,
    completion_limit_source,
    content_category,
    effective_completion_limit,
    estimate_prompt_tokens,
    finished_generations,
    native_message_of,
    worker_max_length_adjustments,
)
from horde_oai.deltas import FIRST_ID, MAX_STREAM_CONNECTIONS, DeltaFeed, StreamBusy
from horde_oai.errors import OpenAIError, bad_request
from horde_oai.metrics import (
    COMPLETIONS,
    QUEUE_WAIT,
    REQUEST_BODY_SIZE,
    REQUEST_DURATION,
    REQUEST_MAX_TOKENS,
    REQUESTS_ERRORS,
    REQUESTS_REFUSED,
    STREAM_FAILURES,
    STREAM_FIRST_CONTENT,
    STREAM_RELAYS,
    max_tokens_bucket,
    outcome_class_for,
)
from horde_oai.native_errors import is_size_only_gap, map_native_error
from horde_oai.native_request import (
    build_native_body,
    include_reasoning,
    key_digest,
    new_operation_key,
    relays_deltas,
    request_digest,
    requested_models,
)
from horde_oai.operations import (
    NO_RECORDS,
    Call,
    declared_retry,
    idempotency_key_of,
    normal_operation_key,
)
from horde_oai.relay import WHOLE_GENERATION, DeltaRelay, EventId, parse_event_id, sse_event
from horde_oai.schema import contract_error, parameter_label, validate_request
from horde_oai.state import get_state
from horde_oai.streaming import buffered_stream_events, sse_error
from horde_oai.waiter import ChatWait, WaitTrace

log = logging.getLogger("horde_oai.requests")

router = APIRouter()

DISCONNECT_POLL_SECONDS = 0.5
# Codes of a native submit refusal counted on horde.oai.requests.errors rather than as a refusal.
SUBMIT_ERROR_CODES = frozenset(
    {"no_eligible_worker", "no_worker_supports_features", "no_worker_supports_limit"}
)
REFUSED_PARAMETER_LOG_LENGTH = 64
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def invalid_json_error(reason: str = "") -> OpenAIError:
    """400 BadRequest for a body that is not JSON, holds NaN/Infinity or is not valid Unicode."""
    return bad_request(
        "We could not parse the JSON body of your request. The API expects a JSON object; NaN, Infinity and "
        "-Infinity are not JSON." + (f" {reason}" if reason else "")
    )


def parse_json_body(raw: bytes) -> Any:
    """The parsed body, read by horde_core's body reader as the native route reads it: its structure within the
    chat bounds (400 BadRequest "The JSON body nests deeper than 64 levels." or "The JSON body has more than
    524288 elements ...", checked before any object is built), then the contract's ``load_json_body`` (400
    BadRequest for invalid JSON, NaN, Infinity, -Infinity, an overflowing number and a lone surrogate)."""
    try:
        return parse_bounded_json(raw, CHAT_BODY_LIMITS)
    except JsonStructureError as exc:
        raise bad_request(exc.message) from None
    except HordeError as exc:
        raise invalid_json_error(exc.message) from None


async def read_body(request: Request, limit: int, read_timeout: float = 60.0) -> bytes:
    """The raw body (horde_core's bounded reader), refused with 413 RequestTooLarge past ``limit`` (declared
    or read), or 408 RequestBodyTimeout when it takes longer than ``read_timeout`` seconds to arrive (spec:
    Refusal attributes)."""
    try:
        return await read_bounded_body(request, limit, read_timeout, strict_content_length=False)
    except BodyTooLarge:
        raise OpenAIError(
            413,
            f"The request body is larger than the {limit} bytes the AI Horde accepts.",
            RC.RequestTooLarge,
        ) from None
    except BodyReadTimeout as exc:
        raise OpenAIError(408, str(exc), RC.RequestBodyTimeout) from None


def bearer_key(request: Request) -> str:
    """The API key from ``Authorization: Bearer <key>``; 401 without one, and 401 InvalidAPIKey for a key with
    characters outside printable ASCII."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise OpenAIError(
            401,
            "You didn't provide an API key. Send your AI Horde API key in the Authorization header as "
            "'Bearer YOUR_KEY' (0000000000 for anonymous access).",
            "invalid_api_key",
        )
    if not key.isascii() or not key.isprintable():
        # No issued key has such characters, and an HTTP header to admission could not carry them: refuse here
        # as admission refuses an unknown key.
        unknown = invalid_api_key_error()
        raise OpenAIError(unknown.status, unknown.message, unknown.rc)
    return key


def apply_contract_rules(native_body: dict[str, Any]) -> None:
    """The request rules shared with the native route (horde_contract.parse_chat_request), so the client gets
    OpenAI's message and param locally: tool_choice/parallel_tool_calls without tools, tool history, strict
    schemas, openai_guards, nesting depth, text caps, max_tokens within 16..16384. The check against the
    workers' limits is deferred, as the Horde lowers a max_tokens above every worker's limit instead of
    refusing it. The native route repeats every check."""
    try:
        parse_chat_request(native_body, defer_length_limits=True)
    except HordeError as exc:
        raise contract_error(exc) from None
    except Exception:  # a contract bug must not refuse what the native route would accept
        log.exception("contract rules failed; leaving validation to the native route")


@dataclass
class RequestRecord:
    """What the finished line and the metrics report about one request."""

    started: float
    streamed: bool
    body: Mapping[str, Any] = field(default_factory=dict)
    request_id: str | None = None
    submitted_at: float | None = None
    status: int = 200
    code: str = "ok"
    served_model: str | None = None
    estimated_usage: bool | None = None
    retry_after: str | None = None
    trace: WaitTrace = field(default_factory=WaitTrace)
    stage: str = ""
    reason: str = ""
    first_content: float | None = None  # Unix seconds of a stream's first reasoning or content chunk

    def finish(
        self, error: OpenAIError | None = None, *, refused: bool = False, after_headers: bool = False
    ) -> None:
        """Record the end: duration and errors metrics, the completion limit of a request the Horde accepted,
        and the finished log line. ``refused`` errors were recorded as refusals and ``after_headers`` ones
        (an SSE error event) as stream failures, so neither counts on horde.oai.requests.errors."""
        if error is not None:
            self.status, self.code = error.status, error.code or "error"
            self.retry_after = error.headers.get("Retry-After")
            self.stage, self.reason = error.stage, error.reason
        outcome = outcome_class_for(self.code, self.stage)
        if not refused:
            REQUEST_DURATION.labels(streamed=str(self.streamed).lower(), outcome_class=outcome).observe(
                time.time() - self.started
            )
        adjustments = self.trace.context_adjustments
        limit = effective_completion_limit(self.body, adjustments)
        source = completion_limit_source(self.body, adjustments)
        if error is not None and not refused and not after_headers and self.code != "client_disconnected":
            REQUESTS_ERRORS.labels(
                http_status=str(self.status),
                code=self.code,
                reason=self.reason,
                stage=self.stage,
                max_tokens_bucket=max_tokens_bucket(limit),
                outcome_class=outcome,
            ).inc()
        if self.request_id is not None:
            REQUEST_MAX_TOKENS.labels(source=source).observe(limit)
        self._log(limit, source)

    def client_left(self) -> None:
        """Record the end of a request whose client left before it ended: 499 client_disconnected."""
        self.status, self.code = 499, "client_disconnected"
        self.finish()

    def _log(self, limit: int, source: str) -> None:
        """The finished-request line (docs/openai-front.md#metrics-and-logs); ``extra`` binds the same values."""
        t = self.trace
        waited = t.woke_at - self.submitted_at if t.woke_at and self.submitted_at else None
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "streamed": self.streamed,
            "submitted_at": self.submitted_at,
            "woke_at": t.woke_at,
            "woke_by": t.woke_by,
            "waited": waited,
            "status": self.status,
            "code": self.code,
            "wakes": t.wakes,
            "estimated_usage": self.estimated_usage,
            "done_without_generation_reads": t.done_without_generation_reads,
            "requested_model": ",".join(requested_models(self.body)),
            "served_model": self.served_model,
            "retry_after": self.retry_after,
        }
        head = (
            f"Chat request {self.request_id} finished:"
            if self.request_id
            else "Unsubmitted chat request finished:"
        )
        message = (
            f"{head} streamed={self.streamed} submitted_at={_seconds(self.submitted_at)} "
            f"woke_at={_seconds(t.woke_at)} woke_by={t.woke_by} waited={_seconds(waited)}s "
            f"status={self.status} code={self.code} wakes={t.wakes} estimated_usage={self.estimated_usage} "
            f"done_without_generation_reads={t.done_without_generation_reads} "
            f"requested_model={fields['requested_model']} served_model={self.served_model or 'none'} "
            f"retry_after={self.retry_after or 'none'}"
        )
        if self.code == "queue_unavailable":
            fields |= {
                "queue_reason": t.queue_reason,
                "wait_time": t.wait_time,
                "eligible_worker_threads": t.eligible_worker_threads,
            }
            message += (
                f" queue_reason={t.queue_reason} wait_time={_none(t.wait_time)} "
                f"eligible_worker_threads={_none(t.eligible_worker_threads)}"
            )
        fields |= {
            "first_read_wait_time": t.first_read_wait_time,
            "first_read_eligible_worker_threads": t.first_read_eligible_worker_threads,
            "max_tokens": limit,
            "max_tokens_source": source,
        }
        message += (
            f" first_read_wait_time={_none(t.first_read_wait_time)} "
            f"first_read_eligible_worker_threads={_none(t.first_read_eligible_worker_threads)} "
            f"max_tokens={limit} max_tokens_source={source}"
        )
        log.info(message, extra=fields)


def _seconds(value: float | None) -> str:
    return "none" if not value else f"{value:.3f}"


def _none(value: Any) -> str:
    return "none" if value is None else str(value)


def record_refusal(error: OpenAIError, started: float, streamed: bool) -> None:
    """horde.oai.requests.refused for a refusal before submit, and the refused-parameter log line."""
    label = ""
    if error.code == RC.UnsupportedChatParameter and error.param:
        label = parameter_label(error.param)
        log.info(
            f"Refused unsupported chat parameter: path={error.param[:REFUSED_PARAMETER_LOG_LENGTH]!r} label={label}"
        )
    outcome = outcome_class_for(error.code, error.stage)
    REQUESTS_REFUSED.labels(
        http_status=str(error.status), code=error.code or "", parameter=label, outcome_class=outcome
    ).inc()
    REQUEST_DURATION.labels(streamed=str(streamed).lower(), outcome_class=outcome).observe(
        time.time() - started
    )


def _impossible_reason(body: Any) -> Mapping[str, Any]:
    reason = body.get("impossible_reason") if isinstance(body, Mapping) else None
    return reason if isinstance(reason, Mapping) else {}


async def _watch_disconnect(request: Request) -> None:
    # Starlette reports a disconnect only when asked, so poll.
    while not await request.is_disconnected():  # noqa: ASYNC110
        await asyncio.sleep(DISCONNECT_POLL_SECONDS)


def record_completion(
    record: RequestRecord, completion: Mapping[str, Any], status: Mapping[str, Any]
) -> None:
    """horde.oai.completions and the record's served model and usage flag."""
    generation = finished_generations(status)[0]
    native_message = native_message_of(generation)
    finish_reason = completion["choices"][0]["finish_reason"]
    lowered = bool(worker_max_length_adjustments(record.trace.context_adjustments))
    category = content_category(native_message)
    queue_wait = generation.get("queue_wait_seconds")
    if isinstance(queue_wait, int | float) and not isinstance(queue_wait, bool) and queue_wait >= 0:
        QUEUE_WAIT.labels(streamed=str(record.streamed).lower()).observe(queue_wait)
    record.served_model = completion["model"]
    record.estimated_usage = bool(completion.get("x_horde", {}).get("estimated_usage"))
    COMPLETIONS.labels(
        model=completion["model"],
        finish_reason=finish_reason,
        lowered=str(lowered).lower(),
        content=category,
        streamed=str(record.streamed).lower(),
    ).inc()
    if category in ("reasoning_only", "empty"):
        details = completion.get("usage", {}).get("completion_tokens_details") or {}
        limit = effective_completion_limit(record.body, record.trace.context_adjustments)
        log.info(
            f"Chat request {record.request_id} returned no visible text: content={category} "
            f"model={completion['model']} max_tokens={limit} "
            f"max_tokens_source={completion_limit_source(record.body, record.trace.context_adjustments)} "
            f"reasoning_effort={record.body.get('reasoning_effort') or 'omitted'} "
            f"reasoning_tokens={_none(details.get('reasoning_tokens'))} finish_reason={finish_reason}"
        )


@dataclass
class Answer:
    """What answering one submitted (or resumed) request takes: its record and wait, the screened body, the
    completion's ``created`` (Unix seconds) and the prompt estimate usage falls back to."""

    record: RequestRecord
    waiter: ChatWait
    body: Mapping[str, Any]
    created: int
    prompt_estimate: int

    @classmethod
    def of(cls, state: Any, record: RequestRecord, body: Mapping[str, Any]) -> Answer:
        """The answer of ``record``'s submitted request, with a new wait the record traces."""
        request_id = record.request_id or ""
        submitted_at = record.submitted_at if record.submitted_at is not None else time.time()
        waiter = new_waiter(state, request_id, submitted_at, body)
        record.trace = waiter.trace
        prompt_estimate = estimate_prompt_tokens(body.get("messages") or [], body.get("tools"))
        return cls(record, waiter, body, int(submitted_at), prompt_estimate)

    def completion(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """The ``chat.completion`` of a done ``status``, recorded on horde.oai.completions and in the record."""
        completion = build_completion(
            request_id=self.record.request_id or "",
            created=self.created,
            body=self.body,
            status=status,
            prompt_estimate=self.prompt_estimate,
        )
        record_completion(self.record, completion, status)
        return completion


async def _stream_failed(record: RequestRecord, call: Call, error: OpenAIError) -> None:
    """An error after a stream's headers (sent as an SSE error event): recorded as a stream failure, not on
    horde.oai.requests.errors; the call ends with it."""
    record.finish(error, after_headers=True)
    STREAM_FAILURES.labels(code=error.code or "", outcome_class=outcome_class_for(error.code)).inc()
    await call.end_with(error, created=True)


def new_waiter(state: Any, request_id: str, submitted_at: float, body: Mapping[str, Any]) -> ChatWait:
    """The wait of a submitted (or resumed) request, with the budget of its kind."""
    settings = state.settings
    streamed = body.get("stream") is True
    horde = body.get("horde") or {}
    return ChatWait(
        request_id=request_id,
        submitted_at=submitted_at,
        budget=settings.oai_stream_timeout_seconds if streamed else settings.oai_nonstream_timeout_seconds,
        client=state.horde,
        hub=state.signals,
        cancels=state.cancels,
        recheck_seconds=settings.oai_signal_recheck_seconds,
        grace_seconds=settings.oai_fail_fast_grace_seconds,
        models=requested_models(body),
        fail_fast=horde.get("availability_mode") == "fail_fast",
        chat_entries=state.chat_entries,
    )


def resume_point(request: Request) -> EventId | None:
    """The ``Last-Event-ID`` of a reconnecting client; 404 stream_not_found when it is not one of ours."""
    header = request.headers.get("last-event-id")
    if header is None:
        return None
    at = parse_event_id(header)
    if at is None:
        raise stream_not_resumable()
    return at


def stream_not_resumable() -> OpenAIError:
    """404 stream_not_found: no live relayed stream of this key and request matches the Last-Event-ID."""
    return OpenAIError(
        404,
        "There is no stream to resume for this Last-Event-ID: it must name a relayed stream of the same API key "
        "and the same request body, within 15 minutes of the stream's start. Send the request without "
        "Last-Event-ID to start a new completion.",
        "stream_not_found",
        headers={"x-should-retry": "false"},
    )


def stream_busy() -> OpenAIError:
    """409 stream_busy: the stream already has its most connections (the original and its resumes)."""
    return OpenAIError(
        409,
        f"This stream already has {MAX_STREAM_CONNECTIONS} connections. Close one, or retry once the server has "
        "noticed a dropped connection.",
        "stream_busy",
        headers={"Retry-After": "2"},
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> Response:
    """Create a chat completion on the AI Horde (see the OpenAPI description for the body and errors)."""
    state = get_state(request)
    settings = state.settings
    started = time.time()
    streamed = False
    try:
        raw = await read_body(request, settings.oai_max_body_bytes, settings.body_read_timeout_seconds)
        REQUEST_BODY_SIZE.observe(len(raw))
        payload = parse_json_body(raw)
        streamed = isinstance(payload, dict) and payload.get("stream") is True
        apikey = bearer_key(request)
        idempotency_key = idempotency_key_of(request.headers)
        _, screened = validate_request(payload)
        horde = screened.get("horde") or {}
        if horde.get("dry_run"):
            raise OpenAIError(
                400,
                "horde.dry_run is not available through the OpenAI front; use the native route for quotes.",
                RC.UnsupportedChatParameter,
                param="horde.dry_run",
            )
        resumed: dict[str, str] | None = None
        relayed = streamed and relays_deltas(screened) and state.deltas.enabled
        native_body = build_native_body(screened, new_operation_key(), stream_hint=relayed)
        apply_contract_rules(native_body)
        resume_at = resume_point(request) if streamed else None
        if resume_at is not None:
            resumed = await state.relay_records.load(resume_at.request_id)
            if (
                resumed is None
                or resumed.get("closed") == "1"
                or resumed.get("key") != key_digest(apikey)
                or resumed.get("body") != request_digest(native_body)
            ):
                raise stream_not_resumable()
    except OpenAIError as refusal:
        record_refusal(refusal, started, streamed)
        return refusal.response()
    record = RequestRecord(started=started, streamed=streamed, body=screened)
    if resume_at is not None and resumed is not None:
        return await _resume(request, record, screened, resume_at, resumed)
    # Anyone may send the shared anonymous key, so its calls never join another call: each is its own
    # operation (a client's own horde.operation_key still names one native request).
    anonymous = apikey == ANONYMOUS_API_KEY
    claim = await (NO_RECORDS if anonymous else state.operations).claim(
        key_digest(apikey),
        request_digest(native_body),
        idempotency_key=None if anonymous else idempotency_key,
        client_operation_key=normal_operation_key((screened.get("horde") or {}).get("operation_key")),
        declared=declared_retry(request.headers),
    )
    if isinstance(claim, OpenAIError):
        # An Idempotency-Key whose request already ended with this error: the same answer again.
        record.request_id = (claim.metadata or {}).get("request_id")
        record.finish(claim)
        return claim.response()
    call = claim
    native_body["horde"]["operation_key"] = call.operation_key
    try:
        return await _submit_and_wait(request, record, call, apikey, native_body, screened, relayed)
    except BaseException:
        # A bug or a cancelled handler must not leave the call held: a retry may take it over.
        await asyncio.shield(_in_background(call.end("retryable")))
        raise


async def _submit_and_wait(
    request: Request,
    record: RequestRecord,
    call: Call,
    apikey: str,
    native_body: dict[str, Any],
    screened: dict[str, Any],
    relayed: bool,
) -> Response:
    """Submit the call's attempt and answer it: the completion, a stream, or the error (ending ``call``)."""
    state = get_state(request)
    settings = state.settings
    started, streamed = record.started, record.streamed
    models = requested_models(screened)
    try:
        response = await state.horde.submit(
            apikey,
            native_body,
            retries=settings.oai_submit_retries,
            client_address=request.client.host if request.client else None,
        )
    except OpenAIError as unavailable:
        await call.end_with(unavailable, created=False)
        record.finish(unavailable)
        return unavailable.response()
    if not response.ok:
        entries = None
        if is_size_only_gap(_impossible_reason(response.body)):
            entries = await _chat_entries_or_none(state)
        error = map_native_error(
            response.status, response.body, models=models, headers=response.headers, chat_entries=entries
        )
        await call.end_with(error, created=False)
        # Validation, authorization and unknown models are refusals; the Horde's availability and rate
        # refusals are errors of an admitted request (docs/openai-front.md#metrics-and-logs).
        refused = error.code not in SUBMIT_ERROR_CODES and error.status in (400, 401, 403, 404, 409, 413)
        if refused:
            record_refusal(error, started, streamed)
        record.finish(error, refused=refused)
        return error.response()
    request_id = str(response.body.get("id"))
    # 200 answers a repeated operation key: this attempt joined a request an earlier one created.
    repeated = response.status == 200
    record.request_id = request_id
    record.submitted_at = time.time()
    answer = Answer.of(state, record, screened)
    if relayed:
        try:
            attached = await state.relay_records.attach(request_id) if repeated else None
        except StreamBusy:
            busy = stream_busy()
            await call.end_with(busy, created=True)
            record.finish(busy)
            return busy.response()
        if attached is None:
            await state.relay_records.save(
                request_id, key_digest(apikey), request_digest(native_body), record.submitted_at
            )
        return await _relayed_stream(request, answer, call=call)
    if streamed:
        return await _stream(request, answer, call)
    wait_task = asyncio.create_task(answer.waiter.run())
    watch_task = asyncio.create_task(_watch_disconnect(request))
    try:
        await asyncio.wait({wait_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not wait_task.done():
            # The client left: cancel the request unless a retry takes it over; stop waiting.
            _abandon(state, call, request_id, record.submitted_at, relayed=False, resumable=False)
            await stop_task(wait_task)
            record.client_left()
        watch_task.cancel()
    if record.code == "client_disconnected":
        return Response(status_code=499)
    try:
        status = wait_task.result()
    except OpenAIError as error:
        await call.end_with(error, created=True)
        record.finish(error)
        return error.response()
    completion = answer.completion(status)
    await call.end("delivered")
    record.finish()
    return JSONResponse(completion)


async def stop_task(task: asyncio.Task[Any], attempts: int = 100) -> None:
    """Cancel ``task`` and wait until it ended. The cancel is repeated until it takes: on Python 3.11
    ``asyncio.wait_for`` (which redis-py wraps around every command) swallows a cancel that lands in the loop
    turn its inner call finishes in, which left a waiter running until its request ended (and a dropped client's
    request uncancelled)."""
    for _ in range(attempts):
        if task.done():
            break
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: an error of a wait nobody reads any more is not worth a warning


async def _chat_entries_or_none(state: Any) -> Mapping[str, Mapping[str, Any]] | None:
    """The model list's chat entries, or None when the list cannot be read: a size-gap message then names the
    limit instead of the largest declared value (docs/openai-front.md#no-eligible-worker)."""
    try:
        entries: Mapping[str, Mapping[str, Any]] = await state.chat_entries()
    except Exception:
        log.warning("model list read failed for a size gap", exc_info=True)
        return None
    return entries


def _abandon(
    state: Any, call: Call, request_id: str, submitted_at: float, *, relayed: bool, resumable: bool
) -> None:
    """The client left before its request ended: cancel the request, after a grace in which a retry of the
    same call (``HORDE_OAI_RETRY_GRACE_SECONDS``, when the call has a record) or, for a relayed stream whose
    client received an event id, a resume (``HORDE_OAI_STREAM_RESUME_GRACE_SECONDS``) may take it over, on any
    front replica (the counts live in Redis). A cancelled non-streamed job still finishes and is charged
    (the cancel only stops what is queued), so its call stays open to a later retry, which gets that reply."""
    settings = state.settings
    grace = settings.oai_retry_grace_seconds if call.tracked else 0.0
    if relayed and resumable:
        grace = max(grace, settings.oai_stream_resume_grace_seconds)
    dropped = _in_background(call.end("dropped"))

    async def taken_over() -> bool:
        await dropped
        joined = await call.joined_meanwhile()
        if relayed:
            resumed = bool(await state.relay_records.detach(request_id, close_if_last=not joined))
            if resumed and not joined:
                await call.abandon("delivered")
            return joined or resumed
        return joined

    async def after_cancel(status: Mapping[str, Any]) -> None:
        charged = _int(status.get("processing")) > 0 or _int(status.get("finished")) > 0
        await call.abandon("retryable" if charged and not relayed else None)

    state.cancels.cancel_later(request_id, submitted_at, grace, taken_over, after_cancel)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


_BACKGROUND: set[asyncio.Task[Any]] = set()


def _in_background(coro: Any) -> asyncio.Task[Any]:
    """Run ``coro`` as a task kept until it ends (the response's own task may be cancelled meanwhile)."""
    task = asyncio.get_running_loop().create_task(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


async def _stream(request: Request, answer: Answer, call: Call) -> Response:
    """The buffered stream (docs/openai-front.md#streaming): JSON error before the first-read decision, SSE
    after it, the whole reply at once when the request is done."""
    record, waiter, body = answer.record, answer.waiter, answer.body
    state = get_state(request)
    request_id = record.request_id or ""
    submitted_at = record.submitted_at or time.time()
    wait_task = asyncio.create_task(waiter.run())
    refused = await _headers_decision(request, answer, wait_task, call, relayed=False, resumable=False)
    if refused is not None:
        return refused
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    keepalive = state.settings.oai_stream_keepalive_seconds

    async def events() -> AsyncIterator[str]:
        finished = False
        try:
            while not wait_task.done():
                done, _ = await asyncio.wait({wait_task}, timeout=keepalive)
                if not done:
                    yield ": keepalive\n\n"
            try:
                status = wait_task.result()
            except OpenAIError as error:
                finished = True
                await _stream_failed(record, call, error)
                yield sse_error(error)
                yield "data: [DONE]\n\n"
                return
            completion = answer.completion(status)
            STREAM_FIRST_CONTENT.labels(relayed="false").observe(max(0.0, time.time() - record.started))
            for event in buffered_stream_events(completion, include_usage=include_usage):
                yield event
            record.finish()
            finished = True
            await call.end("delivered")
        finally:
            if not finished:
                # The client went away mid-stream: stop waiting; cancel unless a retry takes the call over.
                if not wait_task.done():
                    _abandon(state, call, request_id, submitted_at, relayed=False, resumable=False)
                    _in_background(stop_task(wait_task))
                else:
                    _in_background(call.end("dropped"))
                record.client_left()

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def _headers_decision(
    request: Request,
    answer: Answer,
    wait_task: asyncio.Task[dict[str, Any]],
    call: Call,
    *,
    relayed: bool,
    resumable: bool,
) -> Response | None:
    """Wait for the first-read decision (docs/openai-front.md#streaming): a Response when the request ends before any
    header (its JSON error, ending ``call``; or 499 for a client that left, whose request is abandoned as
    :func:`_abandon` says for a ``relayed`` and ``resumable`` stream), None when the stream may open."""
    record, waiter = answer.record, answer.waiter
    first_read = asyncio.create_task(waiter.first_read_passed.wait())
    watch_task = asyncio.create_task(_watch_disconnect(request))
    try:
        await asyncio.wait({wait_task, first_read, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        first_read.cancel()
        watch_task.cancel()
    if watch_task.done() and not wait_task.done():
        submitted_at = record.submitted_at or time.time()
        _abandon(
            get_state(request),
            call,
            record.request_id or "",
            submitted_at,
            relayed=relayed,
            resumable=resumable,
        )
        await stop_task(wait_task)
        record.client_left()
        return Response(status_code=499)
    if wait_task.done() and wait_task.exception() is not None:
        error = wait_task.exception()
        if isinstance(error, OpenAIError):
            await call.end_with(error, created=True)
            record.finish(error)
            return error.response()
        raise error  # type: ignore[misc]
    return None


async def _relayed_stream(
    request: Request, answer: Answer, *, call: Call, resume_at: EventId | None = None
) -> Response:
    """A relayed stream (docs/openai-front.md#streaming): deltas from the progress stream as they arrive, paced, then the
    final reply reconciled with them. ``resume_at`` re-attaches a client at its ``Last-Event-ID``; ``call`` is
    the attempt's operation (untracked for a resume, which is no new call)."""
    record, waiter, body = answer.record, answer.waiter, answer.body
    state = get_state(request)
    settings = state.settings
    request_id = record.request_id or ""
    models = requested_models(body)
    relay = DeltaRelay(
        request_id=request_id,
        created=answer.created,
        default_model=models[0] if models else "",
        include_reasoning=include_reasoning(body),
        max_window=settings.oai_delta_pacing_max_window_seconds,
        max_pieces_per_second=settings.oai_delta_pacing_max_chunks_per_second,
    )
    catchup: list[str] = []
    start_id = FIRST_ID
    if resume_at is not None:
        resumed = await _resume_catchup(state, record, relay, request_id, resume_at)
        if isinstance(resumed, Response):
            return resumed
        catchup, start_id = resumed
    feed = state.deltas.register(request_id, start_id)
    wait_task = asyncio.create_task(waiter.run())
    submitted_at = record.submitted_at or time.time()
    try:
        refused = await _headers_decision(
            request, answer, wait_task, call, relayed=True, resumable=resume_at is not None
        )
    except BaseException:
        state.deltas.unregister(feed)
        raise
    if refused is not None:
        state.deltas.unregister(feed)
        if refused.status_code != 499:
            _detach_finished(state, request_id)
        return refused
    stream = _RelayedStream(
        state=state,
        answer=answer,
        call=call,
        relay=relay,
        feed=feed,
        wait_task=wait_task,
        catchup=catchup,
        request_id=request_id,
        submitted_at=submitted_at,
        include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        keepalive=settings.oai_stream_keepalive_seconds,
    )
    return StreamingResponse(stream.events(), media_type="text/event-stream", headers=SSE_HEADERS)


@dataclass
class _RelayedStream:
    """One connection of a relayed stream once its headers may go out: its events, then its cleanup."""

    state: Any
    answer: Answer
    call: Call
    relay: DeltaRelay
    feed: DeltaFeed
    wait_task: asyncio.Task[dict[str, Any]]
    catchup: list[str]
    request_id: str
    submitted_at: float
    include_usage: bool
    keepalive: float

    async def events(self) -> AsyncIterator[str]:
        record, waiter, relay, feed = self.answer.record, self.answer.waiter, self.relay, self.feed
        wait_task, keepalive, call = self.wait_task, self.keepalive, self.call
        finished = False
        getter: asyncio.Task[list[Any]] | None = None
        head: list[Any] | None = None  # a batch the getter took off the queue
        last_sent = time.monotonic()
        try:
            for event in self.catchup:
                yield event
            while True:
                batches = _take_batches(feed, head)
                head = None
                if batches:
                    waiter.progress_seen()
                out: list[str] = [event for batch in batches for event in relay.on_batch(batch)]
                out += relay.due()
                for event in out:
                    yield event
                if out:
                    last_sent = time.monotonic()
                    _note_first_content(record, relay)
                if wait_task.done():
                    break
                timeout = _relay_wake_timeout(relay, keepalive, last_sent)
                if getter is None:
                    getter = asyncio.create_task(feed.batches.get())
                done, _ = await asyncio.wait(
                    {getter, wait_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    head, getter = getter.result(), None
                elif not done and time.monotonic() - last_sent >= keepalive:
                    yield ": keepalive\n\n"
                    last_sent = time.monotonic()
            try:
                status = wait_task.result()
            except OpenAIError as error:
                finished = True
                await _stream_failed(record, call, error)
                for event in relay.fail(error):
                    yield event
                return
            completion = self.answer.completion(status)
            exposed = relay.exposed
            final = relay.finish(completion, include_usage=self.include_usage)
            diverged = relay.diverged
            finished = True
            for event in final:
                yield event
            _account_relayed(record, relay, exposed=exposed, diverged=diverged)
            await call.end("delivered")
        finally:
            self._ended(getter, finished=finished)

    def _ended(self, getter: asyncio.Task[list[Any]] | None, *, finished: bool) -> None:
        """The connection's cleanup, whether its stream ended or its client left mid-stream."""
        record = self.answer.record
        if getter is not None:
            getter.cancel()
        self.state.deltas.unregister(self.feed)
        if record.first_content is not None:
            STREAM_FIRST_CONTENT.labels(relayed="true").observe(
                max(0.0, record.first_content - record.started)
            )
        if finished:
            _detach_finished(self.state, self.request_id)
        else:
            # The client went away mid-stream: drop pending pieces; cancel unless it resumes in time.
            self.relay.drop()
            STREAM_RELAYS.labels(outcome="dropped").inc()
            if not self.wait_task.done():
                _abandon(
                    self.state,
                    self.call,
                    self.request_id,
                    self.submitted_at,
                    relayed=True,
                    resumable=self.relay.exposed,
                )
                _in_background(stop_task(self.wait_task))
            else:
                _detach_finished(self.state, self.request_id)
                _in_background(self.call.end("dropped"))
            record.client_left()


async def _resume_catchup(
    state: Any, record: RequestRecord, relay: DeltaRelay, request_id: str, resume_at: EventId
) -> Response | tuple[list[str], str]:
    """A resumed stream's catch-up events and the progress-stream id to read on from, or its refusal when
    ``resume_at`` names a generation this stream never relayed."""
    try:
        history = await state.relay_records.history(request_id)
    except Exception:
        log.warning("resume: stream read failed", extra={"request_id": request_id}, exc_info=True)
        history = []
    if resume_at.gen != WHOLE_GENERATION and not any(e.gen == resume_at.gen for e in history):
        # Not a generation this stream relayed: replaying from 0 would duplicate the client's text.
        _detach_finished(state, request_id)
        error = stream_not_resumable()
        record_refusal(error, record.started, True)
        return error.response()
    catchup = relay.resume(resume_at, history)
    start_id = history[-1].id if history else FIRST_ID
    STREAM_RELAYS.labels(outcome="resumed").inc()
    return catchup, start_id


def _take_batches(feed: DeltaFeed, head: list[Any] | None) -> list[list[Any]]:
    """The batch the getter already took (first: it is the oldest), then every batch queued since."""
    batches = [] if head is None else [head]
    while not feed.batches.empty():
        batches.append(feed.batches.get_nowait())
    return batches


def _relay_wake_timeout(relay: DeltaRelay, keepalive: float, last_sent: float) -> float:
    """How long the relay may sleep: until the next keepalive is due or its next paced piece, whichever first."""
    timeout = keepalive - (time.monotonic() - last_sent)
    next_due = relay.next_due()
    if next_due is not None:
        timeout = min(timeout, next_due - time.time())
    return max(0.0, timeout)


def _note_first_content(record: RequestRecord, relay: DeltaRelay) -> None:
    if relay.first_content_at is not None and record.first_content is None:
        record.first_content = relay.first_content_at


def _account_relayed(record: RequestRecord, relay: DeltaRelay, *, exposed: bool, diverged: bool) -> None:
    """Count a relayed stream that sent its final chunks, and finish its record (502 when it diverged)."""
    _note_first_content(record, relay)
    STREAM_RELAYS.labels(outcome="diverged" if diverged else "relayed" if exposed else "whole").inc()
    if diverged:
        record.status, record.code = 502, RC.ChatStreamDiverged
        STREAM_FAILURES.labels(code=record.code, outcome_class=outcome_class_for(record.code)).inc()
    record.finish()


def _detach_finished(state: Any, request_id: str) -> None:
    """A relayed stream's connection ended with the stream: one connection fewer (in the background, since the
    response's task may be cancelled while it closes)."""
    _in_background(state.relay_records.detach(request_id, close_if_last=False))


async def _resume(
    request: Request,
    record: RequestRecord,
    body: Mapping[str, Any],
    at: EventId,
    found: Mapping[str, str],
) -> Response:
    """Re-attach a client to its relayed stream at ``at`` (docs/openai-front.md#resumable-streams): no new request, no new
    charge. A client that already had the finish chunk gets ``data: [DONE]``."""
    state = get_state(request)
    try:
        submitted_at = float(found.get("submitted_at") or 0.0)
    except ValueError:
        submitted_at = 0.0
    record.request_id = at.request_id
    record.submitted_at = submitted_at or time.time()
    if at.final:
        record.finish()

        async def done() -> AsyncIterator[str]:
            yield sse_event(at, "[DONE]")

        return StreamingResponse(done(), media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        attach = await state.relay_records.attach(at.request_id)
    except StreamBusy:
        busy = stream_busy()
        record_refusal(busy, record.started, True)
        return busy.response()
    if attach is None:
        # Closed meanwhile: the drop's grace ended and the request was cancelled.
        error = stream_not_resumable()
        record_refusal(error, record.started, True)
        return error.response()
    return await _relayed_stream(
        request, Answer.of(state, record, body), call=state.operations.untracked(), resume_at=at
    )
