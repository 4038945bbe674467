"""A real model (make test-llm) answers an OpenAI SDK call through the whole horde.

The reference worker runs the in-process llama.cpp backend on gemma3-270m; every service is its own process.
Needs the llamacpp extra (``make test-llm`` installs it); deselected from the default suite by the marker.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from .conftest import Stack

pytestmark = pytest.mark.llm

MODEL = "gemma-3-270m"
COLOUR_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "warm": {"type": "boolean"}},
    "required": ["name", "warm"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm_stack(stack: Stack) -> Stack:
    pytest.importorskip("llama_cpp", reason="needs the llamacpp extra: run make test-llm")
    stack.stop_workers()
    stack.start_worker(
        "e2e-llamacpp", ("HORDE_WORKER_BACKEND", "llamacpp"), ("HORDE_WORKER_SEED", "7"), models=MODEL
    )
    return stack


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.front, api_key=stack.client_key, max_retries=0, timeout=240)


def test_openai_sdk_gets_text_the_model_generated(llm_stack: Stack) -> None:
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
        "max_tokens": 32,
        "temperature": 0,
        "seed": 7,
    }
    first = client(llm_stack).chat.completions.create(**ask)  # type: ignore[call-overload]
    assert first.model == MODEL
    content = first.choices[0].message.content
    assert isinstance(content, str) and content.strip(), first
    assert "scripted backend" not in content
    assert first.choices[0].finish_reason in {"stop", "length"}
    # Greedy decoding with a fixed seed: the model, not a script, produced it, and does so again.
    second = client(llm_stack).chat.completions.create(**ask)  # type: ignore[call-overload]
    assert second.choices[0].message.content == content


def test_strict_json_schema_reply_validates(llm_stack: Stack) -> None:
    completion = client(llm_stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour and say whether it is warm."}],
        max_tokens=64,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "colour", "schema": COLOUR_SCHEMA, "strict": True},
        },
    )
    content = completion.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), COLOUR_SCHEMA)


def test_the_model_streams_through_the_front_in_many_chunks(llm_stack: Stack) -> None:
    """The llamacpp worker streams progress and the front relays it as it is generated."""
    chunks = list(
        client(llm_stack).chat.completions.create(  # type: ignore[call-overload]
            model=MODEL,
            messages=[{"role": "user", "content": "Write three sentences about the sea."}],
            max_tokens=96,
            temperature=0,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) >= 5, chunks
    text = "".join(content)
    assert text.strip() and "scripted backend" not in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert len({c.system_fingerprint for c in chunks}) == 1
