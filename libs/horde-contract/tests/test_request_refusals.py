"""Every refusal of parse_chat_request: status, rc, param path and message (docs/native-api.md#request-body
through #refused-keys-and-values, #images, #tools; docs/openai-front.md#requests)."""

from __future__ import annotations

import copy
from typing import Any

import horde_contract as hc
import pytest

U = "UnsupportedChatParameter"
B = "BadRequest"
C = "ChatRequestConflict"
NOT_SUPPORTED = "this parameter is not supported on chat requests."
VALUE_NOT_SUPPORTED = "this value is not supported on chat requests."
USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def body(**overrides: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "messages": [dict(USER)]}
    for key, value in overrides.items():
        if value is ...:
            out.pop(key, None)
        else:
            out[key] = copy.deepcopy(value)
    return out


def msgs(*messages: dict[str, Any]) -> dict[str, Any]:
    return body(messages=list(messages))


def user_parts(*parts: Any) -> dict[str, Any]:
    return msgs({"role": "user", "content": list(parts)})


def image(url: str = "https://example.com/a.png", **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def assistant_calls(calls: Any) -> dict[str, Any]:
    return msgs(USER, {"role": "assistant", "tool_calls": calls})


def deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def with_tool(function: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return body(tools=[{"type": "function", "function": function}], **extra)


def horde(**options: Any) -> dict[str, Any]:
    return body(horde=options)


def js(schema: Any = None, **extra: Any) -> dict[str, Any]:
    spec = {"name": "colour", "schema": {"type": "object"} if schema is None else schema, **extra}
    return body(response_format={"type": "json_schema", "json_schema": spec})


BIG = "x" * (hc.MAX_CHAT_TEXT_BYTES // 2)
OK_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string"}},
    "required": ["a"],
    "additionalProperties": False,
}

# (id, body, status, rc, param, message)
CASES: list[tuple[str, Any, int, str, str | None, str]] = [
    ("body-not-object", [], 400, B, None, "The request body has to be a JSON object."),
    *[
        (f"unknown-{key}", body(**{key: 1}), 400, U, key, f"'{key}': {NOT_SUPPORTED}")
        for key in (
            "logprobs",
            "top_logprobs",
            "logit_bias",
            "modalities",
            "audio",
            "prediction",
            "functions",
            "top_k",
        )
    ],
    # model / models
    (
        "model-and-models",
        body(models=["m"]),
        400,
        C,
        "models",
        "'models': send exactly one of 'model' and 'models'.",
    ),
    (
        "neither-model",
        body(model=...),
        400,
        B,
        "model",
        "'model': a chat request sends exactly one of 'model' and 'models'.",
    ),
    (
        "null-model",
        body(model=None),
        400,
        B,
        "model",
        "'model': a chat request sends exactly one of 'model' and 'models'.",
    ),
    ("model-empty", body(model=""), 400, B, "model", "'model': has to be a non-empty string."),
    ("model-type", body(model=5), 400, B, "model", "'model': has to be a non-empty string."),
    (
        "models-type",
        body(model=..., models="m"),
        400,
        B,
        "models",
        "'models': has to be an array of model names.",
    ),
    (
        "models-empty",
        body(model=..., models=[]),
        400,
        B,
        "models",
        "'models': has to list at least one model.",
    ),
    (
        "models-empty-entry",
        body(model=..., models=["a", ""]),
        400,
        B,
        "models[1]",
        "'models[1]': has to be a non-empty string.",
    ),
    (
        "models-entry-type",
        body(model=..., models=[1]),
        400,
        B,
        "models[0]",
        "'models[0]': has to be a non-empty string.",
    ),
    (
        "models-duplicate",
        body(model=..., models=["a", "b", "a"]),
        400,
        B,
        "models[2]",
        "'models[2]': lists the model 'a' twice.",
    ),
    (
        "models-six",
        body(model=..., models=list("abcdef")),
        400,
        B,
        "models",
        "'models': lists 6 models; at most 5 are allowed.",
    ),
    # messages
    (
        "messages-missing",
        body(messages=...),
        400,
        B,
        "messages",
        "'messages': Missing required parameter: 'messages'.",
    ),
    ("messages-type", body(messages="hi"), 400, B, "messages", "'messages': has to be an array of messages."),
    ("messages-empty", body(messages=[]), 400, B, "messages", hc.messages.EMPTY_MESSAGES_MESSAGE),
    (
        "messages-over-cap",
        body(messages=[USER] * 1025),
        400,
        U,
        "messages",
        "'messages': holds 1025 messages; at most 1024 are allowed.",
    ),
    ("message-type", msgs("hi"), 400, B, "messages[0]", "'messages[0]': has to be a message object."),  # type: ignore[arg-type]
    (
        "role-missing",
        msgs({"content": "x"}),
        400,
        B,
        "messages[0].role",
        "'messages[0].role': Missing required parameter: 'messages[0].role'.",
    ),
    (
        "role-type",
        msgs({"role": 1, "content": "x"}),
        400,
        B,
        "messages[0].role",
        "'messages[0].role': has to be a string.",
    ),
    (
        "role-function",
        msgs({"role": "function", "content": "x"}),
        400,
        U,
        "messages[0].role",
        f"'messages[0].role=function': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "tool-calls-on-user",
        msgs({"role": "user", "content": "x", "tool_calls": [CALL]}),
        400,
        U,
        "messages[0].tool_calls",
        "'messages[0].tool_calls': user messages do not take this key.",
    ),
    (
        "name-on-tool",
        msgs(
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "r", "name": "n"},
        ),
        400,
        U,
        "messages[2].name",
        "'messages[2].name': tool messages do not take this key.",
    ),
    (
        "refusal-key",
        msgs({"role": "assistant", "content": "x", "refusal": None}),
        400,
        U,
        "messages[0].refusal",
        "'messages[0].refusal': assistant messages do not take this key.",
    ),
    (
        "content-missing",
        msgs({"role": "user"}),
        400,
        B,
        "messages[0].content",
        "'messages[0].content': Missing required parameter: 'messages[0].content'.",
    ),
    (
        "assistant-no-content",
        msgs(USER, {"role": "assistant"}),
        400,
        B,
        "messages[1].content",
        "'messages[1].content': Missing required parameter: 'messages[1].content'.",
    ),
    (
        "content-empty-parts",
        msgs({"role": "user", "content": []}),
        400,
        B,
        "messages[0].content",
        "'messages[0].content': has to hold at least one content part; send an empty string for no text.",
    ),
    (
        "content-type",
        msgs({"role": "user", "content": 5}),
        400,
        B,
        "messages[0].content",
        "'messages[0].content': has to be a string or an array of content parts.",
    ),
    (
        "part-type",
        user_parts("x"),
        400,
        B,
        "messages[0].content[0]",
        "'messages[0].content[0]': has to be a content part object.",
    ),
    (
        "part-no-type",
        user_parts({"text": "x"}),
        400,
        B,
        "messages[0].content[0].type",
        "'messages[0].content[0].type': has to be a string.",
    ),
    (
        "part-input-audio",
        user_parts({"type": "text", "text": "a"}, {"type": "input_audio"}),
        400,
        U,
        "messages[0].content[1].type",
        f"'messages[0].content[1].type=input_audio': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "image-on-assistant",
        msgs(USER, {"role": "assistant", "content": [image()]}),
        400,
        U,
        "messages[1].content[0].type",
        f"'messages[1].content[0].type=image_url': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "image-on-system",
        msgs({"role": "system", "content": [image()]}, USER),
        400,
        U,
        "messages[0].content[0].type",
        f"'messages[0].content[0].type=image_url': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "image-on-tool",
        msgs(
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": [image()]},
        ),
        400,
        U,
        "messages[2].content[0].type",
        f"'messages[2].content[0].type=image_url': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "text-part-key",
        user_parts({"type": "text", "text": "a", "cache_control": {}}),
        400,
        U,
        "messages[0].content[0].cache_control",
        f"'messages[0].content[0].cache_control': {NOT_SUPPORTED}",
    ),
    (
        "text-part-text",
        user_parts({"type": "text", "text": 5}),
        400,
        B,
        "messages[0].content[0].text",
        "'messages[0].content[0].text': has to be a string.",
    ),
    (
        "image-part-key",
        user_parts({**image(), "x": 1}),
        400,
        U,
        "messages[0].content[0].x",
        f"'messages[0].content[0].x': {NOT_SUPPORTED}",
    ),
    (
        "image-url-type",
        user_parts({"type": "image_url", "image_url": "https://a/b.png"}),
        400,
        B,
        "messages[0].content[0].image_url",
        "'messages[0].content[0].image_url': has to be an object with url.",
    ),
    (
        "image-url-key",
        user_parts(image(size=1)),
        400,
        U,
        "messages[0].content[0].image_url.size",
        f"'messages[0].content[0].image_url.size': {NOT_SUPPORTED}",
    ),
    (
        "image-url-url-type",
        user_parts({"type": "image_url", "image_url": {"url": 5}}),
        400,
        B,
        "messages[0].content[0].image_url.url",
        "'messages[0].content[0].image_url.url': has to be a string.",
    ),
    (
        "image-url-ftp",
        user_parts(image("ftp://a/b.png")),
        400,
        B,
        "messages[0].content[0].image_url.url",
        "'messages[0].content[0].image_url.url': has to be a data:image/...;base64, URL or an http(s) URL.",
    ),
    (
        "image-url-data-text",
        user_parts(image("data:text/plain;base64,AAAA")),
        400,
        B,
        "messages[0].content[0].image_url.url",
        "'messages[0].content[0].image_url.url': has to be a data:image/...;base64, URL or an http(s) URL.",
    ),
    (
        "image-url-not-base64",
        user_parts(image("data:image/png,AAAA")),
        400,
        B,
        "messages[0].content[0].image_url.url",
        "'messages[0].content[0].image_url.url': has to be a data:image/...;base64, URL or an http(s) URL.",
    ),
    (
        "image-url-no-comma",
        user_parts(image("data:image/png;base64")),
        400,
        B,
        "messages[0].content[0].image_url.url",
        "'messages[0].content[0].image_url.url': has to be a data:image/...;base64, URL or an http(s) URL.",
    ),
    (
        "image-detail",
        user_parts(image(detail="ultra")),
        400,
        B,
        "messages[0].content[0].image_url.detail",
        "'messages[0].content[0].image_url.detail': has to be one of 'auto', 'low', and 'high'.",
    ),
    (
        "name-type",
        msgs({"role": "user", "content": "x", "name": 5}),
        400,
        B,
        "messages[0].name",
        "'messages[0].name': has to be a string.",
    ),
    (
        "tool-calls-empty",
        assistant_calls([]),
        400,
        B,
        "messages[1].tool_calls",
        "'messages[1].tool_calls': has to hold at least one tool call; leave it out for none.",
    ),
    (
        "tool-calls-type",
        assistant_calls("x"),
        400,
        B,
        "messages[1].tool_calls",
        "'messages[1].tool_calls': has to be an array of tool calls.",
    ),
    (
        "tool-calls-over-cap",
        assistant_calls([{**CALL, "id": f"c{i}"} for i in range(129)]),
        400,
        U,
        "messages[1].tool_calls",
        "'messages[1].tool_calls': holds 129 tool calls; at most 128 are allowed.",
    ),
    (
        "tool-call-type",
        assistant_calls(["x"]),
        400,
        B,
        "messages[1].tool_calls[0]",
        "'messages[1].tool_calls[0]': has to be a tool call object.",
    ),
    (
        "tool-call-key",
        assistant_calls([{**CALL, "index": 0}]),
        400,
        U,
        "messages[1].tool_calls[0].index",
        f"'messages[1].tool_calls[0].index': {NOT_SUPPORTED}",
    ),
    (
        "tool-call-id",
        assistant_calls([{**CALL, "id": ""}]),
        400,
        B,
        "messages[1].tool_calls[0].id",
        "'messages[1].tool_calls[0].id': has to be a string of 1 to 256 characters.",
    ),
    (
        "tool-call-id-long",
        assistant_calls([{**CALL, "id": "x" * 257}]),
        400,
        B,
        "messages[1].tool_calls[0].id",
        "'messages[1].tool_calls[0].id': has to be a string of 1 to 256 characters.",
    ),
    (
        "tool-call-custom",
        assistant_calls([{**CALL, "type": "custom"}]),
        400,
        U,
        "messages[1].tool_calls[0].type",
        f"'messages[1].tool_calls[0].type=custom': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "tool-call-type-type",
        assistant_calls([{**CALL, "type": 1}]),
        400,
        B,
        "messages[1].tool_calls[0].type",
        "'messages[1].tool_calls[0].type': has to be 'function'.",
    ),
    (
        "tool-call-function",
        assistant_calls([{**CALL, "function": "f"}]),
        400,
        B,
        "messages[1].tool_calls[0].function",
        "'messages[1].tool_calls[0].function': has to be an object with name and arguments.",
    ),
    (
        "tool-call-function-key",
        assistant_calls([{**CALL, "function": {"name": "f", "arguments": "{}", "parsed_arguments": {}}}]),
        400,
        U,
        "messages[1].tool_calls[0].function.parsed_arguments",
        f"'messages[1].tool_calls[0].function.parsed_arguments': {NOT_SUPPORTED}",
    ),
    (
        "tool-call-name",
        assistant_calls([{**CALL, "function": {"name": 1, "arguments": "{}"}}]),
        400,
        B,
        "messages[1].tool_calls[0].function.name",
        "'messages[1].tool_calls[0].function.name': has to be a string.",
    ),
    (
        "tool-call-arguments",
        assistant_calls([{**CALL, "function": {"name": "f", "arguments": {}}}]),
        400,
        B,
        "messages[1].tool_calls[0].function.arguments",
        "'messages[1].tool_calls[0].function.arguments': has to be a string.",
    ),
    (
        "tool-call-id-missing",
        msgs(USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "r"}),
        400,
        B,
        "messages[2].tool_call_id",
        "'messages[2].tool_call_id': has to be a string of 1 to 256 characters.",
    ),
    # token limits and sampling
    (
        "max-tokens-differ",
        body(max_tokens=100, max_completion_tokens=200),
        400,
        C,
        "max_completion_tokens",
        "'max_completion_tokens': max_tokens and max_completion_tokens may be sent only with equal values.",
    ),
    (
        "max-tokens-floor",
        body(max_tokens=15),
        400,
        B,
        "max_tokens",
        "'max_tokens': Input payload validation failed: max_length: Input should be greater than or equal to 16",
    ),
    (
        "max-tokens-type",
        body(max_tokens="100"),
        400,
        B,
        "max_tokens",
        "'max_tokens': Input payload validation failed: max_length: Input should be a valid integer",
    ),
    (
        "max-tokens-bool",
        body(max_tokens=True),
        400,
        B,
        "max_tokens",
        "'max_tokens': Input payload validation failed: max_length: Input should be a valid integer",
    ),
    (
        "max-completion-tokens-cap",
        body(max_completion_tokens=16385),
        400,
        B,
        "max_completion_tokens",
        "'max_completion_tokens': Input payload validation failed: max_length: Input should be less than or equal to 16384",
    ),
    (
        "temperature-range",
        body(temperature=5.5),
        400,
        B,
        "temperature",
        "'temperature': Input payload validation failed: temperature: Input should be less than or equal to 5",
    ),
    (
        "temperature-type",
        body(temperature="1"),
        400,
        B,
        "temperature",
        "'temperature': Input payload validation failed: temperature: Input should be a valid number",
    ),
    (
        "temperature-nan",
        body(temperature=float("nan")),
        400,
        B,
        "temperature",
        "'temperature': has to be a finite number.",
    ),
    (
        "top-p-zero",
        body(top_p=0),
        400,
        B,
        "top_p",
        "'top_p': Input payload validation failed: top_p: Input should be greater than or equal to 0.001",
    ),
    (
        "frequency-penalty",
        body(frequency_penalty=2.5),
        400,
        B,
        "frequency_penalty",
        "'frequency_penalty': Input payload validation failed: frequency_penalty: Input should be less than or equal to 2",
    ),
    (
        "presence-penalty",
        body(presence_penalty=-3),
        400,
        B,
        "presence_penalty",
        "'presence_penalty': Input payload validation failed: presence_penalty: Input should be greater than or equal to -2",
    ),
    (
        "seed-float",
        body(seed=1.5),
        400,
        B,
        "seed",
        "'seed': Input payload validation failed: seed: Input should be a valid integer",
    ),
    (
        "seed-bool",
        body(seed=True),
        400,
        B,
        "seed",
        "'seed': Input payload validation failed: seed: Input should be a valid integer",
    ),
    (
        "reasoning-effort",
        body(reasoning_effort="max"),
        400,
        B,
        "reasoning_effort",
        "'reasoning_effort': Input payload validation failed: reasoning_effort: Input should be 'none', 'minimal', 'low', 'medium', 'high' or 'xhigh'",
    ),
    (
        "reasoning-effort-type",
        body(reasoning_effort=1),
        400,
        B,
        "reasoning_effort",
        "'reasoning_effort': Input payload validation failed: reasoning_effort: Input should be 'none', 'minimal', 'low', 'medium', 'high' or 'xhigh'",
    ),
    ("stop-type", body(stop=5), 400, B, "stop", "'stop': has to be a string or an array of strings."),
    (
        "stop-entry",
        body(stop=["a", 1]),
        400,
        B,
        "stop[1]",
        "'stop[1]': Input payload validation failed: stop_sequence.1: Input should be a valid string",
    ),
    (
        "stop-too-many",
        body(stop=[f"s{i}" for i in range(129)]),
        400,
        "TooManyStopSequences",
        "stop",
        "Too many stop sequences: 129 distinct, at most 128.",
    ),
    (
        "stop-too-long",
        body(stop=["x" * 1001, "y" * 1000]),
        400,
        "ExcessiveStopSequence",
        "stop",
        "The stop sequences total 2001 characters, at most 2000.",
    ),
    (
        "max-context-range",
        horde(max_context_length=50),
        400,
        B,
        "horde.max_context_length",
        "'horde.max_context_length': Input payload validation failed: max_context_length: Input should be greater than or equal to 80",
    ),
    ("n-two", body(n=2), 400, U, "n", f"'n=2': {VALUE_NOT_SUPPORTED}"),
    ("n-zero", body(n=0), 400, U, "n", f"'n=0': {VALUE_NOT_SUPPORTED}"),
    ("n-type", body(n="1"), 400, B, "n", "'n': has to be an integer."),
    ("stream-type", body(stream="yes"), 400, B, "stream", "'stream': has to be a boolean."),
    (
        "stream-options-type",
        body(stream_options=1),
        400,
        B,
        "stream_options",
        "'stream_options': has to be an object.",
    ),
    ("metadata-type", body(metadata=[]), 400, B, "metadata", "'metadata': has to be an object."),
    ("user-type", body(user=5), 400, B, "user", "'user': has to be a string."),
    # tools
    ("tools-type", body(tools="x"), 400, B, "tools", "'tools': has to be an array of tools."),
    (
        "tools-over-cap",
        body(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]),
        400,
        U,
        "tools",
        "'tools': holds 129 tools; at most 128 are allowed.",
    ),
    ("tool-type", body(tools=["x"]), 400, B, "tools[0]", "'tools[0]': has to be a tool object."),
    ("tool-key", body(tools=[{**TOOL, "x": 1}]), 400, U, "tools[0].x", f"'tools[0].x': {NOT_SUPPORTED}"),
    (
        "tool-kind",
        body(tools=[{**TOOL, "type": "web_search"}]),
        400,
        U,
        "tools[0].type",
        f"'tools[0].type=web_search': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "tool-kind-missing",
        body(tools=[{"function": {"name": "f"}}]),
        400,
        B,
        "tools[0].type",
        "'tools[0].type': has to be 'function'.",
    ),
    (
        "tool-function",
        body(tools=[{"type": "function"}]),
        400,
        B,
        "tools[0].function",
        "'tools[0].function': has to be an object with name.",
    ),
    (
        "tool-function-key",
        with_tool({"name": "f", "x": 1}),
        400,
        U,
        "tools[0].function.x",
        f"'tools[0].function.x': {NOT_SUPPORTED}",
    ),
    (
        "tool-name-pattern",
        with_tool({"name": "get weather"}),
        400,
        B,
        "tools[0].function.name",
        "'tools[0].function.name': has to be 1 to 64 characters of [A-Za-z0-9_-].",
    ),
    (
        "tool-name-long",
        with_tool({"name": "f" * 65}),
        400,
        B,
        "tools[0].function.name",
        "'tools[0].function.name': has to be 1 to 64 characters of [A-Za-z0-9_-].",
    ),
    (
        "tool-name-missing",
        with_tool({"description": "d"}),
        400,
        B,
        "tools[0].function.name",
        "'tools[0].function.name': has to be 1 to 64 characters of [A-Za-z0-9_-].",
    ),
    (
        "tool-description",
        with_tool({"name": "f", "description": 5}),
        400,
        B,
        "tools[0].function.description",
        "'tools[0].function.description': has to be a string.",
    ),
    (
        "tool-parameters",
        with_tool({"name": "f", "parameters": []}),
        400,
        B,
        "tools[0].function.parameters",
        "'tools[0].function.parameters': has to be a JSON schema object.",
    ),
    (
        "tool-strict",
        with_tool({"name": "f", "strict": "yes"}),
        400,
        B,
        "tools[0].function.strict",
        "'tools[0].function.strict': has to be a boolean.",
    ),
    (
        "tool-choice-value",
        body(tools=[TOOL], tool_choice="any"),
        400,
        B,
        "tool_choice",
        "'tool_choice': Invalid value: 'any'. Supported values are: 'none', 'auto', and 'required'.",
    ),
    (
        "tool-choice-type",
        body(tools=[TOOL], tool_choice=5),
        400,
        B,
        "tool_choice",
        "'tool_choice': has to be none, auto, required or a function choice object.",
    ),
    (
        "tool-choice-key",
        body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}, "x": 1}),
        400,
        U,
        "tool_choice.x",
        f"'tool_choice.x': {NOT_SUPPORTED}",
    ),
    (
        "tool-choice-kind",
        body(tools=[TOOL], tool_choice={"type": "tool", "function": {"name": "f"}}),
        400,
        B,
        "tool_choice.type",
        "'tool_choice.type': has to be 'function'.",
    ),
    (
        "tool-choice-function",
        body(tools=[TOOL], tool_choice={"type": "function"}),
        400,
        B,
        "tool_choice.function",
        "'tool_choice.function': has to be an object with name.",
    ),
    (
        "tool-choice-function-key",
        body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f", "x": 1}}),
        400,
        U,
        "tool_choice.function.x",
        f"'tool_choice.function.x': {NOT_SUPPORTED}",
    ),
    (
        "tool-choice-name",
        body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": 1}}),
        400,
        B,
        "tool_choice.function.name",
        "'tool_choice.function.name': has to be a string.",
    ),
    (
        "tool-choice-without-tools",
        body(tool_choice="auto"),
        400,
        C,
        "tool_choice",
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
    ),
    (
        "tool-choice-none-without-tools",
        body(tool_choice="none"),
        400,
        C,
        "tool_choice",
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
    ),
    (
        "tool-choice-empty-tools",
        body(tools=[], tool_choice="required"),
        400,
        C,
        "tool_choice",
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
    ),
    (
        "parallel-without-tools",
        body(parallel_tool_calls=False),
        400,
        C,
        "parallel_tool_calls",
        "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when 'tools' are specified.",
    ),
    (
        "forced-undefined",
        body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        400,
        C,
        "tool_choice",
        "Invalid value for 'tool_choice': function 'g' is not defined in 'tools'.",
    ),
    (
        "parallel-type",
        body(tools=[TOOL], parallel_tool_calls="no"),
        400,
        B,
        "parallel_tool_calls",
        "'parallel_tool_calls': has to be a boolean.",
    ),
    # response_format
    (
        "format-type",
        body(response_format="json"),
        400,
        B,
        "response_format",
        "'response_format': has to be an object with type.",
    ),
    (
        "format-kind-missing",
        body(response_format={}),
        400,
        B,
        "response_format.type",
        "'response_format.type': has to be 'text', 'json_object' or 'json_schema'.",
    ),
    (
        "format-kind",
        body(response_format={"type": "grammar"}),
        400,
        U,
        "response_format.type",
        f"'response_format.type=grammar': {VALUE_NOT_SUPPORTED}",
    ),
    (
        "format-key",
        body(response_format={"type": "json_object", "schema": {}}),
        400,
        U,
        "response_format.schema",
        f"'response_format.schema': {NOT_SUPPORTED}",
    ),
    (
        "format-json-schema-missing",
        body(response_format={"type": "json_schema"}),
        400,
        B,
        "response_format.json_schema",
        "'response_format.json_schema': has to be an object with name and schema.",
    ),
    (
        "format-json-schema-key",
        js(schema_={}),
        400,
        U,
        "response_format.json_schema.schema_",
        f"'response_format.json_schema.schema_': {NOT_SUPPORTED}",
    ),
    (
        "format-name",
        body(response_format={"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
        400,
        B,
        "response_format.json_schema.name",
        "'response_format.json_schema.name': has to be 1 to 64 characters of [A-Za-z0-9_-].",
    ),
    (
        "format-schema-missing",
        body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        B,
        "response_format.json_schema.schema",
        "'response_format.json_schema.schema': Missing required parameter: 'response_format.json_schema.schema'.",
    ),
    (
        "format-schema-type",
        js(schema=True),
        400,
        B,
        "response_format.json_schema.schema",
        "'response_format.json_schema.schema': has to be a JSON schema object.",
    ),
    (
        "format-description",
        js(description=5),
        400,
        B,
        "response_format.json_schema.description",
        "'response_format.json_schema.description': has to be a string.",
    ),
    (
        "format-strict",
        js(strict="yes"),
        400,
        B,
        "response_format.json_schema.strict",
        "'response_format.json_schema.strict': has to be a boolean.",
    ),
    # caps and schema structure
    (
        "tool-spec-bytes",
        body(tools=[{"type": "function", "function": {"name": "f", "description": "d" * (256 * 1024)}}]),
        400,
        U,
        "tools",
        "'tools': tools, tool_choice and response_format take 262206 bytes of JSON; at most 262144 are allowed.",
    ),
    (
        "tool-nesting",
        with_tool({"name": "f", "parameters": deep(11)}),
        400,
        U,
        "tools[0].function.parameters",
        "'tools[0].function.parameters': the schema nests more than 10 levels below its root.",
    ),
    (
        "format-nesting",
        js(schema=deep(11)),
        400,
        U,
        "response_format.json_schema.schema",
        "'response_format.json_schema.schema': the schema nests more than 10 levels below its root.",
    ),
    (
        "format-nesting-items",
        js(schema={"type": "array", "items": {"anyOf": [deep(10)]}}),
        400,
        U,
        "response_format.json_schema.schema",
        "'response_format.json_schema.schema': the schema nests more than 10 levels below its root.",
    ),
    (
        "strict-tool-root",
        with_tool(
            {"name": "get_weather", "strict": True, "parameters": {"type": "object", "properties": {}}}
        ),
        400,
        U,
        "tools[0].function.parameters",
        "Invalid schema for function 'get_weather': In context=(), 'additionalProperties' is required to be supplied and to be false.",
    ),
    (
        "strict-format-nested",
        js(
            schema={
                "type": "object",
                "properties": {"shade": {"type": "object", "properties": {}}},
                "required": ["shade"],
                "additionalProperties": False,
            },
            strict=True,
        ),
        400,
        U,
        "response_format.json_schema.schema",
        "Invalid schema for response_format 'colour': In context=('properties', 'shade'), 'additionalProperties' is required to be supplied and to be false.",
    ),
    (
        "strict-format-required",
        js(
            schema={
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            strict=True,
        ),
        400,
        U,
        "response_format.json_schema.schema",
        "Invalid schema for response_format 'colour': In context=(), 'required' is required to be supplied and to be an array including every key in properties. Missing 'b'.",
    ),
    (
        "strict-format-defs",
        js(
            schema={**OK_SCHEMA, "$defs": {"d": {"type": "object", "additionalProperties": True}}},
            strict=True,
        ),
        400,
        U,
        "response_format.json_schema.schema",
        "Invalid schema for response_format 'colour': In context=('$defs', 'd'), 'additionalProperties' is required to be supplied and to be false.",
    ),
    (
        "strict-format-anyof-items",
        js(
            schema={
                **OK_SCHEMA,
                "properties": {
                    "a": {
                        "type": "array",
                        "items": {
                            "anyOf": [
                                {"type": "string"},
                                {
                                    "type": ["object", "null"],
                                    "properties": {"x": {}},
                                    "additionalProperties": False,
                                },
                            ]
                        },
                    }
                },
            },
            strict=True,
        ),
        400,
        U,
        "response_format.json_schema.schema",
        "Invalid schema for response_format 'colour': In context=('properties', 'a', 'items', 'anyOf', 1), 'required' is required to be supplied and to be an array including every key in properties. Missing 'x'.",
    ),
    # horde
    ("horde-type", body(horde=[]), 400, B, "horde", "'horde': has to be an object."),
    ("horde-unknown", horde(models=["x"]), 400, U, "horde.models", "'horde.models': unknown horde option."),
    (
        "horde-only-ignore",
        horde(only=["w1"], ignore=["w2"]),
        400,
        C,
        "horde.ignore",
        "'horde.ignore': cannot be combined with horde.only.",
    ),
    (
        "horde-only-empty",
        horde(only=[]),
        400,
        B,
        "horde.only",
        "'horde.only': has to list at least one worker id.",
    ),
    (
        "horde-only-type",
        horde(only="w1"),
        400,
        B,
        "horde.only",
        "'horde.only': has to be an array of worker ids.",
    ),
    (
        "horde-ignore-entry",
        horde(ignore=[""]),
        400,
        B,
        "horde.ignore",
        "'horde.ignore': has to be an array of worker ids.",
    ),
    (
        "horde-bool",
        horde(trusted_workers="yes"),
        400,
        B,
        "horde.trusted_workers",
        "'horde.trusted_workers': has to be a boolean.",
    ),
    ("horde-dry-run", horde(dry_run=1), 400, B, "horde.dry_run", "'horde.dry_run': has to be a boolean."),
    (
        "horde-max-context",
        horde(max_context_length=0),
        400,
        B,
        "horde.max_context_length",
        "'horde.max_context_length': has to be a positive integer.",
    ),
    (
        "horde-max-kudos",
        horde(max_kudos=-1),
        400,
        B,
        "horde.max_kudos",
        "'horde.max_kudos': has to be a positive integer.",
    ),
    (
        "horde-max-kudos-float",
        horde(max_kudos=1.5),
        400,
        B,
        "horde.max_kudos",
        "'horde.max_kudos': has to be a positive integer.",
    ),
    (
        "horde-context-fit-ignore",
        horde(context_fit="ignore"),
        400,
        B,
        "horde.context_fit",
        "'horde.context_fit': has to be one of 'grow', 'reject', and 'truncate_oldest'.",
    ),
    (
        "horde-conformance",
        horde(conformance="lenient"),
        400,
        B,
        "horde.conformance",
        "'horde.conformance': has to be one of 'strict', and 'best_effort'.",
    ),
    (
        "horde-availability",
        horde(availability_mode=1),
        400,
        B,
        "horde.availability_mode",
        "'horde.availability_mode': has to be one of 'wait', and 'fail_fast'.",
    ),
    (
        "horde-operation-key",
        horde(operation_key="not-a-uuid"),
        400,
        B,
        "horde.operation_key",
        "'horde.operation_key': has to be a UUID.",
    ),
    (
        "horde-operation-key-type",
        horde(operation_key=5),
        400,
        B,
        "horde.operation_key",
        "'horde.operation_key': has to be a UUID.",
    ),
    # text and image caps
    (
        "text-bytes",
        msgs(
            {"role": "user", "content": BIG},
            {"role": "assistant", "content": BIG},
            {"role": "user", "content": "x"},
        ),
        400,
        U,
        "messages",
        f"'messages': the message text takes {hc.MAX_CHAT_TEXT_BYTES + 1} bytes of UTF-8; at most {hc.MAX_CHAT_TEXT_BYTES} are allowed.",
    ),
    (
        "text-bytes-multibyte",
        msgs({"role": "user", "content": "é" * (hc.MAX_CHAT_TEXT_BYTES // 2) + "x"}),
        400,
        U,
        "messages",
        f"'messages': the message text takes {hc.MAX_CHAT_TEXT_BYTES + 1} bytes of UTF-8; at most {hc.MAX_CHAT_TEXT_BYTES} are allowed.",
    ),
    (
        "text-bytes-tool-args",
        msgs(
            {"role": "user", "content": BIG},
            {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": BIG}}]},
            {"role": "tool", "tool_call_id": "c1", "content": ""},
        ),
        400,
        U,
        "messages",
        f"'messages': the message text takes {hc.MAX_CHAT_TEXT_BYTES + 1} bytes of UTF-8; at most {hc.MAX_CHAT_TEXT_BYTES} are allowed.",
    ),
    (
        "images-21",
        user_parts(*[image() for _ in range(21)]),
        400,
        "TooManyExtraSourceImages",
        "messages",
        "'messages': the request carries 21 images; at most 20 are allowed.",
    ),
    (
        "images-total",
        user_parts(*[image("data:image/png;base64," + "A" * (7 * 1024 * 1024)) for _ in range(5)]),
        400,
        "SourceImageSizeExceeded",
        "messages",
        "The request's images total 27525120 bytes, above the cap of 26214400 bytes.",
    ),
    # openai_guards
    (
        "guards-json-object",
        body(response_format={"type": "json_object"}, horde={"openai_guards": True}),
        400,
        C,
        "messages",
        "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.",
    ),
]


@pytest.mark.parametrize(
    ("case", "payload", "status", "rc", "param", "message"), CASES, ids=[c[0] for c in CASES]
)
def test_refusal(
    case: str, payload: Any, status: int, rc: str, param: str | None, message: str, refusal: Any
) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(payload)
    refusal(info.value, status, rc, param, message)


def test_case_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


HISTORY_CALLS = [CALL, {**CALL, "id": "c2"}]
UNANSWERED = hc.messages.UNANSWERED_TOOL_CALLS_MESSAGE
ORPHAN = hc.messages.ORPHAN_TOOL_MESSAGE


def tool_reply(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "r"}


HISTORY_CASES = [
    (
        "other-message-while-unanswered",
        [USER, {"role": "assistant", "tool_calls": HISTORY_CALLS}, tool_reply("c1"), USER],
        "messages[3].role",
        UNANSWERED.format(ids="c2"),
    ),
    (
        "tool-without-open-calls",
        [USER, tool_reply("c1")],
        "messages[1].role",
        ORPHAN,
    ),
    (
        "tool-after-all-answered",
        [USER, {"role": "assistant", "tool_calls": [CALL]}, tool_reply("c1"), tool_reply("c1")],
        "messages[3].role",
        ORPHAN,
    ),
    (
        "second-answer-while-open",
        [USER, {"role": "assistant", "tool_calls": HISTORY_CALLS}, tool_reply("c1"), tool_reply("c1")],
        "messages[3].role",
        ORPHAN,
    ),
    (
        "unknown-id",
        [USER, {"role": "assistant", "tool_calls": [CALL]}, tool_reply("zz")],
        "messages[2].tool_call_id",
        "Invalid parameter: 'tool_call_id' of 'zz' not found in 'tool_calls' of previous message.",
    ),
    (
        "repeated-id",
        [USER, {"role": "assistant", "tool_calls": [CALL, CALL]}, tool_reply("c1")],
        "messages[1].tool_calls",
        "The tool call id 'c1' is repeated within one assistant message.",
    ),
    (
        "ends-unanswered",
        [USER, {"role": "assistant", "tool_calls": HISTORY_CALLS}],
        "messages",
        UNANSWERED.format(ids="c1, c2"),
    ),
    (
        "earlier-round-id-not-open",
        [
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            tool_reply("c1"),
            {"role": "assistant", "content": "x"},
            tool_reply("c1"),
        ],
        "messages[4].role",
        ORPHAN,
    ),
]


@pytest.mark.parametrize(
    ("case", "messages", "param", "text"), HISTORY_CASES, ids=[c[0] for c in HISTORY_CASES]
)
def test_tool_history_refusal(
    case: str, messages: list[dict[str, Any]], param: str, text: str, refusal: Any
) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(body(messages=messages))
    refusal(info.value, 400, U, param, f"'{param}': {text}")
    assert info.value.openai_message == text
    # The front applies the same rule to its own validated messages.
    with pytest.raises(hc.HordeError) as again:
        hc.check_tool_history(messages)
    assert again.value.message == info.value.message
