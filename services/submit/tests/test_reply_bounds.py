"""Reply verification cannot be weaponised, through the submit route on real stores.

A requester's strict schema and a worker's reply are both hostile input: a catastrophic pattern is answered at
once (RE2), a check that would run long ends at its bound as ChatSubmitNonconformant while the service keeps
answering /healthz and gRPC, references never leave the schema, and a reply longer than its job allows is 400
ChatSubmitInvalid with nothing stored.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest
from horde_core.grpc import check_health, insecure_channel

SUBMIT = "/v2/generate/text/submit"

REDOS = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"}},
    "required": ["s"],
    "additionalProperties": False,
}

# Both branches fail only at the bottom of a nested array: 2**depth evaluations without a bound.
EXPONENTIAL = {
    "$defs": {
        "n": {
            "anyOf": [
                {"type": "array", "items": {"$ref": "#/$defs/n"}},
                {"type": "array", "items": {"$ref": "#/$defs/n"}},
            ]
        }
    },
    "$ref": "#/$defs/n",
}


def strict(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "strict": True, "schema": schema},
        }
    }


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def chat_body(job: Any, content: str | None, **message: Any) -> dict[str, Any]:
    return {
        "id": str(job.gen_id),
        "message": {"role": "assistant", "content": content, **message},
        "finish_reason": "stop",
        "model_id": job.model,
    }


async def stored(factory: Any, job: Any) -> tuple[Any, Any]:
    gen = await factory.row(
        "SELECT generation, message, chat_refusal_rc FROM processing_gens WHERE id = $1", job.gen_id
    )
    wp = await factory.row(
        "SELECT chat_fault_reason, chat_fault_rc FROM waiting_prompts WHERE id = $1", job.wp_id
    )
    return gen, wp


async def test_catastrophic_pattern_is_nonconformant_at_once_while_healthz_answers(
    app_client, factory
) -> None:
    """The reproduction: ``^(a|a)*$`` against 40 a's and a '!' froze the service for good; now it is answered
    in milliseconds, and /healthz answers beside it."""
    job = await factory.job(chat_extras=strict(REDOS))
    body = chat_body(job, json.dumps({"s": "a" * 40 + "!"}))
    # A backtracking engine takes hours on this reply: answering at all is the proof (the wait_for is a hang
    # guard).
    r, health = await asyncio.wait_for(
        asyncio.gather(
            app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key}),
            app_client.get("/healthz"),
        ),
        30,
    )
    assert health.status_code == 200
    assert r.status_code == 400, r.text
    assert r.json()["rc"] == "ChatSubmitNonconformant"
    message = (
        "'message.content': The reply content does not match the response format schema at '/s': "
        f"'{'a' * 40}!' does not match '^(a|a)*$'"
    )
    assert r.json()["message"] == message
    gen, wp = await stored(factory, job)
    assert (gen["generation"], gen["message"], gen["chat_refusal_rc"]) == (
        None,
        None,
        "ChatSubmitNonconformant",
    )
    assert (wp["chat_fault_reason"], wp["chat_fault_rc"]) == (message, "ChatSubmitNonconformant")
    # A reply that matches is stored as before.
    ok = await factory.job(chat_extras=strict(REDOS))
    r = await app_client.post(
        SUBMIT, json=chat_body(ok, '{"s": "aaaa"}'), headers={"apikey": ok.owner.api_key}
    )
    assert r.status_code == 200, r.text


async def test_a_check_past_its_bound_is_nonconformant_and_the_service_keeps_answering(
    app_client, factory, submit_settings
) -> None:
    """A legal schema whose check grows exponentially with a small legal reply: the check runs off the event
    loop, ends at its bound (500,000 steps or 2 s of CPU) as ChatSubmitNonconformant, and /healthz and gRPC
    health answer while it runs."""
    job = await factory.job(chat_extras=strict(EXPONENTIAL))
    body = chat_body(job, json.dumps(nested(40)))
    channel = insecure_channel(f"127.0.0.1:{submit_settings.submit_grpc_port}")
    try:
        submit = asyncio.create_task(
            app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
        )
        answered: list[float] = []
        while not submit.done():
            asked = time.perf_counter()
            health = await app_client.get("/healthz")
            assert health.status_code == 200
            # A generous deadline: the check's thread competes for the GIL, so one answer may be slow on a
            # busy host; what proves the loop free is that several answers come while the check runs.
            assert await check_health(channel, rpc_timeout=15)
            answered.append(time.perf_counter() - asked)
            await asyncio.sleep(0.02)
        r = await submit
    finally:
        await channel.close()
    assert r.status_code == 400, r.text
    assert r.json()["rc"] == "ChatSubmitNonconformant"
    # Whichever bound this machine reaches first: 2 s of CPU, 500,000 steps or 50,000 reference expansions.
    assert re.fullmatch(
        r"'message\.content': The reply cannot be shown to match the response format schema: checking it exceeded "
        r"(its CPU time bound|more than 500000 validation steps|more than 50000 reference expansions)\.",
        r.json()["message"],
    ), r.json()["message"]
    # Health answered while the check ran, not after it (counted, not timed: a busy host only slows both).
    assert len(answered) >= 3, answered
    gen, _ = await stored(factory, job)
    assert (gen["generation"], gen["chat_refusal_rc"]) == (None, "ChatSubmitNonconformant")


@pytest.mark.parametrize("ref", ["file:///etc/passwd", "{server}/schema.json"], ids=["file", "http"])
async def test_references_outside_the_schema_do_not_resolve(app_client, factory, schema_server, ref) -> None:
    base, hits = schema_server
    ref = ref.format(server=base)
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": ref}},
        "required": ["a"],
        "additionalProperties": False,
    }
    job = await factory.job(chat_extras=strict(schema))
    r = await app_client.post(SUBMIT, json=chat_body(job, '{"a": {}}'), headers={"apikey": job.owner.api_key})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "message": "'response_format': The request's response format schema cannot be compiled (the reference "
        f"'{ref}' does not resolve inside it), so the reply cannot be shown to match it.",
        "rc": "ChatSubmitNonconformant",
    }
    assert hits == []
    gen, _ = await stored(factory, job)
    assert (gen["generation"], gen["chat_refusal_rc"]) == (None, "ChatSubmitNonconformant")


async def test_a_pattern_re2_does_not_take_is_uncompilable(app_client, factory) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": r"^(a+)\1$"}}}
    job = await factory.job(chat_extras=strict(schema))
    r = await app_client.post(
        SUBMIT, json=chat_body(job, '{"s": "aa"}'), headers={"apikey": job.owner.api_key}
    )
    assert r.status_code == 400, r.text
    assert r.json()["rc"] == "ChatSubmitNonconformant"
    assert r.json()["message"] == (
        "'response_format': The request's response format schema cannot be compiled (the pattern '^(a+)\\\\1$' is "
        "not one RE2 takes (no backreferences or lookarounds)), so the reply cannot be shown to match it."
    )


# -- replies bounded by the job -----------------------------------------------------------------------------


async def test_an_over_long_chat_reply_is_invalid_and_nothing_is_stored(app_client, factory) -> None:
    """The reproduction: a 7 MB reply to an 80-token job was stored twice (generation and message)."""
    job = await factory.job(max_length=80)
    r = await app_client.post(
        SUBMIT, json=chat_body(job, "a" * 7_000_000), headers={"apikey": job.owner.api_key}
    )
    assert r.status_code == 400, r.text
    message = (
        "'message': the content and tool calls take 7000000 bytes of UTF-8; at most 1280 are allowed for a job "
        "of max_length 80 (16 per token)."
    )
    assert r.json() == {"message": message, "rc": "ChatSubmitInvalid"}
    gen, wp = await stored(factory, job)
    assert (gen["generation"], gen["message"], gen["chat_refusal_rc"]) == (None, None, "ChatSubmitInvalid")
    assert (wp["chat_fault_reason"], wp["chat_fault_rc"]) == (message, "ChatSubmitInvalid")
    # The same job takes a reply within its bound: 640 two-byte characters are exactly 1280 bytes.
    r = await app_client.post(SUBMIT, json=chat_body(job, "é" * 640), headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text
    gen, _ = await stored(factory, job)
    assert gen["generation"] == "é" * 640


async def test_tool_call_arguments_count_toward_the_bound(app_client, factory) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    job = await factory.job(max_length=16, chat_extras={"tools": [tool]})
    call: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "x" * 254}}
    body = chat_body(job, None, tool_calls=[call])
    body["finish_reason"] = "tool_calls"
    r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    assert r.status_code == 400, r.text
    assert r.json()["rc"] == "ChatSubmitInvalid"
    assert r.json()["message"].startswith(
        "'message': the content and tool calls take 257 bytes of UTF-8; at most 256"
    )
    call["function"]["arguments"] = "x" * 253
    r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text


async def test_an_over_long_text_reply_is_invalid_and_nothing_is_stored(app_client, factory) -> None:
    job = await factory.job(is_chat=False, max_length=80)
    body = {"id": str(job.gen_id), "generation": "a" * 1281}
    r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "message": "'generation': takes 1281 bytes of UTF-8; at most 1280 are allowed for a job of max_length 80 "
        "(16 per token).",
        "rc": "ChatSubmitInvalid",
    }
    gen, _ = await stored(factory, job)
    assert gen["generation"] is None
    body["generation"] = "a" * 1280
    r = await app_client.post(SUBMIT, json=body, headers={"apikey": job.owner.api_key})
    assert r.status_code == 200, r.text
