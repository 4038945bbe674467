"""The tool and response format keys of a chat request: their shapes, and the rules between them.

See docs/native-api.md#tools; docs/openai-front.md#requests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._json_values import choices, compact_json, refuse_unknown_keys, utf8_len
from .errors import RC, HordeError, bad_request, conflict, unsupported, unsupported_value
from .extras import forced_function_name
from .limits import (
    MAX_CHAT_SCHEMA_NESTING,
    MAX_CHAT_TOOL_COUNT,
    MAX_CHAT_TOOL_NAME_LENGTH,
    MAX_CHAT_TOOL_SPEC_BYTES,
)
from .schema_rules import schema_nesting_depth, strict_schema_violation

TOOL_KEYS = frozenset({"type", "function"})
TOOL_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
TOOL_CHOICE_KEYS = frozenset({"type", "function"})
TOOL_CHOICE_FUNCTION_KEYS = frozenset({"name"})
_TOOL_CHOICE_VALUES = ("none", "auto", "required")
_RESPONSE_FORMAT_KEYS: Mapping[str, frozenset[str]] = {
    "text": frozenset({"type"}),
    "json_object": frozenset({"type"}),
    "json_schema": frozenset({"type", "json_schema"}),
}
_JSON_SCHEMA_KEYS = frozenset({"name", "schema", "description", "strict"})
_TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

TOOL_CHOICE_WITHOUT_TOOLS_MESSAGE = (
    "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."
)
PARALLEL_TOOL_CALLS_WITHOUT_TOOLS_MESSAGE = "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when 'tools' are specified."


def parse_function_object(
    raw: Mapping[str, Any], path: str, function_keys: frozenset[str], shape: str
) -> dict[str, Any]:
    """The ``function`` object of a tool or a tool call at ``path``.

    Raises 400 BadRequest when ``type`` is not a string, UnsupportedChatParameter when it is not
    ``"function"``, BadRequest (``has to be an object with <shape>.``) when ``function`` is not an object,
    and UnsupportedChatParameter for a key of it outside ``function_keys``.
    """
    kind = raw.get("type")
    if kind != "function":
        if not isinstance(kind, str):
            raise bad_request(f"{path}.type", "has to be 'function'.")
        raise unsupported_value(f"{path}.type", kind)
    function = raw.get("function")
    if not isinstance(function, dict):
        raise bad_request(f"{path}.function", f"has to be an object with {shape}.")
    refuse_unknown_keys(function, function_keys, f"{path}.function")
    return function


def _check_schema_depth(schema: Any, path: str) -> None:
    depth = schema_nesting_depth(schema, MAX_CHAT_SCHEMA_NESTING)
    if depth > MAX_CHAT_SCHEMA_NESTING:
        raise unsupported(
            path, f"the schema nests more than {MAX_CHAT_SCHEMA_NESTING} levels below its root."
        )


def parse_tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_request("tools", "has to be an array of tools.")
    if not raw:
        return None
    if len(raw) > MAX_CHAT_TOOL_COUNT:
        raise unsupported("tools", f"holds {len(raw)} tools; at most {MAX_CHAT_TOOL_COUNT} are allowed.")
    for index, tool in enumerate(raw):
        path = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise bad_request(path, "has to be a tool object.")
        refuse_unknown_keys(tool, TOOL_KEYS, path)
        function = parse_function_object(tool, path, TOOL_FUNCTION_KEYS, "name")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME_RE.fullmatch(name):
            raise bad_request(
                f"{path}.function.name",
                f"has to be 1 to {MAX_CHAT_TOOL_NAME_LENGTH} characters of [A-Za-z0-9_-].",
            )
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"{path}.function.description", "has to be a string.")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad_request(f"{path}.function.parameters", "has to be a JSON schema object.")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(f"{path}.function.strict", "has to be a boolean.")
    return raw


def parse_tool_choice(raw: Any) -> Any:
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw not in _TOOL_CHOICE_VALUES:
            raise bad_request(
                "tool_choice",
                f"Invalid value: '{raw}'. Supported values are: {choices(_TOOL_CHOICE_VALUES)}.",
            )
        return raw
    if not isinstance(raw, dict):
        raise bad_request("tool_choice", "has to be none, auto, required or a function choice object.")
    refuse_unknown_keys(raw, TOOL_CHOICE_KEYS, "tool_choice")
    if raw.get("type") != "function":
        raise bad_request("tool_choice.type", "has to be 'function'.")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise bad_request("tool_choice.function", "has to be an object with name.")
    refuse_unknown_keys(function, TOOL_CHOICE_FUNCTION_KEYS, "tool_choice.function")
    if not isinstance(function.get("name"), str):
        raise bad_request("tool_choice.function.name", "has to be a string.")
    return raw


def parse_response_format(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise bad_request("response_format", "has to be an object with type.")
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise bad_request("response_format.type", "has to be 'text', 'json_object' or 'json_schema'.")
    allowed = _RESPONSE_FORMAT_KEYS.get(kind)
    if allowed is None:
        raise unsupported_value("response_format.type", kind)
    refuse_unknown_keys(raw, allowed, "response_format")
    if kind != "json_schema":
        return raw
    spec = raw.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("response_format.json_schema", "has to be an object with name and schema.")
    refuse_unknown_keys(spec, _JSON_SCHEMA_KEYS, "response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not _TOOL_NAME_RE.fullmatch(name):
        raise bad_request(
            "response_format.json_schema.name", "has to be 1 to 64 characters of [A-Za-z0-9_-]."
        )
    if "schema" not in spec:
        raise bad_request(
            "response_format.json_schema.schema",
            "Missing required parameter: 'response_format.json_schema.schema'.",
        )
    if not isinstance(spec["schema"], dict):
        raise bad_request("response_format.json_schema.schema", "has to be a JSON schema object.")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request("response_format.json_schema.description", "has to be a string.")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request("response_format.json_schema.strict", "has to be a boolean.")
    return raw


def check_tool_contract(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: dict[str, Any] | None,
) -> None:
    """The request rules on validated tool and format shapes (shared with the front), in this order:

    tool_choice or parallel_tool_calls without a non-empty tools (400 ChatRequestConflict, OpenAI's message,
    param the key); a forced function tools does not define (ChatRequestConflict, ``tool_choice``); the
    compact JSON of tools, tool_choice and response_format over MAX_CHAT_TOOL_SPEC_BYTES (400
    UnsupportedChatParameter, ``tools``); a schema nested deeper than MAX_CHAT_SCHEMA_NESTING (at
    ``tools[i].function.parameters`` or ``response_format.json_schema.schema``); a strict schema breaking
    OpenAI's structural rules (OpenAI's message, unprefixed). See docs/native-api.md#tools.
    """
    if not tools:
        if tool_choice is not None:
            raise conflict("tool_choice", TOOL_CHOICE_WITHOUT_TOOLS_MESSAGE, prefix=False)
        if parallel_tool_calls is not None:
            raise conflict("parallel_tool_calls", PARALLEL_TOOL_CALLS_WITHOUT_TOOLS_MESSAGE, prefix=False)
    forced = forced_function_name(tool_choice)
    if forced is not None and not any(tool["function"]["name"] == forced for tool in tools or ()):
        raise conflict(
            "tool_choice",
            f"Invalid value for 'tool_choice': function '{forced}' is not defined in 'tools'.",
            prefix=False,
        )
    spec_bytes = sum(
        utf8_len(compact_json(value)) for value in (tools, tool_choice, response_format) if value is not None
    )
    if spec_bytes > MAX_CHAT_TOOL_SPEC_BYTES:
        raise unsupported(
            "tools",
            f"tools, tool_choice and response_format take {spec_bytes} bytes of JSON; at most "
            f"{MAX_CHAT_TOOL_SPEC_BYTES} are allowed.",
        )
    for index, tool in enumerate(tools or ()):
        function = tool["function"]
        parameters = function.get("parameters")
        if parameters is None:
            continue
        path = f"tools[{index}].function.parameters"
        _check_schema_depth(parameters, path)
        if function.get("strict") is True:
            breach = strict_schema_violation(parameters)
            if breach is not None:
                message = f"Invalid schema for function '{function['name']}': {breach}"
                raise HordeError(400, RC.UnsupportedChatParameter, message, path)
    if response_format is not None and response_format.get("type") == "json_schema":
        spec = response_format["json_schema"]
        path = "response_format.json_schema.schema"
        _check_schema_depth(spec["schema"], path)
        if spec.get("strict") is True:
            breach = strict_schema_violation(spec["schema"])
            if breach is not None:
                message = f"Invalid schema for response_format '{spec['name']}': {breach}"
                raise HordeError(400, RC.UnsupportedChatParameter, message, path)
