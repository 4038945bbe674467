"""Gemma's turn template, rendered by the worker (the gemma3-270m GGUF carries no chat template).

Format::

    <start_of_turn>user
    {system text}

    {tool instructions}

    {user text}<end_of_turn>
    <start_of_turn>model
    {assistant text}<end_of_turn>
    <start_of_turn>model          ← generation prompt

Gemma has no system or tool role: system text is folded into the first user turn, tool results become user
turns, an assistant's tool calls become ``<tool_call>{json}</tool_call>`` lines in its turn. Consecutive turns
of one role are merged. The BOS token is added by the tokenizer, not here. Pure functions only.
"""

from __future__ import annotations

import json
import re
from typing import Any

from horde_worker.jobs import message_text

START = "<start_of_turn>"
END = "<end_of_turn>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def tool_instructions(tools: list[dict[str, Any]], forced: bool) -> str:
    """The text that presents the functions to the model."""
    specs = [t.get("function", {}) for t in tools]
    listing = json.dumps(specs, ensure_ascii=False, separators=(",", ":"))
    if forced:
        return f'Call one of these functions by answering with a JSON object {{"name", "arguments"}}.\nFunctions: {listing}'
    return (
        "You may call these functions. To call one, answer with only "
        f'{TOOL_OPEN}{{"name": "<function>", "arguments": {{...}}}}{TOOL_CLOSE}.\nFunctions: {listing}'
    )


def _call_lines(calls: list[dict[str, Any]]) -> str:
    lines = []
    for call in calls:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        try:
            args_value = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            args_value = args
        payload = {"name": fn.get("name"), "arguments": args_value}
        lines.append(f"{TOOL_OPEN}{json.dumps(payload, ensure_ascii=False)}{TOOL_CLOSE}")
    return "\n".join(lines)


def render(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, forced_tools: bool = False
) -> str:
    """Render an OpenAI messages array as a Gemma prompt ending with the model's generation prompt."""
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    names_by_id: dict[str, str] = {}

    def add(role: str, text: str) -> None:
        if turns and turns[-1][0] == role:
            turns[-1] = (role, f"{turns[-1][1]}\n\n{text}")
        else:
            turns.append((role, text))

    for msg in messages:
        role = msg.get("role")
        text = message_text(msg)
        if role in ("system", "developer"):
            system.append(text)
        elif role == "assistant":
            calls = msg.get("tool_calls") or []
            for call in calls:
                names_by_id[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
            parts = [p for p in (text, _call_lines(calls)) if p]
            add("model", "\n".join(parts))
        elif role == "tool":
            call_id = str(msg.get("tool_call_id", ""))
            name = names_by_id.get(call_id, "function")
            add("user", f"Result of {name} ({call_id}):\n{text}")
        else:
            add("user", text)
    preface = [s for s in system if s]
    if tools:
        preface.append(tool_instructions(tools, forced_tools))
    if preface:
        if turns and turns[0][0] == "user":
            turns[0] = ("user", "\n\n".join([*preface, turns[0][1]]))
        else:
            turns.insert(0, ("user", "\n\n".join(preface)))
    out = [f"{START}{role}\n{text}{END}\n" for role, text in turns]
    out.append(f"{START}model\n")
    return "".join(out)


_TOOL_BLOCK = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.DOTALL)


def parse_tool_blocks(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split ``<tool_call>{"name", "arguments"}</tool_call>`` blocks out of free text.

    Returns ``(remaining text, calls)``; a block that is not a JSON object with a string ``name`` is left in
    the text. Calls have no id (the worker mints them).
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            value = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return match.group(0)
        calls.append(call_from_json(value))
        return ""

    rest = _TOOL_BLOCK.sub(take, text)
    return rest.strip() if calls else text, calls


def call_from_json(value: dict[str, Any]) -> dict[str, Any]:
    """``{"name", "arguments"}`` → an OpenAI tool call without id (arguments as compact JSON text)."""
    args = value.get("arguments", {})
    return {
        "type": "function",
        "function": {
            "name": value["name"],
            "arguments": args
            if isinstance(args, str)
            else json.dumps(args, ensure_ascii=False, separators=(",", ":")),
        },
    }


def forced_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of a forced call: ``{"name": <one tool>, "arguments": <its parameters>}``."""
    branches = []
    for tool in tools:
        fn = tool.get("function") or {}
        params = fn.get("parameters") or {"type": "object"}
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn.get("name")}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return branches[0] if len(branches) == 1 else {"anyOf": branches}
