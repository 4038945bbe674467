"""Dispatch's OpenAPI 3.1 document (``/openapi.json``): the pop route, the worker details routes and the
worker modify route (spec: docs/native-api.md#chat-declaration, #chat-job-payload, #job-lease, #worker-details,
#modify-worker; docs/native-api.md#pop, #workers).

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
    Answer,
    NativeOperation,
    header,
    install_native_openapi,
    nullable,
    pydantic_schema,
)
from horde_core.openapi_parts import STRING, json_object, ref, worker_post

from .pop_body import TextPopBody
from .worker_update import ModifyWorkerBody

DESCRIPTION = (
    "The AI Horde's text worker routes: pop a text or chat job (checking the worker in with its chat "
    "declaration), and read worker details. Every route also answers at `/v2/...` without the `/api` prefix. "
    'Every error is the Horde envelope `{"message", "rc"}`.'
)


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
            "chat_limits": nullable(ref("ChatLimits")),
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
    chat_limits = json_object(
        {
            "max_context_length": {"type": "integer", "minimum": 1},
            "max_length": {"type": "integer", "minimum": 1},
            "tools_max_temperature": nullable({"type": "number", "minimum": 0}),
        },
        ["max_context_length", "max_length"],
    )
    return {"PopRequest": schema, "ChatLimits": chat_limits, **defs}


def answer_schemas() -> dict[str, Any]:
    """The successful answers of dispatch's routes."""
    worker = json_object(
        {
            "type": STRING,
            "name": STRING,
            "id": STRING,
            "online": {"type": "boolean"},
            "models": {"type": "array", "items": STRING},
            "accepts_chat_jobs": {"type": "boolean"},
            "accepts_prompt_jobs": {"type": "boolean"},
            "paused": {
                "type": "boolean",
                "description": "Only for the worker's owner or a moderator (their apikey); absent otherwise.",
            },
            "suspicious": {
                "type": "integer",
                "description": "Only for the worker's owner or a moderator (their apikey); absent otherwise.",
            },
        },
        ["name", "id"],
    )
    pop_response = json_object(
        {
            "id": nullable(STRING),
            "ids": {"type": "array", "items": STRING},
            "payload": {
                "type": "object",
                "description": "The job's generation settings and prompt; `{}` when there is no job.",
            },
            "model": STRING,
            "ttl": {"type": "integer"},
            "chat": {"type": "boolean"},
            "softprompt": {
                "type": "null",
                "description": "Always null on a job: soft prompts are not served (older bridges read the key).",
            },
            "skipped": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        ["payload", "id", "ids", "skipped"],
        description=(
            "With a job: `{payload, id, ids, model, ttl, softprompt: null, skipped: {}}` plus `chat: true` for a "
            "chat job, "
            "`ttl` being the job lease in seconds. Without one: `{payload: {}, id: null, ids: [], skipped: "
            "{reason: count}}` (after `wait_seconds` when the pop sent it; `skipped` is empty when dispatch shut "
            "down meanwhile)."
        ),
    )
    return {
        "PopResponse": pop_response,
        "WorkerDetails": worker,
        "WorkerList": {"type": "array", "items": ref("WorkerDetails")},
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
WORKER_ERRORS = {"404": "WorkerNotFound", "429": "RateLimitExceeded"}
#: The optional key of the details reads (upstream's details_privilege): no key and an unknown key read the same.
DETAILS_APIKEY = header(
    "apikey",
    "Optional. The worker owner's or a moderator's API key adds paused and suspicious (every worker's for a "
    "moderator, the owner's own otherwise); without one, or with any other key, they are absent. An unknown key is "
    "no error.",
)


def operations() -> list[NativeOperation]:
    """Dispatch's routes, as served under ``/api``."""
    pop = worker_post(
        "/api/v2/generate/text/pop",
        "Check a worker in and pop a text or chat job",
        (
            "Create or check in the named worker with its models, limits and chat declaration, and hand it "
            "the first queued job it may take. With `wait_seconds` (a Horde Chat extension, 0 to "
            f"{MAX_POP_WAIT_SECONDS}, default 0) an empty pop is held up to that many seconds and answered "
            "as soon as a job the worker may take is queued; the empty answer comes when the time is up. "
            "A worker in maintenance gets its 403 at once."
        ),
        body="PopRequest",
        answer=Answer("A job, or none with the skipped reasons.", "PopResponse"),
        errors=POP_ERRORS,
    )
    workers = NativeOperation(
        method="get",
        path="/api/v2/workers",
        summary="List the online workers",
        description=(
            "Details of every online worker (checked in within 300 s), as upstream lists active workers only; "
            "name picks the one of that name, compared case-insensitively (type is then ignored); otherwise "
            "type other than text lists none."
        ),
        headers=(DETAILS_APIKEY,),
        answers={"200": Answer("The workers.", "WorkerList")},
        errors={"400": "BadRequest (a malformed query parameter)", "429": "RateLimitExceeded"},
    )
    details = [
        NativeOperation(
            method="get",
            path=f"/api/v2/workers/{key}",
            summary=f"A worker's details by {by}",
            description="One worker's details, with the chat declaration of its last pop.",
            headers=(DETAILS_APIKEY,),
            answers={"200": Answer("The worker.", "WorkerDetails")},
            errors=WORKER_ERRORS,
        )
        for key, by in (("name/{worker_name}", "name"), ("{worker_id}", "id"))
    ]
    return [pop, workers, *details, modify_operation()]


def schemas() -> dict[str, Any]:
    """Every component schema of dispatch's document."""
    return {**pop_body_schemas(), **answer_schemas(), **modify_schemas()}


MODIFY_ERRORS = {
    "400": "BadRequest (a field of the wrong type or length, a name holding colab, tpu or google, a malformed "
    "body), NoWorkerModSelected (no field set), WorkerNameAlreadyExists, NulByteInPayload",
    "401": "InvalidAPIKey (a missing or unknown key)",
    "403": "NotOwner (maintenance or info by someone other than the owner or a moderator), NotModerator (paused "
    "by anyone but a moderator; name or team by someone other than the owner or a moderator), DeletedUser",
    "404": "WorkerNotFound, TeamNotFound (any non-empty team: teams are not kept)",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge (over 64 KiB)",
    "429": "RateLimitExceeded (HORDE_MODIFY_REQUEST_LIMIT_PER_IP, upstream's 30 a minute)",
}


def modify_schemas() -> dict[str, Any]:
    """``ModifyWorkerInput`` and ``ModifyWorker`` (upstream's names), from the validating model."""
    body, defs = pydantic_schema(ModifyWorkerBody)
    body["description"] = (
        "Upstream's ModifyWorkerInput: each key optional (null is absent), unknown keys ignored. "
        "maintenance_msg applies when maintenance turns on; team '' leaves the worker without a team."
    )
    answer = json_object(
        {
            "maintenance": {"type": "boolean"},
            "paused": {"type": "boolean"},
            "info": STRING,
            "name": STRING,
            "team": {"type": "string", "description": "'None' for a cleared team."},
        },
        description="Upstream's ModifyWorker: each field the body set, with its new value.",
    )
    return {"ModifyWorkerInput": body, "ModifyWorker": answer, **defs}


def modify_operation() -> NativeOperation:
    """``PUT /api/v2/workers/{worker_id}``."""
    return NativeOperation(
        method="put",
        path="/api/v2/workers/{worker_id}",
        summary="Change a worker",
        description=(
            "The owner or a moderator sets maintenance (with its message), info, name or team; a moderator "
            "alone sets paused. Every refusal is checked before anything is written; the worker's next pop "
            "reads the new state."
        ),
        body="ModifyWorkerInput",
        headers=(header("apikey", "The worker owner's or a moderator's API key.", required=True),),
        answers={"200": Answer("The fields set, with their new values.", "ModifyWorker")},
        errors=MODIFY_ERRORS,
    )


def install_openapi(app: FastAPI) -> None:
    """Serve dispatch's document at ``/openapi.json``."""
    install_native_openapi(app, description=DESCRIPTION, operations=operations(), schemas=schemas())
