"""Admission's OpenAPI 3.1 document (``/openapi.json``): the chat and text generate routes, their status and
cancel routes, the model list and the upstream read routes (users, horde status, text model stats)
(docs/native-api.md#routes, #request-body, #tools, #refused-keys-and-values; docs/native-api.md#text-route,
#status-and-cancel, #model-list, #find-user, #user-details, #heartbeat, #horde-performance, #horde-modes, #news,
#text-model-stats).

The request bodies are read by hand (``horde_contract.parse_chat_request``, :func:`horde_admission.text.
parse_text_body`), so their schemas are written here from the spec's tables, with the ``horde`` object and the
text params taken from the contract's pydantic models (``ChatHordeOptions``, ``TextGenerationParams``,
``ChatTextParams``). A null optional value is read as its default, so optional keys accept null.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from horde_contract import TOP_LEVEL_KEYS, limits
from horde_contract.request_options import ChatHordeOptions
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
from horde_core.openapi_parts import STRING, json_object, ref, tool_call

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


def _text_params_property(name: str) -> dict[str, Any]:
    """One text param's schema as ChatTextParams declares it (its non-null branch), made nullable."""
    schema: dict[str, Any] = ChatTextParams.model_json_schema(ref_template="#/components/schemas/{model}")
    prop: dict[str, Any] = schema["properties"][name]
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    value = dict(branches[0])
    if "$ref" in value:  # reasoning_effort: the enum, inline
        value = {"type": "string", "enum": [e.value for e in ChatReasoningEffort]}
    return nullable(value)


_TEXT_PARTS_ONLY = {"type": "array", "minItems": 1, "items": ref("ChatTextPart")}
_TOOL_NAME = {"type": "string", "pattern": limits.CHAT_TOOL_NAME_PATTERN}
_TOOL_CALL_ID = {"type": "string", "minLength": 1, "maxLength": limits.MAX_CHAT_TOOL_CALL_ID_LENGTH}


def _closed(
    properties: dict[str, Any], required: list[str], description: str | None = None
) -> dict[str, Any]:
    """An object schema refusing keys beyond ``properties`` (the chat body refuses unknown keys)."""
    return json_object(properties, required, additional=False, description=description)


def _enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def _function(function_properties: dict[str, Any]) -> dict[str, Any]:
    """``{type: "function", function: {name, ...}}`` (a tool, a tool choice)."""
    function = _closed(function_properties, ["name"])
    return _closed({"type": _enum("function"), "function": function}, ["type", "function"])


def _message(role: Any, content: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return _closed({"role": role, "content": content, **extra}, required)


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
    # The sampling keys the body passes to the text params as they are: its top-level keys ChatTextParams
    # declares, n aside (described below: only 1), in the params model's order.
    sampling = [name for name in ChatTextParams.model_fields if name in TOP_LEVEL_KEYS and name != "n"]
    params = {name: _text_params_property(name) for name in sampling}
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
                "items": ref("ChatMessage"),
            },
            "max_tokens": {**max_tokens, "description": "max_length, 16 to 16384 (default 512)."},
            "max_completion_tokens": {
                **max_tokens,
                "description": "As max_tokens; both only with equal values.",
            },
            **params,
            "stop": nullable({"anyOf": [STRING, {"type": "array", "items": STRING}]}),
            "n": nullable({"type": "integer", "enum": [1]}),
            "stream": nullable({"type": "boolean"}),
            "stream_options": nullable({"type": "object"}),
            "user": nullable(STRING),
            "metadata": nullable({"type": "object"}),
            "tools": nullable(
                {"type": "array", "maxItems": limits.MAX_CHAT_TOOL_COUNT, "items": ref("ChatTool")}
            ),
            "tool_choice": nullable(
                {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, ref("ChatToolChoice")]}
            ),
            "parallel_tool_calls": nullable({"type": "boolean"}),
            "response_format": nullable(ref("ChatResponseFormat")),
            "horde": nullable(ref("ChatHordeOptions")),
        },
        "required": ["messages"],
        "oneOf": [
            {"required": ["model"], "properties": {"model": {"type": "string"}}},
            {"required": ["models"], "properties": {"models": {"type": "array"}}},
        ],
        "additionalProperties": False,
    }
    image_url = _closed(
        {
            "url": {
                "type": "string",
                "pattern": "^(data:image/[^,]*;base64,|https?://)",
                "description": "A data:image/...;base64, URL or an http(s) URL of a public image.",
            },
            "detail": nullable({"type": "string", "enum": [d.value for d in ChatImageDetail]}),
        },
        ["url"],
    )
    content_any = {
        "anyOf": [
            STRING,
            {
                "type": "array",
                "minItems": 1,
                "items": {"anyOf": [ref("ChatTextPart"), ref("ChatImagePart")]},
            },
        ]
    }
    content_text = {"anyOf": [STRING, _TEXT_PARTS_ONLY]}
    json_schema = _closed(
        {
            "name": _TOOL_NAME,
            "schema": {"type": "object", "description": "A JSON schema."},
            "description": nullable(STRING),
            "strict": nullable({"type": "boolean"}),
        },
        ["name", "schema"],
    )
    return {
        "ChatAsyncRequest": request,
        "ChatHordeOptions": horde,
        **horde_defs,
        "ChatMessage": {
            "anyOf": [
                ref("ChatSystemMessage"),
                ref("ChatUserMessage"),
                ref("ChatAssistantMessage"),
                ref("ChatToolMessage"),
            ]
        },
        "ChatSystemMessage": _message(
            {"type": "string", "enum": ["system", "developer"]},
            content_text,
            ["role", "content"],
            name=nullable(STRING),
        ),
        "ChatUserMessage": _message(
            {"type": "string", "enum": ["user"]}, content_any, ["role", "content"], name=nullable(STRING)
        ),
        "ChatAssistantMessage": _message(
            {"type": "string", "enum": ["assistant"]},
            nullable(content_text),
            ["role"],
            name=nullable(STRING),
            tool_calls=nullable(
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.MAX_CHAT_TOOL_CALL_COUNT,
                    "items": ref("ChatToolCall"),
                }
            ),
        ),
        "ChatToolMessage": _message(
            {"type": "string", "enum": ["tool"]},
            content_text,
            ["role", "content", "tool_call_id"],
            tool_call_id=_TOOL_CALL_ID,
        ),
        "ChatTextPart": _closed({"type": _enum("text"), "text": STRING}, ["type", "text"]),
        "ChatImagePart": _closed(
            {"type": _enum("image_url"), "image_url": image_url},
            ["type", "image_url"],
            description="An image, on a user message only.",
        ),
        "ChatToolCall": tool_call(_TOOL_CALL_ID),
        "ChatTool": _function(
            {
                "name": _TOOL_NAME,
                "description": nullable(STRING),
                "parameters": nullable({"type": "object", "description": "A JSON schema."}),
                "strict": nullable({"type": "boolean"}),
            }
        ),
        "ChatToolChoice": _function({"name": STRING}),
        "ChatResponseFormat": {
            "anyOf": [
                _closed({"type": _enum("text", "json_object")}, ["type"]),
                _closed({"type": _enum("json_schema"), "json_schema": json_schema}, ["type", "json_schema"]),
            ]
        },
    }


def text_request_schemas() -> dict[str, Any]:
    """The legacy text body (``TextAsyncRequest``, docs/native-api.md#text-route) and its params (``TextGenerationParams``)."""
    params, params_defs = pydantic_schema(TextGenerationParams)
    flag = nullable({"type": "boolean"})
    return {
        "TextAsyncRequest": json_object(
            {
                "prompt": {"type": "string", "description": "The prompt; an empty one is 400 MissingPrompt."},
                "params": nullable(ref("TextGenerationParams")),
                "models": nullable({"type": "array", "items": STRING}),
                "workers": nullable(
                    {"type": "array", "items": STRING, "description": "Worker ids; the first 5 are kept."}
                ),
                "worker_blacklist": flag,
                "trusted_workers": flag,
                "validated_backends": flag,
                "slow_workers": flag,
                "dry_run": flag,
                "allow_downgrade": flag,
            },
            ["prompt"],
            description=(
                "A legacy text request. Keys this horde does not apply (webhook, style, proxied_account, "
                "disable_batching, softprompt, nsfw) are ignored; extra_source_images is 400."
            ),
        ),
        "TextGenerationParams": params,
        **params_defs,
    }


_GENERATION = json_object(
    {
        "id": nullable(STRING),
        "worker_id": nullable(STRING),
        "worker_name": nullable(STRING),
        "model": nullable(STRING),
        "state": STRING,
        "text": nullable(STRING),
    }
)


def answer_schemas() -> dict[str, Any]:
    """The successful answers of admission's routes."""
    number = {"type": "number"}
    count = {"type": "integer"}
    accepted = json_object(
        {"id": STRING, "kudos": number, "message": STRING, "warnings": {"type": "array", "items": {}}},
        ["id", "kudos"],
        description="A queued request: its id and kudos estimate, with a warning message when no worker "
        "can serve it now.",
    )
    chat_dry_run = json_object(
        {
            "kudos": number,
            "estimated_prompt_tokens": count,
            "resolved": {"type": "object"},
            "context_adjustments": nullable({"type": "array", "items": {"type": "object"}}),
        },
        ["kudos"],
    )
    status = json_object(
        {
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
        ["finished", "processing", "waiting", "done", "faulted", "generations"],
        description="A request's status; a chat request's adds is_possible's inputs, context adjustments, "
        "its fault and each generation's structured reply.",
    )
    model = json_object(
        {
            "name": STRING,
            "count": count,
            "performance": number,
            "queued": count,
            "jobs": count,
            "eta": count,
            "type": STRING,
            "chat": {"type": "object"},
        },
        ["name", "count", "type"],
    )
    return {
        "RequestAccepted": accepted,
        "ChatAsyncOk": {
            "description": "A repeated operation key's request `{id, kudos}`, or a dry run's quote.",
            "anyOf": [ref("RequestAccepted"), ref("ChatDryRun")],
        },
        "ChatDryRun": chat_dry_run,
        "TextDryRun": json_object({"kudos": number}, ["kudos"]),
        "RequestStatus": status,
        "ModelList": {"type": "array", "items": model},
    }


CHAT_ASYNC_ERRORS = {
    "400": "BadRequest, UnsupportedChatParameter, ChatRequestConflict, NulByteInPayload, OperationKeyConflict, "
    "TokenOverflow, PromptExceedsContext, ChatKudosCapExceeded, TooManyStopSequences, ExcessiveStopSequence, "
    "TooManyExtraSourceImages, SourceImageSizeExceeded, SourceImageResolutionExceeded, SourceImageUnreadable, "
    "SourceImageUrlRefused, SourceImageUrlInvalid, MaintenanceMode, CorruptPrompt",
    "401": "InvalidAPIKey",
    "403": "NoEligibleWorker, KudosUpfront, SharedKeyInsufficientKudos, SharedKeyExpired, SharedKeyEmpty, "
    "DeletedUser, TimeoutIP",
    "404": "UnknownChatModel, WorkerNotFound",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge",
    "429": "RateLimitExceeded, TooManyPrompts",
    "503": "ChatAdmissionDisabled, ChatImageStorageUnavailable, WorkerPoolUnavailable",
}
TEXT_ASYNC_ERRORS = {
    "400": "BadRequest, MissingPrompt, NulByteInPayload, InvalidExtraSourceImages., TokenOverflow, "
    "MissingFullSamplerOrder, TooManyStopSequences, ExcessiveStopSequence, MaintenanceMode, CorruptPrompt",
    "401": "InvalidAPIKey",
    "403": "KudosUpfront, SharedKeyInsufficientKudos, SharedKeyExpired, SharedKeyEmpty, DeletedUser, TimeoutIP",
    "404": "WorkerNotFound",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge",
    "429": "RateLimitExceeded, TooManyPrompts",
}
STATUS_ERRORS = {"404": "RequestNotFound (an unknown id, a malformed one, or a request of the other family)"}
MODELS_ERRORS = {
    "400": "BadRequest (chat=true without type=text, an unknown model_state or a malformed number)"
}


def _generate(
    family: str, summary: str, description: str, *, body: str, ok: Answer, errors: dict[str, str]
) -> NativeOperation:
    """``POST /api/v2/generate/{family}/async``: 202 with the queued request, 200 ``ok``."""
    return NativeOperation(
        method="post",
        path=f"/api/v2/generate/{family}/async",
        summary=summary,
        description=description,
        body=body,
        headers=GENERATE_HEADERS,
        answers={"202": Answer("The request is queued.", "RequestAccepted"), "200": ok},
        errors=errors,
    )


def operations() -> list[NativeOperation]:
    """Admission's routes, as served under ``/api``."""
    status_ok = {"200": Answer("The request's status.", "RequestStatus")}
    ops = [
        _generate(
            "chat",
            "Queue a chat request",
            (
                "Validate the body, authenticate, check the model is known and served, size the context, quote "
                "and hold kudos, and queue the request. 202 with its id; 200 with the first request's id for a "
                "repeated horde.operation_key, or the quote of a dry run."
            ),
            body="ChatAsyncRequest",
            ok=Answer("A repeated operation key's request, or a dry run's quote.", "ChatAsyncOk"),
            errors=CHAT_ASYNC_ERRORS,
        ),
        _generate(
            "text",
            "Queue a legacy text request",
            "Queue a prompt for text workers. 202 with its id; 200 with the quote of a dry run.",
            body="TextAsyncRequest",
            ok=Answer("A dry run's quote.", "TextDryRun"),
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
        NativeOperation(
            method="get",
            path="/api/v2/status/models/{model_name}",
            summary="One model's statistics",
            description=(
                "A list holding the model's entry of the text model list (its worker threads, speed and queue), "
                "as upstream's; empty when no online worker serves the model. The name is matched exactly and "
                "may hold / (as is or as %2F)."
            ),
            answers={"200": Answer("The model, or none.", "ModelList")},
            # The path parameter matches any name but one with a line break, which no model has: that path is
            # no route's.
            errors={"404": "NotFound (a name holding a line break)"},
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
    return ops + info_operations()


def schemas() -> dict[str, Any]:
    """Every component schema of admission's document."""
    return {**chat_request_schemas(), **text_request_schemas(), **answer_schemas(), **info_schemas()}


def info_schemas() -> dict[str, Any]:
    """The answers of the upstream read routes (users, horde status, text model stats), in upstream's shapes."""
    number = {"type": "number"}
    count = {"type": "integer"}
    flag = {"type": "boolean"}
    ids = {"type": "array", "items": STRING}
    amounts = json_object({"image": count, "text": count, "interrogation": count})
    things = json_object({"megapixelsteps": number, "tokens": count})
    kudos_keys = ("accumulated", "gifted", "donated", "admin", "received", "recurring", "awarded", "styled")
    user = json_object(
        {
            "username": {"type": "string", "description": "alias#id"},
            "id": count,
            "kudos": number,
            "kudos_details": json_object(dict.fromkeys(kudos_keys, number)),
            "usage": {"type": "object"},
            "contributions": {"type": "object"},
            "records": json_object(
                {
                    "usage": things,
                    "contribution": things,
                    "fulfillment": amounts,
                    "request": amounts,
                    "style": amounts,
                }
            ),
            "concurrency": count,
            "worker_invited": count,
            "moderator": flag,
            "trusted": flag,
            "flagged": flag,
            "pseudonymous": flag,
            "worker_count": count,
            "account_age": {"type": "integer", "description": "Seconds since the account was created."},
            "service": flag,
            "deleted": flag,
            "education": flag,
            "customizer": flag,
            "styles": {"type": "array", "items": {"type": "object"}},
            "worker_ids": {**ids, "description": "The user's own key or a moderator's only."},
            "sharedkey_ids": {**ids, "description": "The user's own key or a moderator's only."},
            "active_generations": json_object({"text": ids}),
            "vpn": flag,
            "special": flag,
            "evaluating_kudos": {**number, "description": "A moderator's key only."},
            "suspicious": {**count, "description": "A moderator's key only."},
        },
        ["username", "id", "kudos"],
        description="Upstream's UserDetails (docs/native-api.md#user-details): the privileged fields only for the "
        "user's own key or a moderator's.",
    )
    performance = json_object(
        {
            name: count
            for name in (
                "queued_requests",
                "queued_text_requests",
                "worker_count",
                "text_worker_count",
                "thread_count",
                "text_thread_count",
                "interrogator_count",
                "interrogator_thread_count",
            )
        }
        | {
            name: number
            for name in (
                "queued_megapixelsteps",
                "past_minute_megapixelsteps",
                "queued_forms",
                "queued_tokens",
                "past_minute_tokens",
            )
        },
        description="Upstream's HordePerformance: the text numbers from the tables, the image and interrogation "
        "ones 0 (docs/native-api.md#horde-performance).",
    )
    per_model = {"type": "object", "additionalProperties": count}
    period_totals = json_object({"requests": count, "tokens": count}, ["requests", "tokens"])
    news_piece = json_object(
        {
            "date_published": STRING,
            "newspiece": STRING,
            "importance": STRING,
            "tags": ids,
            "title": STRING,
            "more_info_urls": ids,
        }
    )
    return {
        "UserDetails": user,
        "Heartbeat": json_object({"message": STRING, "version": STRING}, ["message", "version"]),
        "HordePerformance": performance,
        "HordeModes": json_object(
            {"maintenance_mode": flag, "invite_only_mode": flag, "raid_mode": flag},
            ["maintenance_mode", "invite_only_mode"],
            description="raid_mode is given to a moderator's key only.",
        ),
        "NewsList": {"type": "array", "items": news_piece},
        "TextTotals": json_object(
            {period: period_totals for period in ("minute", "hour", "day", "month", "total")},
            ["minute", "hour", "day", "month", "total"],
            description="Upstream's StatsTxtTotals: completed generations and their tokens per period; what each "
            "period can count with the records this horde keeps is in docs/native-api.md#text-totals.",
        ),
        "TextModelStats": json_object(
            {"day": per_model, "month": per_model, "total": per_model},
            ["day", "month", "total"],
            description="Completed generations per model (docs/native-api.md#text-model-stats).",
        ),
    }


OPTIONAL_APIKEY_HEADER = header(
    "apikey", "Optional: a user's own key or a moderator's adds the privileged fields; an unknown key is 401."
)


def info_operations() -> list[NativeOperation]:
    """The upstream read routes existing clients and workers poll."""

    def read(
        path: str, summary: str, description: str, answer: Answer, errors: dict[str, str], **kw: Any
    ) -> NativeOperation:
        # Every one of them counts against the per-address read limit (horde_core.ratelimit.ROUTE_LIMITS).
        errors = {**errors, "429": "RateLimitExceeded"}
        return NativeOperation(
            method="get",
            path=path,
            summary=summary,
            description=description,
            answers={"200": answer},
            errors=errors,
            **kw,
        )

    user = Answer("The user's details.", "UserDetails")
    return [
        read(
            "/api/v2/find_user",
            "The user of an API key",
            "The details of the key's user, its own fields included; a shared key finds its owner's public "
            "details, the username marked as a shared key's.",
            user,
            headers=(header("apikey", "The key whose user to find.", required=True),),
            errors={"401": "InvalidAPIKey (a missing or unknown key)"},
        ),
        read(
            "/api/v2/users/{user_id}",
            "A user's details",
            "Public details; with the user's own key its own fields, with a moderator's key the moderator fields.",
            user,
            headers=(OPTIONAL_APIKEY_HEADER,),
            errors={
                "401": "InvalidAPIKey (an unknown key)",
                "404": "UserNotFound (an unknown or non-numeric id)",
            },
        ),
        read(
            "/api/v2/status/heartbeat",
            "Whether this horde answers",
            "OK and the version, while the process serves.",
            Answer("Alive.", "Heartbeat"),
            errors={},
        ),
        read(
            "/api/v2/status/performance",
            "The horde's load",
            "Queued text jobs and tokens, online text workers and threads, the past minute's tokens; image and "
            "interrogation numbers are 0.",
            Answer("The load.", "HordePerformance"),
            errors={},
        ),
        read(
            "/api/v2/status/modes",
            "The horde's modes",
            "Maintenance and invite-only mode; raid mode for a moderator's key.",
            Answer("The modes.", "HordeModes"),
            headers=(header("apikey", "Optional: a moderator's key, to see raid_mode."),),
            errors={"401": "InvalidAPIKey (an unknown key)", "403": "NotModerator (a key not a moderator's)"},
        ),
        read(
            "/api/v2/status/news",
            "The horde's news",
            "The news pieces; none are published.",
            Answer("The news.", "NewsList"),
            errors={},
        ),
        read(
            "/api/v2/stats/text/models",
            "Text generations per model",
            "Completed generations per model in the past day, month and in total, from the stored speed samples.",
            Answer("The counts.", "TextModelStats"),
            errors={},
        ),
        read(
            "/api/v2/stats/text/totals",
            "Text generations and tokens in total",
            "Completed generations and their tokens in the past minute, hour, day, month (30 days) and in "
            "total: the windows from the stored speed samples and replies (about the last hour and the last 20 "
            "minutes), the total from the workers' lifetime counters.",
            Answer("The totals.", "TextTotals"),
            errors={},
        ),
    ]


def install_openapi(app: FastAPI) -> None:
    """Serve admission's document at ``/openapi.json``."""
    install_native_openapi(app, description=DESCRIPTION, operations=operations(), schemas=schemas())
