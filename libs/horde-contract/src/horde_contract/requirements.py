"""What a chat request needs of a worker, the worker's chat declaration, eligibility rules 1–3, and the
declaration gap.

See docs/native-api.md#chat-declaration, #guarantees, #tool-temperature-limit, #eligibility,
#impossible-reason, #free-output-allowance (the NoEligibleWorker message).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import RC, HordeError
from .extras import build_chat_extras, forced_function_name, forwards_tools
from .limits import CHAT_SAMPLING_DEFAULTS
from .vocab import (
    IMAGE_CARRYING_TRANSPORTS,
    KNOWN_CHAT_FEATURES,
    ChatConformance,
    ChatFeature,
    ChatGuarantee,
    ChatImageTransport,
)

# Refusal reasons that describe a worker's declaration (rules 2 and 3); any other reason is no gap.
CHAT_LIMIT_REASONS = ("max_context_length", "max_length", "tools_max_temperature")
IMAGE_TRANSPORTS_REASON = "image_transports"
_GAP_DECLARATION_REASONS = frozenset(KNOWN_CHAT_FEATURES) | {IMAGE_TRANSPORTS_REASON}
_GAP_LIMIT_REASONS = frozenset(CHAT_LIMIT_REASONS)


def messages_have_images(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any message carries an ``image_url`` part."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "image_url":
                    return True
    return False


def messages_have_tool_history(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any message is a tool message or carries tool_calls."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def _is_nonzero(value: Any) -> bool:
    return value is not None and value != 0


def required_chat_features(
    *,
    text_params: Mapping[str, Any],
    chat_extras: Mapping[str, Any] | None,
    messages: Sequence[Mapping[str, Any]],
    conformance: str = ChatConformance.strict,
) -> list[str]:
    """The sorted features and guarantees a request needs: the single derivation of
    ``waiting_prompts.chat_required_features`` and of :func:`chat_request_requirements`.

    Inputs: the mapped text params, the answer extras (stored values; the stream hint is ignored), the stored
    messages and the conformance mode. Features apply under both modes; guarantees only under strict.
    See docs/native-api.md#chat-declaration (feature table), #guarantees.
    """
    needed: set[str] = set()
    if "seed" in text_params:
        needed.add(ChatFeature.seed)
    if "reasoning_effort" in text_params:
        needed.add(ChatFeature.reasoning_effort)
    if _is_nonzero(text_params.get("presence_penalty")):
        needed.add(ChatFeature.presence_penalty)
    if _is_nonzero(text_params.get("frequency_penalty")):
        needed.add(ChatFeature.frequency_penalty)
    if messages_have_images(messages):
        needed.add(ChatFeature.vision)
    extras = chat_extras or {}
    forwarded = forwards_tools(extras)
    if forwarded or messages_have_tool_history(messages):
        needed.add(ChatFeature.tools)
    response_format = extras.get("response_format")
    format_type = response_format.get("type") if isinstance(response_format, Mapping) else None
    if format_type == "json_object":
        needed.add(ChatFeature.json_object)
    elif format_type == "json_schema":
        needed.add(ChatFeature.json_schema)
    if forwarded and format_type in ("json_object", "json_schema"):
        needed.add(ChatFeature.tools_with_response_format)
    if conformance == ChatConformance.strict:
        needed.update(required_chat_guarantees(extras))
    return sorted(str(value) for value in needed)


def required_chat_guarantees(chat_extras: Mapping[str, Any] | None) -> list[str]:
    """The guarantees a strict request needs (sorted): tool_choice_enforced for forwarded tools under
    required or a function choice, structured_output_enforced for a strict json_schema, and always
    prompt_overflow_refused. See docs/native-api.md#guarantees.
    """
    extras = chat_extras or {}
    needed: set[str] = {ChatGuarantee.prompt_overflow_refused.value}
    choice = extras.get("tool_choice")
    if forwards_tools(extras) and (choice == "required" or forced_function_name(choice) is not None):
        needed.add(ChatGuarantee.tool_choice_enforced.value)
    response_format = extras.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        schema_spec = response_format.get("json_schema")
        if isinstance(schema_spec, Mapping) and schema_spec.get("strict") is True:
            needed.add(ChatGuarantee.structured_output_enforced.value)
    return sorted(needed)


def chat_tools_temperature(
    text_params: Mapping[str, Any], chat_extras: Mapping[str, Any] | None
) -> float | None:
    """``waiting_prompts.chat_tools_temperature``: the temperature the job carries (the client's or 1.0)
    when the request forwards tools, else None. See docs/native-api.md#tool-temperature-limit.
    """
    if not forwards_tools(chat_extras):
        return None
    return float(text_params.get("temperature", CHAT_SAMPLING_DEFAULTS["temperature"]))


def chat_request_requirements(body_or_request: Any) -> list[str]:
    """Client-side requirements: the sorted features and guarantees a native chat body (dict) or a parsed
    ``ChatRequest`` needs, through the same :func:`required_chat_features` the server stores.

    A body is read without validation (send it to ``parse_chat_request`` for that); the stop, sampling,
    tool and format values are read as the server maps them. See docs/native-api.md#routes
    (chat_request_requirements, TestRequirementParity).
    """
    if not isinstance(body_or_request, Mapping):
        return list(body_or_request.required_features)
    body = body_or_request
    text_params = {
        key: body[key]
        for key in ("seed", "reasoning_effort", "presence_penalty", "frequency_penalty")
        if body.get(key) is not None
    }
    tools = body.get("tools") or None
    extras = build_chat_extras(
        tools=tools,
        tool_choice=body.get("tool_choice"),
        parallel_tool_calls=body.get("parallel_tool_calls"),
        response_format=body.get("response_format"),
    )
    horde_raw = body.get("horde")
    horde: Mapping[str, Any] = horde_raw if isinstance(horde_raw, Mapping) else {}
    conformance = horde.get("conformance") or ChatConformance.strict
    messages = body.get("messages") or []
    return required_chat_features(
        text_params=text_params, chat_extras=extras, messages=messages, conformance=conformance
    )


@dataclass(frozen=True, slots=True)
class ChatDeclaration:
    """A worker's chat declaration from one pop, as stored on the worker row.

    ``chat_features`` and ``image_transports`` list the recognised values only, sorted; the limits are in
    tokens; every chat field is empty/None when ``accepts_chat_jobs`` is false (a pop without chat_jobs
    withdraws the declaration). See docs/native-api.md#chat-declaration.
    """

    accepts_chat_jobs: bool = False
    accepts_prompt_jobs: bool = True
    chat_features: tuple[str, ...] = ()
    chat_max_context_length: int | None = None
    chat_max_length: int | None = None
    chat_tools_max_temperature: float | None = None
    chat_model_id: str | None = None
    image_transports: tuple[str, ...] = ()
    feature_set: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @property
    def receives_images(self) -> bool:
        """Whether the worker declared url or base64."""
        return any(t in IMAGE_CARRYING_TRANSPORTS for t in self.image_transports)

    def details(self) -> dict[str, Any] | None:
        """The ``chat`` object of worker details; None when the worker does not accept chat jobs."""
        if not self.accepts_chat_jobs:
            return None
        limits: dict[str, Any] = {
            "max_context_length": self.chat_max_context_length,
            "max_length": self.chat_max_length,
        }
        if self.chat_tools_max_temperature is not None:
            limits["tools_max_temperature"] = self.chat_tools_max_temperature
        return {
            "model_id": self.chat_model_id,
            "features": list(self.chat_features),
            "limits": limits,
            "image_transports": list(self.image_transports),
        }


def _declaration_error(param: str, text: str) -> HordeError:
    return HordeError(400, RC.ChatDeclarationInvalid, f"'{param}': {text}", param, openai_message=text)


def _known_values(raw: Any, param: str, known: Iterable[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _declaration_error(param, "has to be an array of strings.")
    known_set = set(known)
    return tuple(sorted({v for v in raw if isinstance(v, str) and v in known_set}))


def _positive_int(raw: Any, param: str) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise _declaration_error(param, "has to be a positive integer.")
    return raw


def parse_chat_declaration(pop_body: Mapping[str, Any]) -> ChatDeclaration:
    """Read the six chat fields of a text pop body into a :class:`ChatDeclaration`.

    Raises 400 ``ChatDeclarationInvalid`` (param the field path) for: chat_jobs without chat_limits or
    model_id, a negative chat_limits.tools_max_temperature, a model_id that is not one of ``models``,
    prompt_jobs false without chat_jobs, and a field of the wrong type. Unknown features and transports are
    ignored. See docs/native-api.md#chat-declaration.
    """
    chat_jobs = pop_body.get("chat_jobs")
    if chat_jobs is None:
        chat_jobs = False
    if not isinstance(chat_jobs, bool):
        raise _declaration_error("chat_jobs", "has to be a boolean.")
    prompt_jobs = pop_body.get("prompt_jobs")
    if prompt_jobs is None:
        prompt_jobs = True
    if not isinstance(prompt_jobs, bool):
        raise _declaration_error("prompt_jobs", "has to be a boolean.")
    if not prompt_jobs and not chat_jobs:
        raise _declaration_error(
            "prompt_jobs", "prompt_jobs false needs chat_jobs true (a chat-only worker)."
        )
    if not chat_jobs:
        return ChatDeclaration(accepts_chat_jobs=False, accepts_prompt_jobs=True)
    limits = pop_body.get("chat_limits")
    if limits is None:
        raise _declaration_error("chat_limits", "chat_jobs needs chat_limits.")
    if not isinstance(limits, Mapping):
        raise _declaration_error("chat_limits", "has to be an object.")
    max_context_length = _positive_int(limits.get("max_context_length"), "chat_limits.max_context_length")
    max_length = _positive_int(limits.get("max_length"), "chat_limits.max_length")
    tools_max = limits.get("tools_max_temperature")
    if tools_max is not None:
        if (
            not isinstance(tools_max, int | float)
            or isinstance(tools_max, bool)
            or not math.isfinite(tools_max)
        ):
            raise _declaration_error("chat_limits.tools_max_temperature", "has to be a number.")
        if tools_max < 0:
            raise _declaration_error("chat_limits.tools_max_temperature", "cannot be negative.")
        tools_max = float(tools_max)
    model_id = pop_body.get("model_id")
    if model_id is None:
        raise _declaration_error("model_id", "chat_jobs needs model_id.")
    if not isinstance(model_id, str):
        raise _declaration_error("model_id", "has to be a string.")
    models = pop_body.get("models")
    if not isinstance(models, list) or model_id not in models:
        raise _declaration_error("model_id", f"model_id {model_id!r} has to be one of models.")
    features = _known_values(pop_body.get("chat_features"), "chat_features", KNOWN_CHAT_FEATURES)
    transports = _known_values(pop_body.get("image_transports"), "image_transports", ChatImageTransport)
    return ChatDeclaration(
        accepts_chat_jobs=True,
        accepts_prompt_jobs=prompt_jobs,
        chat_features=features,
        chat_max_context_length=max_context_length,
        chat_max_length=max_length,
        chat_tools_max_temperature=tools_max,
        chat_model_id=model_id,
        image_transports=transports,
        feature_set=frozenset(features),
    )


def chat_refusal_reasons(
    *,
    declaration: ChatDeclaration,
    models: Sequence[str],
    required_features: Iterable[str],
    max_length: int,
    max_context_length: int,
    tools_temperature: float | None,
    has_images: bool,
) -> list[str]:
    """Every reason eligibility rules 1–3 refuse this worker, in rule order; empty when it is eligible.

    Rule 1: ``"chat_jobs"`` (no chat declared) or ``"model"`` (model_id not among ``models``), and nothing
    else is checked. Rule 2: each missing required feature or guarantee value, then ``"image_transports"``
    for a request with images and neither url nor base64 declared. Rule 3: ``"max_context_length"``,
    ``"max_length"``, ``"tools_max_temperature"`` (lengths in tokens). See docs/native-api.md#eligibility.
    """
    if not declaration.accepts_chat_jobs:
        return ["chat_jobs"]
    if declaration.chat_model_id not in models:
        return ["model"]
    reasons: list[str] = []
    declared = declaration.feature_set or frozenset(declaration.chat_features)
    reasons.extend(f for f in required_features if f not in declared)
    if has_images and not declaration.receives_images:
        reasons.append(IMAGE_TRANSPORTS_REASON)
    if (
        declaration.chat_max_context_length is not None
        and max_context_length > declaration.chat_max_context_length
    ):
        reasons.append("max_context_length")
    if declaration.chat_max_length is not None and max_length > declaration.chat_max_length:
        reasons.append("max_length")
    limit = declaration.chat_tools_max_temperature
    if tools_temperature is not None and limit is not None and tools_temperature > limit:
        reasons.append("tools_max_temperature")
    return reasons


def chat_refusal_reason(**needs: Any) -> str | None:
    """The first reason rules 1–3 refuse this worker, or None; takes the keywords of
    :func:`chat_refusal_reasons`.

    See docs/native-api.md#eligibility, TextWorker.chat_refusal_reason.
    """
    reasons = chat_refusal_reasons(**needs)
    return reasons[0] if reasons else None


def declaration_gap(refusals: Iterable[str | Sequence[str] | None]) -> dict[str, Any] | None:
    """The ``impossible_reason`` of a request no online worker serves because of declarations, or None.

    ``refusals`` holds one entry per online worker serving the model that passed the queue query's rules:
    its refusal reason, or the list of its reasons, or None when it is eligible. The gap exists only when
    there is at least one worker and every one was refused for rule-2 or rule-3 reasons only; then
    ``{"kind": "declaration_gap", "missing_declarations": [...], "exceeded_limits": [...]}`` with the sorted
    union of missing feature/guarantee values (and ``image_transports``) and of exceeded limits.
    See docs/native-api.md#impossible-reason.
    """
    missing: set[str] = set()
    exceeded: set[str] = set()
    seen = False
    for entry in refusals:
        if not entry:
            return None
        reasons = [entry] if isinstance(entry, str) else list(entry)
        for reason in reasons:
            if reason in _GAP_DECLARATION_REASONS:
                missing.add(reason)
            elif reason in _GAP_LIMIT_REASONS:
                exceeded.add(reason)
            else:
                return None
        seen = True
    if not seen:
        return None
    return declaration_gap_reason(missing, exceeded)


def declaration_gap_reason(missing: Iterable[str], exceeded: Iterable[str]) -> dict[str, Any]:
    """The declaration gap ``impossible_reason``: ``{"kind": "declaration_gap", "missing_declarations":
    [...], "exceeded_limits": [...]}`` with both lists sorted. See docs/native-api.md#impossible-reason."""
    return {
        "kind": "declaration_gap",
        "missing_declarations": sorted(missing),
        "exceeded_limits": sorted(exceeded),
    }


def _join(values: Sequence[str], conjunction: str) -> str:
    if len(values) <= 1:
        return "".join(values)
    return ", ".join(values[:-1]) + f" {conjunction} " + values[-1]


def declaration_gap_sentence(
    gap: Mapping[str, Any], *, models: str = "the model", missing_conjunction: str = "or"
) -> str:
    """What a declaration gap ``impossible_reason`` means, as one clause per list joined by ``"; "``, without
    a capital or a final period: ``"no online worker serving the model declares seed or tools; the request
    exceeds the max_context_length and max_length limits of every online worker serving the model"``.

    ``models`` names what the workers serve (``"the listed models"`` for a list); ``missing_conjunction`` joins
    the last two missing declarations (the OpenAI front lists them with ``"and"``). Empty for an empty gap.
    """
    parts = []
    missing = [str(m) for m in gap.get("missing_declarations") or []]
    exceeded = [str(e) for e in gap.get("exceeded_limits") or []]
    if missing:
        parts.append(f"no online worker serving {models} declares {_join(missing, missing_conjunction)}")
    if exceeded:
        noun = "limit" if len(exceeded) == 1 else "limits"
        parts.append(
            f"the request exceeds the {_join(exceeded, 'and')} {noun} of every online worker serving {models}"
        )
    return "; ".join(parts)


def no_eligible_worker_message(gap: Mapping[str, Any] | None) -> str:
    """The 403 NoEligibleWorker message of a request refused for kudos with no worker able to serve it.

    See docs/native-api.md#free-output-allowance.
    """
    base = "No online worker can serve this request"
    if not gap:
        return base + "."
    return f"{base}: {declaration_gap_sentence(gap)}."


def no_eligible_worker_error(gap: Mapping[str, Any] | None) -> HordeError:
    """403 NoEligibleWorker for a kudos refusal with no worker able to serve, with ``impossible_reason``
    in the body when the declarations are the cause. See docs/native-api.md#free-output-allowance.
    """
    extra = {"impossible_reason": dict(gap)} if gap else None
    return HordeError(403, RC.NoEligibleWorker, no_eligible_worker_message(gap), None, extra)


def no_serving_worker_error(models: Sequence[str]) -> HordeError:
    """403 NoEligibleWorker for known models without an online chat worker (no impossible_reason).

    See docs/native-api.md#known-models.
    """
    if len(models) == 1:
        message = f"No worker is currently serving the model '{models[0]}'."
    else:
        quoted = ", ".join(f"'{m}'" for m in models)
        message = f"No worker is currently serving any of the models {quoted}."
    return HordeError(403, RC.NoEligibleWorker, message, "models" if len(models) > 1 else "model")


def unknown_chat_model_error(model: str, path: str) -> HordeError:
    """404 UnknownChatModel for the first unknown entry; the message starts with its quoted ``path``
    (``'model'`` or ``'models[1]'``). See docs/native-api.md#known-models.
    """
    text = f"the model {model!r} is not known to this horde."
    return HordeError(404, RC.UnknownChatModel, f"'{path}': {text}", path, openai_message=text)
