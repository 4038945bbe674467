"""The OpenAPI 3.1 description (spec: chat-front.md *API documentation*).

The handlers read the body by hand, so the component schemas come from the models here: the request as
validated (:class:`~horde_oai.schema.ChatCompletionRequest`, plus the default no-op keys) and the
responses as serialized. FastAPI's 422 is not listed, since the front never returns it.
"""

from __future__ import annotations

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

RETRY_HEADERS = {
    "Retry-After": {"description": "Seconds before a retry may succeed.", "schema": {"type": "integer"}},
    "x-should-retry": {"description": "false: the SDK should not retry.", "schema": {"type": "string"}},
}

COMPLETION_ERRORS = {
    "400": "BadRequest, UnsupportedChatParameter, ChatRequestConflict, max_kudos_exceeded, no_worker_supports_limit",
    "401": "invalid_api_key, InvalidAPIKey",
    "404": "model_not_found, no_worker_supports_features, stream_not_found (a Last-Event-ID that names no resumable stream)",
    "408": "ChatRequestTimeout",
    "409": "stream_busy (a resumed stream already has its most connections)",
    "413": "RequestTooLarge",
    "429": "rate_limit_exceeded",
    "502": "ChatRequestFaulted, ChatRequestNoGeneration, HordeUnavailable",
    "503": "no_eligible_worker, queue_unavailable, ChatAdmissionDisabled",
}


def _schemas(models: list[type[BaseModel]], mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(mode=mode, ref_template="#/components/schemas/{model}")  # type: ignore[arg-type]
        for name, sub in schema.pop("$defs", {}).items():
            out[name] = sub
        out[model.__name__] = schema
    return out


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The document: FastAPI's paths with the request body, responses and headers filled in."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description=DESCRIPTION)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(_schemas([ChatCompletionRequest], "validation"))
    schemas.update(
        _schemas(
            [ChatCompletionResponse, ChatCompletionChunk, OpenAIErrorEnvelope, ModelList, ModelCard],
            "serialization",
        )
    )
    for key, schema in NO_OP_PARAMETER_SCHEMAS.items():
        if key not in REQUEST_FIELDS:
            schemas["ChatCompletionRequest"]["properties"][key] = {
                **schema,
                "description": "Accepted only at its default; the AI Horde does not apply it.",
            }
    for name in KEY_DROPPING_MODELS:
        if name in schemas:
            schemas[name]["additionalProperties"] = True
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    error = {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIErrorEnvelope"}}}
    }
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
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}},
    }
    post["responses"] = {
        "200": {
            "description": (
                "The completion, or with stream true a text/event-stream of chunks ending data: [DONE]. A "
                "relayed stream sends the reply as the worker writes it; each of its events has an id: for "
                "Last-Event-ID."
            ),
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionResponse"}},
                "text/event-stream": {"schema": {"$ref": "#/components/schemas/ChatCompletionChunk"}},
            },
        },
        **{
            status: {
                "description": f"Error codes: {codes}.",
                **error,
                **({"headers": RETRY_HEADERS} if status in ("429", "503") else {}),
            }
            for status, codes in COMPLETION_ERRORS.items()
        },
    }
    get = doc["paths"]["/v1/models"]["get"]
    get["responses"] = {
        "200": {
            "description": "Models with at least one online chat worker.",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelList"}}},
        },
        "502": {"description": "HordeUnavailable.", **error},
    }
    return doc


DESCRIPTION = (
    "An OpenAI-compatible chat completions API over the AI Horde's crowdsourced text workers. "
    "Send your AI Horde API key as a Bearer token. Requests queue on the Horde until a volunteer worker "
    "serves them; the `horde` object carries Horde options OpenAI has no key for."
)


def install_openapi(app: FastAPI) -> None:
    """Replace FastAPI's generator with :func:`build_openapi` (cached on the app)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
