"""Dispatch's OpenAPI 3.1 document (``/openapi.json``): the pop route and the worker details routes (spec:
chat-requests.md *Chat declaration on pop*, *Chat job pop response*, *Job lease*, *Worker details*;
ai-horde-text-path.md §3, §6).

The pop body's text fields come from :class:`horde_dispatch.pop_body.TextPopBody`, the model that validates
them; the six chat declaration fields, read by ``horde_contract.parse_chat_declaration``, are written here
from the spec's table.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from horde_contract.limits import MAX_POP_WAIT_SECONDS
from horde_contract.vocab import KNOWN_CHAT_FEATURES, ChatImageTransport
from horde_core.openapi import (
    WORKER_APIKEY_HEADER,
    Answer,
    NativeOperation,
    install_native_openapi,
    nullable,
    pydantic_schema,
)

from .pop_body import TextPopBody

DESCRIPTION = (
    "The AI Horde's text worker routes: pop a text or chat job (checking the worker in with its chat "
    "declaration), and read worker details. Every route also answers at `/v2/...` without the `/api` prefix. "
    'Every error is the Horde envelope `{"message", "rc"}`.'
)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def pop_body_schemas() -> dict[str, Any]:
    """``PopRequest``: TextPopBody's fields plus the chat declaration."""
    schema, defs = pydantic_schema(TextPopBody)
    properties: dict[str, Any] = schema["properties"]
    properties.update(
        {
            "chat_jobs": {
                **nullable({"type": "boolean"}),
                "description": "The worker accepts chat jobs (default false); needs chat_limits and model_id.",
            },
            "prompt_jobs": {
                **nullable({"type": "boolean"}),
                "description": "The worker accepts text jobs (default true); false needs chat_jobs.",
            },
            "chat_features": {
                **nullable({"type": "array", "items": {"type": "string"}}),
                "description": "Features and guarantees the worker declares; unknown values are ignored. Known: "
                + ", ".join(sorted(KNOWN_CHAT_FEATURES))
                + ".",
            },
            "chat_limits": nullable(_ref("ChatLimits")),
            "model_id": {
                **nullable({"type": "string"}),
                "description": "The model chat jobs are served with; one of models.",
            },
            "image_transports": {
                **nullable({"type": "array", "items": {"type": "string"}}),
                "description": "How the worker receives images and offloaded messages; unknown values are "
                "ignored. Known: " + ", ".join(t.value for t in ChatImageTransport) + ".",
            },
        }
    )
    schema["additionalProperties"] = True
    schema["description"] = (
        "A pop: the text fields (lengths in tokens; unknown keys are ignored, as upstream) and the chat "
        "declaration. models must list at least one model; a name holding colab, tpu or google is refused."
    )
    chat_limits = {
        "type": "object",
        "properties": {
            "max_context_length": {"type": "integer", "minimum": 1},
            "max_length": {"type": "integer", "minimum": 1},
            "tools_max_temperature": nullable({"type": "number", "minimum": 0}),
        },
        "required": ["max_context_length", "max_length"],
        "additionalProperties": True,
    }
    return {"PopRequest": schema, "ChatLimits": chat_limits, **defs}


def answer_schemas() -> dict[str, Any]:
    """The successful answers of dispatch's routes."""
    text = {"type": "string"}
    worker = {
        "type": "object",
        "properties": {
            "type": text,
            "name": text,
            "id": text,
            "online": {"type": "boolean"},
            "models": {"type": "array", "items": text},
            "accepts_chat_jobs": {"type": "boolean"},
            "accepts_prompt_jobs": {"type": "boolean"},
        },
        "required": ["name", "id"],
        "additionalProperties": True,
    }
    return {
        "PopResponse": {
            "type": "object",
            "description": (
                "With a job: `{payload, id, ids, model, ttl, skipped: {}}` plus `chat: true` for a chat job, "
                "`ttl` being the job lease in seconds. Without one: `{id: null, ids: [], skipped: {reason: "
                "count}}` (after `wait_seconds` when the pop sent it; `skipped` is empty when dispatch shut "
                "down meanwhile)."
            ),
            "properties": {
                "id": nullable(text),
                "ids": {"type": "array", "items": text},
                "payload": {"type": "object"},
                "model": text,
                "ttl": {"type": "integer"},
                "chat": {"type": "boolean"},
                "skipped": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
            "required": ["id", "ids", "skipped"],
            "additionalProperties": True,
        },
        "WorkerDetails": worker,
        "WorkerList": {"type": "array", "items": _ref("WorkerDetails")},
    }


POP_ERRORS = {
    "400": "BadRequest, InvalidPriorityUsername, ChatDeclarationInvalid",
    "401": "InvalidAPIKey",
    "403": "AnonForbiddenWorker, DeletedUser, WorkerFlaggedMaintenance, WrongCredentials (the name belongs to "
    "another user), WorkerMaintenance",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge",
    "429": "RateLimitExceeded",
}
WORKER_ERRORS = {"404": "WorkerNotFound"}


def operations() -> list[NativeOperation]:
    """Dispatch's routes, as served under ``/api``."""
    return [
        NativeOperation(
            method="post",
            path="/api/v2/generate/text/pop",
            summary="Check a worker in and pop a text or chat job",
            description=(
                "Create or check in the named worker with its models, limits and chat declaration, and hand it "
                "the first queued job it may take. With `wait_seconds` (a Horde Chat extension, 0 to "
                f"{MAX_POP_WAIT_SECONDS}, default 0) an empty pop is held up to that many seconds and answered "
                "as soon as a job the worker may take is queued; the empty answer comes when the time is up. "
                "A worker in maintenance gets its 403 at once."
            ),
            body="PopRequest",
            headers=(WORKER_APIKEY_HEADER,),
            answers={"200": Answer("A job, or none with the skipped reasons.", "PopResponse")},
            errors=POP_ERRORS,
        ),
        NativeOperation(
            method="get",
            path="/api/v2/workers",
            summary="List the online workers",
            description="Details of every online worker (checked in within 300 s); type other than text lists none.",
            answers={"200": Answer("The workers.", "WorkerList")},
            errors={"400": "BadRequest (a malformed query parameter)"},
        ),
        NativeOperation(
            method="get",
            path="/api/v2/workers/name/{worker_name}",
            summary="A worker's details by name",
            description="One worker's details, with the chat declaration of its last pop.",
            answers={"200": Answer("The worker.", "WorkerDetails")},
            errors=WORKER_ERRORS,
        ),
        NativeOperation(
            method="get",
            path="/api/v2/workers/{worker_id}",
            summary="A worker's details by id",
            description="One worker's details, with the chat declaration of its last pop.",
            answers={"200": Answer("The worker.", "WorkerDetails")},
            errors=WORKER_ERRORS,
        ),
    ]


def schemas() -> dict[str, Any]:
    """Every component schema of dispatch's document."""
    return {**pop_body_schemas(), **answer_schemas()}


def install_openapi(app: FastAPI) -> None:
    """Serve dispatch's document at ``/openapi.json``."""
    install_native_openapi(app, description=DESCRIPTION, operations=operations(), schemas=schemas())
