"""The body of ``POST /v2/generate/text/pop``: the text pop fields (docs/native-api.md#pop) and the chat
declaration (docs/native-api.md#chat-declaration).

The text fields are validated here; the six chat fields are read by ``horde_contract.parse_chat_declaration``
from the raw body, so the worker, the front and dispatch share one rule. The body is read by horde_core's body
reader within the pop's bounds (POP_BODY_LIMITS: 512 KiB, 16,384 elements, 64 levels).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from horde_contract import RC, ChatDeclaration, HordeError, parse_chat_declaration
from horde_contract.limits import MAX_POP_PRIORITY_USERNAMES, MAX_POP_WAIT_SECONDS
from horde_core import body as body_reader
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

#: Upstream keeps at most this many models of one pop (TextWorker.parse_models).
MAX_WORKER_MODELS = 200
#: Upstream's bridge agent when the worker does not send one.
DEFAULT_BRIDGE_AGENT = "unknown:0:unknown"
#: Names upstream refuses for a new worker (JobPopTemplate.validate).
_FORBIDDEN_NAME_PARTS = ("colab", "tpu", "google")
UNRECOGNISED_MODELS_MESSAGE = (
    "Unfortunately we cannot accept workers serving unrecognised models at this time"
)

ModelName = Annotated[StrictStr, Field(min_length=3, max_length=255)]
#: The largest token length a worker row stores (PostgreSQL ``integer``); a larger declared length is 400.
MAX_STORED_LENGTH = 2**31 - 1
#: The largest user id (PostgreSQL ``bigint``): a priority entry naming a larger id names no user.
MAX_USER_ID = 2**63 - 1


class TextPopBody(BaseModel):
    """The text fields of a pop. Lengths are in tokens; unknown keys are ignored, as upstream.

    ``nsfw``, ``require_upfront_kudos`` and ``extra_slow_worker`` are accepted and not applied to text.
    ``wait_seconds`` (a Horde Chat extension, 0 to MAX_POP_WAIT_SECONDS = 20, default 0) is how long an empty
    pop may wait for a job to be queued (docs/worker-guide.md#long-poll).
    """

    model_config = ConfigDict(extra="ignore")

    name: Annotated[StrictStr, Field(min_length=1, max_length=100)]
    models: list[ModelName] = Field(default_factory=list)
    max_length: Annotated[StrictInt, Field(ge=1, le=MAX_STORED_LENGTH)] = 512
    max_context_length: Annotated[StrictInt, Field(ge=1, le=MAX_STORED_LENGTH)] = 2048
    softprompts: Annotated[list[Annotated[StrictStr, Field(max_length=100)]], Field(max_length=200)] = Field(
        default_factory=list
    )
    bridge_agent: Annotated[StrictStr, Field(max_length=1000)] = DEFAULT_BRIDGE_AGENT
    threads: Annotated[StrictInt, Field(ge=1, le=50)] = 1
    amount: Annotated[StrictInt, Field(ge=1, le=20)] = 1
    priority_usernames: Annotated[
        list[Annotated[StrictStr, Field(max_length=100)]], Field(max_length=MAX_POP_PRIORITY_USERNAMES)
    ] = Field(default_factory=list)
    nsfw: StrictBool | None = None
    require_upfront_kudos: StrictBool | None = None
    extra_slow_worker: StrictBool | None = None
    wait_seconds: Annotated[
        StrictFloat,
        Field(
            ge=0,
            le=MAX_POP_WAIT_SECONDS,
            description=(
                "A Horde Chat extension: when no job is queued for this worker, hold the pop up to this many "
                f"seconds (at most {MAX_POP_WAIT_SECONDS}) and answer as soon as a job it may take is queued; "
                "0 (the default) answers at once. An empty answer comes when the time is up."
            ),
        ),
    ] = 0.0


class PopBody:
    """A validated pop: ``text`` (the text fields), ``declaration`` (the chat declaration), and
    ``priority_user_ids`` (the user ids of ``alias#id`` entries of ``priority_usernames``)."""

    __slots__ = ("declaration", "priority_user_ids", "text")

    def __init__(self, text: TextPopBody, declaration: ChatDeclaration, priority_user_ids: list[int]) -> None:
        self.text = text
        self.declaration = declaration
        self.priority_user_ids = priority_user_ids

    @property
    def models(self) -> list[str]:
        """The pop's models, deduplicated in order and capped at 200."""
        return list(dict.fromkeys(self.text.models))[:MAX_WORKER_MODELS]

    @property
    def wait_seconds(self) -> float:
        """How long an empty pop may wait for a job, in seconds (0: answer at once)."""
        return self.text.wait_seconds

    @property
    def bridge_name(self) -> str:
        """The bridge name: ``bridge_agent`` up to its first ``:`` (``unknown`` when empty)."""
        return self.text.bridge_agent.split(":", 1)[0] or "unknown"


def worker_name_refusal(name: str) -> HordeError | None:
    """The 400 BadRequest for a worker name holding colab, tpu or google (any case), or None. The pop's rule
    for a new name, and the rename's (PUT /v2/workers/{id})."""
    lowered = name.lower()
    if any(part in lowered for part in _FORBIDDEN_NAME_PARTS):
        return HordeError(400, RC.BadRequest, "Worker names cannot contain 'colab', 'tpu' or 'google'.")
    return None


def _priority_user_id(entry: str) -> int:
    """The user id of an ``alias#id`` entry (ASCII digits); 400 InvalidPriorityUsername otherwise."""
    alias, sep, raw_id = entry.rpartition("#")
    if not sep or not alias or not (raw_id.isascii() and raw_id.isdigit()):
        raise HordeError(
            400,
            RC.InvalidPriorityUsername,
            f"Priority usernames need to be in the form alias#id. '{entry}' is not.",
        )
    return int(raw_id)


async def read_pop_body(request: Request, read_timeout: float) -> Any:
    """The pop's JSON body (``None`` when empty), read within :data:`horde_core.body.POP_BODY_LIMITS`.

    Errors: 413 RequestTooLarge past its bytes; 408 RequestBodyTimeout when it takes longer than
    ``read_timeout`` seconds; 400 BadRequest for a malformed Content-Length, past its elements or depth
    ("Input payload validation failed: body: The JSON body nests deeper than 64 levels."), for invalid JSON,
    NaN, Infinity or a lone surrogate; 400 NulByteInPayload for a NUL (names are stored as text).
    """
    limits = body_reader.POP_BODY_LIMITS
    try:
        return await body_reader.read_json_body(request, limits, read_timeout, allow_empty=True)
    except body_reader.BodyTooLarge as exc:
        raise HordeError(413, RC.RequestTooLarge, str(exc)) from None
    except body_reader.BodyReadTimeout as exc:
        raise HordeError(408, RC.RequestBodyTimeout, str(exc)) from None
    except body_reader.InvalidContentLength as exc:
        raise HordeError(400, RC.BadRequest, f"Input payload validation failed: {exc}") from None
    except body_reader.JsonStructureError as exc:
        raise HordeError(
            400, RC.BadRequest, f"Input payload validation failed: body: {exc.message}"
        ) from None


def parse_pop_body(raw: Any) -> PopBody:
    """Validate a pop body.

    Errors: 400 BadRequest for a field of the wrong type or out of range (the message names the field,
    e.g. ``threads``; ``wait_seconds`` must be a number from 0 to 20), for an empty ``models`` (upstream's
    "unrecognised models" message) and for a name containing colab, tpu or google; 400
    InvalidPriorityUsername for a priority entry without ``#id`` (ASCII digits; an id past the largest user id
    names nobody and is dropped); 400 ChatDeclarationInvalid for an invalid chat declaration, chat_limits
    lengths past :data:`MAX_STORED_LENGTH` included (as the text lengths, 400 BadRequest).
    """
    if not isinstance(raw, dict):
        raise HordeError(400, RC.BadRequest, "Input payload validation failed: body: has to be a JSON object")
    try:
        text = TextPopBody.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    if not text.models:
        raise HordeError(400, RC.BadRequest, UNRECOGNISED_MODELS_MESSAGE)
    name_refusal = worker_name_refusal(text.name)
    if name_refusal is not None:
        raise name_refusal
    priority_ids = [_priority_user_id(entry) for entry in text.priority_usernames]
    declaration = parse_chat_declaration(raw)
    for param, value in (
        ("chat_limits.max_context_length", declaration.chat_max_context_length),
        ("chat_limits.max_length", declaration.chat_max_length),
    ):
        if value is not None and value > MAX_STORED_LENGTH:
            reason = f"has to be at most {MAX_STORED_LENGTH}."
            raise HordeError(
                400, RC.ChatDeclarationInvalid, f"'{param}': {reason}", param, openai_message=reason
            )
    return PopBody(text, declaration, [i for i in priority_ids if i <= MAX_USER_ID])
