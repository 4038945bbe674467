"""Admission's OpenAPI 3.1 document (``/openapi.json``): the chat and text generate routes, their status and
cancel routes and the model list (spec: chat-requests.md *Routes*, *Request body*, *Tools*, *Refused keys and
values*; ai-horde-text-path.md §1, §2, §8).

The request bodies are read by hand (``horde_contract.parse_chat_request``, :func:`horde_admission.text.
parse_text_body`), so their schemas are written here from the spec's tables, with the ``horde`` object and the
text params taken from the contract's pydantic models (``ChatHordeOptions``, ``TextGenerationParams``,
``ChatTextParams``). A null optional value is read as its default, so optional keys accept null.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from horde_contract import limits
from horde_contract.request import ChatHordeOptions
from horde_contract.text_params import ChatTextParams, TextGenerationParams
from horde_contract.vocab import ChatImageDetail, ChatReasoningEffort
from horde_core.openapi import (
    APIKEY_HEADER,
    Answer,
    NativeOperation,
    header,
    install_native_openapi,
    nullable,
    pydantic_schema,
)

DESCRIPTION = (
    "The AI Horde's native chat and text request routes: queue a request, read its status, cancel it, and list "
    "the models online workers serve. Every route also answers at `/v2/...` without the `/api` prefix. Every "
    'error is the Horde envelope `{"message", "rc"}`.'
)

CLIENT_AGENT_HEADER = header(
    "Client-Agent",
    "The client's `name:version:contact`, stored with the request (default unknown:0:unknown).",
)
PROXY_AUTHORIZATION_HEADER = header(
    "Proxy-Authorization",
    "A proxy passkey (HORDE_PROXY_PASSKEYS): with a known one, Proxied-For is the address rate limits count.",
)
PROXIED_FOR_HEADER = header("Proxied-For", "The proxied client's address, read with a known proxy passkey.")
GENERATE_HEADERS = (APIKEY_HEADER, CLIENT_AGENT_HEADER, PROXY_AUTHORIZATION_HEADER, PROXIED_FOR_HEADER)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _text_params_property(name: str) -> dict[str, Any]:
    """One text param's schema as ChatTextParams declares it (its non-null branch), made nullable."""
    schema: dict[str, Any] = ChatTextParams.model_json_schema(ref_template="#/components/schemas/{model}")
    prop: dict[str, Any] = schema["properties"][name]
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    value = dict(branches[0])
    if "$ref" in value:  # reasoning_effort: the enum, inline
        value = {"type": "string", "enum": [e.value for e in ChatReasoningEffort]}
    return nullable(value)


_TEXT = {"type": "string"}
_TEXT_PARTS_ONLY = {"type": "array", "minItems": 1, "items": _ref("ChatTextPart")}
_TOOL_NAME = {"type": "string", "pattern": limits.CHAT_TOOL_NAME_PATTERN}
_TOOL_CALL_ID = {"type": "string", "minLength": 1, "maxLength": limits.MAX_CHAT_TOOL_CALL_ID_LENGTH}


def _message(role: Any, content: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"role": role, "content": content, **extra},
        "required": required,
        "additionalProperties": False,
    }


def _horde_options_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """ChatHordeOptions as parse_horde_options reads it: every key may be null (its default), only/ignore list
    at least one non-empty id, max_context_length and max_kudos are positive and operation_key is a UUID."""
    schema, defs = pydantic_schema(ChatHordeOptions)
    properties: dict[str, Any] = schema["properties"]
    worker_ids = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
    for name, prop in list(properties.items()):
        description = prop.get("description")
        if name in ("only", "ignore"):
            value: dict[str, Any] = dict(worker_ids)
        elif name in ("max_context_length", "max_kudos"):
            value = {"type": "integer", "minimum": 1}
        elif name == "operation_key":
            value = {"type": "string", "format": "uuid"}
        else:
            value = {k: v for k, v in prop.items() if k not in ("default", "title", "description")}
        properties[name] = {**nullable(value), **({"description": description} if description else {})}
    schema["additionalProperties"] = False
    return schema, defs


def chat_request_schemas() -> dict[str, Any]:
    """The native chat body (``ChatAsyncRequest``) and the schemas it references."""
    horde, horde_defs = _horde_options_schema()
    params = {
        name: _text_params_property(name)
        for name in (
            "temperature",
            "top_p",
            "frequency_penalty",
            "presence_penalty",
            "seed",
            "reasoning_effort",
        )
    }
    max_tokens = nullable(
        {"type": "integer", "minimum": limits.MIN_CHAT_MAX_TOKENS, "maximum": limits.MAX_CHAT_MAX_TOKENS}
    )
    request = {
        "type": "object",
        "description": (
            "A chat request: an OpenAI messages array and its sampling keys, with the AI Horde's options in "
            "`horde`. Exactly one of `model` and `models`. Any other key is 400 UnsupportedChatParameter."
        ),
        "properties": {
            "model": nullable({"type": "string", "minLength": 1}),
            "models": nullable(
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.MAX_CHAT_MODEL_COUNT,
                    "uniqueItems": True,
                    "items": {"type": "string", "minLength": 1},
                }
            ),
            "messages": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits.MAX_CHAT_MESSAGE_COUNT,
                "items": _ref("ChatMessage"),
            },
            "max_tokens": {**max_tokens, "description": "max_length, 16 to 16384 (default 512)."},
            "max_completion_tokens": {
                **max_tokens,
                "description": "As max_tokens; both only with equal values.",
            },
            **params,
            "stop": nullable({"anyOf": [_TEXT, {"type": "array", "items": _TEXT}]}),
            "n": nullable({"type": "integer", "enum": [1]}),
            "stream": nullable({"type": "boolean"}),
            "stream_options": nullable({"type": "object"}),
            "user": nullable(_TEXT),
            "metadata": nullable({"type": "object"}),
            "tools": nullable(
                {"type": "array", "maxItems": limits.MAX_CHAT_TOOL_COUNT, "items": _ref("ChatTool")}
            ),
            "tool_choice": nullable(
                {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, _ref("ChatToolChoice")]}
            ),
            "parallel_tool_calls": nullable({"type": "boolean"}),
            "response_format": nullable(_ref("ChatResponseFormat")),
            "horde": nullable(_ref("ChatHordeOptions")),
        },
        "required": ["messages"],
        "oneOf": [
            {"required": ["model"], "properties": {"model": {"type": "string"}}},
            {"required": ["models"], "properties": {"models": {"type": "array"}}},
        ],
        "additionalProperties": False,
    }
    image_url = {
        "type": "object",
        "properties": {
            "url": {
                "type": "string",
                "pattern": "^(data:image/[^,]*;base64,|https?://)",
                "description": "A data:image/...;base64, URL or an http(s) URL of a public image.",
            },
            "detail": nullable({"type": "string", "enum": [d.value for d in ChatImageDetail]}),
        },
        "required": ["url"],
        "additionalProperties": False,
    }
    content_any = {
        "anyOf": [
            _TEXT,
            {
                "type": "array",
                "minItems": 1,
                "items": {"anyOf": [_ref("ChatTextPart"), _ref("ChatImagePart")]},
            },
        ]
    }
    content_text = {"anyOf": [_TEXT, _TEXT_PARTS_ONLY]}
    return {
        "ChatAsyncRequest": request,
        "ChatHordeOptions": horde,
        **horde_defs,
        "ChatMessage": {
            "anyOf": [
                _ref("ChatSystemMessage"),
                _ref("ChatUserMessage"),
                _ref("ChatAssistantMessage"),
                _ref("ChatToolMessage"),
            ]
        },
        "ChatSystemMessage": _message(
            {"type": "string", "enum": ["system", "developer"]},
            content_text,
            ["role", "content"],
            name=nullable(_TEXT),
        ),
        "ChatUserMessage": _message(
            {"type": "string", "enum": ["user"]}, content_any, ["role", "content"], name=nullable(_TEXT)
        ),
        "ChatAssistantMessage": _message(
            {"type": "string", "enum": ["assistant"]},
            nullable(content_text),
            ["role"],
            name=nullable(_TEXT),
            tool_calls=nullable(
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.MAX_CHAT_TOOL_CALL_COUNT,
                    "items": _ref("ChatToolCall"),
                }
            ),
        ),
        "ChatToolMessage": _message(
            {"type": "string", "enum": ["tool"]},
            content_text,
            ["role", "content", "tool_call_id"],
            tool_call_id=_TOOL_CALL_ID,
        ),
        "ChatTextPart": {
            "type": "object",
            "properties": {"type": {"type": "string", "enum": ["text"]}, "text": _TEXT},
            "required": ["type", "text"],
            "additionalProperties": False,
        },
        "ChatImagePart": {
            "type": "object",
            "description": "An image, on a user message only.",
            "properties": {"type": {"type": "string", "enum": ["image_url"]}, "image_url": image_url},
            "required": ["type", "image_url"],
            "additionalProperties": False,
        },
        "ChatToolCall": {
            "type": "object",
            "properties": {
                "id": _TOOL_CALL_ID,
                "type": {"type": "string", "enum": ["function"]},
                "function": {
                    "type": "object",
                    "properties": {"name": _TEXT, "arguments": _TEXT},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                },
            },
            "required": ["id", "type", "function"],
            "additionalProperties": False,
        },
        "ChatTool": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {
                    "type": "object",
                    "properties": {
                        "name": _TOOL_NAME,
                        "description": nullable(_TEXT),
                        "parameters": nullable({"type": "object", "description": "A JSON schema."}),
                        "strict": nullable({"type": "boolean"}),
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            "required": ["type", "function"],
            "additionalProperties": False,
        },
        "ChatToolChoice": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {
                    "type": "object",
                    "properties": {"name": _TEXT},
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            "required": ["type", "function"],
            "additionalProperties": False,
        },
        "ChatResponseFormat": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}},
                    "required": ["type"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string", "enum": ["json_schema"]},
                        "json_schema": {
                            "type": "object",
                            "properties": {
                                "name": _TOOL_NAME,
                                "schema": {"type": "object", "description": "A JSON schema."},
                                "description": nullable(_TEXT),
                                "strict": nullable({"type": "boolean"}),
                            },
                            "required": ["name", "schema"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["type", "json_schema"],
                    "additionalProperties": False,
                },
            ]
        },
    }


def text_request_schemas() -> dict[str, Any]:
    """The legacy text body (``TextAsyncRequest``, text path §1) and its params (``TextGenerationParams``)."""
    params, params_defs = pydantic_schema(TextGenerationParams)
    flag = nullable({"type": "boolean"})
    return {
        "TextAsyncRequest": {
            "type": "object",
            "description": (
                "A legacy text request. Keys this horde does not apply (webhook, style, proxied_account, "
                "disable_batching, softprompt, nsfw) are ignored; extra_source_images is 400."
            ),
            "properties": {
                "prompt": {"type": "string", "description": "The prompt; an empty one is 400 MissingPrompt."},
                "params": nullable(_ref("TextGenerationParams")),
                "models": nullable({"type": "array", "items": _TEXT}),
                "workers": nullable(
                    {"type": "array", "items": _TEXT, "description": "Worker ids; the first 5 are kept."}
                ),
                "worker_blacklist": flag,
                "trusted_workers": flag,
                "validated_backends": flag,
                "slow_workers": flag,
                "dry_run": flag,
                "allow_downgrade": flag,
            },
            "required": ["prompt"],
            "additionalProperties": True,
        },
        "TextGenerationParams": params,
        **params_defs,
    }


_GENERATION = {
    "type": "object",
    "properties": {
        "id": nullable(_TEXT),
        "worker_id": nullable(_TEXT),
        "worker_name": nullable(_TEXT),
        "model": nullable(_TEXT),
        "state": _TEXT,
        "text": nullable(_TEXT),
    },
    "additionalProperties": True,
}


def answer_schemas() -> dict[str, Any]:
    """The successful answers of admission's routes."""
    number = {"type": "number"}
    count = {"type": "integer"}
    return {
        "RequestAccepted": {
            "type": "object",
            "description": "A queued request: its id and kudos estimate, with a warning message when no worker "
            "can serve it now.",
            "properties": {
                "id": _TEXT,
                "kudos": number,
                "message": _TEXT,
                "warnings": {"type": "array", "items": {}},
            },
            "required": ["id", "kudos"],
            "additionalProperties": True,
        },
        "ChatAsyncOk": {
            "description": "A repeated operation key's request `{id, kudos}`, or a dry run's quote.",
            "anyOf": [_ref("RequestAccepted"), _ref("ChatDryRun")],
        },
        "ChatDryRun": {
            "type": "object",
            "properties": {
                "kudos": number,
                "estimated_prompt_tokens": count,
                "resolved": {"type": "object"},
                "context_adjustments": nullable({"type": "array", "items": {"type": "object"}}),
            },
            "required": ["kudos"],
            "additionalProperties": True,
        },
        "TextDryRun": {
            "type": "object",
            "properties": {"kudos": number},
            "required": ["kudos"],
            "additionalProperties": True,
        },
        "RequestStatus": {
            "type": "object",
            "description": "A request's status; a chat request's adds is_possible's inputs, context adjustments, "
            "its fault and each generation's structured reply.",
            "properties": {
                "finished": count,
                "processing": count,
                "restarted": count,
                "waiting": count,
                "done": {"type": "boolean"},
                "faulted": {"type": "boolean"},
                "queue_position": count,
                "wait_time": count,
                "kudos": number,
                "is_possible": {"type": "boolean"},
                "generations": {"type": "array", "items": _GENERATION},
            },
            "required": ["finished", "processing", "waiting", "done", "faulted", "generations"],
            "additionalProperties": True,
        },
        "ModelList": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": _TEXT,
                    "count": count,
                    "performance": number,
                    "queued": count,
                    "jobs": count,
                    "eta": count,
                    "type": _TEXT,
                    "chat": {"type": "object"},
                },
                "required": ["name", "count", "type"],
                "additionalProperties": True,
            },
        },
    }


CHAT_ASYNC_ERRORS = {
    "400": "BadRequest, UnsupportedChatParameter, ChatRequestConflict, NulByteInPayload, OperationKeyConflict, "
    "TokenOverflow, PromptExceedsContext, ChatKudosCapExceeded, TooManyStopSequences, ExcessiveStopSequence, "
    "TooManyExtraSourceImages, SourceImageSizeExceeded, SourceImageResolutionExceeded, SourceImageUnreadable, "
    "SourceImageUrlRefused, SourceImageUrlInvalid",
    "401": "InvalidAPIKey",
    "403": "NoEligibleWorker, KudosUpfront, SharedKeyInsufficientKudos, SharedKeyExpired, SharedKeyEmpty, "
    "DeletedUser",
    "404": "UnknownChatModel, WorkerNotFound",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge",
    "429": "RateLimitExceeded, TooManyPrompts",
    "503": "ChatAdmissionDisabled, ChatImageStorageUnavailable, WorkerPoolUnavailable",
}
TEXT_ASYNC_ERRORS = {
    "400": "BadRequest, MissingPrompt, NulByteInPayload, InvalidExtraSourceImages., TokenOverflow, "
    "MissingFullSamplerOrder, TooManyStopSequences, ExcessiveStopSequence",
    "401": "InvalidAPIKey",
    "403": "KudosUpfront, SharedKeyInsufficientKudos, SharedKeyExpired, SharedKeyEmpty, DeletedUser",
    "404": "WorkerNotFound",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge",
    "429": "RateLimitExceeded, TooManyPrompts",
}
STATUS_ERRORS = {"404": "RequestNotFound (an unknown id, a malformed one, or a request of the other family)"}
MODELS_ERRORS = {
    "400": "BadRequest (chat=true without type=text, an unknown model_state or a malformed number)"
}


def operations() -> list[NativeOperation]:
    """Admission's routes, as served under ``/api``."""
    status_ok = {"200": Answer("The request's status.", "RequestStatus")}
    ops = [
        NativeOperation(
            method="post",
            path="/api/v2/generate/chat/async",
            summary="Queue a chat request",
            description=(
                "Validate the body, authenticate, check the model is known and served, size the context, quote "
                "and hold kudos, and queue the request. 202 with its id; 200 with the first request's id for a "
                "repeated horde.operation_key, or the quote of a dry run."
            ),
            body="ChatAsyncRequest",
            headers=GENERATE_HEADERS,
            answers={
                "202": Answer("The request is queued.", "RequestAccepted"),
                "200": Answer("A repeated operation key's request, or a dry run's quote.", "ChatAsyncOk"),
            },
            errors=CHAT_ASYNC_ERRORS,
        ),
        NativeOperation(
            method="post",
            path="/api/v2/generate/text/async",
            summary="Queue a legacy text request",
            description="Queue a prompt for text workers. 202 with its id; 200 with the quote of a dry run.",
            body="TextAsyncRequest",
            headers=GENERATE_HEADERS,
            answers={
                "202": Answer("The request is queued.", "RequestAccepted"),
                "200": Answer("A dry run's quote.", "TextDryRun"),
            },
            errors=TEXT_ASYNC_ERRORS,
        ),
        NativeOperation(
            method="get",
            path="/api/v2/status/models",
            summary="List the models online workers serve",
            description=(
                "Active models with their worker count, speed and queue; with type=text and chat=true only "
                "the models an online chat worker serves, each with its chat offer."
            ),
            answers={"200": Answer("The models.", "ModelList")},
            errors=MODELS_ERRORS,
        ),
    ]
    for family in ("chat", "text"):
        path = f"/api/v2/generate/{family}/status/{{request_id}}"
        ops.append(
            NativeOperation(
                method="get",
                path=path,
                summary=f"A {family} request's status",
                description=f"The {family} request's status with its finished generations.",
                answers=status_ok,
                errors=STATUS_ERRORS,
            )
        )
        ops.append(
            NativeOperation(
                method="delete",
                path=path,
                summary=f"Cancel a {family} request",
                description=(
                    f"Cancel the {family} request (in-flight jobs finish) and return its status after the cancel."
                ),
                answers=status_ok,
                errors=STATUS_ERRORS,
            )
        )
    return ops


def schemas() -> dict[str, Any]:
    """Every component schema of admission's document."""
    return {**chat_request_schemas(), **text_request_schemas(), **answer_schemas()}


def install_openapi(app: FastAPI) -> None:
    """Serve admission's document at ``/openapi.json``."""
    install_native_openapi(app, description=DESCRIPTION, operations=operations(), schemas=schemas())
