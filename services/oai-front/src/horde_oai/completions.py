"""``POST /v1/chat/completions``: the OpenAI chat completion over the native chat routes.

Flow (spec: chat-front.md; chat-requests.md *Completion signal*): read the body (413 over the bound; 400
BadRequest for non-JSON or NaN/Infinity) → Bearer key → screen and validate (``schema``) → the shared
contract rules → ``POST /v2/generate/chat/async`` with a fresh ``horde.operation_key`` → wait on the signal
(``waiter``) → ``chat.completion``, or for ``stream: true`` the buffered stream (*Buffered stream events*).
Every refusal is an OpenAI error; every admitted request logs one finished line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from horde_contract import ChatContractError, load_json_body, parse_chat_request
from horde_core.body import BodyReadTimeout, BodyTooLarge, read_bounded_body

from horde_oai.errors import OpenAIError, bad_request
from horde_oai.mapping import (
    build_completion,
    build_native_body,
    completion_limit_source,
    content_category,
    effective_completion_limit,
    estimate_prompt_tokens,
    finished_generations,
    is_size_only_gap,
    map_native_error,
    native_message_of,
    new_operation_key,
    requested_models,
)
from horde_oai.metrics import (
    COMPLETIONS,
    REQUEST_DURATION,
    REQUEST_MAX_TOKENS,
    REQUESTS_ERRORS,
    REQUESTS_REFUSED,
    max_tokens_bucket,
    outcome_class_for,
)
from horde_oai.schema import contract_error, parameter_label, validate_request
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


def invalid_json_error(reason: str = "") -> OpenAIError:
    """400 BadRequest for a body that is not JSON, holds NaN/Infinity or is not valid Unicode."""
    return bad_request(
        "We could not parse the JSON body of your request. The API expects a JSON object; NaN, Infinity and "
        "-Infinity are not JSON." + (f" {reason}" if reason else "")
    )


def parse_json_body(raw: bytes) -> Any:
    """The parsed body, read by the contract's ``load_json_body`` as the native route reads it; raises 400
    BadRequest for invalid JSON, NaN, Infinity, -Infinity, an overflowing number and a lone surrogate."""
    try:
        return load_json_body(raw)
    except ChatContractError as exc:
        raise invalid_json_error(exc.message) from None


async def read_body(request: Request, limit: int, read_timeout: float = 60.0) -> bytes:
    """The raw body (horde_core's bounded reader), refused with 413 RequestTooLarge past ``limit`` (declared
    or read), or 408 RequestBodyTimeout when it takes longer than ``read_timeout`` seconds to arrive (spec:
    Refusal attributes)."""
    try:
        return await read_bounded_body(request, limit, read_timeout, strict_content_length=False)
    except BodyTooLarge:
        raise OpenAIError(
            413, f"The request body is larger than the {limit} bytes the AI Horde accepts.", "RequestTooLarge"
        ) from None
    except BodyReadTimeout as exc:
        raise OpenAIError(408, str(exc), "RequestBodyTimeout") from None


def bearer_key(request: Request) -> str:
    """The API key from ``Authorization: Bearer <key>``; 401 without one."""
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
    return key


def apply_contract_rules(native_body: dict[str, Any]) -> None:
    """The request rules shared with the native route (horde_contract.parse_chat_request), so the client gets
    OpenAI's message and param locally: tool_choice/parallel_tool_calls without tools, tool history, strict
    schemas, openai_guards, nesting depth, text caps. Length limits are deferred, as the Horde lowers a
    max_tokens above every worker's limit instead of refusing it. The native route repeats every check."""
    try:
        parse_chat_request(native_body, defer_length_limits=True)
    except ChatContractError as exc:
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

    def finish(self, error: OpenAIError | None = None, *, refused: bool = False) -> None:
        """Record the end: duration and errors metrics (unless ``refused`` recorded it as a refusal), the
        completion limit of a request the Horde accepted, and the finished log line."""
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
        if error is not None and not refused and self.code != "client_disconnected":
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

    def _log(self, limit: int, source: str) -> None:
        t = self.trace
        woke_at = f"{t.woke_at:.3f}" if t.woke_at else "none"
        waited = f"{t.woke_at - self.submitted_at:.3f}" if t.woke_at and self.submitted_at else "none"
        head = (
            f"Chat request {self.request_id} finished:"
            if self.request_id
            else "Unsubmitted chat request finished:"
        )
        submitted = f"{self.submitted_at:.3f}" if self.submitted_at else "none"
        message = (
            f"{head} streamed={self.streamed} submitted_at={submitted} woke_at={woke_at} woke_by={t.woke_by} "
            f"waited={waited}s status={self.status} code={self.code} wakes={t.wakes} "
            f"estimated_usage={self.estimated_usage} "
            f"done_without_generation_reads={t.done_without_generation_reads} "
            f"requested_model={','.join(requested_models(self.body))} served_model={self.served_model or 'none'} "
            f"retry_after={self.retry_after or 'none'}"
        )
        if self.code == "queue_unavailable":
            message += (
                f" queue_reason={t.queue_reason} wait_time={_none(t.wait_time)} "
                f"eligible_worker_threads={_none(t.eligible_worker_threads)}"
            )
        message += (
            f" first_read_wait_time={_none(t.first_read_wait_time)} "
            f"first_read_eligible_worker_threads={_none(t.first_read_eligible_worker_threads)} "
            f"max_tokens={limit} max_tokens_source={source}"
        )
        log.info(
            message,
            extra={
                "request_id": self.request_id,
                "streamed": self.streamed,
                "status": self.status,
                "code": self.code,
                "wakes": t.wakes,
                "served_model": self.served_model,
                "max_tokens": limit,
                "max_tokens_source": source,
            },
        )


def _none(value: Any) -> str:
    return "none" if value is None else str(value)


def record_refusal(error: OpenAIError, started: float, streamed: bool) -> None:
    """horde.oai.requests.refused for a refusal before submit, and the refused-parameter log line."""
    label = ""
    if error.code == "UnsupportedChatParameter" and error.param:
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
    lowered = bool(record.trace.context_adjustments) and any(
        isinstance(a, Mapping) and a.get("reason") == "worker_max_length"
        for a in record.trace.context_adjustments or ()
    )
    category = content_category(native_message)
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


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> Response:
    """Create a chat completion on the AI Horde (see the OpenAPI description for the body and errors)."""
    state = request.app.state
    settings = state.settings
    started = time.time()
    streamed = False
    try:
        raw = await read_body(request, settings.oai_max_body_bytes, settings.body_read_timeout_seconds)
        payload = parse_json_body(raw)
        streamed = isinstance(payload, dict) and payload.get("stream") is True
        apikey = bearer_key(request)
        _, screened = validate_request(payload)
        horde = screened.get("horde") or {}
        if horde.get("dry_run"):
            raise OpenAIError(
                400,
                "horde.dry_run is not available through the OpenAI front; use the native route for quotes.",
                "UnsupportedChatParameter",
                param="horde.dry_run",
            )
        native_body = build_native_body(screened, new_operation_key())
        apply_contract_rules(native_body)
    except OpenAIError as refusal:
        record_refusal(refusal, started, streamed)
        return refusal.response()
    record = RequestRecord(started=started, streamed=streamed, body=screened)
    models = requested_models(screened)
    try:
        response = await state.horde.submit(
            apikey,
            native_body,
            retries=settings.oai_submit_retries,
            client_address=request.client.host if request.client else None,
        )
    except OpenAIError as unavailable:
        record.finish(unavailable)
        return unavailable.response()
    if not response.ok:
        entries = None
        if is_size_only_gap(_impossible_reason(response.body)):
            entries = await state.chat_entries()
        error = map_native_error(
            response.status, response.body, models=models, headers=response.headers, chat_entries=entries
        )
        # Validation, authorization and unknown models are refusals; the Horde's availability and rate
        # refusals are errors of an admitted request (spec: Refusal attributes, Error attributes).
        refused = error.code not in SUBMIT_ERROR_CODES and error.status in (400, 401, 403, 404, 409, 413)
        if refused:
            record_refusal(error, started, streamed)
        record.finish(error, refused=refused)
        return error.response()
    request_id = str(response.body.get("id"))
    record.request_id = request_id
    record.submitted_at = time.time()
    budget = settings.oai_stream_timeout_seconds if streamed else settings.oai_nonstream_timeout_seconds
    waiter = ChatWait(
        request_id=request_id,
        submitted_at=record.submitted_at,
        budget=budget,
        client=state.horde,
        hub=state.signals,
        cancels=state.cancels,
        recheck_seconds=settings.oai_signal_recheck_seconds,
        grace_seconds=settings.oai_fail_fast_grace_seconds,
        models=models,
        fail_fast=horde.get("availability_mode") == "fail_fast",
        chat_entries=state.chat_entries,
    )
    record.trace = waiter.trace
    prompt_estimate = estimate_prompt_tokens(screened.get("messages") or [], screened.get("tools"))
    created = int(record.submitted_at)
    if streamed:
        return await _stream(request, record, waiter, screened, created, prompt_estimate)
    wait_task = asyncio.create_task(waiter.run())
    watch_task = asyncio.create_task(_watch_disconnect(request))
    try:
        await asyncio.wait({wait_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not wait_task.done():
            # The client left: cancel the native request, don't wait for the answer.
            wait_task.cancel()
            with contextlib.suppress(BaseException):
                await wait_task
            state.cancels.cancel_in_background(request_id, record.submitted_at)
            record.status, record.code = 499, "client_disconnected"
            record.finish()
        watch_task.cancel()
    if record.code == "client_disconnected":
        return Response(status_code=499)
    try:
        status = wait_task.result()
    except OpenAIError as error:
        record.finish(error)
        return error.response()
    completion = build_completion(
        request_id=request_id, created=created, body=screened, status=status, prompt_estimate=prompt_estimate
    )
    record_completion(record, completion, status)
    record.finish()
    return JSONResponse(completion)


async def _stream(
    request: Request,
    record: RequestRecord,
    waiter: ChatWait,
    body: Mapping[str, Any],
    created: int,
    prompt_estimate: int,
) -> Response:
    """The buffered stream: JSON error before the first-read decision, SSE after it."""
    state = request.app.state
    wait_task = asyncio.create_task(waiter.run())
    first_read = asyncio.create_task(waiter.first_read_passed.wait())
    watch_task = asyncio.create_task(_watch_disconnect(request))
    await asyncio.wait({wait_task, first_read, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    if watch_task.done() and not wait_task.done():
        first_read.cancel()
        wait_task.cancel()
        with contextlib.suppress(BaseException):
            await wait_task
        state.cancels.cancel_in_background(record.request_id, record.submitted_at)
        record.status, record.code = 499, "client_disconnected"
        record.finish()
        return Response(status_code=499)
    watch_task.cancel()
    if wait_task.done() and wait_task.exception() is not None:
        first_read.cancel()
        error = wait_task.exception()
        if isinstance(error, OpenAIError):
            record.finish(error)
            return error.response()
        raise error  # type: ignore[misc]
    first_read.cancel()
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
                record.finish(error)
                finished = True
                yield sse_error(error)
                yield "data: [DONE]\n\n"
                return
            completion = build_completion(
                request_id=record.request_id or "",
                created=created,
                body=body,
                status=status,
                prompt_estimate=prompt_estimate,
            )
            record_completion(record, completion, status)
            for event in buffered_stream_events(completion, include_usage=include_usage):
                yield event
            record.finish()
            finished = True
        finally:
            if not finished:
                # The client went away mid-stream: stop waiting and cancel the native request.
                if not wait_task.done():
                    wait_task.cancel()
                    state.cancels.cancel_in_background(record.request_id, record.submitted_at)
                record.status, record.code = 499, "client_disconnected"
                record.finish()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
