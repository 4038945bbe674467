"""The front's request contract: screening, OpenAI-range validation and the request model.

See docs/openai-front.md#requests (Parameter screening, Model selection, Value and contract validation,
Message roles). Screening runs in this order:

1. :func:`find_refused_parameter` refuses unknown top-level keys, non-default values of
   :data:`DEFAULT_NO_OP_PARAMETERS`, unsupported roles and content part types (the error holds the path).
2. :func:`drop_default_no_ops` removes the no-op keys sent at their defaults.
3. :func:`drop_unknown_nested_keys` removes unknown keys inside messages, tool definitions and tool_choice.

:func:`validate_request` then validates the rest against :class:`ChatCompletionRequest` and OpenAI's ranges,
and the front applies the rules it shares with the native route (horde_contract) in ``completions``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeGuard

# The shared limits below come from the contract library, their single source.
from horde_contract import (
    MAX_CHAT_MODEL_COUNT,
    MIN_CHAT_MAX_TOKENS,
    OPENAI_MAX_STOP_SEQUENCES,
    OPENAI_SAMPLING_RANGES,
    SUPPORTED_MESSAGE_KEYS,
    ChatHordeOptions,
    HordeError,
    parse_horde_options,
)
from horde_contract.errors import RC
from horde_contract.messages import (
    IMAGE_PART_KEYS,
    IMAGE_URL_KEYS,
    TEXT_PART_KEYS,
    TOOL_CALL_FUNCTION_KEYS,
    TOOL_CALL_KEYS,
)
from horde_contract.tools import TOOL_CHOICE_FUNCTION_KEYS, TOOL_CHOICE_KEYS, TOOL_FUNCTION_KEYS, TOOL_KEYS
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from horde_oai.errors import OpenAIError, bad_request

UNSUPPORTED = RC.UnsupportedChatParameter
CONFLICT = RC.ChatRequestConflict

# OpenAI keys the Horde does not apply, accepted only at their default (None is every key's default).
DEFAULT_NO_OP_PARAMETERS: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "store": (False,),
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
    "verbosity": ("medium",),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "functions": ([],),
    "function_call": ("none",),
}

# Schemas of the no-op keys that are not request fields, for the OpenAPI document (accepted only at default).
NO_OP_PARAMETER_SCHEMAS: dict[str, dict[str, Any]] = {
    "logprobs": {"type": ["boolean", "null"], "enum": [False, None]},
    "top_logprobs": {"type": ["integer", "null"], "enum": [0, None]},
    "logit_bias": {"type": ["object", "null"], "maxProperties": 0},
    "store": {"type": ["boolean", "null"], "enum": [False, None]},
    "service_tier": {"type": ["string", "null"], "enum": ["auto", "default", None]},
    "modalities": {"type": ["array", "null"], "items": {"type": "string", "enum": ["text"]}},
    "verbosity": {"type": ["string", "null"], "enum": ["medium", None]},
    "audio": {"type": "null"},
    "prediction": {"type": "null"},
    "web_search_options": {"type": "null"},
    "functions": {"type": ["array", "null"], "maxItems": 0},
    "function_call": {"type": ["string", "null"], "enum": ["none", None]},
}

# OpenAI keys the front has no use for (kept for the refusal label only).
UNDEFINED_OPENAI_PARAMETERS = frozenset(
    {
        "logit_bias",
        "functions",
        "function_call",
        "logprobs",
        "top_logprobs",
        "audio",
        "prediction",
        "modalities",
    }
)
# Sampler keys that other OpenAI-compatible servers take and OpenAI does not (refusal label only).
COMMON_NON_OPENAI_SAMPLER_PARAMETERS = frozenset(
    {
        "top_k",
        "min_p",
        "top_a",
        "typical_p",
        "tfs",
        "rep_pen",
        "rep_pen_range",
        "rep_pen_slope",
        "repetition_penalty",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "min_tokens",
        "dynatemp_range",
        "smoothing_factor",
        "dry_multiplier",
        "xtc_probability",
        "sampler_order",
        "grammar",
        "guided_json",
        "max_context_length",
        "max_length",
    }
)

# Keys a message keeps, by role (the contract's); others are dropped (tool_calls outside assistant is refused
# instead).
SUPPORTED_ROLES = tuple(SUPPORTED_MESSAGE_KEYS)
# Keys a content part keeps, by type (the contract's).
PART_KEYS = {"text": TEXT_PART_KEYS, "image_url": IMAGE_PART_KEYS}

# Objects whose unknown keys are dropped (the OpenAPI document lets them carry other keys).
KEY_DROPPING_MODELS = ("ChatMessage", "ContentPart", "ToolCall", "ToolDefinition", "ToolChoiceFunction")


# --- request model (the schema of the OpenAPI document and the type validation) ------------------------------
#
# Each field's docstring is its description in the OpenAPI document (use_attribute_docstrings), so it is public
# text for API users and says where the front differs from OpenAI; a detail for maintainers goes in a comment
# above the field. A cross-reference is written [`name`][dotted.path]; the document renders it as `name`, and
# drops a parenthetical "(see [`name`][dotted.path])" whole (openapi.plain_description).


class _Documented(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)


class _Strict(_Documented):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class StreamOptions(_Strict):
    """Options of a streamed response. Unknown keys are refused."""

    include_usage: StrictBool | None = None
    """Send one last chunk with `choices: []` and the request's usage before `data: [DONE]`."""

    include_obfuscation: StrictBool | None = None
    """Accepted and ignored: the front does not add obfuscation padding."""


class JsonSchemaFormat(_Strict):
    """A JSON schema the reply has to follow. Unknown keys are refused."""

    name: str
    """The schema's name."""

    description: str | None = None
    """What the schema is for."""

    # The Python name schema_ is not an accepted key: a body sending "schema_" is refused at its own path.
    schema_: dict[str, Any] = Field(alias="schema")
    """The JSON schema, forwarded unchanged."""

    strict: StrictBool | None = None
    """Enforce the schema exactly. Needs OpenAI's structural rules for strict schemas and a worker that guarantees
    structured output (unless `horde.conformance` is `best_effort`)."""


class ResponseFormat(_Strict):
    """The reply format: text, a JSON object, or a JSON schema. Unknown keys are refused."""

    type: Literal["text", "json_object", "json_schema"]
    """The format. `json_object` and `json_schema` need a worker declaring them."""

    json_schema: JsonSchemaFormat | None = None
    """With type `json_schema`: the schema (see [`JsonSchemaFormat`][horde_oai.schema.JsonSchemaFormat])."""


class FunctionDefinition(_Documented):
    """A function the model may call. Unknown keys are dropped."""

    name: str
    """1 to 64 characters of `[A-Za-z0-9_-]`."""

    description: str | None = None
    """What the function does."""

    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema, forwarded unchanged."""

    strict: StrictBool | None = None
    """Apply OpenAI's strict schema rules to `parameters`."""


class ToolDefinition(_Documented):
    """A tool definition. Unknown keys are dropped."""

    type: Literal["function"] = "function"
    """Always `function`."""

    function: FunctionDefinition
    """The function the model may call."""


class ToolChoiceFunction(_Documented):
    """A forced function choice. Unknown keys are dropped."""

    type: Literal["function"] = "function"
    """Always `function`."""

    function: dict[str, str]
    """`{"name": ...}` of one of the tools."""


class ChatMessage(_Documented):
    """One message. Keys outside the role's set are dropped rather than refused, including what the OpenAI SDKs
    add to a replayed streamed reply (refusal, audio, annotations, function_call, parsed)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    """The author. Other roles, such as `function`, are refused."""

    content: str | list[dict[str, Any]] | None = None
    """Text, or parts: `text` parts, and `image_url` parts on a user message (images need a worker declaring
    vision). Null only on an assistant message with tool calls."""

    name: str | None = None
    """On system, developer, user and assistant messages; dropped on a tool message."""

    tool_calls: list[dict[str, Any]] | None = None
    """On an assistant message only: the calls it made, each `{id, type, function: {name, arguments}}`."""

    tool_call_id: str | None = None
    """On a tool message: the id of the call it answers."""


class ChatCompletionRequest(_Strict):
    """The body of `POST /v1/chat/completions`, as the front validates it. Unknown top-level keys are refused with
    400 `UnsupportedChatParameter`."""

    model: str | None = None
    """The model. Send exactly one of `model` and `models`."""

    models: list[str] | None = None
    """1 to 5 distinct model ids; any listed model may serve the request (an AI Horde extension)."""

    messages: list[ChatMessage]
    """The conversation, at least one message."""

    max_tokens: int | None = None
    """Completion limit, 16 to 16384, default 512. The AI Horde lowers a limit above every online worker's
    declared limit for the model to the largest one declared."""

    max_completion_tokens: int | None = None
    """Same as `max_tokens`; when both are sent they must be equal."""

    temperature: float | None = None
    """0 to 2."""

    top_p: float | None = None
    """0 to 1."""

    frequency_penalty: float | None = None
    """-2 to 2; needs a worker declaring it."""

    presence_penalty: float | None = None
    """-2 to 2; needs a worker declaring it."""

    seed: int | None = None
    """Needs a worker declaring `seed`."""

    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """Forwarded unchanged; needs a worker declaring `reasoning_effort`."""

    stop: str | list[str] | None = None
    """Up to 4 stop sequences."""

    n: int | None = None
    """Only 1: the AI Horde returns one choice."""

    stream: StrictBool | None = None
    """Deliver the reply as server-sent events."""

    stream_options: StreamOptions | None = None
    """Options of a streamed response (see [`StreamOptions`][horde_oai.schema.StreamOptions])."""

    user: str | None = None
    """Accepted and not applied."""

    metadata: dict[str, str] | None = None
    """Accepted and not applied."""

    prompt_cache_key: str | None = None
    """Accepted and not applied."""

    safety_identifier: str | None = None
    """Accepted and not applied."""

    tools: list[ToolDefinition] | None = None
    """At most 128 function tools; needs a worker declaring `tools`."""

    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    """Only with `tools`. A forced choice needs a worker guaranteeing it (unless `horde.conformance` is
    `best_effort`)."""

    parallel_tool_calls: StrictBool | None = None
    """Only with `tools`."""

    response_format: ResponseFormat | None = None
    """The reply format (see [`ResponseFormat`][horde_oai.schema.ResponseFormat])."""

    # Validated by horde_contract.parse_horde_options, the native route's own parser, not by this model.
    horde: ChatHordeOptions | None = None
    """AI Horde options OpenAI has no key for, validated with the native route's rules (see
    [`ChatHordeOptions`][horde_contract.request_options.ChatHordeOptions]). `horde.operation_key`, when sent, is
    forwarded so a retried call is the same operation. `horde.dry_run` is not available through the front."""


REQUEST_FIELDS = frozenset(ChatCompletionRequest.model_fields)


# --- screening ------------------------------------------------------------------------------------------------


def parameter_label(path: str) -> str:
    """The ``horde.parameter`` attribute of a refusal: the path's top-level key when known, else ``other``."""
    top = path.split("[", 1)[0].split(".", 1)[0].split("=", 1)[0]
    known = REQUEST_FIELDS | set(DEFAULT_NO_OP_PARAMETERS) | UNDEFINED_OPENAI_PARAMETERS
    if top in known or top in COMMON_NON_OPENAI_SAMPLER_PARAMETERS:
        return top
    return "other"


def _unsupported(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, UNSUPPORTED, param=param)


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    if value is None:
        return True
    for default in defaults:
        # bool is an int in Python: False must not match 0 and True must not match 1.
        if type(value) is type(default) and value == default:
            return True
    return False


def _with_article(role: str) -> str:
    """``a user``, ``an assistant``: the article by the role's sound (every role but assistant takes ``a``)."""
    return f"{'an' if role == 'assistant' else 'a'} {role}"


def find_refused_parameter(body: dict[str, Any]) -> OpenAIError | None:
    """The first refusal of screening step 1, or None.

    Unknown top-level keys, non-default no-op values, unsupported roles and content part types, each with
    its path as ``param`` (400 UnsupportedChatParameter).
    """
    for key, value in body.items():
        refusal = _refused_top_level(key, value)
        if refusal is not None:
            return refusal
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            refusal = _refused_in_message(i, message)
            if refusal is not None:
                return refusal
    return None


def _refused_top_level(key: str, value: Any) -> OpenAIError | None:
    """The refusal of one top-level key: unknown, or a no-op parameter at a value other than its default."""
    if key in DEFAULT_NO_OP_PARAMETERS:
        if key == "n" and isinstance(value, int) and not isinstance(value, bool) and value < 1:
            return None  # OpenAI's range message comes from validation
        if not _is_default(value, DEFAULT_NO_OP_PARAMETERS[key]):
            shown = repr(value) if not isinstance(value, bool) else str(value).lower()
            return _unsupported(
                f"Unsupported value: '{key}' does not support {shown} on the AI Horde; "
                f"only its default is accepted.",
                key,
            )
    elif key not in REQUEST_FIELDS:
        return _unsupported(f"Unrecognized request argument supplied: {key}", key)
    return None


def _refused_in_message(i: int, message: dict[str, Any]) -> OpenAIError | None:
    """The first refusal in ``messages[i]``: its role, then its content parts' types, then its tool calls."""
    role = message.get("role")
    if isinstance(role, str) and role not in SUPPORTED_ROLES:
        return _unsupported(
            f"Invalid value: '{role}'. Supported values are: 'system', 'developer', 'user', "
            f"'assistant', and 'tool'.",
            f"messages[{i}].role",
        )
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if not isinstance(kind, str):
                continue
            allowed = ("text", "image_url") if role == "user" else ("text",)
            if kind not in allowed:
                return _unsupported(
                    f"Invalid value: '{kind}'. Supported values are: "
                    + " and ".join(f"'{a}'" for a in allowed)
                    + f" on {_with_article(str(role))} message.",
                    f"messages[{i}].content[{j}].type={kind}",
                )
    if "tool_calls" in message and role in SUPPORTED_ROLES and role != "assistant":
        return _unsupported(
            f"Invalid parameter: 'tool_calls' is only allowed on messages with role 'assistant', "
            f"not '{role}'.",
            f"messages[{i}].tool_calls",
        )
    return None


def drop_default_no_ops(body: dict[str, Any]) -> dict[str, Any]:
    """Step 2: the body without the no-op keys (all at their defaults once step 1 passed)."""
    return {
        k: v
        for k, v in body.items()
        if k not in DEFAULT_NO_OP_PARAMETERS or (k == "n" and v not in (None, 1))
    }


def _keep(obj: Any, keys: frozenset[str]) -> Any:
    if isinstance(obj, dict):
        return {k: v for k, v in obj.items() if k in keys}
    return obj


def _keep_nested(obj: Any, keys: frozenset[str], nested: str, nested_keys: frozenset[str]) -> Any:
    """``obj`` with only ``keys``, and its ``nested`` object (when one) with only ``nested_keys``."""
    kept = _keep(obj, keys)
    if isinstance(kept, dict) and isinstance(kept.get(nested), dict):
        kept[nested] = _keep(kept[nested], nested_keys)
    return kept


def _drop_unknown_message_keys(message: Any) -> Any:
    """A message of a supported role with only its role's keys, in its content parts and tool calls too."""
    role = message.get("role") if isinstance(message, dict) else None
    if not (isinstance(role, str) and role in SUPPORTED_MESSAGE_KEYS):
        return message
    kept = _keep(message, SUPPORTED_MESSAGE_KEYS[role])
    content = kept.get("content")
    if isinstance(content, list):
        kept["content"] = [_drop_unknown_part_keys(part) for part in content]
    calls = kept.get("tool_calls")
    if isinstance(calls, list):
        kept["tool_calls"] = [
            _keep_nested(call, TOOL_CALL_KEYS, "function", TOOL_CALL_FUNCTION_KEYS) for call in calls
        ]
    return kept


def _drop_unknown_part_keys(part: Any) -> Any:
    kind = part.get("type") if isinstance(part, dict) else None
    if not (isinstance(kind, str) and kind in PART_KEYS):
        return part
    # Only an image part keeps an image_url object, so only its own keys are filtered.
    return _keep_nested(part, PART_KEYS[kind], "image_url", IMAGE_URL_KEYS)


def drop_unknown_nested_keys(body: dict[str, Any]) -> dict[str, Any]:
    """Step 3: drop unknown keys inside messages, tool definitions and tool_choice (Message roles).

    Covers what the OpenAI SDK adds to a replayed streamed reply (refusal, audio, annotations,
    function_call, parsed, tool_calls[].index, function.parsed_arguments).
    """
    out = dict(body)
    messages = out.get("messages")
    if isinstance(messages, list):
        out["messages"] = [_drop_unknown_message_keys(message) for message in messages]
    tools = out.get("tools")
    if isinstance(tools, list):
        out["tools"] = [_keep_nested(tool, TOOL_KEYS, "function", TOOL_FUNCTION_KEYS) for tool in tools]
    if isinstance(out.get("tool_choice"), dict):
        out["tool_choice"] = _keep_nested(
            out["tool_choice"], TOOL_CHOICE_KEYS, "function", TOOL_CHOICE_FUNCTION_KEYS
        )
    return out


# --- validation -----------------------------------------------------------------------------------------------


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # Locations use the field aliases (json_schema's "schema"), so a "schema_" here is a key the client
            # sent: an unknown key at its own path (docs/openai-front.md#requests).
            out += f".{part}" if out else str(part)
    return out


_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a decimal",
    "float_parsing": "a decimal",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _strip_union_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic puts the union member (e.g. "str", "list[str]", "literal['none','auto']") in the location.
    return tuple(
        p for p in loc if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool")))
    )


def _validation_error(exc: ValidationError) -> OpenAIError:
    errors = exc.errors()
    # An unknown key is refused before any value, as screening refuses unknown top-level keys first: a body with
    # json_schema.schema_ and no schema is told about schema_, the key it sent, not about the missing schema.
    error = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = _strip_union_tags(tuple(error.get("loc", ())))
    path = _path(loc)
    kind = error.get("type", "")
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{path}'.", path)
    if kind == "extra_forbidden":
        return _unsupported(f"Unrecognized request argument supplied: {path}", path)
    if kind in _TYPE_NAMES:
        return bad_request(
            f"Invalid type for '{path}': expected {_TYPE_NAMES[kind]}, but got "
            f"{_json_kind(error.get('input'))} instead.",
            path,
        )
    if kind in ("literal_error", "enum"):
        expected = error.get("ctx", {}).get("expected", "")
        return bad_request(f"Invalid value: {error.get('input')!r}. Supported values are: {expected}.", path)
    return bad_request(f"Invalid value for '{path}': {error.get('msg', 'invalid value')}.", path)


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_openai_ranges(body: dict[str, Any]) -> None:
    """OpenAI's ranges and shapes the front enforces with OpenAI's message (Value and contract validation).

    Raises :class:`OpenAIError` 400 UnsupportedChatParameter for a sampling value outside its range, n or a
    token limit below 1, a token limit below the Horde floor (16) and more than four stop sequences, and
    400 BadRequest for an empty messages.
    """
    for key, (low, high) in OPENAI_SAMPLING_RANGES.items():
        value = body.get(key)
        if not _number(value):
            continue
        if value > high:
            raise _unsupported(
                f"Invalid '{key}': decimal above maximum value. Expected a value <= {high:g}, but got "
                f"{value} instead.",
                key,
            )
        if value < low:
            raise _unsupported(
                f"Invalid '{key}': decimal below minimum value. Expected a value >= {low:g}, but got "
                f"{value} instead.",
                key,
            )
    for key in ("n", "max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise _unsupported(
                f"Invalid '{key}': integer below minimum value. Expected a value >= 1, but got {value} instead.",
                key,
            )
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < MIN_CHAT_MAX_TOKENS:
            raise _unsupported(
                f"Invalid '{key}': the AI Horde needs a completion limit of at least {MIN_CHAT_MAX_TOKENS} "
                f"tokens, but got {value}.",
                key,
            )
    stop = body.get("stop")
    if isinstance(stop, list) and len(stop) > OPENAI_MAX_STOP_SEQUENCES:
        raise _unsupported(
            f"Invalid 'stop': array too long. Expected an array with maximum length "
            f"{OPENAI_MAX_STOP_SEQUENCES}, but got an array with length {len(stop)} instead.",
            "stop",
        )
    if body.get("messages") == []:
        raise bad_request(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
            "array instead.",
            "messages",
        )


def check_model_selection(body: dict[str, Any]) -> None:
    """Exactly one of model and models; models holds 1 to 5 non-empty distinct ids (Model selection)."""
    model, models = body.get("model"), body.get("models")
    if model is not None and models is not None:
        raise OpenAIError(400, "Send exactly one of 'model' and 'models'.", CONFLICT, param="models")
    if model is None and models is None:
        raise bad_request("Missing required parameter: 'model'.", "model")
    if isinstance(model, str) and not model:
        raise bad_request("Invalid 'model': empty string. Expected a model id.", "model")
    if isinstance(models, list):
        if not 1 <= len(models) <= MAX_CHAT_MODEL_COUNT:
            raise bad_request(
                f"Invalid 'models': expected 1 to {MAX_CHAT_MODEL_COUNT} model ids, but got {len(models)}.",
                "models",
            )
        seen: set[str] = set()
        for i, entry in enumerate(models):
            if isinstance(entry, str) and not entry:
                raise bad_request(
                    f"Invalid 'models[{i}]': empty string. Expected a model id.", f"models[{i}]"
                )
            if isinstance(entry, str) and entry in seen:
                raise bad_request(f"Invalid 'models[{i}]': '{entry}' is listed twice.", f"models[{i}]")
            if isinstance(entry, str):
                seen.add(entry)


def contains_non_finite(value: Any) -> bool:
    """True when a parsed JSON value holds NaN, Infinity or -Infinity anywhere (iterative)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


Screened = Annotated[dict[str, Any], "screened body"]


def validate_request(body: Any) -> tuple[ChatCompletionRequest, Screened]:
    """Screen and validate a parsed JSON body.

    Returns the validated model and the screened body (no-op defaults and unknown nested keys removed), from
    which the native body is built. Raises :class:`OpenAIError` 400 with ``param`` on the first refusal.
    """
    if not isinstance(body, dict):
        raise bad_request(
            f"Invalid type for the request body: expected an object, but got {_json_kind(body)} instead."
        )
    refused = find_refused_parameter(body)
    if refused is not None:
        raise refused
    screened = drop_unknown_nested_keys(drop_default_no_ops(body))
    check_openai_ranges(screened)
    try:
        horde = parse_horde_options(screened.get("horde"))
    except HordeError as exc:
        raise contract_error(exc) from None
    try:
        request = ChatCompletionRequest.model_validate({**screened, "horde": None})
    except ValidationError as exc:
        raise _validation_error(exc) from None
    check_model_selection(screened)
    request.horde = horde
    return request, screened


def contract_error(exc: HordeError) -> OpenAIError:
    """A shared-rule refusal with the path as ``param``.

    OpenAI's own messages (a sentence) are sent as they are, since they hold the parameter; a contract
    fragment such as ``has to be a boolean.`` is sent as ``Invalid '<param>': has to be a boolean.``.
    """
    message = exc.openai_message
    if exc.param and message[:1].islower():
        message = f"Invalid '{exc.param}': {message}"
    return OpenAIError(exc.status, message, exc.rc, param=exc.param)
