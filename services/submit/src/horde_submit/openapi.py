"""Submit's OpenAPI 3.1 document (``/openapi.json``): the submit and progress routes (docs/native-api.md
#submit, #reasoning, #worker-fault-reasons, #progress; docs/native-api.md#submit).

Both bodies are read by hand (``horde_contract.parse_submit_body``, ``parse_progress_body``), so their schemas
are written here from the spec's tables. A submit is a text submit (``generation``) or a chat submit (a body
carrying ``message``, ``model_id``, ``finish_reason`` or ``fault_reason``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from horde_contract import limits
from horde_contract.vocab import ChatFaultReason, ChatFinishReason, ChatSubmitState
from horde_core.openapi import Answer, NativeOperation, install_native_openapi, nullable
from horde_core.openapi_parts import STRING, json_object, ref, tool_call, worker_post

DESCRIPTION = (
    "The AI Horde's text worker routes for results: submit a text or chat job's reply (or its fault), and post "
    "a streamed chat job's progress. Every route also answers at `/v2/...` without the `/api` prefix. Every "
    'error is the Horde envelope `{"message", "rc"}`.'
)

_GEN_ID = {"type": "string", "minLength": 1, "description": "The generation id from the pop."}
_COUNT = nullable({"type": "integer", "minimum": 0, "maximum": limits.MAX_CHAT_REPORTED_TOKENS})


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
    chat_submit = json_object(
        {
            **_common(reply_states),
            "message": ref("ChatReplyMessage"),
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
            "fault_reason": nullable(STRING),
        },
        ["id", "message", "finish_reason", "model_id"],
        description="A chat job's reply, checked against the request's tools and response format.",
    )
    fault_submit = json_object(
        {
            **_common(["faulted"]),
            "model_id": {"type": "string", "minLength": 1},
            "fault_reason": nullable(STRING),
        },
        ["id", "state", "model_id"],
        description="A chat job the worker could not finish. Known fault reasons: "
        + ", ".join(r.value for r in ChatFaultReason)
        + "; any other is accepted as none.",
    )
    reply_message = json_object(
        {
            "role": {"type": "string", "enum": ["assistant"]},
            "content": nullable(STRING),
            "tool_calls": nullable(
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.MAX_CHAT_TOOL_CALL_COUNT,
                    "items": ref("ChatReplyToolCall"),
                }
            ),
            "reasoning_content": nullable(STRING),
        },
        ["role"],
        additional=False,
    )
    return {
        "SubmitRequest": {
            "description": "A text job's submit, a chat job's structured submit, or a chat job's fault.",
            "anyOf": [ref("TextSubmit"), ref("ChatSubmit"), ref("ChatFaultSubmit")],
        },
        "TextSubmit": json_object(
            {**_common(all_states), "generation": STRING},
            ["id", "generation"],
            description="A text job's result; state faulted faults the job (200 {reward: 0}).",
        ),
        "ChatSubmit": chat_submit,
        "ChatFaultSubmit": fault_submit,
        "ChatReplyMessage": reply_message,
        "ChatReplyToolCall": tool_call({"type": "string", "minLength": 1}),
    }


def progress_schemas() -> dict[str, Any]:
    """``ProgressRequest``: ``{id, seq, delta: {content?, reasoning_content?}}``."""
    delta = json_object(
        {"content": nullable(STRING), "reasoning_content": nullable(STRING)},
        description="What was generated since the previous post; content may be empty only with "
        "reasoning_content.",
    )
    seq = {"type": "integer", "minimum": 1, "description": "1 for the first post, then one more each."}
    return {
        "ProgressRequest": json_object({"id": _GEN_ID, "seq": seq, "delta": delta}, ["id", "seq", "delta"])
    }


def answer_schemas() -> dict[str, Any]:
    """The successful answers of submit's routes."""
    cancelled = {"type": "boolean", "description": "The request was cancelled: stop generating."}
    return {
        "SubmitAccepted": json_object(
            {"reward": {"type": "number", "description": "The kudos the worker earned."}}, ["reward"]
        ),
        "ProgressAccepted": json_object(
            {"accepted_seq": {"type": "integer"}, "cancelled": cancelled}, ["accepted_seq", "cancelled"]
        ),
    }


SUBMIT_ERRORS = {
    "400": "BadRequest, ChatSubmitInvalid, ChatSubmitNonconformant, ChatModelMismatch, DuplicateGen, AbortedGen",
    "401": "InvalidAPIKey",
    "403": "WrongCredentials",
    "404": "InvalidJobID",
    "408": "RequestBodyTimeout",
    "413": "RequestTooLarge",
    "429": "RateLimitExceeded",
}
PROGRESS_ERRORS = {
    "400": "BadRequest",
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
        worker_post(
            "/api/v2/generate/text/submit",
            "Submit a job's result",
            (
                "Store a text job's generation or a chat job's structured reply, verify it, settle the kudos and "
                "wake the waiting client; or fault the job (state faulted)."
            ),
            body="SubmitRequest",
            answer=Answer("The reply is stored (or the fault applied).", "SubmitAccepted"),
            errors=SUBMIT_ERRORS,
        ),
        worker_post(
            "/api/v2/generate/text/progress",
            "Post a streamed chat job's progress",
            (
                "Append what the worker generated since its previous post to the request's progress stream, and "
                "renew the job lease. Only for a job whose payload carries stream_progress."
            ),
            body="ProgressRequest",
            answer=Answer("The post is accepted.", "ProgressAccepted"),
            errors=PROGRESS_ERRORS,
        ),
    ]


def schemas() -> dict[str, Any]:
    """Every component schema of submit's document."""
    return {**submit_schemas(), **progress_schemas(), **answer_schemas()}


def install_openapi(app: FastAPI) -> None:
    """Serve submit's document at ``/openapi.json``."""
    install_native_openapi(app, description=DESCRIPTION, operations=operations(), schemas=schemas())
