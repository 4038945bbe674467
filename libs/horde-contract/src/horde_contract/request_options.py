"""The ``horde`` object of a chat request: AI Horde options OpenAI has no key for, and their parser (shared by
admission and the OpenAI front, so both accept the same keys and values).

See docs/native-api.md#request-body (the horde table), #refused-keys-and-values.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from ._json_values import choices, is_int
from .errors import bad_request, conflict, unsupported
from .limits import MAX_CHAT_WORKER_IDS, MAX_WORKER_ID_LENGTH
from .vocab import ChatAvailabilityMode, ChatConformance, ChatContextFit


class ChatHordeOptions(BaseModel):
    """AI Horde request options OpenAI has no key for. Unknown keys are refused."""

    # Validated by parse_horde_options (also used by the front, so both accept the same keys and values). Each
    # field's docstring is its public description in the front's OpenAPI document (use_attribute_docstrings).
    # See docs/native-api.md#request-body (the horde table).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    only: list[str] | None = None
    """Only these worker ids serve the request."""

    ignore: list[str] | None = None
    """These worker ids never serve it; cannot be combined with `only`."""

    trusted_workers: bool = False
    """Only trusted workers serve it, as on text requests."""

    validated_backends: bool = False
    """Only validated backends serve it, as on text requests."""

    slow_workers: bool = True
    """Slow workers may serve it, as on text requests."""

    max_context_length: int | None = None
    """An explicit context length in tokens."""

    context_fit: ChatContextFit = ChatContextFit.truncate_oldest
    """What to do when the messages do not fit the context: `grow` it up to the largest context an online chat
    worker serving the model declares, `reject` the request, or `truncate_oldest` (the default): grow, then drop
    whole turns from the oldest forward until the messages fit."""

    conformance: ChatConformance = ChatConformance.strict
    """`strict` (the default): only workers declaring every guarantee the request needs serve it;
    `best_effort` drops that requirement."""

    openai_guards: bool = False
    """Apply the request refusals OpenAI applies and the AI Horde relaxes on purpose, such as a `json_object`
    response format without the word "json" in the messages."""

    include_reasoning: bool = True
    """Read by the OpenAI-compatible front: return the model's reasoning as `reasoning_content` unless false."""

    availability_mode: ChatAvailabilityMode = ChatAvailabilityMode.wait
    """Read by the OpenAI-compatible front: `wait` (the default) queues the request for the front's time budget;
    `fail_fast` refuses it at once when no eligible worker can take it, or the estimated wait is over the time
    left in the budget."""

    max_kudos: int | None = None
    """A cap on the request's kudos estimate: a request whose estimate is above it is refused before it is
    queued. The estimate assumes the full completion limit is generated."""

    dry_run: bool = False
    """Return the kudos cost without queueing."""

    operation_key: str | None = None
    """A UUID identifying one submission: a submit repeated with the same key and body returns the request the
    first one created."""


HORDE_OPTION_DEFAULTS: Mapping[str, Any] = {
    name: info.default for name, info in ChatHordeOptions.model_fields.items()
}
_HORDE_BOOLS = (
    "trusted_workers",
    "validated_backends",
    "slow_workers",
    "openai_guards",
    "include_reasoning",
    "dry_run",
)
_HORDE_ENUMS: Mapping[str, type[StrEnum]] = {
    "context_fit": ChatContextFit,
    "conformance": ChatConformance,
    "availability_mode": ChatAvailabilityMode,
}


def parse_horde_options(raw: Any, path: str = "horde") -> ChatHordeOptions:
    """Validate the ``horde`` object (None means every default) into :class:`ChatHordeOptions`.

    Raises 400 ``UnsupportedChatParameter`` for an unknown key (``horde.<key>``), ``ChatRequestConflict``
    for only with ignore, and ``BadRequest`` for a value of the wrong type, an empty only/ignore or one
    listing more than MAX_CHAT_WORKER_IDS ids or an id above MAX_WORKER_ID_LENGTH characters, a non-positive max_context_length or max_kudos, an unknown context_fit (``ignore`` included),
    conformance or availability_mode, and an operation_key that is not a UUID. A null value is the default.
    See docs/native-api.md#request-body (the horde table), #refused-keys-and-values.
    """
    if raw is None:
        return ChatHordeOptions()
    if not isinstance(raw, dict):
        raise bad_request(path, "has to be an object.")
    for key in raw:
        if key not in HORDE_OPTION_DEFAULTS:
            raise unsupported(f"{path}.{key}", "unknown horde option.")
    values: dict[str, Any] = dict(HORDE_OPTION_DEFAULTS)
    _parse_values(raw, path, ("only", "ignore"), _worker_ids, values)
    if values["only"] is not None and values["ignore"] is not None:
        raise conflict(f"{path}.ignore", "cannot be combined with horde.only.")
    _parse_values(raw, path, _HORDE_BOOLS, _boolean, values)
    _parse_values(raw, path, ("max_context_length", "max_kudos"), _positive_int, values)
    for key, enum in _HORDE_ENUMS.items():
        _parse_values(raw, path, (key,), functools.partial(_member, enum), values)
    _parse_values(raw, path, ("operation_key",), _operation_key, values)
    return ChatHordeOptions.model_construct(**values)


def _parse_values(
    raw: Mapping[str, Any],
    path: str,
    keys: Iterable[str],
    check: Callable[[Any, str], Any],
    values: dict[str, Any],
) -> None:
    """``values[key]`` is ``check(raw[key], "<path>.<key>")`` for each key of ``keys`` sent with a value."""
    for key in keys:
        value = raw.get(key)
        if value is not None:
            values[key] = check(value, f"{path}.{key}")


def _worker_ids(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(
        isinstance(i, str) and 0 < len(i) <= MAX_WORKER_ID_LENGTH for i in value
    ):
        raise bad_request(where, "has to be an array of worker ids.")
    if not value:
        raise bad_request(where, "has to list at least one worker id.")
    if len(value) > MAX_CHAT_WORKER_IDS:
        raise bad_request(where, f"lists {len(value)} worker ids; at most {MAX_CHAT_WORKER_IDS} are allowed.")
    return list(value)


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise bad_request(where, "has to be a boolean.")
    return value


def _positive_int(value: Any, where: str) -> int:
    if not is_int(value) or value < 1:
        raise bad_request(where, "has to be a positive integer.")
    return int(value)


def _member(enum: type[StrEnum], value: Any, where: str) -> StrEnum:
    if not isinstance(value, str) or value not in enum.__members__:
        raise bad_request(where, f"has to be one of {choices(list(enum.__members__))}.")
    return enum(value)


def _operation_key(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise bad_request(where, "has to be a UUID.")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise bad_request(where, "has to be a UUID.") from None
