"""Submit's OpenAPI 3.1 document (``/openapi.json``): the submit and progress routes (spec: chat-requests.md
*Structured submit*, *Reasoning*, *Worker fault reasons*, *Streaming progress*; ai-horde-text-path.md §4).

Both bodies are read by hand (``horde_contract.parse_submit_body``, ``parse_progress_body``), so their schemas
are written here from the spec's tables. A submit is a text submit (``generation``) or a chat submit (a body
carrying ``message``, ``model_id``, ``finish_reason`` or ``fault_reason``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from horde_contract import limits
from horde_contract.vocab import ChatFaultReason, ChatFinishReason, ChatSubmitState
from horde_core.openapi import (
    WORKER_APIKEY_HEADER,
    Answer,
    NativeOperation,
    install_native_openapi,
    nullable,
)

DESCRIPTION = (
    "The AI Horde's text worker routes for results: submit a text or chat job's reply (or its fault), and post "
    "a streamed chat job's progress. Every route also answers at `/v2/...` without the `/api` prefix. Every "
    'error is the Horde envelope `{"message", "rc"}`.'
)

_TEXT = {"type": "string"}
_GEN_ID = {"type": "string", "minLength": 1, "description": "The generation id from the pop."}
_COUNT = nullable({"type": "integer", "minimum": 0, "maximum": limits.MAX_CHAT_REPORTED_TOKENS})


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _common(states: list[str]) -> dict[str, Any]:
    return {
        "id": _GEN_ID,
        "state": nullable({"type": "string", "enum": states}),
        "seed": nullable({"type": "integer"}),
        "gen_metadata": nullable({"type": "array", "items": {"type": "object"}}),
    }


def submit_schemas() -> dict[str, Any]:
    """``SubmitRequest`` (a text, chat or faulted chat submit) and the schemas it references."""
    all_states = [s.value for s in ChatSubmitState]
    reply_states = [s.value for s in ChatSubmitState if s != ChatSubmitState.faulted]
    return {
        "SubmitRequest": {
            "description": "A text job's submit, a chat job's structured submit, or a chat job's fault.",
            "anyOf": [_ref("TextSubmit"), _ref("ChatSubmit"), _ref("ChatFaultSubmit")],
        },
        "TextSubmit": {
            "type": "object",
            "description": "A text job's result; state faulted faults the job (200 {reward: 0}).",
            "properties": {**_common(all_states), "generation": _TEXT},
            "required": ["id", "generation"],
            "additionalProperties": True,
        },
        "ChatSubmit": {
            "type": "object",
            "description": "A chat job's reply, checked against the request's tools and response format.",
            "properties": {
                **_common(reply_states),
                "message": _ref("ChatReplyMessage"),
                "finish_reason": {"type": "string", "enum": [r.value for r in ChatFinishReason]},
                "native_finish_reason": nullable(
                    {"type": "string", "maxLength": limits.MAX_CHAT_NATIVE_FINISH_REASON_LENGTH}
                ),
                "prompt_tokens": _COUNT,
                "completion_tokens": _COUNT,
                "reasoning_tokens": _COUNT,
                "model_id": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The generation's assigned model.",
                },
                "fault_reason": nullable(_TEXT),
            },
            "required": ["id", "message", "finish_reason", "model_id"],
            "additionalProperties": True,
        },
        "ChatFaultSubmit": {
            "type": "object",
            "description": "A chat job the worker could not finish. Known fault reasons: "
            + ", ".join(r.value for r in ChatFaultReason)
            + "; any other is accepted as none.",
            "properties": {
                **_common(["faulted"]),
                "model_id": {"type": "string", "minLength": 1},
                "fault_reason": nullable(_TEXT),
            },
            "required": ["id", "state", "model_id"],
            "additionalProperties": True,
        },
        "ChatReplyMessage": {
            "type": "object",
            "properties": {
                "role": {"type": "string", "enum": ["assistant"]},
                "content": nullable(_TEXT),
                "tool_calls": nullable(
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": limits.MAX_CHAT_TOOL_CALL_COUNT,
                        "items": _ref("ChatReplyToolCall"),
                    }
                ),
                "reasoning_content": nullable(_TEXT),
            },
            "required": ["role"],
            "additionalProperties": False,
        },
        "ChatReplyToolCall": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "minLength": 1},
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
    }


def progress_schemas() -> dict[str, Any]:
    """``ProgressRequest``: ``{id, seq, delta: {content?, reasoning_content?}}``."""
    return {
        "ProgressRequest": {
            "type": "object",
            "properties": {
                "id": _GEN_ID,
                "seq": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "1 for the first post, then one more each.",
                },
                "delta": {
                    "type": "object",
                    "description": "What was generated since the previous post; content may be empty only with "
                    "reasoning_content.",
                    "properties": {"content": nullable(_TEXT), "reasoning_content": nullable(_TEXT)},
                    "additionalProperties": True,
                },
            },
            "required": ["id", "seq", "delta"],
            "additionalProperties": True,
        },
    }


def answer_schemas() -> dict[str, Any]:
    """The successful answers of submit's routes."""
    return {
        "SubmitAccepted": {
            "type": "object",
            "properties": {"reward": {"type": "number", "description": "The kudos the worker earned."}},
            "required": ["reward"],
            "additionalProperties": True,
        },
        "ProgressAccepted": {
            "type": "object",
            "properties": {
                "accepted_seq": {"type": "integer"},
                "cancelled": {
                    "type": "boolean",
                    "description": "The request was cancelled: stop generating.",
                },
            },
            "required": ["accepted_seq", "cancelled"],
            "additionalProperties": True,
        },
    }


SUBMIT_ERRORS = {
    "400": "BadRequest, NulByteInPayload, ChatSubmitInvalid, ChatSubmitNonconformant, ChatModelMismatch, "
    "DuplicateGen, AbortedGen",
    "401": "InvalidAPIKey",
    "403": "WrongCredentials",
    "404": "InvalidJobID",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge",
    "429": "RateLimitExceeded",
}
PROGRESS_ERRORS = {
    "400": "BadRequest",
    "401": "InvalidAPIKey",
    "403": "WrongCredentials",
    "404": "ChatJobAborted, ChatProgressNotStreaming",
    "408": "RequestBodyTimeout",
    "409": "ChatProgressOutOfSequence (the body adds expected_seq)",
    "413": "ChatProgressCapReached",
    "429": "RateLimitExceeded",
    "503": "ChatProgressUnavailable",
}


def operations() -> list[NativeOperation]:
    """Submit's routes, as served under ``/api``."""
    return [
        NativeOperation(
            method="post",
            path="/api/v2/generate/text/submit",
            summary="Submit a job's result",
            description=(
                "Store a text job's generation or a chat job's structured reply, verify it, settle the kudos and "
                "wake the waiting client; or fault the job (state faulted)."
            ),
            body="SubmitRequest",
            headers=(WORKER_APIKEY_HEADER,),
            answers={"200": Answer("The reply is stored (or the fault applied).", "SubmitAccepted")},
            errors=SUBMIT_ERRORS,
        ),
        NativeOperation(
            method="post",
            path="/api/v2/generate/text/progress",
            summary="Post a streamed chat job's progress",
            description=(
                "Append what the worker generated since its previous post to the request's progress stream, and "
                "renew the job lease. Only for a job whose payload carries stream_progress."
            ),
            body="ProgressRequest",
            headers=(WORKER_APIKEY_HEADER,),
            answers={"200": Answer("The post is accepted.", "ProgressAccepted")},
            errors=PROGRESS_ERRORS,
        ),
    ]


def schemas() -> dict[str, Any]:
    """Every component schema of submit's document."""
    return {**submit_schemas(), **progress_schemas(), **answer_schemas()}


def install_openapi(app: FastAPI) -> None:
    """Serve submit's document at ``/openapi.json``."""
    install_native_openapi(app, description=DESCRIPTION, operations=operations(), schemas=schemas())
