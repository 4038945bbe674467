"""The text params model (legacy text route and the chat mapping).

See docs/native-api.md#text-route (ranges, cross-field checks) and #text-route (max_length 16–16384);
docs/native-api.md#request-body ("The mapped params are validated against the text params model, so every
range a text request enforces applies, and an out-of-range value returns the same 400 validation error and is
not clamped").
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from .errors import RC, HordeError
from .limits import (
    CHAT_PENALTY_RANGE,
    MAX_TEXT_STOP_SEQUENCE_CHARS,
    MAX_TEXT_STOP_SEQUENCES,
    MIN_SAMPLER_ORDER_VALUES,
    TEXT_DEFAULT_MAX_CONTEXT_LENGTH,
    TEXT_DEFAULT_MAX_LENGTH,
    TEXT_MAX_CONTEXT_LENGTH_RANGE,
    TEXT_MAX_LENGTH_RANGE,
)
from .vocab import ChatReasoningEffort

# Strict: JSON true is not an integer and "5" is not a number, as under the upstream JSON schema.
Number = Annotated[float, Field(strict=True)]


class TextGenerationParams(BaseModel):
    """``params`` of a text request, with upstream ranges; unknown keys pass through to workers.

    All fields are optional; the server fills only ``max_length`` (80), ``max_context_length`` (2048) and
    ``n`` (1) where it needs them.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    n: Annotated[StrictInt, Field(ge=1, le=20)] | None = None
    max_length: (
        Annotated[StrictInt, Field(ge=TEXT_MAX_LENGTH_RANGE[0], le=TEXT_MAX_LENGTH_RANGE[1])] | None
    ) = None
    max_context_length: (
        Annotated[StrictInt, Field(ge=TEXT_MAX_CONTEXT_LENGTH_RANGE[0], le=TEXT_MAX_CONTEXT_LENGTH_RANGE[1])]
        | None
    ) = None
    temperature: Annotated[Number, Field(ge=0, le=5)] | None = None
    top_p: Annotated[Number, Field(ge=0.001, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0, le=200)] | None = None
    top_a: Annotated[Number, Field(ge=0, le=1)] | None = None
    typical: Annotated[Number, Field(ge=0, le=1)] | None = None
    tfs: Annotated[Number, Field(ge=0, le=1)] | None = None
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    rep_pen: Annotated[Number, Field(ge=1, le=3)] | None = None
    rep_pen_range: Annotated[StrictInt, Field(ge=0, le=4096)] | None = None
    rep_pen_slope: Annotated[Number, Field(ge=0, le=10)] | None = None
    smoothing_factor: Annotated[Number, Field(ge=0, le=10)] | None = None
    dynatemp_range: Annotated[Number, Field(ge=0, le=5)] | None = None
    dynatemp_exponent: Annotated[Number, Field(ge=0, le=5)] | None = None
    stop_sequence: list[StrictStr] | None = None
    sampler_order: list[StrictInt] | None = None
    use_default_badwordsids: StrictBool | None = None
    singleline: StrictBool | None = None
    frmtadsnsp: StrictBool | None = None
    frmtrmblln: StrictBool | None = None
    frmtrmspch: StrictBool | None = None
    frmttriminc: StrictBool | None = None


class ChatTextParams(TextGenerationParams):
    """The mapped params of a chat request: the text params plus the chat-only sampling keys.

    ``frequency_penalty`` and ``presence_penalty`` are -2 to 2, ``seed`` an integer and ``reasoning_effort``
    a :class:`ChatReasoningEffort` value (docs/native-api.md#request-body).
    """

    frequency_penalty: Annotated[Number, Field(ge=CHAT_PENALTY_RANGE[0], le=CHAT_PENALTY_RANGE[1])] | None = (
        None
    )
    presence_penalty: Annotated[Number, Field(ge=CHAT_PENALTY_RANGE[0], le=CHAT_PENALTY_RANGE[1])] | None = (
        None
    )
    seed: StrictInt | None = None
    reasoning_effort: ChatReasoningEffort | None = None


def _validation_error(exc: ValidationError, field_paths: dict[str, str] | None) -> HordeError:
    first = exc.errors(include_url=False)[0]
    loc = first.get("loc", ())
    field = str(loc[0]) if loc else "params"
    dotted = ".".join(str(part) for part in loc) or field
    text = first.get("msg", "invalid value")
    param = (field_paths or {}).get(field, field)
    if param != field and len(loc) > 1:
        param = param + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:])
    return HordeError(
        400,
        RC.BadRequest,
        f"'{param}': Input payload validation failed: {dotted}: {text}",
        param,
        {"errors": {dotted: text}},
        openai_message=f"Invalid value for '{param}': {text}",
    )


def parse_text_params(
    params: Any,
    *,
    model: type[TextGenerationParams] = TextGenerationParams,
    field_paths: dict[str, str] | None = None,
    cross_field: bool = True,
) -> dict[str, Any]:
    """Validate a text request's ``params`` and return them as sent (unset keys left out, extras kept).

    ``params`` is the JSON object; ``model`` the params model (:class:`ChatTextParams` for a chat request);
    ``field_paths`` maps a param key to the request path reported as ``param`` (the chat route reports
    ``max_length`` as ``max_tokens``). Raises :class:`HordeError` 400 ``BadRequest`` naming the first
    failing field (body extra ``errors: {field: text}``), then the upstream cross-field checks when
    ``cross_field`` is true: ``TokenOverflow`` (``max_context_length`` below ``max_length``, defaults 2048 and
    80 filled), ``MissingFullSamplerOrder``, ``TooManyStopSequences`` and ``ExcessiveStopSequence``.
    See docs/native-api.md#text-route.
    """
    if not isinstance(params, dict):
        raise HordeError(
            400,
            RC.BadRequest,
            "'params': Input payload validation failed: params must be an object",
            "params",
            {"errors": {"params": "must be an object"}},
        )
    try:
        validated = model.model_validate(params)
    except ValidationError as exc:
        raise _validation_error(exc, field_paths) from None
    out = validated.model_dump(exclude_unset=True)
    # An explicit null of a known param is the param left out (its default), as upstream reads it.
    for name in model.model_fields:
        if name in out and out[name] is None:
            del out[name]
    if isinstance(out.get("reasoning_effort"), ChatReasoningEffort):
        out["reasoning_effort"] = out["reasoning_effort"].value
    check_stop_sequences(out.get("stop_sequence"), (field_paths or {}).get("stop_sequence", "stop_sequence"))
    if cross_field:
        check_text_params_cross_fields(out, field_paths)
    return out


def check_stop_sequences(stops: list[str] | None, param: str = "stop_sequence") -> None:
    """Upstream's stop sequence bounds: at most 128 distinct, at most 2000 characters across the distinct ones.

    Raises 400 ``TooManyStopSequences`` or ``ExcessiveStopSequence``. See docs/native-api.md#text-route.
    """
    if not stops:
        return
    distinct = set(stops)
    if len(distinct) > MAX_TEXT_STOP_SEQUENCES:
        raise HordeError(
            400,
            RC.TooManyStopSequences,
            f"Too many stop sequences: {len(distinct)} distinct, at most {MAX_TEXT_STOP_SEQUENCES}.",
            param,
        )
    total = sum(len(s) for s in distinct)
    if total > MAX_TEXT_STOP_SEQUENCE_CHARS:
        raise HordeError(
            400,
            RC.ExcessiveStopSequence,
            f"The stop sequences total {total} characters, at most {MAX_TEXT_STOP_SEQUENCE_CHARS}.",
            param,
        )


def check_text_params_cross_fields(params: dict[str, Any], field_paths: dict[str, str] | None = None) -> None:
    """Upstream's cross-field rules: ``TokenOverflow`` and ``MissingFullSamplerOrder`` (400).

    See docs/native-api.md#text-route.
    """
    paths = field_paths or {}
    # An explicit null is the default, as an absent key is (upstream's parser fills both).
    max_length = params.get("max_length")
    max_length = TEXT_DEFAULT_MAX_LENGTH if max_length is None else max_length
    max_context_length = params.get("max_context_length")
    max_context_length = TEXT_DEFAULT_MAX_CONTEXT_LENGTH if max_context_length is None else max_context_length
    if max_context_length < max_length:
        raise HordeError(
            400,
            RC.TokenOverflow,
            f"max_context_length ({max_context_length}) has to be at least max_length ({max_length}).",
            paths.get("max_context_length", "max_context_length"),
        )
    order = params.get("sampler_order")
    if order is not None and len(set(order)) < MIN_SAMPLER_ORDER_VALUES:
        raise HordeError(
            400,
            RC.MissingFullSamplerOrder,
            f"sampler_order has to list at least {MIN_SAMPLER_ORDER_VALUES} distinct samplers.",
            "sampler_order",
        )
