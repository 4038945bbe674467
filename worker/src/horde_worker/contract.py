"""The chat contract vocabulary the worker speaks, from ``horde_contract`` (spec: chat-requests.md **Chat
declaration on pop**, **Guarantees**, **Structured submit**, **Worker fault reasons**), so the worker and the
services apply one vocabulary. Values are plain strings on the wire (every enum is a ``StrEnum``).
"""

from __future__ import annotations

from typing import Final

from horde_contract import (
    MAX_CHAT_NATIVE_FINISH_REASON_LENGTH,
    MAX_CHAT_REPORTED_TOKENS,
    MAX_CHAT_TEXT_BYTES,
    MAX_CHAT_TOOL_CALL_COUNT,
    TEXT_JOB_LEASE_SECONDS,
    ChatFaultReason,
    ChatFeature,
    ChatFinishReason,
    ChatGuarantee,
    ChatImageTransport,
)

__all__ = [
    "FEATURES",
    "FINISH_REASONS",
    "GUARANTEES",
    "MAX_CHAT_TEXT_BYTES",
    "MAX_MESSAGES_URL_BYTES",
    "MAX_NATIVE_FINISH_REASON_LENGTH",
    "MAX_REPORTED_TOKENS",
    "MAX_TOOL_CALLS",
    "RC_ABORTED_GEN",
    "RC_DUPLICATE_GEN",
    "TEXT_JOB_LEASE_SECONDS",
    "ChatFaultReason",
    "ChatFeature",
    "ChatFinishReason",
    "ChatGuarantee",
    "ChatImageTransport",
]

#: Every feature value (spec: **Chat declaration on pop**).
FEATURES: Final = frozenset(str(v.value) for v in ChatFeature)
#: Every guarantee value (spec: **Guarantees**).
GUARANTEES: Final = frozenset(str(v.value) for v in ChatGuarantee)
#: The submit's finish reasons (spec: **Structured submit**).
FINISH_REASONS: Final = frozenset(str(v.value) for v in ChatFinishReason)

#: Longest native_finish_reason the submit accepts (spec: **Structured submit**).
MAX_NATIVE_FINISH_REASON_LENGTH: Final = MAX_CHAT_NATIVE_FINISH_REASON_LENGTH
#: Most tool calls one reply may carry (spec: **Structured submit**).
MAX_TOOL_CALLS: Final = MAX_CHAT_TOOL_CALL_COUNT
#: Largest reported token count the submit accepts (spec: **Structured submit**).
MAX_REPORTED_TOKENS: Final = MAX_CHAT_REPORTED_TOKENS
#: Largest decoded messages_url body the worker reads (worker-side.md §2).
MAX_MESSAGES_URL_BYTES: Final = 36 * 1024 * 1024

#: Return codes the worker reacts to (the Horde error envelope ``{"message", "rc"}``).
RC_ABORTED_GEN: Final = "AbortedGen"
RC_DUPLICATE_GEN: Final = "DuplicateGen"
