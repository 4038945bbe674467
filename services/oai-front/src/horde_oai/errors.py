"""The OpenAI error envelope and the front's own refusals.

Every error the front returns is ``{"error": {"message", "type", "param", "code"[, "metadata"]}}`` (OpenAI's
shape). ``code`` is the Horde return code (the native ``rc`` passed through, so the
code set is open) or one of the front's codes below. Headers such as ``Retry-After`` and ``x-should-retry``
ride on the exception. See docs/openai-front.md#no-eligible-worker, #kudos-cap, #metrics-and-logs.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from horde_contract.errors import RC
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

# Retry-After of every no_eligible_worker (docs/openai-front.md#no-eligible-worker).
NO_ELIGIBLE_WORKER_RETRY_AFTER_SECONDS = 30

# OpenAI's error type for each status the front returns.
ERROR_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type_for(status: int) -> str:
    """OpenAI's ``type`` for ``status``: the table above, ``api_error`` for 5xx and anything else."""
    return ERROR_TYPE_BY_STATUS.get(status, "api_error")


# x-should-retry on every error (docs/openai-front.md#retries-and-idempotency). A retry of the same call joins the same
# native operation, so it is always safe; it is useful after the statuses the SDKs retry (408, 409, 429, 5xx)
# unless the code below says the call's outcome is settled. Errors of a request the Horde created and ended are
# settled too: the front marks them where it raises them (``settled()``).
RETRIED_STATUSES = frozenset({408, 409, 429})
SETTLED_CODES = frozenset(
    {
        RC.ChatRequestTimeout,  # the whole budget was spent and the request cancelled
        RC.ChatRequestFaulted,  # the horde already restarted the job up to its fault limit
        RC.ChatRequestNoGeneration,
        RC.ChatStreamDiverged,
        "no_eligible_worker",  # spec: an SDK retries within seconds, and the online workers are the same
        "queue_unavailable",
        RC.OperationKeyConflict,
    }
)


def should_retry_by_default(status: int, code: str | None) -> bool:
    """Whether a retry of the call is safe and useful: the SDKs' retried statuses, except settled codes."""
    if code in SETTLED_CODES:
        return False
    return status in RETRIED_STATUSES or status >= 500


class OpenAIError(Exception):
    """A refusal in the OpenAI envelope.

    ``status`` HTTP status; ``message``; ``code`` (rc or front code, may be None); ``param`` request path or
    None; ``type`` (defaults from the status); ``metadata`` extra object (omitted when empty); ``headers``
    response headers (Retry-After, x-should-retry).
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None,
        *,
        param: str | None = None,
        type: str | None = None,
        metadata: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or error_type_for(status)
        self.metadata = metadata or {}
        self.headers = dict(headers or {})
        self.headers.setdefault(
            "x-should-retry", "true" if should_retry_by_default(status, code) else "false"
        )
        # Metrics attributes (Outcome class): the stage of a no_eligible_worker and the refused parameter.
        self.stage = ""
        self.reason = ""

    def body(self) -> dict[str, Any]:
        """The JSON body ``{"error": {...}}``."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.metadata:
            error["metadata"] = self.metadata
        return {"error": error}

    @property
    def should_retry(self) -> bool:
        """The ``x-should-retry`` this error sends."""
        return self.headers.get("x-should-retry") == "true"

    def settled(self) -> OpenAIError:
        """Mark the call's outcome settled (``x-should-retry: false``): the Horde created the request and it
        ended, so a retry would only meet the same request again. Returns self."""
        self.headers["x-should-retry"] = "false"
        return self

    def response(self) -> JSONResponse:
        """The JSON response with the status and headers."""
        return JSONResponse(status_code=self.status, content=self.body(), headers=self.headers)

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready copy (status, body, headers) that :meth:`from_record` rebuilds."""
        return {"status": self.status, "body": self.body(), "headers": self.headers}

    @classmethod
    def from_record(cls, text: str) -> OpenAIError | None:
        """The error :meth:`to_record` wrote as JSON ``text``; None when it does not parse as one."""
        try:
            record = json.loads(text)
            error = record["body"]["error"]
            rebuilt = cls(
                int(record["status"]),
                str(error["message"]),
                error.get("code"),
                param=error.get("param"),
                type=error.get("type"),
                metadata=error.get("metadata"),
                headers={str(k): str(v) for k, v in (record.get("headers") or {}).items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return rebuilt

    def __repr__(self) -> str:
        return f"OpenAIError({self.status}, {self.code!r}, {self.message!r}, param={self.param!r})"


def bad_request(message: str, param: str | None = None, code: str = RC.BadRequest) -> OpenAIError:
    """400 invalid_request_error with ``code`` (BadRequest unless given)."""
    return OpenAIError(400, message, code, param=param)


def no_eligible_worker(message: str, *, stage: str, request_id: str | None = None) -> OpenAIError:
    """503 no_eligible_worker with Retry-After 30 and x-should-retry false (docs/openai-front.md#no-eligible-worker)."""
    exc = OpenAIError(
        503,
        message,
        "no_eligible_worker",
        type="service_unavailable_error",
        metadata={"request_id": request_id} if request_id else None,
        headers={
            "Retry-After": str(NO_ELIGIBLE_WORKER_RETRY_AFTER_SECONDS),
            "x-should-retry": "false",
        },
    )
    exc.stage = stage
    return exc


def install_openai_error_handlers(app: FastAPI) -> None:
    """Answer every error, framework ones included, in the OpenAI envelope."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
        return bad_request(f"Invalid request: {first.get('msg', 'invalid value')}", loc or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, RC.BadRequest)
        return OpenAIError(exc.status_code, str(exc.detail), code).response()

    @app.exception_handler(Exception)
    async def _unhandled(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return OpenAIError(
            500, "The server had an error while processing your request.", RC.InternalServerError
        ).response()
