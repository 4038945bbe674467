"""The submit's use of the chat contract (horde_contract owns every rule; this module only adapts).

``parse_submit_body`` tells chat from text submits and validates them, ``verify_chat_reply`` checks a reply
against the stored chat_extras, ``chat_reply_characters`` / ``charged_tokens`` price it and
``build_stored_reply`` / ``stored_generation`` give the stored columns (spec: **Structured submit**,
**Reasoning**, **Reply verification**, **Pricing**).
"""

from __future__ import annotations

from typing import Any, TypeAlias

from horde_contract import (
    RC,
    ChatContractError,
    ChatSubmit,
    TextSubmit,
    VerifiedReply,
    build_stored_reply,
    chat_reply_characters,
    parse_submit_body,
    stored_generation,
    verify_chat_reply,
)

__all__ = [
    "ChatSubmit",
    "SubmitBody",
    "TextSubmit",
    "VerifiedReply",
    "build_stored_reply",
    "chat_reply_characters",
    "parse_submit",
    "replace_nul",
    "stored_generation",
    "submit_invalid",
    "verify_chat_reply",
]

SubmitBody: TypeAlias = ChatSubmit | TextSubmit


def submit_invalid(message: str, param: str | None = None) -> ChatContractError:
    """400 ChatSubmitInvalid."""
    return ChatContractError(400, RC.ChatSubmitInvalid, message, param)


def parse_submit(body: Any) -> SubmitBody:
    """``horde_contract.parse_submit_body``: 400 ChatSubmitInvalid for a bad chat submit, 400 BadRequest for a
    bad text one (a text submit without ``generation`` included)."""
    return parse_submit_body(body)


def replace_nul(text: str) -> str:
    """NUL becomes U+FFFD, as the text path's compare-and-set stores it (text path §4)."""
    return text.replace("\x00", "\ufffd")
