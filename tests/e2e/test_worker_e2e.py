"""The reference worker (scripted backend) against every service as its own process.

Plain, tool-call and reasoning replies through the OpenAI SDK, a legacy text job, and each fault reason
reaching submit as a faulted chat submit with that ``fault_reason`` (seen on submit's
``horde_chat_worker_faults_total``), with the job restarted until the request faults past the limit.
"""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest

from .conftest import MODEL, Stack

GREETING = "Hello from the scripted backend:"
FAULT_REASONS = [
    "prompt_overflow",
    "unbuildable_grammar",
    "tool_violation",
    "reply_refused",
    "generation_error",
]
STORED_FAULT_MESSAGES = {
    "prompt_overflow": "The worker could not fit the prompt into its context.",
    "unbuildable_grammar": "The worker could not build the grammar the request's tool choice or response format needs.",
    "tool_violation": "The model's reply broke the request's tool controls.",
    "generation_error": "The worker's backend failed while generating.",
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def worker_stack(stack: Stack) -> Stack:
    stack.stop_workers()
    stack.start_worker("e2e-scripted", ("HORDE_WORKER_THREADS", "3"))
    return stack


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=90)


def worker_faults(stack: Stack) -> dict[str, float]:
    text = httpx.get(f"{stack.url('submit')}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for match in re.finditer(r"^horde_chat_worker_faults_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        counts[labels["reason"]] = counts.get(labels["reason"], 0.0) + float(match.group(2))
    return counts


def test_plain_reply(worker_stack: Stack) -> None:
    completion = client(worker_stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "plain"}],
    )
    assert completion.choices[0].message.content == f"{GREETING} plain"
    assert completion.choices[0].finish_reason == "stop"


def test_tool_call_reply(worker_stack: Stack) -> None:
    completion = client(worker_stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "[[tool:get_weather]] What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    assert calls[0].id == "call_1"
    assert isinstance(calls[0].function.arguments, str)  # type: ignore[union-attr]


def test_reasoning_reply(worker_stack: Stack) -> None:
    completion = client(worker_stack).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "[[think]] ponder this"}]
    )
    message = completion.choices[0].message
    assert message.content == f"{GREETING} ponder this"
    reasoning = getattr(message, "reasoning_content", None) or (message.model_extra or {}).get(
        "reasoning_content"
    )
    assert reasoning, "the reasoning is split out of content into reasoning_content"
    assert "<think>" not in (message.content or "")


def test_legacy_text_job(worker_stack: Stack) -> None:
    r = httpx.post(
        f"{worker_stack.native}/generate/text/async",
        headers={"apikey": worker_stack.client_key},
        json={"prompt": "Once upon a time", "params": {"max_length": 32}, "models": [MODEL]},
        timeout=10,
    )
    assert r.status_code == 202, r.text
    request_id = r.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = httpx.get(f"{worker_stack.native}/generate/text/status/{request_id}", timeout=10).json()
        if status["done"]:
            break
        time.sleep(0.2)
    assert status["done"] and not status["faulted"], status
    assert status["generations"][0]["text"].startswith(f"{GREETING} Once upon a time")
    # A text request's id is not a chat request's.
    assert httpx.get(f"{worker_stack.native}/generate/chat/status/{request_id}").status_code == 404


def test_each_fault_reason_reaches_submit_and_restarts_the_job(worker_stack: Stack) -> None:
    before = worker_faults(worker_stack)
    ids = {}
    for reason in FAULT_REASONS:
        r = httpx.post(
            f"{worker_stack.native}/generate/chat/async",
            headers={"apikey": worker_stack.client_key},
            json={"model": MODEL, "messages": [{"role": "user", "content": f"[[fault:{reason}]] please"}]},
            timeout=10,
        )
        assert r.status_code == 202, r.text
        ids[reason] = r.json()["id"]

    statuses: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + 180
    while len(statuses) < len(ids) and time.monotonic() < deadline:
        for reason, request_id in ids.items():
            if reason in statuses:
                continue
            status = httpx.get(f"{worker_stack.native}/generate/chat/status/{request_id}", timeout=10).json()
            if status["done"]:
                statuses[reason] = status
        time.sleep(0.5)
    assert len(statuses) == len(ids), f"not all faulted in time: {sorted(statuses)}"

    after = worker_faults(worker_stack)
    for reason in FAULT_REASONS:
        status = statuses[reason]
        # Restarted after each fault until the third crossed FAULTED_GENERATIONS_LIMIT (2).
        assert status["faulted"] is True, (reason, status)
        assert status["restarted"] == 3, (reason, status)
        assert status["finished"] == 0
        assert after.get(reason, 0) - before.get(reason, 0) == 3, (reason, before, after)
        if reason == "reply_refused":
            # The Horde's own refusal is more specific than the worker's reason, and is kept.
            assert status["fault_rc"] == "ChatSubmitInvalid", status
        else:
            assert status["fault_rc"] == "ChatWorkerFault", status
            assert status["fault_reason"] == STORED_FAULT_MESSAGES[reason]
