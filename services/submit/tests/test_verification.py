"""Every row of the docs/native-api.md#reply-verification table through the submit route, under strict and best_effort.

A refused reply returns 400 with its rc and leaves the generation pending with the refusal recorded; a passing
reply is stored (with the single-call reduction and the finish reason rule applied).
"""

from __future__ import annotations

from typing import Any

import pytest

SUBMIT = "/v2/generate/text/submit"

WEATHER = {"type": "function", "function": {"name": "lookup_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "lookup_time", "parameters": {"type": "object"}}}


def call(name: str, call_id: str = "call_1", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


STRICT_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "colour",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"shade": {"type": "string"}},
            "required": ["shade"],
            "additionalProperties": False,
        },
    },
}

# (name, chat_extras, content, tool_calls, finish_reason, strict outcome, best_effort outcome)
# An outcome is an rc (refused) or "ok".
ROWS = [
    (
        "undefined function",
        {"tools": [WEATHER]},
        None,
        [call("other")],
        "tool_calls",
        "ChatSubmitInvalid",
        "ChatSubmitInvalid",
    ),
    (
        "call without tools",
        None,
        None,
        [call("lookup_weather")],
        "tool_calls",
        "ChatSubmitInvalid",
        "ChatSubmitInvalid",
    ),
    (
        "duplicate ids",
        {"tools": [WEATHER, TIME]},
        None,
        [call("lookup_weather", "c1"), call("lookup_time", "c1")],
        "tool_calls",
        "ChatSubmitInvalid",
        "ChatSubmitInvalid",
    ),
    (
        "call under none",
        {"tools": [WEATHER], "tool_choice": "none"},
        None,
        [call("lookup_weather")],
        "tool_calls",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "no call under required",
        {"tools": [WEATHER], "tool_choice": "required"},
        "text",
        None,
        "stop",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "no call under a function choice",
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "lookup_weather"}}},
        "text",
        None,
        "stop",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "another function under a function choice",
        {
            "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "lookup_weather"}},
        },
        None,
        [call("lookup_time")],
        "tool_calls",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "json_object not an object",
        {"response_format": {"type": "json_object"}},
        "[1, 2]",
        None,
        "stop",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "json_schema without strict, not an object",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            }
        },
        "not json",
        None,
        "stop",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "strict json_schema mismatch",
        {"response_format": STRICT_SCHEMA},
        '{"shade": 3}',
        None,
        "stop",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "strict json_schema match",
        {"response_format": STRICT_SCHEMA},
        '{"shade": "red"}',
        None,
        "stop",
        "ok",
        "ok",
    ),
    (
        "json_object NaN refused",
        {"response_format": {"type": "json_object"}},
        '{"a": NaN}',
        None,
        "stop",
        "ChatSubmitNonconformant",
        "ok",
    ),
    (
        "tool calls exempt from the response format",
        {"tools": [WEATHER], "response_format": {"type": "json_object"}},
        "",
        [call("lookup_weather")],
        "tool_calls",
        "ok",
        "ok",
    ),
]


@pytest.mark.parametrize("conformance", ["strict", "best_effort"])
@pytest.mark.parametrize(
    ("name", "extras", "content", "calls", "finish", "strict", "best_effort"), ROWS, ids=[r[0] for r in ROWS]
)
async def test_verification_row(
    app_client, factory, conformance, name, extras, content, calls, finish, strict, best_effort
) -> None:
    job = await factory.job(chat_extras=extras, conformance=conformance)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    body = {"id": str(job.gen_id), "message": message, "finish_reason": finish, "model_id": job.model}
    r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    expected = strict if conformance == "strict" else best_effort
    gen = await factory.row(
        "SELECT generation, chat_refusal_rc FROM processing_gens WHERE id = $1", job.gen_id
    )
    wp = await factory.row(
        "SELECT chat_fault_reason, chat_fault_rc FROM waiting_prompts WHERE id = $1", job.wp_id
    )
    if expected == "ok":
        assert r.status_code == 200, r.text
        assert gen["generation"] is not None
        assert gen["chat_refusal_rc"] is None
    else:
        assert r.status_code == 400, r.text
        assert r.json()["rc"] == expected
        assert gen["generation"] is None
        assert gen["chat_refusal_rc"] == expected
        assert (wp["chat_fault_reason"], wp["chat_fault_rc"]) == (r.json()["message"], expected)


async def test_single_call_reduction_and_forced_finish(app_client, factory) -> None:
    """strict + parallel_tool_calls false keeps the first call; best_effort keeps all; a tool_calls finish under
    a function choice is stored as stop."""
    for conformance, kept in (("strict", 1), ("best_effort", 2)):
        extras = {"tools": [WEATHER, TIME], "tool_choice": "auto", "parallel_tool_calls": False}
        job = await factory.job(chat_extras=extras, conformance=conformance)
        calls = [call("lookup_weather", "c1"), call("lookup_time", "c2")]
        body = {
            "id": str(job.gen_id),
            "message": {"role": "assistant", "content": None, "tool_calls": calls},
            "finish_reason": "tool_calls",
            "model_id": job.model,
        }
        r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
        assert r.status_code == 200, r.text
        gen = await factory.row("SELECT message FROM processing_gens WHERE id = $1", job.gen_id)
        assert gen["message"]["tool_calls"] == calls[:kept]

    forced = {"type": "function", "function": {"name": "lookup_weather"}}
    job = await factory.job(chat_extras={"tools": [WEATHER], "tool_choice": forced})
    body = {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": None, "tool_calls": [call("lookup_weather")]},
        "finish_reason": "tool_calls",
        "model_id": job.model,
    }
    r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text
    gen = await factory.row("SELECT finish_reason FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["finish_reason"] == "stop"
