"""Parsing a native chat body into a validated :class:`ChatRequest`.

Spec: chat-requests.md *Request body* (through *Refused keys and values*), *Images* (caps and refusals),
*Tools*; chat-front.md *Request keys*, *Value and contract validation*, *Message roles*.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from .errors import (
    RC,
    ChatContractError,
    bad_request,
    conflict,
    unsupported,
    unsupported_value,
)
from .extras import answer_chat_extras, build_chat_extras, build_stored_chat_extras, forced_function_name
from .limits import (
    DEFAULT_CHAT_MAX_TOKENS,
    MAX_CHAT_IMAGE_COUNT,
    MAX_CHAT_IMAGE_TOTAL_BYTES,
    MAX_CHAT_MAX_TOKENS,
    MAX_CHAT_MESSAGE_COUNT,
    MAX_CHAT_MODEL_COUNT,
    MAX_CHAT_SCHEMA_NESTING,
    MAX_CHAT_TEXT_BYTES,
    MAX_CHAT_TOOL_CALL_COUNT,
    MAX_CHAT_TOOL_CALL_ID_LENGTH,
    MAX_CHAT_TOOL_COUNT,
    MAX_CHAT_TOOL_NAME_LENGTH,
    MAX_CHAT_TOOL_SPEC_BYTES,
    MAX_CHAT_WORKER_IDS,
    MAX_MODEL_NAME_LENGTH,
    MAX_WORKER_ID_LENGTH,
    MIN_CHAT_MAX_TOKENS,
)
from .refusals import source_image_total_error, too_many_images_error
from .requirements import chat_tools_temperature, required_chat_features
from .schema_rules import schema_nesting_depth, strict_schema_violation
from .text_params import ChatTextParams, parse_text_params
from .vocab import ChatAvailabilityMode, ChatConformance, ChatContextFit, ChatImageDetail

TOP_LEVEL_KEYS = frozenset(
    {
        "model",
        "models",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "seed",
        "reasoning_effort",
        "stop",
        "n",
        "stream",
        "stream_options",
        "user",
        "metadata",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "horde",
    }
)
_BASE_MESSAGE_KEYS = frozenset({"role", "content", "name"})
SUPPORTED_MESSAGE_KEYS: Mapping[str, frozenset[str]] = {
    "system": _BASE_MESSAGE_KEYS,
    "developer": _BASE_MESSAGE_KEYS,
    "user": _BASE_MESSAGE_KEYS,
    "assistant": _BASE_MESSAGE_KEYS | {"tool_calls"},
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
_TEXT_PART_KEYS = frozenset({"type", "text"})
_IMAGE_PART_KEYS = frozenset({"type", "image_url"})
_IMAGE_URL_KEYS = frozenset({"url", "detail"})
_TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
_TOOL_CALL_FUNCTION_KEYS = frozenset({"name", "arguments"})
_TOOL_KEYS = frozenset({"type", "function"})
_TOOL_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
_TOOL_CHOICE_KEYS = frozenset({"type", "function"})
_TOOL_CHOICE_FUNCTION_KEYS = frozenset({"name"})
_TOOL_CHOICE_VALUES = ("none", "auto", "required")
_RESPONSE_FORMAT_KEYS: Mapping[str, frozenset[str]] = {
    "text": frozenset({"type"}),
    "json_object": frozenset({"type"}),
    "json_schema": frozenset({"type", "json_schema"}),
}
_JSON_SCHEMA_KEYS = frozenset({"name", "schema", "description", "strict"})
_TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

EMPTY_MESSAGES_MESSAGE = "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead."
TOOL_CHOICE_WITHOUT_TOOLS_MESSAGE = (
    "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."
)
PARALLEL_TOOL_CALLS_WITHOUT_TOOLS_MESSAGE = "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when 'tools' are specified."
JSON_OBJECT_WITHOUT_JSON_MESSAGE = (
    "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'."
)
UNANSWERED_TOOL_CALLS_MESSAGE = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
    "'tool_call_id'. The following tool_call_ids did not have response messages: {ids}"
)
ORPHAN_TOOL_MESSAGE = "Invalid parameter: messages with role 'tool' must be a response to a preceding message with 'tool_calls'."
UNKNOWN_TOOL_CALL_ID_MESSAGE = (
    "Invalid parameter: 'tool_call_id' of '{id}' not found in 'tool_calls' of previous message."
)

# Native text param key -> request path, for refusals of the mapped params.
_CHAT_PARAM_PATHS = {"stop_sequence": "stop", "max_context_length": "horde.max_context_length"}


class ChatHordeOptions(BaseModel):
    """AI Horde request options OpenAI has no key for. Unknown keys are refused."""

    # Validated by parse_horde_options (also used by the front, so both accept the same keys and values). Each
    # field's docstring is its public description in the front's OpenAPI document (use_attribute_docstrings).
    # Spec: chat-requests.md *Request body* (the horde table).
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _utf8_len(text: str) -> int:
    # ASCII is the common case and needs no encoding.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _choices(values: Any) -> str:
    names = [f"'{v}'" for v in values]
    return ", ".join(names[:-1]) + f", and {names[-1]}" if len(names) > 1 else names[0]


def parse_horde_options(raw: Any, path: str = "horde") -> ChatHordeOptions:
    """Validate the ``horde`` object (None means every default) into :class:`ChatHordeOptions`.

    Raises 400 ``UnsupportedChatParameter`` for an unknown key (``horde.<key>``), ``ChatRequestConflict``
    for only with ignore, and ``BadRequest`` for a value of the wrong type, an empty only/ignore or one
    listing more than MAX_CHAT_WORKER_IDS ids or an id above MAX_WORKER_ID_LENGTH characters, a non-positive max_context_length or max_kudos, an unknown context_fit (``ignore`` included),
    conformance or availability_mode, and an operation_key that is not a UUID. A null value is the default.
    Spec: chat-requests.md *Request body* (the horde table), *Refused keys and values*.
    """
    if raw is None:
        return ChatHordeOptions()
    if not isinstance(raw, dict):
        raise bad_request(path, "has to be an object.")
    for key in raw:
        if key not in HORDE_OPTION_DEFAULTS:
            raise unsupported(f"{path}.{key}", "unknown horde option.")
    values: dict[str, Any] = dict(HORDE_OPTION_DEFAULTS)
    for key in ("only", "ignore"):
        ids = raw.get(key)
        if ids is None:
            continue
        if not isinstance(ids, list) or not all(
            isinstance(i, str) and 0 < len(i) <= MAX_WORKER_ID_LENGTH for i in ids
        ):
            raise bad_request(f"{path}.{key}", "has to be an array of worker ids.")
        if not ids:
            raise bad_request(f"{path}.{key}", "has to list at least one worker id.")
        if len(ids) > MAX_CHAT_WORKER_IDS:
            raise bad_request(
                f"{path}.{key}", f"lists {len(ids)} worker ids; at most {MAX_CHAT_WORKER_IDS} are allowed."
            )
        values[key] = list(ids)
    if values["only"] is not None and values["ignore"] is not None:
        raise conflict(f"{path}.ignore", "cannot be combined with horde.only.")
    for key in _HORDE_BOOLS:
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise bad_request(f"{path}.{key}", "has to be a boolean.")
        values[key] = value
    for key in ("max_context_length", "max_kudos"):
        value = raw.get(key)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise bad_request(f"{path}.{key}", "has to be a positive integer.")
        values[key] = value
    for key, enum in _HORDE_ENUMS.items():
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value not in enum.__members__:
            raise bad_request(f"{path}.{key}", f"has to be one of {_choices(list(enum.__members__))}.")
        values[key] = enum(value)
    key_value = raw.get("operation_key")
    if key_value is not None:
        if not isinstance(key_value, str):
            raise bad_request(f"{path}.operation_key", "has to be a UUID.")
        try:
            values["operation_key"] = str(uuid.UUID(key_value))
        except ValueError:
            raise bad_request(f"{path}.operation_key", "has to be a UUID.") from None
    return ChatHordeOptions.model_construct(**values)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated native chat body, mapped to what the Horde stores and sends.

    - ``models``: the accepted models (``model: "a"`` becomes ``["a"]``); ``model_key`` is the key sent.
    - ``messages``: the stored form (developer as system; an absent assistant content as None).
    - ``max_length`` (tokens, default 512) and ``max_length_sent``; ``max_context_length`` from horde.
    - ``text_params``: the mapped text params (max_length always; max_context_length, temperature, top_p,
      frequency_penalty, presence_penalty, stop_sequence, seed and reasoning_effort only when sent).
    - ``horde``: :class:`ChatHordeOptions` with defaults filled; ``conformance`` from it.
    - ``chat_extras``: the stored column (tools/format values that change the answer, plus the stream
      hint); ``answer_extras`` without the hint.
    - ``required_features`` (sorted features and guarantees), ``tools_temperature``.
    - ``image_count``, ``image_data_bytes`` (decoded size estimated from the data URLs), ``text_bytes``.
    """

    models: list[str]
    model_key: str
    messages: list[dict[str, Any]]
    max_length: int
    max_length_sent: bool
    max_context_length: int | None
    text_params: dict[str, Any]
    horde: ChatHordeOptions
    chat_extras: dict[str, Any] | None
    stream: bool
    image_count: int
    image_data_bytes: int
    text_bytes: int
    required_features: list[str]
    tools_temperature: float | None

    @property
    def conformance(self) -> ChatConformance:
        """The request's conformance mode."""
        return self.horde.conformance

    @property
    def has_images(self) -> bool:
        """Whether a message carries an image part."""
        return self.image_count > 0

    @property
    def answer_extras(self) -> dict[str, Any] | None:
        """The stored extras without the stream hint."""
        return answer_chat_extras(self.chat_extras)

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The stored tools (rendered into the flattened prompt), or None."""
        return (self.chat_extras or {}).get("tools")

    def model_path(self, index: int) -> str:
        """The request path of ``models[index]`` as sent: ``model`` for a single ``model`` key."""
        return "model" if self.model_key == "model" else f"models[{index}]"


def _parse_models(body: dict[str, Any]) -> tuple[list[str], str]:
    model = body.get("model")
    models = body.get("models")
    if model is not None and models is not None:
        raise conflict("models", "send exactly one of 'model' and 'models'.")
    if model is None and models is None:
        raise bad_request("model", "a chat request sends exactly one of 'model' and 'models'.")
    if model is not None:
        if not isinstance(model, str) or not model:
            raise bad_request("model", "has to be a non-empty string.")
        if len(model) > MAX_MODEL_NAME_LENGTH:
            raise bad_request("model", f"a model name has at most {MAX_MODEL_NAME_LENGTH} characters.")
        return [model], "model"
    if not isinstance(models, list):
        raise bad_request("models", "has to be an array of model names.")
    if not models:
        raise bad_request("models", "has to list at least one model.")
    if len(models) > MAX_CHAT_MODEL_COUNT:
        raise bad_request(
            "models", f"lists {len(models)} models; at most {MAX_CHAT_MODEL_COUNT} are allowed."
        )
    seen: set[str] = set()
    for index, name in enumerate(models):
        if not isinstance(name, str) or not name:
            raise bad_request(f"models[{index}]", "has to be a non-empty string.")
        if len(name) > MAX_MODEL_NAME_LENGTH:
            raise bad_request(
                f"models[{index}]", f"a model name has at most {MAX_MODEL_NAME_LENGTH} characters."
            )
        if name in seen:
            raise bad_request(f"models[{index}]", f"lists the model {name!r} twice.")
        seen.add(name)
    return list(models), "models"


class _MessageStats:
    __slots__ = ("image_bytes", "images", "text_bytes")

    def __init__(self) -> None:
        self.text_bytes = 0
        self.images = 0
        self.image_bytes = 0


def estimate_data_url_bytes(url: str) -> int:
    """Decoded size in bytes of a ``data:...;base64,`` URL, estimated from its payload length."""
    comma = url.find(",")
    payload_length = len(url) - comma - 1
    padding = 2 if url.endswith("==") else 1 if url.endswith("=") else 0
    return max(payload_length * 3 // 4 - padding, 0)


def _parse_image_url(raw: Any, path: str, stats: _MessageStats) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise bad_request(path, "has to be an object with url.")
    for key in raw:
        if key not in _IMAGE_URL_KEYS:
            raise unsupported(f"{path}.{key}")
    url = raw.get("url")
    if not isinstance(url, str):
        raise bad_request(f"{path}.url", "has to be a string.")
    lowered = url[:16].lower()
    if lowered.startswith("data:image/"):
        head = url[: url.find(",") + 1] if "," in url else ""
        if not head.lower().endswith(";base64,"):
            raise bad_request(f"{path}.url", "has to be a data:image/...;base64, URL or an http(s) URL.")
        stats.image_bytes += estimate_data_url_bytes(url)
    elif not (lowered.startswith("https://") or lowered.startswith("http://")):
        raise bad_request(f"{path}.url", "has to be a data:image/...;base64, URL or an http(s) URL.")
    out: dict[str, Any] = {"url": url}
    detail = raw.get("detail")
    if detail is not None:
        if not isinstance(detail, str) or detail not in ChatImageDetail.__members__:
            raise bad_request(
                f"{path}.detail", f"has to be one of {_choices(list(ChatImageDetail.__members__))}."
            )
        out["detail"] = detail
    return out


def _parse_content(raw: Any, path: str, role: str, stats: _MessageStats) -> str | list[dict[str, Any]]:
    if isinstance(raw, str):
        stats.text_bytes += _utf8_len(raw)
        return raw
    if not isinstance(raw, list):
        raise bad_request(path, "has to be a string or an array of content parts.")
    if not raw:  # OpenAI refuses an empty parts array; a string may be empty
        raise bad_request(path, "has to hold at least one content part; send an empty string for no text.")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(raw):
        part_path = f"{path}[{index}]"
        if not isinstance(part, dict):
            raise bad_request(part_path, "has to be a content part object.")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise bad_request(f"{part_path}.type", "has to be a string.")
        if kind == "text":
            for key in part:
                if key not in _TEXT_PART_KEYS:
                    raise unsupported(f"{part_path}.{key}")
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request(f"{part_path}.text", "has to be a string.")
            stats.text_bytes += _utf8_len(text)
            parts.append({"type": "text", "text": text})
        elif kind == "image_url" and role == "user":
            for key in part:
                if key not in _IMAGE_PART_KEYS:
                    raise unsupported(f"{part_path}.{key}")
            stats.images += 1
            image_url = _parse_image_url(part.get("image_url"), f"{part_path}.image_url", stats)
            parts.append({"type": "image_url", "image_url": image_url})
        else:
            raise unsupported_value(f"{part_path}.type", kind)
    return parts


def _parse_tool_calls(raw: Any, path: str, stats: _MessageStats) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad_request(path, "has to be an array of tool calls.")
    if not raw:
        raise bad_request(path, "has to hold at least one tool call; leave it out for none.")
    if len(raw) > MAX_CHAT_TOOL_CALL_COUNT:
        raise unsupported(
            path, f"holds {len(raw)} tool calls; at most {MAX_CHAT_TOOL_CALL_COUNT} are allowed."
        )
    calls = []
    for index, call in enumerate(raw):
        call_path = f"{path}[{index}]"
        if not isinstance(call, dict):
            raise bad_request(call_path, "has to be a tool call object.")
        for key in call:
            if key not in _TOOL_CALL_KEYS:
                raise unsupported(f"{call_path}.{key}")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_CHAT_TOOL_CALL_ID_LENGTH:
            raise bad_request(
                f"{call_path}.id", f"has to be a string of 1 to {MAX_CHAT_TOOL_CALL_ID_LENGTH} characters."
            )
        kind = call.get("type")
        if kind != "function":
            if not isinstance(kind, str):
                raise bad_request(f"{call_path}.type", "has to be 'function'.")
            raise unsupported_value(f"{call_path}.type", kind)
        function = call.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{call_path}.function", "has to be an object with name and arguments.")
        for key in function:
            if key not in _TOOL_CALL_FUNCTION_KEYS:
                raise unsupported(f"{call_path}.function.{key}")
        name = function.get("name")
        arguments = function.get("arguments")
        if not isinstance(name, str):
            raise bad_request(f"{call_path}.function.name", "has to be a string.")
        if not isinstance(arguments, str):
            raise bad_request(f"{call_path}.function.arguments", "has to be a string.")
        stats.text_bytes += _utf8_len(name) + _utf8_len(arguments)
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls


def _parse_message(raw: Any, index: int, stats: _MessageStats) -> dict[str, Any]:
    path = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise bad_request(path, "has to be a message object.")
    if "role" not in raw:
        raise bad_request(f"{path}.role", f"Missing required parameter: '{path}.role'.")
    role = raw["role"]
    if not isinstance(role, str):
        raise bad_request(f"{path}.role", "has to be a string.")
    allowed = SUPPORTED_MESSAGE_KEYS.get(role)
    if allowed is None:
        raise unsupported_value(f"{path}.role", role)
    for key in raw:
        if key not in allowed:
            raise unsupported(f"{path}.{key}", f"{role} messages do not take this key.")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    content = raw.get("content")
    tool_calls = None
    if role == "assistant" and raw.get("tool_calls") is not None:
        tool_calls = _parse_tool_calls(raw["tool_calls"], f"{path}.tool_calls", stats)
    if content is None:
        if tool_calls is None:
            raise bad_request(f"{path}.content", f"Missing required parameter: '{path}.content'.")
        out["content"] = None
    else:
        out["content"] = _parse_content(content, f"{path}.content", role, stats)
    if tool_calls is not None:
        out["tool_calls"] = tool_calls
    name = raw.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise bad_request(f"{path}.name", "has to be a string.")
        out["name"] = name
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_CHAT_TOOL_CALL_ID_LENGTH:
            raise bad_request(
                f"{path}.tool_call_id",
                f"has to be a string of 1 to {MAX_CHAT_TOOL_CALL_ID_LENGTH} characters.",
            )
        out["tool_call_id"] = call_id
    return out


def _parse_messages(raw: Any) -> tuple[list[dict[str, Any]], _MessageStats]:
    if raw is None:
        raise bad_request("messages", "Missing required parameter: 'messages'.")
    if not isinstance(raw, list):
        raise bad_request("messages", "has to be an array of messages.")
    if not raw:
        raise ChatContractError(400, RC.BadRequest, EMPTY_MESSAGES_MESSAGE, "messages")
    if len(raw) > MAX_CHAT_MESSAGE_COUNT:
        raise unsupported(
            "messages", f"holds {len(raw)} messages; at most {MAX_CHAT_MESSAGE_COUNT} are allowed."
        )
    stats = _MessageStats()
    messages = [_parse_message(message, index, stats) for index, message in enumerate(raw)]
    return messages, stats


def check_tool_history(messages: Sequence[Mapping[str, Any]]) -> None:
    """OpenAI's tool history rule over validated messages (check_tool_history, shared with the front).

    An assistant message with tool_calls is followed at once by tool messages answering each of its ids
    exactly once, in any order; ids within one assistant message are unique; an id may recur in a later
    round. Raises 400 ``UnsupportedChatParameter`` whose message is prefixed with the quoted request path:
    ``messages[i].role`` (unanswered calls, or a tool message without open calls or answering an id twice),
    ``messages[i].tool_call_id`` (an id the preceding assistant did not issue), ``messages[i].tool_calls``
    (a repeated id), ``messages`` (the history ends with calls unanswered). Spec: chat-requests.md *Tools*.
    """
    issued: list[str] = []
    answered: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if len(answered) == len(issued) or call_id in answered:
                raise unsupported(f"messages[{index}].role", ORPHAN_TOOL_MESSAGE)
            if call_id not in issued:
                raise unsupported(
                    f"messages[{index}].tool_call_id", UNKNOWN_TOOL_CALL_ID_MESSAGE.format(id=call_id)
                )
            answered.add(call_id)
            continue
        if len(answered) < len(issued):
            missing = ", ".join(i for i in issued if i not in answered)
            raise unsupported(f"messages[{index}].role", UNANSWERED_TOOL_CALLS_MESSAGE.format(ids=missing))
        issued, answered = [], set()
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            seen: set[str] = set()
            for call in calls:
                call_id = call.get("id")
                if call_id in seen:
                    raise unsupported(
                        f"messages[{index}].tool_calls",
                        f"The tool call id '{call_id}' is repeated within one assistant message.",
                    )
                seen.add(call_id)
            issued = [call["id"] for call in calls]
    if len(answered) < len(issued):
        missing = ", ".join(i for i in issued if i not in answered)
        raise unsupported("messages", UNANSWERED_TOOL_CALLS_MESSAGE.format(ids=missing))


def _check_schema_depth(schema: Any, path: str) -> None:
    depth = schema_nesting_depth(schema, MAX_CHAT_SCHEMA_NESTING)
    if depth > MAX_CHAT_SCHEMA_NESTING:
        raise unsupported(
            path, f"the schema nests more than {MAX_CHAT_SCHEMA_NESTING} levels below its root."
        )


def _parse_tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_request("tools", "has to be an array of tools.")
    if not raw:
        return None
    if len(raw) > MAX_CHAT_TOOL_COUNT:
        raise unsupported("tools", f"holds {len(raw)} tools; at most {MAX_CHAT_TOOL_COUNT} are allowed.")
    for index, tool in enumerate(raw):
        path = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise bad_request(path, "has to be a tool object.")
        for key in tool:
            if key not in _TOOL_KEYS:
                raise unsupported(f"{path}.{key}")
        kind = tool.get("type")
        if kind != "function":
            if not isinstance(kind, str):
                raise bad_request(f"{path}.type", "has to be 'function'.")
            raise unsupported_value(f"{path}.type", kind)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{path}.function", "has to be an object with name.")
        for key in function:
            if key not in _TOOL_FUNCTION_KEYS:
                raise unsupported(f"{path}.function.{key}")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME_RE.fullmatch(name):
            raise bad_request(
                f"{path}.function.name",
                f"has to be 1 to {MAX_CHAT_TOOL_NAME_LENGTH} characters of [A-Za-z0-9_-].",
            )
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"{path}.function.description", "has to be a string.")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad_request(f"{path}.function.parameters", "has to be a JSON schema object.")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(f"{path}.function.strict", "has to be a boolean.")
    return raw


def _parse_tool_choice(raw: Any) -> Any:
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw not in _TOOL_CHOICE_VALUES:
            raise bad_request(
                "tool_choice",
                f"Invalid value: '{raw}'. Supported values are: {_choices(_TOOL_CHOICE_VALUES)}.",
            )
        return raw
    if not isinstance(raw, dict):
        raise bad_request("tool_choice", "has to be none, auto, required or a function choice object.")
    for key in raw:
        if key not in _TOOL_CHOICE_KEYS:
            raise unsupported(f"tool_choice.{key}")
    if raw.get("type") != "function":
        raise bad_request("tool_choice.type", "has to be 'function'.")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise bad_request("tool_choice.function", "has to be an object with name.")
    for key in function:
        if key not in _TOOL_CHOICE_FUNCTION_KEYS:
            raise unsupported(f"tool_choice.function.{key}")
    if not isinstance(function.get("name"), str):
        raise bad_request("tool_choice.function.name", "has to be a string.")
    return raw


def _parse_response_format(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise bad_request("response_format", "has to be an object with type.")
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise bad_request("response_format.type", "has to be 'text', 'json_object' or 'json_schema'.")
    allowed = _RESPONSE_FORMAT_KEYS.get(kind)
    if allowed is None:
        raise unsupported_value("response_format.type", kind)
    for key in raw:
        if key not in allowed:
            raise unsupported(f"response_format.{key}")
    if kind != "json_schema":
        return raw
    spec = raw.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("response_format.json_schema", "has to be an object with name and schema.")
    for key in spec:
        if key not in _JSON_SCHEMA_KEYS:
            raise unsupported(f"response_format.json_schema.{key}")
    name = spec.get("name")
    if not isinstance(name, str) or not _TOOL_NAME_RE.fullmatch(name):
        raise bad_request(
            "response_format.json_schema.name", "has to be 1 to 64 characters of [A-Za-z0-9_-]."
        )
    if "schema" not in spec:
        raise bad_request(
            "response_format.json_schema.schema",
            "Missing required parameter: 'response_format.json_schema.schema'.",
        )
    if not isinstance(spec["schema"], dict):
        raise bad_request("response_format.json_schema.schema", "has to be a JSON schema object.")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request("response_format.json_schema.description", "has to be a string.")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request("response_format.json_schema.strict", "has to be a boolean.")
    return raw


def check_tool_contract(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: dict[str, Any] | None,
) -> None:
    """The request rules on validated tool and format shapes (shared with the front), in this order:

    tool_choice or parallel_tool_calls without a non-empty tools (400 ChatRequestConflict, OpenAI's message,
    param the key); a forced function tools does not define (ChatRequestConflict, ``tool_choice``); the
    compact JSON of tools, tool_choice and response_format over MAX_CHAT_TOOL_SPEC_BYTES (400
    UnsupportedChatParameter, ``tools``); a schema nested deeper than MAX_CHAT_SCHEMA_NESTING (at
    ``tools[i].function.parameters`` or ``response_format.json_schema.schema``); a strict schema breaking
    OpenAI's structural rules (OpenAI's message, unprefixed). Spec: chat-requests.md *Tools*.
    """
    if not tools:
        if tool_choice is not None:
            raise conflict("tool_choice", TOOL_CHOICE_WITHOUT_TOOLS_MESSAGE, prefix=False)
        if parallel_tool_calls is not None:
            raise conflict("parallel_tool_calls", PARALLEL_TOOL_CALLS_WITHOUT_TOOLS_MESSAGE, prefix=False)
    forced = forced_function_name(tool_choice)
    if forced is not None and not any(tool["function"]["name"] == forced for tool in tools or ()):
        raise conflict(
            "tool_choice",
            f"Invalid value for 'tool_choice': function '{forced}' is not defined in 'tools'.",
            prefix=False,
        )
    spec_bytes = sum(
        _utf8_len(_compact_json(value))
        for value in (tools, tool_choice, response_format)
        if value is not None
    )
    if spec_bytes > MAX_CHAT_TOOL_SPEC_BYTES:
        raise unsupported(
            "tools",
            f"tools, tool_choice and response_format take {spec_bytes} bytes of JSON; at most "
            f"{MAX_CHAT_TOOL_SPEC_BYTES} are allowed.",
        )
    for index, tool in enumerate(tools or ()):
        function = tool["function"]
        parameters = function.get("parameters")
        if parameters is None:
            continue
        path = f"tools[{index}].function.parameters"
        _check_schema_depth(parameters, path)
        if function.get("strict") is True:
            breach = strict_schema_violation(parameters)
            if breach is not None:
                message = f"Invalid schema for function '{function['name']}': {breach}"
                raise ChatContractError(400, RC.UnsupportedChatParameter, message, path)
    if response_format is not None and response_format.get("type") == "json_schema":
        spec = response_format["json_schema"]
        path = "response_format.json_schema.schema"
        _check_schema_depth(spec["schema"], path)
        if spec.get("strict") is True:
            breach = strict_schema_violation(spec["schema"])
            if breach is not None:
                message = f"Invalid schema for response_format '{spec['name']}': {breach}"
                raise ChatContractError(400, RC.UnsupportedChatParameter, message, path)


def messages_mention_json(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some message text contains the word "json" in any case (the openai_guards rule)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            if "json" in content.lower():
                return True
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text" and "json" in part.get("text", "").lower():
                    return True
    return False


def _check_finite(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(key, "has to be a finite number.")


def parse_chat_request(body: Any, *, defer_length_limits: bool = False) -> ChatRequest:
    """Validate a native chat body (the parsed JSON) and map it to a :class:`ChatRequest`.

    Every refusal is a :class:`ChatContractError` with the spec's status, rc, request path and message:
    400 UnsupportedChatParameter (unknown or refused keys and values, caps), ChatRequestConflict (model with
    models, differing max_tokens and max_completion_tokens, horde.only with horde.ignore, tool keys without
    tools, an undefined forced function, openai_guards' json rule), BadRequest (wrong types, missing or
    empty values, out-of-range text params), TooManyExtraSourceImages and SourceImageSizeExceeded (the 25 MiB
    data URL total). A null optional value is the same as leaving it out.

    ``defer_length_limits``: admission lowers max_length to the workers' largest and sizes the context before
    validating the final params (chat-requests.md route steps 7–8); with it set, max_length (max_tokens or
    max_completion_tokens) is still held to its whole range, 16 to 16384 (MIN_CHAT_MAX_TOKENS,
    MAX_CHAT_MAX_TOKENS: a value outside it is refused, never lowered), max_context_length is checked only for
    being positive, and the caller validates the final values with :func:`validate_chat_text_params`. Without
    it every range is checked here. A max_length refusal is 400 BadRequest with ``param`` the key the client
    sent (max_completion_tokens when it sent that key, max_tokens otherwise).
    Spec: chat-requests.md *Request body*, *Images*, *Tools*, *Refused keys and values*.
    """
    if not isinstance(body, dict):
        raise ChatContractError(400, RC.BadRequest, "The request body has to be a JSON object.", None)
    for key in body:
        if key not in TOP_LEVEL_KEYS:
            raise unsupported(key)
    models, model_key = _parse_models(body)
    messages, stats = _parse_messages(body.get("messages"))

    max_tokens = body.get("max_tokens")
    max_completion_tokens = body.get("max_completion_tokens")
    if max_tokens is not None and max_completion_tokens is not None and max_tokens != max_completion_tokens:
        raise conflict(
            "max_completion_tokens",
            "max_tokens and max_completion_tokens may be sent only with equal values.",
        )
    length_key = "max_completion_tokens" if max_completion_tokens is not None else "max_tokens"
    sent_length = max_completion_tokens if max_completion_tokens is not None else max_tokens

    n = body.get("n")
    if n is not None:
        if not _is_int(n):
            raise bad_request("n", "has to be an integer.")
        if n != 1:
            raise unsupported_value("n", n)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("stream", "has to be a boolean.")
    for key in ("stream_options", "metadata"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise bad_request(key, "has to be an object.")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request("user", "has to be a string.")

    tools = _parse_tools(body.get("tools"))
    tool_choice = _parse_tool_choice(body.get("tool_choice"))
    parallel_tool_calls = body.get("parallel_tool_calls")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise bad_request("parallel_tool_calls", "has to be a boolean.")
    response_format = _parse_response_format(body.get("response_format"))
    check_tool_contract(tools, tool_choice, parallel_tool_calls, response_format)

    horde = parse_horde_options(body.get("horde"))

    if stats.text_bytes > MAX_CHAT_TEXT_BYTES:
        raise unsupported(
            "messages",
            f"the message text takes {stats.text_bytes} bytes of UTF-8; at most {MAX_CHAT_TEXT_BYTES} are allowed.",
        )
    if stats.images > MAX_CHAT_IMAGE_COUNT:
        raise too_many_images_error(stats.images)
    if stats.image_bytes > MAX_CHAT_IMAGE_TOTAL_BYTES:
        raise source_image_total_error(stats.image_bytes, MAX_CHAT_IMAGE_TOTAL_BYTES)

    check_tool_history(messages)

    # The mapped text params, validated against the text params model.
    params: dict[str, Any] = {"max_length": DEFAULT_CHAT_MAX_TOKENS if sent_length is None else sent_length}
    for key in ("temperature", "top_p", "frequency_penalty", "presence_penalty", "seed", "reasoning_effort"):
        _check_finite(body, key)
        if body.get(key) is not None:
            params[key] = body[key]
    stop = body.get("stop")
    if isinstance(stop, str):
        params["stop_sequence"] = [stop]
    elif isinstance(stop, list):
        if stop:
            params["stop_sequence"] = stop
    elif stop is not None:
        raise bad_request("stop", "has to be a string or an array of strings.")
    if horde.max_context_length is not None:
        params["max_context_length"] = horde.max_context_length
    paths = dict(_CHAT_PARAM_PATHS, max_length=length_key)
    model = _DeferredChatTextParams if defer_length_limits else ChatTextParams
    text_params = parse_text_params(params, model=model, field_paths=paths, cross_field=False)

    if (
        horde.openai_guards
        and response_format is not None
        and response_format.get("type") == "json_object"
        and not messages_mention_json(messages)
    ):
        raise conflict("messages", JSON_OBJECT_WITHOUT_JSON_MESSAGE, prefix=False)

    extras = build_chat_extras(
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls,
        response_format=response_format,
    )
    required = required_chat_features(
        text_params=text_params, chat_extras=extras, messages=messages, conformance=horde.conformance
    )
    return ChatRequest(
        models=models,
        model_key=model_key,
        messages=messages,
        max_length=text_params["max_length"],
        max_length_sent=sent_length is not None,
        max_context_length=horde.max_context_length,
        text_params=text_params,
        horde=horde,
        chat_extras=build_stored_chat_extras(extras, stream=bool(stream)),
        stream=bool(stream),
        image_count=stats.images,
        image_data_bytes=stats.image_bytes,
        text_bytes=stats.text_bytes,
        required_features=required,
        tools_temperature=chat_tools_temperature(text_params, extras),
    )


class _DeferredChatTextParams(ChatTextParams):
    """ChatTextParams with the context range left to :func:`validate_chat_text_params`.

    max_length keeps its whole range (16 to 16384, chat-requests.md *Request body*): lowering to the workers'
    largest declared max_length applies only to a value inside it.
    """

    max_length: Annotated[StrictInt, Field(ge=MIN_CHAT_MAX_TOKENS, le=MAX_CHAT_MAX_TOKENS)] | None = None
    max_context_length: Annotated[StrictInt, Field(ge=1)] | None = None


def validate_chat_text_params(
    text_params: Mapping[str, Any], *, length_key: str = "max_tokens"
) -> dict[str, Any]:
    """The final check of a chat request's params, after max_length lowering and context sizing: every range
    of the text params model plus the cross-field checks (TokenOverflow). Raises 400 as
    :func:`parse_text_params`. Spec: chat-requests.md route steps 7–8, *Request body*.
    """
    paths = dict(_CHAT_PARAM_PATHS, max_length=length_key)
    return parse_text_params(dict(text_params), model=ChatTextParams, field_paths=paths)
