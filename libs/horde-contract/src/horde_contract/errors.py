"""Return codes and the one exception every refusal raises (the Horde error envelope).

See docs/native-api.md (every section that names an ``rc``), docs/openai-front.md#requests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Any


class RC(StrEnum):
    """Every ``rc`` string a native route returns, and every ``code`` of the OpenAI front's own errors."""

    # Request validation and admission (POST /v2/generate/chat/async, text async)
    BadRequest = "BadRequest"
    UnsupportedChatParameter = "UnsupportedChatParameter"
    ChatRequestConflict = "ChatRequestConflict"
    UnknownChatModel = "UnknownChatModel"
    NoEligibleWorker = "NoEligibleWorker"
    ChatAdmissionDisabled = "ChatAdmissionDisabled"
    RequestTooLarge = "RequestTooLarge"
    OperationKeyConflict = "OperationKeyConflict"
    ChatKudosCapExceeded = "ChatKudosCapExceeded"
    PromptExceedsContext = "PromptExceedsContext"
    KudosUpfront = "KudosUpfront"
    SharedKeyInsufficientKudos = "SharedKeyInsufficientKudos"
    TooManyPrompts = "TooManyPrompts"
    MaintenanceMode = "MaintenanceMode"
    InvalidAPIKey = "InvalidAPIKey"
    WrongCredentials = "WrongCredentials"
    DeletedUser = "DeletedUser"
    TimeoutIP = "TimeoutIP"
    CorruptPrompt = "CorruptPrompt"
    MissingPrompt = "MissingPrompt"
    NulByteInPayload = "NulByteInPayload"
    WorkerNotFound = "WorkerNotFound"
    SharedKeyExpired = "SharedKeyExpired"
    SharedKeyEmpty = "SharedKeyEmpty"
    # Dispatch did not answer admission's availability call
    WorkerPoolUnavailable = "WorkerPoolUnavailable"
    # Any native route: past the process's in-flight cap (horde_core.capacity), past a rate limit, a body
    # slower than the read timeout, a store outage, an unknown route or method, an unhandled error
    ServiceAtCapacity = "ServiceAtCapacity"
    RateLimitExceeded = "RateLimitExceeded"
    RequestBodyTimeout = "RequestBodyTimeout"
    ServiceUnavailable = "ServiceUnavailable"
    NotFound = "NotFound"
    MethodNotAllowed = "MethodNotAllowed"
    InternalServerError = "InternalServerError"
    OnlyServiceAccountProxy = "OnlyServiceAccountProxy"
    RequiresTrust = "RequiresTrust"
    # Upstream's rc really ends with a dot.
    InvalidExtraSourceImages = "InvalidExtraSourceImages."
    # Text params cross-field checks (validate_text_params)
    TokenOverflow = "TokenOverflow"
    MissingFullSamplerOrder = "MissingFullSamplerOrder"
    TooManyStopSequences = "TooManyStopSequences"
    ExcessiveStopSequence = "ExcessiveStopSequence"
    # Images
    TooManyExtraSourceImages = "TooManyExtraSourceImages"
    SourceImageSizeExceeded = "SourceImageSizeExceeded"
    SourceImageResolutionExceeded = "SourceImageResolutionExceeded"
    SourceImageUnreadable = "SourceImageUnreadable"
    SourceImageUrlRefused = "SourceImageUrlRefused"
    SourceImageUrlInvalid = "SourceImageUrlInvalid"
    ChatImageStorageUnavailable = "ChatImageStorageUnavailable"
    # Status and cancel
    RequestNotFound = "RequestNotFound"
    # Pop
    ChatDeclarationInvalid = "ChatDeclarationInvalid"
    AnonForbiddenWorker = "AnonForbiddenWorker"
    WorkerFlaggedMaintenance = "WorkerFlaggedMaintenance"
    WorkerMaintenance = "WorkerMaintenance"
    InvalidPriorityUsername = "InvalidPriorityUsername"
    # Worker creation on pop
    TooManyWorkers = "TooManyWorkers"
    TooManyWorkersTrusted = "TooManyWorkersTrusted"
    TooManySameIPs = "TooManySameIPs"
    # Submit
    ChatSubmitInvalid = "ChatSubmitInvalid"
    ChatSubmitNonconformant = "ChatSubmitNonconformant"
    ChatModelMismatch = "ChatModelMismatch"
    ChatWorkerFault = "ChatWorkerFault"
    AbortedGen = "AbortedGen"
    DuplicateGen = "DuplicateGen"
    InvalidJobID = "InvalidJobID"
    # Progress
    ChatJobAborted = "ChatJobAborted"
    ChatProgressNotStreaming = "ChatProgressNotStreaming"
    ChatProgressOutOfSequence = "ChatProgressOutOfSequence"
    ChatProgressCapReached = "ChatProgressCapReached"
    ChatProgressUnavailable = "ChatProgressUnavailable"
    # User details (GET /v2/users/{id}) and worker changes (PUT /v2/workers/{id}), upstream's codes
    UserNotFound = "UserNotFound"
    NotOwner = "NotOwner"
    NotModerator = "NotModerator"
    NoWorkerModSelected = "NoWorkerModSelected"
    WorkerNameAlreadyExists = "WorkerNameAlreadyExists"
    TeamNotFound = "TeamNotFound"
    # The OpenAI front's own codes (its error envelope's ``code``)
    FrontAtCapacity = "FrontAtCapacity"
    ChatRequestTimeout = "ChatRequestTimeout"
    ChatRequestFaulted = "ChatRequestFaulted"
    ChatRequestNoGeneration = "ChatRequestNoGeneration"
    ChatStreamDiverged = "ChatStreamDiverged"
    HordeUnavailable = "HordeUnavailable"


# The front reads the request path a native message starts with (UnknownChatModel, tool history, ...).
NATIVE_REQUEST_PATH_PATTERN = re.compile(r"^'(?P<path>[^']+)'")


class HordeError(Exception):
    """An API refusal in the Horde error envelope: every error body is ``{"message", "rc", **extra}``.

    Attributes: ``status`` (HTTP status), ``rc`` (an :class:`RC` value), ``message`` (the native message;
    where the spec says so it starts with the quoted request path), ``param`` (the request path such as
    ``messages[2].tool_calls`` or ``horde.only``, or None), ``extra`` (keys added to the native body, such
    as ``expected_seq`` or ``impossible_reason``), ``openai_message`` (the message without the path
    prefix, which the front sends beside ``param``) and ``headers`` (response headers such as
    ``Retry-After``, or None).
    """

    __slots__ = ("extra", "headers", "message", "openai_message", "param", "rc", "status")

    def __init__(
        self,
        status: int,
        rc: str,
        message: str,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
        *,
        openai_message: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.rc = str(rc)
        self.message = message
        self.param = param
        self.extra = extra or {}
        self.openai_message = openai_message if openai_message is not None else message
        self.headers = headers

    def to_body(self) -> dict[str, Any]:
        """The native error body: ``{"message", "rc", **extra}``."""
        return {"message": self.message, "rc": self.rc, **self.extra}

    def __repr__(self) -> str:
        return f"HordeError({self.status}, {self.rc!r}, {self.message!r}, param={self.param!r})"


def path_error(status: int, rc: str, path: str, text: str, extra: dict[str, Any] | None = None) -> HordeError:
    """A refusal whose message is ``'<path>': <text>``; ``openai_message`` is ``text`` alone."""
    return HordeError(status, rc, f"'{path}': {text}", path, extra, openai_message=text)


def bad_request(path: str, text: str) -> HordeError:
    """400 BadRequest at ``path`` (a value of the wrong type or outside its documented values)."""
    return path_error(400, RC.BadRequest, path, text)


def unsupported(path: str, text: str | None = None) -> HordeError:
    """400 UnsupportedChatParameter at ``path``; the message holds the path."""
    return path_error(
        400, RC.UnsupportedChatParameter, path, text or "this parameter is not supported on chat requests."
    )


def unsupported_value(path: str, value: Any) -> HordeError:
    """400 UnsupportedChatParameter for a refused value; the message holds ``path=value``."""
    shown = value if isinstance(value, str) else repr(value)
    return HordeError(
        400,
        RC.UnsupportedChatParameter,
        f"'{path}={shown}': this value is not supported on chat requests.",
        path,
        openai_message=f"Unsupported value: '{path}' does not support {value!r} on the Horde.",
    )


def conflict(path: str, text: str, *, prefix: bool = True) -> HordeError:
    """400 ChatRequestConflict at ``path``; OpenAI's own messages are sent unprefixed."""
    if prefix:
        return path_error(400, RC.ChatRequestConflict, path, text)
    return HordeError(400, RC.ChatRequestConflict, text, path)


def _refuse_json_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def load_json_body(raw: bytes | str, *, refuse_nul: bool = True) -> object:
    """Parse a request body as JSON, refusing what JSON or the stores cannot carry.

    Raises 400 BadRequest when the body is not UTF-8 JSON, holds NaN, Infinity or -Infinity (as constants or as
    a number too large for a float, such as ``1e400``), or holds a lone UTF-16 surrogate escape (``"\\ud800"``),
    which no UTF-8 store or peer can encode. With ``refuse_nul``, a NUL character anywhere (raw or escaped as
    ``\\u0000``) raises 400 NulByteInPayload, as upstream does, since PostgreSQL cannot store it in text or
    JSONB. See docs/openai-front.md#requests; docs/native-api.md#text-route (error bodies).
    """
    import json

    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise HordeError(400, RC.BadRequest, "The request body is not UTF-8 JSON.", None) from None
    nul = HordeError(400, RC.NulByteInPayload, "The request body contains a NUL character.", None)
    if refuse_nul and "\x00" in text:
        raise nul
    try:
        value = json.loads(text, parse_constant=_refuse_json_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        raise HordeError(400, RC.BadRequest, "The request body is not valid JSON.", None) from None
    # The escaped forms are rare; only then walk the parsed value (an escaped backslash is neither).
    if refuse_nul and "\\u0000" in text and _find_string(value, _has_nul):
        raise nul
    if ("\\ud" in text or "\\uD" in text) and _find_string(value, _has_lone_surrogate):
        raise HordeError(
            400,
            RC.BadRequest,
            "The request body holds a lone UTF-16 surrogate, which is not valid Unicode.",
            None,
        )
    return value


def _finite_float(literal: str) -> float:
    number = float(literal)
    if math.isinf(number):
        raise ValueError(f"{literal} does not fit a float")
    return number


def _has_nul(text: str) -> bool:
    return "\x00" in text


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _find_string(value: object, test: Callable[[str], bool]) -> bool:
    """True when any string in ``value`` (keys included) passes ``test``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if test(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
