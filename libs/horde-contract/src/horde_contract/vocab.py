"""Vocabularies of the chat contract: features, guarantees, modes, finish and fault reasons.

See docs/native-api.md#chat-declaration, #guarantees, #submit, #worker-fault-reasons,
#context-adjustments, #images; values never change meaning, vocabularies grow by adding values.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Final

# The shared anonymous API key of the AI Horde (user id 0): every anonymous client sends the same key.
ANONYMOUS_API_KEY: Final = "0000000000"


class ChatFeature(StrEnum):
    """Optional capabilities a worker declares in ``chat_features`` (docs/native-api.md#chat-declaration)."""

    seed = "seed"
    reasoning_effort = "reasoning_effort"
    presence_penalty = "presence_penalty"
    frequency_penalty = "frequency_penalty"
    vision = "vision"
    tools = "tools"
    json_object = "json_object"
    json_schema = "json_schema"
    tools_with_response_format = "tools_with_response_format"


class ChatGuarantee(StrEnum):
    """Parts of the OpenAI contract a backend follows exactly, in the same list as features (docs/native-api.md#guarantees)."""

    tool_choice_enforced = "tool_choice_enforced"
    single_tool_call_enforced = "single_tool_call_enforced"
    structured_output_enforced = "structured_output_enforced"
    prompt_overflow_refused = "prompt_overflow_refused"


KNOWN_CHAT_FEATURES: Final = frozenset(ChatFeature) | frozenset(ChatGuarantee)
#: Every feature and every guarantee as the plain string a declaration carries on the wire.
CHAT_FEATURE_VALUES: Final = frozenset(str(v.value) for v in ChatFeature)
CHAT_GUARANTEE_VALUES: Final = frozenset(str(v.value) for v in ChatGuarantee)


class ChatConformance(StrEnum):
    """``horde.conformance``: strict needs every guarantee the request needs; best_effort none."""

    strict = "strict"
    best_effort = "best_effort"


class ChatReasoningEffort(StrEnum):
    """Accepted ``reasoning_effort`` values, forwarded unchanged."""

    none = "none"
    minimal = "minimal"
    low = "low"
    medium = "medium"
    high = "high"
    xhigh = "xhigh"


class ChatFinishReason(StrEnum):
    """``finish_reason`` of a structured submit."""

    stop = "stop"
    length = "length"
    content_filter = "content_filter"
    tool_calls = "tool_calls"


class ChatSubmitState(StrEnum):
    """``state`` of a submit, as for text jobs."""

    ok = "ok"
    censored = "censored"
    csam = "csam"
    faulted = "faulted"


class ChatFaultReason(StrEnum):
    """``fault_reason`` a worker may send with a faulted chat submit (docs/native-api.md#worker-fault-reasons)."""

    prompt_overflow = "prompt_overflow"
    unbuildable_grammar = "unbuildable_grammar"
    tool_violation = "tool_violation"
    reply_refused = "reply_refused"
    generation_error = "generation_error"


# The horde stores these messages, never text from the worker.
CHAT_WORKER_FAULT_MESSAGES: Final = MappingProxyType(
    {
        ChatFaultReason.prompt_overflow: "The worker could not fit the prompt into its context.",
        ChatFaultReason.unbuildable_grammar: (
            "The worker could not build the grammar the request's tool choice or response format needs."
        ),
        ChatFaultReason.tool_violation: "The model's reply broke the request's tool controls.",
        ChatFaultReason.reply_refused: "The AI Horde refused the worker's reply.",
        ChatFaultReason.generation_error: "The worker's backend failed while generating.",
    }
)


def chat_worker_fault_message(reason: object) -> str | None:
    """The stored ``chat_fault_reason`` for a worker's ``fault_reason``; None for a missing or unknown value."""
    if isinstance(reason, str) and reason in CHAT_WORKER_FAULT_MESSAGES:
        return CHAT_WORKER_FAULT_MESSAGES[ChatFaultReason(reason)]
    return None


def chat_worker_fault_label(reason: object) -> str:
    """The ``horde.reason`` attribute of ``horde.chat.worker_faults``: the reason, ``unknown`` or ``none``."""
    if reason is None:
        return "none"
    if isinstance(reason, str) and reason in CHAT_WORKER_FAULT_MESSAGES:
        return reason
    return "unknown"


class ChatImageTransport(StrEnum):
    """How a worker receives images and offloaded messages (``image_transports``)."""

    url = "url"
    base64 = "base64"
    messages_url = "messages_url"


# Only these let a worker receive images; messages_url is declared beside them.
IMAGE_CARRYING_TRANSPORTS: Final = frozenset({ChatImageTransport.url, ChatImageTransport.base64})


class ChatImageDetail(StrEnum):
    """``image_url.detail``, passed to the worker unchanged."""

    auto = "auto"
    low = "low"
    high = "high"


class ChatContextAdjustmentReason(StrEnum):
    """``reason`` of a ``context_adjustments`` entry."""

    grow = "grow"
    truncate_oldest = "truncate_oldest"
    worker_max_length = "worker_max_length"


class ChatContextFit(StrEnum):
    """``horde.context_fit``."""

    grow = "grow"
    reject = "reject"
    truncate_oldest = "truncate_oldest"


class ChatAvailabilityMode(StrEnum):
    """``horde.availability_mode``, read by the front."""

    wait = "wait"
    fail_fast = "fail_fast"


class ChatSignalEvent(StrEnum):
    """``event`` of a completion signal on ``horde:chat:<request id>``."""

    generation = "generation"
    done = "done"
    cancelled = "cancelled"
    faulted = "faulted"
