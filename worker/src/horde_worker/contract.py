"""The chat contract vocabulary the worker speaks, from ``horde_contract`` (spec: chat-requests.md **Chat
declaration on pop**, **Guarantees**, **Structured submit**, **Worker fault reasons**, **Streaming progress**,
**Job lease**), and the Horde's bounded check of a reply against a strict schema (**Reply verification**), so
the worker and the services apply one vocabulary and one check. Values are plain strings on the wire (every
enum is a ``StrEnum``).
"""

from __future__ import annotations

from typing import Final

from horde_contract import (
    CHAT_STREAM_PROGRESS_KEY,
    MAX_CHAT_NATIVE_FINISH_REASON_LENGTH,
    MAX_CHAT_REPORTED_TOKENS,
    MAX_CHAT_TEXT_BYTES,
    MAX_CHAT_TOOL_CALL_COUNT,
    RC,
    TEXT_JOB_LEASE_SECONDS,
    TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
    ChatFaultReason,
    ChatFeature,
    ChatFinishReason,
    ChatGuarantee,
    ChatImageTransport,
)
from horde_contract.reply_schema import (
    SchemaBoundExceeded,
    SchemaUncompilable,
    compile_reply_schema,
    reply_schema_error,
)

__all__ = [
    "CHAT_STREAM_PROGRESS_KEY",
    "FEATURES",
    "FINISH_REASONS",
    "GUARANTEES",
    "MAX_CHAT_TEXT_BYTES",
    "MAX_MESSAGES_URL_BYTES",
    "MAX_NATIVE_FINISH_REASON_LENGTH",
    "MAX_REPORTED_TOKENS",
    "MAX_TOOL_CALLS",
    "RC_ABORTED_GEN",
    "RC_CHAT_JOB_ABORTED",
    "RC_CHAT_PROGRESS_CAP_REACHED",
    "RC_CHAT_PROGRESS_NOT_STREAMING",
    "RC_CHAT_PROGRESS_OUT_OF_SEQUENCE",
    "RC_CHAT_PROGRESS_UNAVAILABLE",
    "RC_DUPLICATE_GEN",
    "TEXT_JOB_LEASE_SECONDS",
    "TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS",
    "ChatFaultReason",
    "ChatFeature",
    "ChatFinishReason",
    "ChatGuarantee",
    "ChatImageTransport",
    "SchemaBoundExceeded",
    "SchemaUncompilable",
    "compile_reply_schema",
    "reply_schema_error",
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

#: Return codes of the progress route (spec: **Streaming progress**).
RC_CHAT_JOB_ABORTED: Final = str(RC.ChatJobAborted.value)
RC_CHAT_PROGRESS_NOT_STREAMING: Final = str(RC.ChatProgressNotStreaming.value)
RC_CHAT_PROGRESS_OUT_OF_SEQUENCE: Final = str(RC.ChatProgressOutOfSequence.value)
RC_CHAT_PROGRESS_CAP_REACHED: Final = str(RC.ChatProgressCapReached.value)
RC_CHAT_PROGRESS_UNAVAILABLE: Final = str(RC.ChatProgressUnavailable.value)
