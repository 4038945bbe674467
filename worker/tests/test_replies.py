"""Reply building: reasoning split, tool checks, strict schemas, finish reasons, submit bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from horde_worker.jobs import BackendFault, ChatJob, ChatOutput
from horde_worker.replies import (
    ThinkSplitter,
    build_chat_fault,
    build_chat_submit,
    check_strict_schema,
    check_tool_calls,
    map_finish_reason,
    normalize_tool_calls,
    parse_json_strict,
    split_reasoning,
)

ALL = frozenset(
    {
        "tool_choice_enforced",
        "single_tool_call_enforced",
        "structured_output_enforced",
        "prompt_overflow_refused",
    }
)


def job(**kw: object) -> ChatJob:
    base: dict[str, object] = {
        "id": "j1",
        "messages": [{"role": "user", "content": "hi"}],
        "max_length": 64,
        "max_context_length": 1024,
    }
    base.update(kw)
    return ChatJob(**base)  # type: ignore[arg-type]


def tool(name: str, params: dict[str, object] | None = None) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "parameters": params or {"type": "object"}}}


def call(name: str, call_id: str | None = "c1", args: object = "{}") -> dict[str, object]:
    c: dict[str, object] = {"type": "function", "function": {"name": name, "arguments": args}}
    if call_id is not None:
        c["id"] = call_id
    return c


# -- reasoning -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content", "reasoning"),
    [
        ("plain answer", "plain answer", None),
        ("<think>why</think>\n\nanswer", "answer", "why"),
        ("  <think> a </think>b<think>c</think> d", "b d", "a\n\nc"),
        ("<think>cut off at max_len", "", "cut off at max_len"),
        ("answer first <think>then thought", "answer first ", "then thought"),
        ("implicit open</think>\nanswer", "answer", "implicit open"),
        ("<think></think>answer", "answer", ""),
        ("", "", None),
    ],
)
def test_split_reasoning(text: str, content: str, reasoning: str | None) -> None:
    assert split_reasoning(text) == (content, reasoning)


def split_incrementally(pieces: list[str]) -> tuple[str, str]:
    """``(reasoning, content)`` released by a :class:`ThinkSplitter` fed ``pieces``, then flushed."""
    splitter = ThinkSplitter()
    reasoning, content = [], []
    for piece in pieces:
        r, c = splitter.feed(piece)
        reasoning.append(r)
        content.append(c)
    r, c = splitter.flush()
    return "".join([*reasoning, r]), "".join([*content, c])


SPLIT_TEXTS = [
    "plain answer",
    "<think>why</think>\n\nanswer",
    "<think> r \n</think>\n\nanswer",
    "  <think> a </think>b<think>c</think> d",
    "a<think>b</think>c<think>d</think>e",
    "<think>cut off at max_len  ",
    "answer first <think>then thought",
    "<think></think>answer",
    "<think>  </think><think>r</think>x",
    "<thi not a tag, x < y and </thinking> z <",
    "<think>a <b> c</think> d </think> e",
    "<<think>>x</think></think>",
    "<think>r</think",
    "   ",
    "",
]


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_think_splitter_matches_split_reasoning_for_every_cut(text: str) -> None:
    content, reasoning = split_reasoning(text)
    expected = (reasoning or "", content or "")
    # every piece size, so each tag is cut at each of its positions across two deltas
    for size in range(1, max(2, len(text) + 1)):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        assert split_incrementally(pieces) == expected, (text, size)
    # and each single cut point
    for cut in range(1, len(text)):
        assert split_incrementally([text[:cut], text[cut:]]) == expected, (text, cut)


def test_think_splitter_holds_a_cut_tag_until_it_is_complete() -> None:
    splitter = ThinkSplitter()
    assert splitter.feed("Hi <thi") == ("", "Hi ")
    assert splitter.feed("nk>deep ") == ("deep", "")
    assert splitter.feed("thought </th") == (" thought", "")
    assert splitter.feed("ink>\n\nso") == ("", "\n\nso")  # content had started: not stripped
    assert splitter.feed(" <t") == ("", " ")
    assert splitter.flush() == ("", "<t")
    assert split_reasoning("Hi <think>deep thought </think>\n\nso <t") == ("Hi \n\nso <t", "deep thought")


def test_think_splitter_orphan_close_tag() -> None:
    # whole in one delta: the text before a close tag without an opening one is reasoning, as at the submit
    assert split_incrementally(["implicit open</think>\nanswer"]) == ("implicit open", "answer")
    # once released as content it stays content (the stream then differs from the submit); nothing is lost
    assert split_incrementally(["implicit ", "open</think>\nanswer"]) == ("", "implicit open\nanswer")


def test_split_reasoning_none() -> None:
    assert split_reasoning(None) == (None, None)


def test_unclosed_think_goes_to_reasoning_content() -> None:
    out = ChatOutput(content="<think>still thinking when max_length hit", native_finish_reason="length")
    body = build_chat_submit(job(), out, "m", ALL)
    assert body["message"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "still thinking when max_length hit",
    }
    assert body["finish_reason"] == "length"


def test_backend_reasoning_and_think_blocks_are_joined() -> None:
    out = ChatOutput(content="<think>b</think>x", reasoning="a")
    body = build_chat_submit(job(), out, "m", ALL)
    assert body["message"]["reasoning_content"] == "a\n\nb"
    assert body["message"]["content"] == "x"


# -- finish reasons --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("native", "calls", "mapped"),
    [
        ("stop", False, "stop"),
        ("eos", False, "stop"),
        (None, False, "stop"),
        ("length", False, "length"),
        ("max_tokens", False, "length"),
        ("content_filter", False, "content_filter"),
        ("tool_calls", False, "stop"),
        ("tool_calls", True, "tool_calls"),
        ("stop", True, "tool_calls"),
        ("length", True, "length"),
    ],
)
def test_map_finish_reason(native: str | None, calls: bool, mapped: str) -> None:
    assert map_finish_reason(native, calls) == mapped


# -- tool calls ------------------------------------------------------------------------------------------------


def test_normalize_mints_missing_and_duplicate_ids_and_stringifies_arguments() -> None:
    calls = normalize_tool_calls([call("a", None, {"x": 1}), call("b", "call_7"), call("a", "call_7")])
    assert [c["id"] for c in calls] == ["call_1", "call_7", "call_3"]
    assert calls[0]["function"]["arguments"] == '{"x":1}'
    assert all(c["type"] == "function" for c in calls)


def test_normalize_refuses_nameless_call() -> None:
    with pytest.raises(BackendFault) as err:
        normalize_tool_calls([{"id": "x", "function": {"arguments": "{}"}}])
    assert err.value.reason == "tool_violation"


def test_unknown_function_is_a_tool_violation() -> None:
    j = job(tools=[tool("get_weather")], tool_choice="auto")
    with pytest.raises(BackendFault) as err:
        check_tool_calls(j, normalize_tool_calls([call("launch_rockets")]), ALL)
    assert err.value.reason == "tool_violation"


def test_any_call_without_tools_is_a_tool_violation() -> None:
    with pytest.raises(BackendFault) as err:
        check_tool_calls(job(), normalize_tool_calls([call("x")]), frozenset())
    assert err.value.reason == "tool_violation"


def test_parallel_false_keeps_the_first_call() -> None:
    j = job(tools=[tool("a"), tool("b")], tool_choice="auto", parallel_tool_calls=False)
    kept = check_tool_calls(j, normalize_tool_calls([call("a", "1"), call("nope", "2")]), ALL)
    assert [c["function"]["name"] for c in kept] == ["a"]


def test_required_without_call_faults_only_when_enforced() -> None:
    j = job(tools=[tool("a"), tool("b")], tool_choice="required")
    assert check_tool_calls(j, [], frozenset()) == []
    with pytest.raises(BackendFault) as err:
        check_tool_calls(j, [], ALL)
    assert err.value.reason == "tool_violation"


def test_forced_function_must_be_the_one_called() -> None:
    j = job(tools=[tool("a"), tool("b")], tool_choice={"type": "function", "function": {"name": "a"}})
    assert check_tool_calls(j, normalize_tool_calls([call("a")]), ALL)
    with pytest.raises(BackendFault):
        check_tool_calls(j, normalize_tool_calls([call("b")]), ALL)


def test_narrowed_required_with_one_tool_forces_it() -> None:
    j = job(tools=[tool("only")], tool_choice="required")
    assert j.forced_function == "only"
    assert j.requires_tool_call


def test_tool_reply_body() -> None:
    j = job(tools=[tool("get_weather")], tool_choice="auto")
    out = ChatOutput(
        content="",
        tool_calls=[call("get_weather", "call_1", '{"city":"Paris"}')],
        native_finish_reason="tool_calls",
    )
    body = build_chat_submit(j, out, "m", ALL)
    assert body["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    assert body["finish_reason"] == "tool_calls"


# -- strict schemas --------------------------------------------------------------------------------------------

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def strict_job(schema: dict[str, Any] = SCHEMA, strict: bool = True) -> ChatJob:
    return job(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "strict": strict, "schema": schema},
        }
    )


def test_strict_schema_passes_a_matching_reply() -> None:
    check_strict_schema(strict_job(), json.dumps({"name": "a", "age": 3}), False)


@pytest.mark.parametrize("content", ['{"name": "a"}', "not json", '{"name": "a", "age": NaN}', "", None])
def test_strict_schema_faults_a_mismatch(content: str | None) -> None:
    with pytest.raises(BackendFault) as err:
        check_strict_schema(strict_job(), content, False)
    assert err.value.reason == "generation_error"


def test_non_strict_schema_is_not_checked() -> None:
    check_strict_schema(strict_job(strict=False), "not json", False)


def test_tool_calls_with_empty_content_are_exempt() -> None:
    check_strict_schema(strict_job(), None, True)


def test_uncompilable_schema_is_unbuildable_grammar() -> None:
    with pytest.raises(BackendFault) as err:
        check_strict_schema(strict_job({"type": "no-such-type"}), "{}", False)
    assert err.value.reason == "unbuildable_grammar"


def test_unresolvable_reference_is_unbuildable_grammar() -> None:
    schema = {"$ref": "#/$defs/missing"}
    with pytest.raises(BackendFault) as err:
        check_strict_schema(strict_job(schema), "{}", False)
    assert err.value.reason == "unbuildable_grammar"


def test_schema_draft_follows_dollar_schema() -> None:
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "integer"}],
    }
    check_strict_schema(strict_job(draft7), "[1]", False)
    with pytest.raises(BackendFault):
        check_strict_schema(strict_job(draft7), '["x"]', False)


def test_strict_check_only_when_declared() -> None:
    out = ChatOutput(content="not json")
    assert build_chat_submit(strict_job(), out, "m", frozenset())["message"]["content"] == "not json"
    with pytest.raises(BackendFault):
        build_chat_submit(strict_job(), out, "m", ALL)


def test_parse_json_strict_refuses_infinity() -> None:
    with pytest.raises(ValueError):
        parse_json_strict("[Infinity]")


# -- bodies ----------------------------------------------------------------------------------------------------


def test_counts_only_when_reported_and_native_reason_cut() -> None:
    out = ChatOutput(content="x", native_finish_reason="a" * 40, prompt_tokens=5, completion_tokens=None)
    body = build_chat_submit(job(), out, "model-a", ALL)
    assert body == {
        "id": "j1",
        "message": {"role": "assistant", "content": "x"},
        "finish_reason": "stop",
        "native_finish_reason": "a" * 32,
        "prompt_tokens": 5,
        "model_id": "model-a",
    }


def test_all_counts() -> None:
    out = ChatOutput(content="x", prompt_tokens=1, completion_tokens=2, reasoning_tokens=0)
    body = build_chat_submit(job(), out, "m", ALL)
    assert (body["prompt_tokens"], body["completion_tokens"], body["reasoning_tokens"]) == (1, 2, 0)
    assert "native_finish_reason" not in body


def test_null_content_without_calls_becomes_empty() -> None:
    body = build_chat_submit(job(), ChatOutput(content=None), "m", ALL)
    assert body["message"]["content"] == ""


def test_fault_body() -> None:
    assert build_chat_fault("j", "m", "prompt_overflow") == {
        "id": "j",
        "state": "faulted",
        "model_id": "m",
        "fault_reason": "prompt_overflow",
    }
    assert "fault_reason" not in build_chat_fault("j", "m", None)
