"""The Gemma template (llamacpp backend, pure part) and the scripted backend's markers."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from horde_worker.backends import gemma
from horde_worker.backends.scripted import (
    GREETING,
    ScriptedBackend,
    filler_words,
    parse_markers,
    stream_pieces,
)
from horde_worker.jobs import BackendFault, ChatDelta, ChatJob, ChatOutput, TextJob
from horde_worker.replies import ThinkSplitter, build_chat_submit
from horde_worker.schema_sample import sample_value

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}

# -- gemma ------------------------------------------------------------------------------------------------------


def test_system_text_is_folded_into_the_first_user_turn() -> None:
    prompt = gemma.render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
        ]
    )
    assert prompt == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_tool_history_and_merged_turns() -> None:
    prompt = gemma.render(
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "Thanks"},
        ],
        tools=[WEATHER],
    )
    turns = prompt.split("<end_of_turn>\n")
    assert turns[0].startswith("<start_of_turn>user\nYou may call these functions") and turns[0].endswith(
        "Weather?"
    )
    assert (
        turns[1]
        == '<start_of_turn>model\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    )
    assert turns[2] == "<start_of_turn>user\nResult of get_weather (call_1):\nsunny\n\nThanks"
    assert turns[3] == "<start_of_turn>model\n"


def test_only_system_message() -> None:
    assert (
        gemma.render([{"role": "system", "content": "S"}])
        == "<start_of_turn>user\nS<end_of_turn>\n<start_of_turn>model\n"
    )


def test_parse_tool_blocks() -> None:
    rest, calls = gemma.parse_tool_blocks('ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    assert rest == "ok"
    assert calls == [{"type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]
    text = "<tool_call>not json</tool_call>"
    assert gemma.parse_tool_blocks(text) == (text, [])


def test_forced_call_schema() -> None:
    schema = gemma.forced_call_schema([WEATHER])
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["required"] == ["name", "arguments"]
    assert "anyOf" in gemma.forced_call_schema([WEATHER, WEATHER])


# -- schema sampling ----------------------------------------------------------------------------------------------


def test_sample_value_satisfies_simple_schemas() -> None:
    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 10},
            "n": {"type": "integer", "minimum": 3},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2},
            "ref": {"$ref": "#/$defs/flag"},
            "opt": {"anyOf": [{"type": "null"}, {"type": "number"}]},
        },
        "required": ["name", "n", "tags", "ref", "opt"],
        "$defs": {"flag": {"type": "boolean"}},
    }
    jsonschema.validate(sample_value(schema), schema)


# -- scripted backend ---------------------------------------------------------------------------------------------


def chat(text: str, **kw: object) -> ChatJob:
    base: dict[str, object] = {
        "id": "j",
        "messages": [{"role": "user", "content": text}],
        "max_length": 64,
        "max_context_length": 1024,
    }
    base.update(kw)
    return ChatJob(**base)  # type: ignore[arg-type]


ALL = frozenset({"tool_choice_enforced", "single_tool_call_enforced", "structured_output_enforced"})


def test_parse_markers() -> None:
    markers, rest = parse_markers('a [[tool:f:{"x": [1]}]] b [[think]]')
    assert [(m.name, m.arg) for m in markers] == [("tool", 'f:{"x": [1]}'), ("think", None)]
    assert rest == "a b"


async def test_default_reply_echoes_the_last_user_text() -> None:
    out = await ScriptedBackend().generate_chat(chat("How are  you?"))
    assert out.content == f"{GREETING} How are you?"
    assert out.native_finish_reason == "stop"
    assert out.prompt_tokens == 3 and out.completion_tokens == len(out.content.split())


async def test_tool_markers() -> None:
    backend = ScriptedBackend()
    out = await backend.generate_chat(chat("[[tool]]", tools=[WEATHER], tool_choice="required"))
    assert out.tool_calls[0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"scripted","days":1}',
    }
    out = await backend.generate_chat(
        chat('[[tool:get_weather:{"city":"Oslo"}]][[tool:get_weather]]', tools=[WEATHER])
    )
    assert [c["id"] for c in out.tool_calls] == ["call_1", "call_2"]
    assert out.tool_calls[0]["function"]["arguments"] == '{"city":"Oslo"}'


async def test_think_markers_split_in_the_submit() -> None:
    backend = ScriptedBackend()
    body = build_chat_submit(chat("q [[think]]"), await backend.generate_chat(chat("q [[think]]")), "m", ALL)
    assert body["message"]["reasoning_content"] == "Scripted reasoning about: q"
    assert body["message"]["content"] == f"{GREETING} q"
    assert body["reasoning_tokens"] == 4
    out = await backend.generate_chat(chat("q [[think:unclosed]]"))
    body = build_chat_submit(chat("q"), out, "m", ALL)
    assert body["message"]["content"] == "" and body["finish_reason"] == "length"


async def test_length_is_real_when_the_echo_is_too_long() -> None:
    out = await ScriptedBackend().generate_chat(chat("one two three four five", max_length=3))
    assert out.content == "Hello from the" and out.native_finish_reason == "length"


async def test_json_reply_follows_the_schema() -> None:
    rf = {
        "type": "json_schema",
        "json_schema": {"name": "w", "strict": True, "schema": WEATHER["function"]["parameters"]},
    }
    j = chat("give json", response_format=rf)
    body = build_chat_submit(j, await ScriptedBackend().generate_chat(j), "m", ALL)
    assert json.loads(body["message"]["content"]) == {"city": "scripted", "days": 1}
    bad = chat("[[json:bad]]", response_format=rf)
    with pytest.raises(BackendFault):
        build_chat_submit(bad, await ScriptedBackend().generate_chat(bad), "m", ALL)


@pytest.mark.parametrize("reason", ["prompt_overflow", "unbuildable_grammar", "generation_error"])
async def test_fault_markers(reason: str) -> None:
    with pytest.raises(BackendFault) as err:
        await ScriptedBackend().generate_chat(chat(f"[[fault:{reason}]]"))
    assert err.value.reason == reason


async def test_prompt_overflow_is_counted() -> None:
    with pytest.raises(BackendFault) as err:
        await ScriptedBackend().generate_chat(chat("word " * 100, max_length=50, max_context_length=120))
    assert err.value.reason == "prompt_overflow"


async def test_tool_violation_marker_fails_the_worker_check() -> None:
    j = chat("[[fault:tool_violation]]", tools=[WEATHER], tool_choice="auto")
    with pytest.raises(BackendFault) as err:
        build_chat_submit(j, await ScriptedBackend().generate_chat(j), "m", ALL)
    assert err.value.reason == "tool_violation"


async def test_misc_markers() -> None:
    backend = ScriptedBackend()
    out = await backend.generate_chat(chat("[[reply:exact text]][[nousage]][[finish:content_filter]]"))
    assert out.content == "exact text" and out.prompt_tokens is None
    assert out.native_finish_reason == "content_filter"
    with pytest.raises(BackendFault) as err:
        await backend.generate_chat(chat("[[fault:none]]"))
    assert err.value.reason is None
    with pytest.raises(RuntimeError):
        await backend.generate_chat(chat("[[fault:crash]]"))


async def test_text_jobs() -> None:
    backend = ScriptedBackend()
    job = TextJob(id="t", prompt="Story:\nOnce upon a time\n", payload={})
    assert await backend.generate_text(job, 100) == f"{GREETING} Once upon a time"
    assert await backend.generate_text(job, 2) == "Hello from"
    with pytest.raises(BackendFault):
        await backend.generate_text(TextJob(id="t", prompt="[[fault:generation_error]]", payload={}), 10)


# -- scripted streaming -------------------------------------------------------------------------------------------


async def collect(backend: ScriptedBackend, job: ChatJob) -> tuple[list[tuple[float, ChatDelta]], ChatOutput]:
    """The deltas (with their arrival time from the start) and the final output of a stream."""
    start = time.monotonic()
    deltas: list[tuple[float, ChatDelta]] = []
    final: ChatOutput | None = None
    async for item in backend.stream_chat(job):
        if isinstance(item, ChatOutput):
            final = item
        else:
            assert final is None, "the output comes last"
            deltas.append((time.monotonic() - start, item))
    assert final is not None
    return deltas, final


def test_words_and_pieces() -> None:
    assert filler_words(3) == "alpha bravo charlie"
    assert len(filler_words(60).split()) == 60 and filler_words(27).split()[-1] == "alpha"
    assert stream_pieces("<think>a b</think>\n\nc ") == ["<think>a", " b</think>", "\n\nc", " "]
    assert stream_pieces("") == []


async def test_stream_without_pace_concatenates_to_the_output() -> None:
    deltas, out = await collect(ScriptedBackend(), chat("Say hi [[words:5]]", max_length=64))
    assert out.content == f"{GREETING} Say hi alpha bravo charlie delta echo"
    assert [d.content for _, d in deltas] == stream_pieces(out.content)
    assert all(d.reasoning == "" for _, d in deltas)


async def test_pace_spreads_the_reply_evenly() -> None:
    deltas, out = await collect(ScriptedBackend(), chat("go [[pace:0.6]] [[words:25]]", max_length=64))
    assert len(deltas) == len(out.content.split()) == 31
    times = [t for t, _ in deltas]
    assert 0.55 <= times[-1] < 1.5
    assert times[0] < 0.15  # the first word after one step, not after the whole pace
    assert "".join(d.content for _, d in deltas) == out.content


async def test_pace_without_streaming_returns_after_the_pace() -> None:
    start = time.monotonic()
    out = await ScriptedBackend().generate_chat(chat("go [[pace:0.3]]"))
    assert time.monotonic() - start >= 0.29 and out.content == f"{GREETING} go"


async def test_think_streams_reasoning_first_then_content() -> None:
    j = chat("why? [[think]] [[words:3]]", max_length=64)
    deltas, out = await collect(ScriptedBackend(), j)
    splitter = ThinkSplitter()
    order: list[str] = []
    reasoning, content = "", ""
    for _, d in deltas:
        r, c = splitter.feed(d.content)
        reasoning, content = reasoning + r, content + c
        order += ["r"] * bool(r) + ["c"] * bool(c)
    r, c = splitter.flush()
    reasoning, content = reasoning + r, content + c
    assert order == sorted(order, reverse=True) and "r" in order and "c" in order  # all reasoning first
    body = build_chat_submit(j, out, "m", ALL)
    assert (reasoning, content) == (body["message"]["reasoning_content"], body["message"]["content"])
    assert content == f"{GREETING} why? alpha bravo charlie"


async def test_a_paced_stream_is_cancelled_at_once() -> None:
    received: list[ChatDelta | ChatOutput] = []

    async def consume() -> None:
        async for item in ScriptedBackend().stream_chat(chat("slow [[pace:6.5]] [[words:10]]")):
            received.append(item)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.75)  # 6.5 s over 13 pieces: one piece every 0.5 s
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)  # a hang guard
    # Cancelled inside the wait for the second piece: no piece after it.
    assert len(received) == 1 and isinstance(received[0], ChatDelta)


async def test_tool_replies_are_not_streamed() -> None:
    deltas, out = await collect(ScriptedBackend(), chat("[[tool]]", tools=[WEATHER], tool_choice="required"))
    assert deltas == [] and out.tool_calls


async def test_random_starts_the_reply_with_a_random_word() -> None:
    backend = ScriptedBackend()
    first = await backend.generate_chat(chat("again [[random]]"))
    second = await backend.generate_chat(chat("again [[random]]"))
    assert first.content != second.content
    assert (first.content or "").split(" ", 1)[1] == f"{GREETING} again"


async def test_pace_applies_to_text_jobs() -> None:
    started = time.monotonic()
    out = await ScriptedBackend().generate_text(TextJob(id="t", prompt="go [[pace:0.2]]", payload={}), 10)
    assert time.monotonic() - started >= 0.19 and out == f"{GREETING} go"
