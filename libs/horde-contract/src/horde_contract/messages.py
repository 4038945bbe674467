"""The messages of a chat request: roles, content parts, images, tool calls, and OpenAI's tool history rule.

See docs/native-api.md#request-body, #images, #tools; docs/openai-front.md#requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._json_values import choices, refuse_unknown_keys, utf8_len
from .errors import RC, HordeError, bad_request, unsupported, unsupported_value
from .limits import MAX_CHAT_MESSAGE_COUNT, MAX_CHAT_TOOL_CALL_COUNT, MAX_CHAT_TOOL_CALL_ID_LENGTH
from .tools import parse_function_object
from .vocab import ChatImageDetail

_BASE_MESSAGE_KEYS = frozenset({"role", "content", "name"})
SUPPORTED_MESSAGE_KEYS: Mapping[str, frozenset[str]] = {
    "system": _BASE_MESSAGE_KEYS,
    "developer": _BASE_MESSAGE_KEYS,
    "user": _BASE_MESSAGE_KEYS,
    "assistant": _BASE_MESSAGE_KEYS | {"tool_calls"},
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
TEXT_PART_KEYS = frozenset({"type", "text"})
IMAGE_PART_KEYS = frozenset({"type", "image_url"})
IMAGE_URL_KEYS = frozenset({"url", "detail"})
TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
TOOL_CALL_FUNCTION_KEYS = frozenset({"name", "arguments"})

EMPTY_MESSAGES_MESSAGE = "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead."
UNANSWERED_TOOL_CALLS_MESSAGE = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
    "'tool_call_id'. The following tool_call_ids did not have response messages: {ids}"
)
ORPHAN_TOOL_MESSAGE = "Invalid parameter: messages with role 'tool' must be a response to a preceding message with 'tool_calls'."
UNKNOWN_TOOL_CALL_ID_MESSAGE = (
    "Invalid parameter: 'tool_call_id' of '{id}' not found in 'tool_calls' of previous message."
)


class MessageStats:
    __slots__ = ("image_bytes", "images", "text_bytes")

    def __init__(self) -> None:
        self.text_bytes = 0
        self.images = 0
        self.image_bytes = 0


def estimate_data_url_bytes(url: str) -> int:
    """Decoded size in bytes of a ``data:...;base64,`` URL, estimated from its payload length."""
    comma = url.find(",")
    payload_length = len(url) - comma - 1
    padding = 2 if url.endswith("==") else 1 if url.endswith("=") else 0
    return max(payload_length * 3 // 4 - padding, 0)


def _parse_image_url(raw: Any, path: str, stats: MessageStats) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise bad_request(path, "has to be an object with url.")
    refuse_unknown_keys(raw, IMAGE_URL_KEYS, path)
    url = raw.get("url")
    if not isinstance(url, str):
        raise bad_request(f"{path}.url", "has to be a string.")
    lowered = url[:16].lower()
    if lowered.startswith("data:image/"):
        head = url[: url.find(",") + 1] if "," in url else ""
        if not head.lower().endswith(";base64,"):
            raise bad_request(f"{path}.url", "has to be a data:image/...;base64, URL or an http(s) URL.")
        stats.image_bytes += estimate_data_url_bytes(url)
    elif not (lowered.startswith("https://") or lowered.startswith("http://")):
        raise bad_request(f"{path}.url", "has to be a data:image/...;base64, URL or an http(s) URL.")
    out: dict[str, Any] = {"url": url}
    detail = raw.get("detail")
    if detail is not None:
        if not isinstance(detail, str) or detail not in ChatImageDetail.__members__:
            raise bad_request(
                f"{path}.detail", f"has to be one of {choices(list(ChatImageDetail.__members__))}."
            )
        out["detail"] = detail
    return out


def _parse_content(raw: Any, path: str, role: str, stats: MessageStats) -> str | list[dict[str, Any]]:
    if isinstance(raw, str):
        stats.text_bytes += utf8_len(raw)
        return raw
    if not isinstance(raw, list):
        raise bad_request(path, "has to be a string or an array of content parts.")
    if not raw:  # OpenAI refuses an empty parts array; a string may be empty
        raise bad_request(path, "has to hold at least one content part; send an empty string for no text.")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(raw):
        part_path = f"{path}[{index}]"
        if not isinstance(part, dict):
            raise bad_request(part_path, "has to be a content part object.")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise bad_request(f"{part_path}.type", "has to be a string.")
        if kind == "text":
            refuse_unknown_keys(part, TEXT_PART_KEYS, part_path)
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request(f"{part_path}.text", "has to be a string.")
            stats.text_bytes += utf8_len(text)
            parts.append({"type": "text", "text": text})
        elif kind == "image_url" and role == "user":
            refuse_unknown_keys(part, IMAGE_PART_KEYS, part_path)
            stats.images += 1
            image_url = _parse_image_url(part.get("image_url"), f"{part_path}.image_url", stats)
            parts.append({"type": "image_url", "image_url": image_url})
        else:
            raise unsupported_value(f"{part_path}.type", kind)
    return parts


def _parse_tool_calls(raw: Any, path: str, stats: MessageStats) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad_request(path, "has to be an array of tool calls.")
    if not raw:
        raise bad_request(path, "has to hold at least one tool call; leave it out for none.")
    if len(raw) > MAX_CHAT_TOOL_CALL_COUNT:
        raise unsupported(
            path, f"holds {len(raw)} tool calls; at most {MAX_CHAT_TOOL_CALL_COUNT} are allowed."
        )
    calls = []
    for index, call in enumerate(raw):
        call_path = f"{path}[{index}]"
        if not isinstance(call, dict):
            raise bad_request(call_path, "has to be a tool call object.")
        refuse_unknown_keys(call, TOOL_CALL_KEYS, call_path)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_CHAT_TOOL_CALL_ID_LENGTH:
            raise bad_request(
                f"{call_path}.id", f"has to be a string of 1 to {MAX_CHAT_TOOL_CALL_ID_LENGTH} characters."
            )
        function = parse_function_object(call, call_path, TOOL_CALL_FUNCTION_KEYS, "name and arguments")
        name = function.get("name")
        arguments = function.get("arguments")
        if not isinstance(name, str):
            raise bad_request(f"{call_path}.function.name", "has to be a string.")
        if not isinstance(arguments, str):
            raise bad_request(f"{call_path}.function.arguments", "has to be a string.")
        stats.text_bytes += utf8_len(name) + utf8_len(arguments)
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls


def _parse_message(raw: Any, index: int, stats: MessageStats) -> dict[str, Any]:
    path = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise bad_request(path, "has to be a message object.")
    if "role" not in raw:
        raise bad_request(f"{path}.role", f"Missing required parameter: '{path}.role'.")
    role = raw["role"]
    if not isinstance(role, str):
        raise bad_request(f"{path}.role", "has to be a string.")
    allowed = SUPPORTED_MESSAGE_KEYS.get(role)
    if allowed is None:
        raise unsupported_value(f"{path}.role", role)
    for key in raw:
        if key not in allowed:
            raise unsupported(f"{path}.{key}", f"{role} messages do not take this key.")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    content = raw.get("content")
    tool_calls = None
    if role == "assistant" and raw.get("tool_calls") is not None:
        tool_calls = _parse_tool_calls(raw["tool_calls"], f"{path}.tool_calls", stats)
    if content is None:
        if tool_calls is None:
            raise bad_request(f"{path}.content", f"Missing required parameter: '{path}.content'.")
        out["content"] = None
    else:
        out["content"] = _parse_content(content, f"{path}.content", role, stats)
    if tool_calls is not None:
        out["tool_calls"] = tool_calls
    name = raw.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise bad_request(f"{path}.name", "has to be a string.")
        out["name"] = name
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_CHAT_TOOL_CALL_ID_LENGTH:
            raise bad_request(
                f"{path}.tool_call_id",
                f"has to be a string of 1 to {MAX_CHAT_TOOL_CALL_ID_LENGTH} characters.",
            )
        out["tool_call_id"] = call_id
    return out


def parse_messages(raw: Any) -> tuple[list[dict[str, Any]], MessageStats]:
    if raw is None:
        raise bad_request("messages", "Missing required parameter: 'messages'.")
    if not isinstance(raw, list):
        raise bad_request("messages", "has to be an array of messages.")
    if not raw:
        raise HordeError(400, RC.BadRequest, EMPTY_MESSAGES_MESSAGE, "messages")
    if len(raw) > MAX_CHAT_MESSAGE_COUNT:
        raise unsupported(
            "messages", f"holds {len(raw)} messages; at most {MAX_CHAT_MESSAGE_COUNT} are allowed."
        )
    stats = MessageStats()
    messages = [_parse_message(message, index, stats) for index, message in enumerate(raw)]
    return messages, stats


def check_tool_history(messages: Sequence[Mapping[str, Any]]) -> None:
    """OpenAI's tool history rule over validated messages (check_tool_history, shared with the front).

    An assistant message with tool_calls is followed at once by tool messages answering each of its ids
    exactly once, in any order; ids within one assistant message are unique; an id may recur in a later
    round. Raises 400 ``UnsupportedChatParameter`` whose message is prefixed with the quoted request path:
    ``messages[i].role`` (unanswered calls, or a tool message without open calls or answering an id twice),
    ``messages[i].tool_call_id`` (an id the preceding assistant did not issue), ``messages[i].tool_calls``
    (a repeated id), ``messages`` (the history ends with calls unanswered). See docs/native-api.md#tools.
    """
    issued: list[str] = []
    answered: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if len(answered) == len(issued) or call_id in answered:
                raise unsupported(f"messages[{index}].role", ORPHAN_TOOL_MESSAGE)
            if call_id not in issued:
                raise unsupported(
                    f"messages[{index}].tool_call_id", UNKNOWN_TOOL_CALL_ID_MESSAGE.format(id=call_id)
                )
            answered.add(call_id)
            continue
        if len(answered) < len(issued):
            missing = ", ".join(i for i in issued if i not in answered)
            raise unsupported(f"messages[{index}].role", UNANSWERED_TOOL_CALLS_MESSAGE.format(ids=missing))
        issued, answered = [], set()
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            seen: set[str] = set()
            for call in calls:
                call_id = call.get("id")
                if call_id in seen:
                    raise unsupported(
                        f"messages[{index}].tool_calls",
                        f"The tool call id '{call_id}' is repeated within one assistant message.",
                    )
                seen.add(call_id)
            issued = [call["id"] for call in calls]
    if len(answered) < len(issued):
        missing = ", ".join(i for i in issued if i not in answered)
        raise unsupported("messages", UNANSWERED_TOOL_CALLS_MESSAGE.format(ids=missing))


def messages_mention_json(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some message text contains the word "json" in any case (the openai_guards rule)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            if "json" in content.lower():
                return True
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text" and "json" in part.get("text", "").lower():
                    return True
    return False
