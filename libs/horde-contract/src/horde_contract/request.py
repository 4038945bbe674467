"""Parsing a native chat body into a validated :class:`ChatRequest`: the top-level keys, the models, the text
params; the messages (:mod:`.messages`), tools and response format (:mod:`.tools`) and ``horde`` options
(:mod:`.request_options`) are parsed by their own modules.

See docs/native-api.md#request-body (through #refused-keys-and-values), #images (caps and refusals),
#tools; docs/openai-front.md#requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, StrictInt

from ._json_values import is_int
from .errors import RC, HordeError, bad_request, conflict, unsupported, unsupported_value
from .extras import answer_chat_extras, build_chat_extras, build_stored_chat_extras
from .limits import (
    DEFAULT_CHAT_MAX_TOKENS,
    MAX_CHAT_IMAGE_COUNT,
    MAX_CHAT_IMAGE_TOTAL_BYTES,
    MAX_CHAT_MAX_TOKENS,
    MAX_CHAT_MODEL_COUNT,
    MAX_CHAT_TEXT_BYTES,
    MAX_MODEL_NAME_LENGTH,
    MIN_CHAT_MAX_TOKENS,
)
from .messages import MessageStats, check_tool_history, messages_mention_json, parse_messages
from .refusals import source_image_total_error, too_many_images_error
from .request_options import ChatHordeOptions, parse_horde_options
from .requirements import chat_tools_temperature, required_chat_features
from .text_params import ChatTextParams, parse_text_params
from .tools import check_tool_contract, parse_response_format, parse_tool_choice, parse_tools
from .vocab import ChatConformance

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

JSON_OBJECT_WITHOUT_JSON_MESSAGE = (
    "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'."
)

# Native text param key -> request path, for refusals of the mapped params.
_CHAT_PARAM_PATHS = {"stop_sequence": "stop", "max_context_length": "horde.max_context_length"}


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


def _check_finite(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(key, "has to be a finite number.")


def _parse_length(body: dict[str, Any]) -> tuple[str, Any]:
    """``(length_key, sent_length)``: the key the client sent its max_length with, and its value (None when
    neither max_tokens nor max_completion_tokens is sent). ChatRequestConflict when both differ."""
    max_tokens = body.get("max_tokens")
    max_completion_tokens = body.get("max_completion_tokens")
    if max_tokens is not None and max_completion_tokens is not None and max_tokens != max_completion_tokens:
        raise conflict(
            "max_completion_tokens",
            "max_tokens and max_completion_tokens may be sent only with equal values.",
        )
    if max_completion_tokens is not None:
        return "max_completion_tokens", max_completion_tokens
    return "max_tokens", max_tokens


def _check_plain_keys(body: dict[str, Any]) -> bool | None:
    """Check n, stream, stream_options, metadata and user; returns ``stream``."""
    n = body.get("n")
    if n is not None:
        if not is_int(n):
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
    return stream


def _parse_tool_keys(body: dict[str, Any]) -> tuple[Any, Any, bool | None, dict[str, Any] | None]:
    """``(tools, tool_choice, parallel_tool_calls, response_format)``, each shape checked, then the rules
    between them (:func:`check_tool_contract`)."""
    tools = parse_tools(body.get("tools"))
    tool_choice = parse_tool_choice(body.get("tool_choice"))
    parallel_tool_calls = body.get("parallel_tool_calls")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise bad_request("parallel_tool_calls", "has to be a boolean.")
    response_format = parse_response_format(body.get("response_format"))
    check_tool_contract(tools, tool_choice, parallel_tool_calls, response_format)
    return tools, tool_choice, parallel_tool_calls, response_format


def _check_message_caps(stats: MessageStats) -> None:
    """The caps over all messages: text bytes, image count, data URL bytes."""
    if stats.text_bytes > MAX_CHAT_TEXT_BYTES:
        raise unsupported(
            "messages",
            f"the message text takes {stats.text_bytes} bytes of UTF-8; at most {MAX_CHAT_TEXT_BYTES} are allowed.",
        )
    if stats.images > MAX_CHAT_IMAGE_COUNT:
        raise too_many_images_error(stats.images)
    if stats.image_bytes > MAX_CHAT_IMAGE_TOTAL_BYTES:
        raise source_image_total_error(stats.image_bytes, MAX_CHAT_IMAGE_TOTAL_BYTES)


def _mapped_text_params(body: dict[str, Any], sent_length: Any, horde: ChatHordeOptions) -> dict[str, Any]:
    """The native text params a chat body maps to (max_length always; the others only when sent)."""
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
    return params


def parse_chat_request(body: Any, *, defer_length_limits: bool = False) -> ChatRequest:
    """Validate a native chat body (the parsed JSON) and map it to a :class:`ChatRequest`.

    Every refusal is a :class:`HordeError` with the spec's status, rc, request path and message:
    400 UnsupportedChatParameter (unknown or refused keys and values, caps), ChatRequestConflict (model with
    models, differing max_tokens and max_completion_tokens, horde.only with horde.ignore, tool keys without
    tools, an undefined forced function, openai_guards' json rule), BadRequest (wrong types, missing or
    empty values, out-of-range text params), TooManyExtraSourceImages and SourceImageSizeExceeded (the 25 MiB
    data URL total). A null optional value is the same as leaving it out.

    ``defer_length_limits``: admission lowers max_length to the workers' largest and sizes the context before
    validating the final params (docs/native-api.md#routes, steps 7–8); with it set, max_length (max_tokens or
    max_completion_tokens) is still held to its whole range, 16 to 16384 (MIN_CHAT_MAX_TOKENS,
    MAX_CHAT_MAX_TOKENS: a value outside it is refused, never lowered), max_context_length is checked only for
    being positive, and the caller validates the final values with :func:`validate_chat_text_params`. Without
    it every range is checked here. A max_length refusal is 400 BadRequest with ``param`` the key the client
    sent (max_completion_tokens when it sent that key, max_tokens otherwise).
    See docs/native-api.md#request-body, #images, #tools, #refused-keys-and-values.
    """
    if not isinstance(body, dict):
        raise HordeError(400, RC.BadRequest, "The request body has to be a JSON object.", None)
    for key in body:
        if key not in TOP_LEVEL_KEYS:
            raise unsupported(key)
    models, model_key = _parse_models(body)
    messages, stats = parse_messages(body.get("messages"))

    length_key, sent_length = _parse_length(body)
    stream = _check_plain_keys(body)
    tools, tool_choice, parallel_tool_calls, response_format = _parse_tool_keys(body)
    horde = parse_horde_options(body.get("horde"))
    _check_message_caps(stats)
    check_tool_history(messages)

    # The mapped text params, validated against the text params model.
    params = _mapped_text_params(body, sent_length, horde)
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

    max_length keeps its whole range (16 to 16384, docs/native-api.md#request-body): lowering to the workers'
    largest declared max_length applies only to a value inside it.
    """

    max_length: Annotated[StrictInt, Field(ge=MIN_CHAT_MAX_TOKENS, le=MAX_CHAT_MAX_TOKENS)] | None = None
    max_context_length: Annotated[StrictInt, Field(ge=1)] | None = None


def validate_chat_text_params(
    text_params: Mapping[str, Any], *, length_key: str = "max_tokens"
) -> dict[str, Any]:
    """The final check of a chat request's params, after max_length lowering and context sizing: every range
    of the text params model plus the cross-field checks (TokenOverflow). Raises 400 as
    :func:`parse_text_params`. See docs/native-api.md#routes (steps 7–8), #request-body.
    """
    paths = dict(_CHAT_PARAM_PATHS, max_length=length_key)
    return parse_text_params(dict(text_params), model=ChatTextParams, field_paths=paths)
