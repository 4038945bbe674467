"""Limits and defaults of the chat contract, with the spec's names and values.

Spec: chat-requests.md *Request body*, *Images*, *Tools*, *Refused keys and values*, *Flattened prompt*,
*Chat job pop response*, *Job lease*, *Streaming progress*, *Structured submit*, *Pricing*, *Operation key*;
ai-horde-text-path.md §1 (text params ranges) and §14 (max_length 16–16384).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * 1024

# Request body
MAX_CHAT_BODY_BYTES: Final = 36 * MIB
MAX_CHAT_MODEL_COUNT: Final = 5
MAX_CHAT_MESSAGE_COUNT: Final = 1024
MAX_CHAT_TEXT_BYTES: Final = 1 * MIB
MIN_CHAT_MAX_TOKENS: Final = 16
MAX_CHAT_MAX_TOKENS: Final = 16384
DEFAULT_CHAT_MAX_TOKENS: Final = 512
# OpenAI's stop cap, applied by the front only (the native route keeps the text route's rules).
OPENAI_MAX_STOP_SEQUENCES: Final = 4

# Tools
MAX_CHAT_TOOL_COUNT: Final = 128
MAX_CHAT_TOOL_SPEC_BYTES: Final = 256 * KIB
MAX_CHAT_SCHEMA_NESTING: Final = 10
MAX_CHAT_TOOL_CALL_COUNT: Final = 128
MAX_CHAT_TOOL_CALL_ID_LENGTH: Final = 256
MAX_CHAT_TOOL_NAME_LENGTH: Final = 64
CHAT_TOOL_NAME_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"

# Images
MAX_CHAT_IMAGE_COUNT: Final = 20
MAX_CHAT_IMAGE_BYTES: Final = 5 * MIB
MAX_CHAT_IMAGE_TOTAL_BYTES: Final = 25 * MIB
MAX_CHAT_IMAGE_TOTAL_BYTES_UNTRUSTED: Final = 5 * MIB
MAX_CHAT_IMAGE_PIXELS: Final = 3072 * 3072
CHAT_IMAGE_MAX_SIDE: Final = 2048
CHAT_IMAGE_JPEG_QUALITY: Final = 90
CHAT_IMAGE_PROMPT_TOKENS: Final = 512
CHAT_IMAGE_PLACEHOLDER: Final = "[image]"
CHAT_IMAGE_REFERENCE_SCHEME: Final = "horde-r2://"
EXTRA_SOURCE_IMAGE_HORDE_TAX: Final = 5
MIN_CHAT_IMAGE_URL_SECONDS: Final = 600
CHAT_MESSAGES_URL_SECONDS: Final = 120
CHAT_MESSAGES_OFFLOAD_BYTES_DEFAULT: Final = 256 * KIB

# Prompt estimate: characters per token of the character-based estimate.
CHARS_PER_TOKEN: Final = 4

# Sampling: OpenAI's ranges (the front), and the values a chat job carries when the client sent none.
OPENAI_SAMPLING_RANGES: Final = MappingProxyType(
    {
        "temperature": (0.0, 2.0),
        "top_p": (0.0, 1.0),
        "frequency_penalty": (-2.0, 2.0),
        "presence_penalty": (-2.0, 2.0),
    }
)
CHAT_SAMPLING_DEFAULTS: Final = MappingProxyType(
    {
        "temperature": 1.0,
        "top_p": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "rep_pen": 1.0,
        "top_k": 0,
        "min_p": 0.0,
    }
)
# The native chat penalty range (the text params model does not know the penalties).
CHAT_PENALTY_RANGE: Final = (-2.0, 2.0)

# Text params (upstream ranges; max_length widened to 16–16384 for this project, ai-horde-text-path §14)
TEXT_MAX_LENGTH_RANGE: Final = (16, 16384)
TEXT_MAX_CONTEXT_LENGTH_RANGE: Final = (80, 1_048_576)
TEXT_DEFAULT_MAX_LENGTH: Final = 80
TEXT_DEFAULT_MAX_CONTEXT_LENGTH: Final = 2048
MAX_TEXT_STOP_SEQUENCES: Final = 128
MAX_TEXT_STOP_SEQUENCE_CHARS: Final = 2000
MIN_SAMPLER_ORDER_VALUES: Final = 7

# Submit and pricing
MAX_CHAT_NATIVE_FINISH_REASON_LENGTH: Final = 32
MAX_CHAT_REPORTED_TOKENS: Final = 10_000_000
MIN_CHARGED_TOKENS: Final = 20
MAX_CHAT_FAULT_REASON_LENGTH: Final = 1000
FAULTED_GENERATIONS_LIMIT: Final = 2
CHAT_CHARGE_BASIS_OUTPUT_ESTIMATE: Final = "output_estimate"

# Job lease and speed gate
TEXT_JOB_LEASE_SECONDS: Final = 150
TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS: Final = 600
UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS: Final = 200
TEXT_JOB_PREPARATION_SECONDS: Final = 30
UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND: Final = 10

# Streaming progress
CHAT_STREAM_PROGRESS_KEY: Final = "stream_progress"
CHAT_PROGRESS_LEASE_GRACE_SECONDS: Final = 90
MAX_CHAT_PROGRESS_ENTRIES: Final = 1000
CHAT_PROGRESS_BYTES_PER_TOKEN: Final = 16
CHAT_PROGRESS_STREAM_TTL_SECONDS: Final = 900
CHAT_PROGRESS_STREAM_MAX_ENTRIES: Final = 4000

# Lifetimes
CHAT_REQUEST_EXPIRY_SECONDS: Final = 20 * 60
ONLINE_WORKER_SECONDS: Final = 300

# Operation key: horde options left out of the fingerprint.
OPERATION_FINGERPRINT_EXCLUDED_HORDE_KEYS: Final = frozenset(
    {"availability_mode", "dry_run", "include_reasoning", "max_kudos", "operation_key"}
)

__all__ = [
    "CHARS_PER_TOKEN",
    "CHAT_CHARGE_BASIS_OUTPUT_ESTIMATE",
    "CHAT_IMAGE_JPEG_QUALITY",
    "CHAT_IMAGE_MAX_SIDE",
    "CHAT_IMAGE_PLACEHOLDER",
    "CHAT_IMAGE_PROMPT_TOKENS",
    "CHAT_IMAGE_REFERENCE_SCHEME",
    "CHAT_MESSAGES_OFFLOAD_BYTES_DEFAULT",
    "CHAT_MESSAGES_URL_SECONDS",
    "CHAT_PENALTY_RANGE",
    "CHAT_PROGRESS_BYTES_PER_TOKEN",
    "CHAT_PROGRESS_LEASE_GRACE_SECONDS",
    "CHAT_PROGRESS_STREAM_MAX_ENTRIES",
    "CHAT_PROGRESS_STREAM_TTL_SECONDS",
    "CHAT_REQUEST_EXPIRY_SECONDS",
    "CHAT_SAMPLING_DEFAULTS",
    "CHAT_STREAM_PROGRESS_KEY",
    "CHAT_TOOL_NAME_PATTERN",
    "DEFAULT_CHAT_MAX_TOKENS",
    "EXTRA_SOURCE_IMAGE_HORDE_TAX",
    "FAULTED_GENERATIONS_LIMIT",
    "KIB",
    "MAX_CHAT_BODY_BYTES",
    "MAX_CHAT_FAULT_REASON_LENGTH",
    "MAX_CHAT_IMAGE_BYTES",
    "MAX_CHAT_IMAGE_COUNT",
    "MAX_CHAT_IMAGE_PIXELS",
    "MAX_CHAT_IMAGE_TOTAL_BYTES",
    "MAX_CHAT_IMAGE_TOTAL_BYTES_UNTRUSTED",
    "MAX_CHAT_MAX_TOKENS",
    "MAX_CHAT_MESSAGE_COUNT",
    "MAX_CHAT_MODEL_COUNT",
    "MAX_CHAT_NATIVE_FINISH_REASON_LENGTH",
    "MAX_CHAT_PROGRESS_ENTRIES",
    "MAX_CHAT_REPORTED_TOKENS",
    "MAX_CHAT_SCHEMA_NESTING",
    "MAX_CHAT_TEXT_BYTES",
    "MAX_CHAT_TOOL_CALL_COUNT",
    "MAX_CHAT_TOOL_CALL_ID_LENGTH",
    "MAX_CHAT_TOOL_COUNT",
    "MAX_CHAT_TOOL_NAME_LENGTH",
    "MAX_CHAT_TOOL_SPEC_BYTES",
    "MAX_TEXT_STOP_SEQUENCES",
    "MAX_TEXT_STOP_SEQUENCE_CHARS",
    "MIB",
    "MIN_CHARGED_TOKENS",
    "MIN_CHAT_IMAGE_URL_SECONDS",
    "MIN_CHAT_MAX_TOKENS",
    "MIN_SAMPLER_ORDER_VALUES",
    "ONLINE_WORKER_SECONDS",
    "OPENAI_MAX_STOP_SEQUENCES",
    "OPENAI_SAMPLING_RANGES",
    "OPERATION_FINGERPRINT_EXCLUDED_HORDE_KEYS",
    "TEXT_DEFAULT_MAX_CONTEXT_LENGTH",
    "TEXT_DEFAULT_MAX_LENGTH",
    "TEXT_JOB_LEASE_SECONDS",
    "TEXT_JOB_PREPARATION_SECONDS",
    "TEXT_MAX_CONTEXT_LENGTH_RANGE",
    "TEXT_MAX_LENGTH_RANGE",
    "TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS",
    "UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND",
    "UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS",
]
