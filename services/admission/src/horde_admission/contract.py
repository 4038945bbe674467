"""The horde_contract names admission uses, in one place (horde_contract is the single source of the chat
contract, issue 3; admission never re-derives a rule it defines)."""

from __future__ import annotations

from horde_contract.errors import RC, ChatContractError
from horde_contract.fingerprint import build_operation_fingerprint
from horde_contract.limits import (
    EXTRA_SOURCE_IMAGE_HORDE_TAX,
    MAX_CHAT_BODY_BYTES,
    TEXT_DEFAULT_MAX_CONTEXT_LENGTH,
    TEXT_DEFAULT_MAX_LENGTH,
)
from horde_contract.prompt import (
    estimate_chat_prompt_tokens,
    flatten_messages,
    prompt_exceeds_context_error,
    truncate_oldest,
)
from horde_contract.refusals import (
    chat_admission_disabled_error,
    chat_image_storage_unavailable_error,
    check_image_total,
    context_adjustment,
    kudos_cap_exceeded_error,
    operation_key_conflict_error,
    request_too_large_error,
    source_image_resolution_error,
    source_image_size_error,
    source_image_unreadable_error,
    source_image_url_invalid_error,
    source_image_url_refused_error,
)
from horde_contract.request import ChatRequest, parse_chat_request, validate_chat_text_params
from horde_contract.text_params import parse_text_params

__all__ = [
    "EXTRA_SOURCE_IMAGE_HORDE_TAX",
    "MAX_CHAT_BODY_BYTES",
    "RC",
    "TEXT_DEFAULT_MAX_CONTEXT_LENGTH",
    "TEXT_DEFAULT_MAX_LENGTH",
    "ChatContractError",
    "ChatRequest",
    "build_operation_fingerprint",
    "chat_admission_disabled_error",
    "chat_image_storage_unavailable_error",
    "check_image_total",
    "context_adjustment",
    "estimate_chat_prompt_tokens",
    "flatten_messages",
    "kudos_cap_exceeded_error",
    "operation_key_conflict_error",
    "parse_chat_request",
    "parse_text_params",
    "prompt_exceeds_context_error",
    "request_too_large_error",
    "source_image_resolution_error",
    "source_image_size_error",
    "source_image_unreadable_error",
    "source_image_url_invalid_error",
    "source_image_url_refused_error",
    "truncate_oldest",
    "validate_chat_text_params",
]
