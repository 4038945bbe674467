"""The OpenAPI 3.1 description (docs/openai-front.md#routes).

The handlers read the body by hand, so the component schemas come from the models here: the request as
validated (:class:`~horde_oai.schema.ChatCompletionRequest`, plus the default no-op keys) and the
responses as serialized. Each field's description is its model field's docstring, with cross-references
rendered by :func:`plain_description`. Every route gets its responses by status with their error codes and the
``x-should-retry`` and ``Retry-After`` headers. FastAPI's 422 is removed everywhere, with its schemas, since the
front never returns it.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from horde_oai.responses import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    ModelCard,
    ModelList,
    OpenAIErrorEnvelope,
)
from horde_oai.schema import (
    KEY_DROPPING_MODELS,
    NO_OP_PARAMETER_SCHEMAS,
    REQUEST_FIELDS,
    ChatCompletionRequest,
)

# FastAPI's request validation response and its schemas: the front answers a bad body with 400 instead.
FASTAPI_VALIDATION_STATUS = "422"
FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")

SHOULD_RETRY_HEADER = {
    "description": (
        "Whether an OpenAI SDK should retry the call: `true` only where a retry is safe and useful (a retry of "
        "the same call joins the same AI Horde request), `false` where the outcome is settled."
    ),
    "schema": {"type": "string", "enum": ["true", "false"]},
}
RETRY_AFTER_HEADER = {
    "description": "Seconds to wait before retrying, when the front or the AI Horde knows.",
    "schema": {"type": "integer", "minimum": 0},
}
# Statuses whose errors may carry Retry-After: rate limits, the front's capacity, the AI Horde's own 503 (also as a
# 502 HordeUnavailable), no eligible worker and queue_unavailable.
RETRY_AFTER_STATUSES = frozenset({"429", "502", "503"})

COMPLETION_ERRORS = {
    "400": "BadRequest, UnsupportedChatParameter, ChatRequestConflict, max_kudos_exceeded, "
    "no_worker_supports_limit",
    "401": "invalid_api_key, InvalidAPIKey",
    "404": "UnknownChatModel (an unknown model; param is model or the models entry), no_worker_supports_features, "
    "stream_not_found (a Last-Event-ID that names no resumable stream)",
    "408": "ChatRequestTimeout, RequestBodyTimeout",
    "409": "stream_busy (a resumed stream already has its most connections)",
    "413": "RequestTooLarge",
    "429": "rate_limit_exceeded, or the AI Horde's return code",
    "500": "InternalServerError",
    "502": "ChatRequestFaulted, ChatRequestNoGeneration, HordeUnavailable",
    "503": "no_eligible_worker, queue_unavailable, FrontAtCapacity, or the AI Horde's return code",
}
MODEL_LIST_ERRORS = {"500": "InternalServerError", "502": "HordeUnavailable"}
MODEL_ERRORS = {
    "404": "model_not_found (no online chat worker serves the model)",
    "500": "InternalServerError",
    "502": "HordeUnavailable",
}

# A cross-reference in a docstring: [`name`][dotted.path], and the parenthetical "(see [`name`][dotted.path])".
_SEE_REFERENCE = re.compile(r"\s*\(see\s+\[`[^`\]]+`\]\[[^\]\s]+\]\)")
_INLINE_REFERENCE = re.compile(r"\[(`[^`\]]+`)\]\[[^\]\s]+\]")
_LINE_BREAK = re.compile(r"(?<!\n)\n(?!\n)")


def plain_description(text: str) -> str:
    """A docstring as a description (docs/openai-front.md#routes): a parenthetical ``(see [`name`][path])``
    cross-reference is dropped, an inline ``[`name`][path]`` one is rendered as ``name`` in backticks, and the
    docstring's line breaks inside a paragraph become spaces."""
    text = _SEE_REFERENCE.sub("", text)
    text = _INLINE_REFERENCE.sub(r"\1", text)
    return _LINE_BREAK.sub(" ", text).strip()


def _plain_descriptions(node: Any) -> None:
    """Apply :func:`plain_description` to every ``description`` string under ``node`` (a property named
    ``description`` is a schema object, not a string, and is walked into instead)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                node[key] = plain_description(value)
            else:
                _plain_descriptions(value)
    elif isinstance(node, list):
        for item in node:
            _plain_descriptions(item)


def _schemas(models: list[type[BaseModel]], mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(mode=mode, ref_template="#/components/schemas/{model}")  # type: ignore[arg-type]
        for name, sub in schema.pop("$defs", {}).items():
            out[name] = sub
        out[model.__name__] = schema
    return out


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def error_responses(codes: dict[str, str]) -> dict[str, Any]:
    """The error responses of a route: the envelope, its codes, ``x-should-retry`` and, where it may be set,
    ``Retry-After``."""
    out: dict[str, Any] = {}
    for status, listed in codes.items():
        headers: dict[str, Any] = {"x-should-retry": SHOULD_RETRY_HEADER}
        if status in RETRY_AFTER_STATUSES:
            headers["Retry-After"] = RETRY_AFTER_HEADER
        out[status] = {
            "description": f"Error codes: {listed}.",
            "headers": headers,
            "content": {"application/json": {"schema": _ref("OpenAIErrorEnvelope")}},
        }
    return out


def _drop_validation_responses(doc: dict[str, Any]) -> None:
    for path_item in doc.get("paths", {}).values():
        for operation in path_item.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop(FASTAPI_VALIDATION_STATUS, None)
    schemas = doc.get("components", {}).get("schemas", {})
    for name in FASTAPI_VALIDATION_SCHEMAS:
        schemas.pop(name, None)


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The document: FastAPI's paths with the request body, responses and headers filled in."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description=DESCRIPTION)
    _drop_validation_responses(doc)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    request_schemas = _schemas([ChatCompletionRequest], "validation")
    for key, schema in NO_OP_PARAMETER_SCHEMAS.items():
        if key not in REQUEST_FIELDS:
            request_schemas["ChatCompletionRequest"]["properties"][key] = {
                **schema,
                "description": "Accepted only at its default; the AI Horde does not apply it.",
            }
    # Only the request's own objects drop unknown keys (a response model may share a name, such as ToolCall).
    for name in KEY_DROPPING_MODELS:
        if name in request_schemas:
            request_schemas[name]["additionalProperties"] = True
    schemas.update(request_schemas)
    schemas.update(
        _schemas(
            [ChatCompletionResponse, ChatCompletionChunk, OpenAIErrorEnvelope, ModelList, ModelCard],
            "serialization",
        )
    )

    post = doc["paths"]["/v1/chat/completions"]["post"]
    post["parameters"] = [
        {
            "name": "Last-Event-ID",
            "in": "header",
            "required": False,
            "description": (
                "Resume a relayed stream (stream true, no tools, no structured output): the id of the last event "
                "received. The same API key and body re-attach to the same completion and get the rest of the "
                "stream, with no new request and no new charge."
            ),
            "schema": {"type": "string", "maxLength": 200},
        }
    ]
    post["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": _ref("ChatCompletionRequest")}},
    }
    post["responses"] = {
        "200": {
            "description": (
                "The completion, or with stream true a text/event-stream of chunks ending data: [DONE]. A "
                "relayed stream sends the reply as the worker writes it; each of its events has an id: for "
                "Last-Event-ID."
            ),
            "content": {
                "application/json": {"schema": _ref("ChatCompletionResponse")},
                "text/event-stream": {"schema": _ref("ChatCompletionChunk")},
            },
        },
        **error_responses(COMPLETION_ERRORS),
    }

    listing = doc["paths"]["/v1/models"]["get"]
    listing["responses"] = {
        "200": {
            "description": "Models with at least one online chat worker.",
            "content": {"application/json": {"schema": _ref("ModelList")}},
        },
        **error_responses(MODEL_LIST_ERRORS),
    }

    retrieve = doc["paths"]["/v1/models/{model_id}"]["get"]
    retrieve["description"] = (
        "One model card, as `GET /v1/models` lists it (the OpenAI SDKs' `models.retrieve`). A model id may hold "
        "`/`, sent as it is."
    )
    for parameter in retrieve.get("parameters", []):
        if parameter.get("name") == "model_id":
            parameter["description"] = "The model id, as `GET /v1/models` lists it."
    retrieve["responses"] = {
        "200": {
            "description": "The model card.",
            "content": {"application/json": {"schema": _ref("ModelCard")}},
        },
        **error_responses(MODEL_ERRORS),
    }
    _plain_descriptions(doc)
    return doc


DESCRIPTION = (
    "An OpenAI-compatible chat completions API over the AI Horde's crowdsourced text workers. "
    "Send your AI Horde API key as a Bearer token. Requests queue on the AI Horde until a volunteer worker "
    "serves them; the `horde` object carries AI Horde options OpenAI has no key for. Every error is OpenAI's "
    '`{"error": {...}}` envelope, with `x-should-retry` saying whether an OpenAI SDK should retry it.'
)


def install_openapi(app: FastAPI) -> None:
    """Replace FastAPI's generator with :func:`build_openapi` (cached on the app)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
