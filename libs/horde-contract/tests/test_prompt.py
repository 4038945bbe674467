"""Flattening, the prompt estimate and truncate_oldest (docs/native-api.md#flattened-prompt,
#context-adjustments)."""

from __future__ import annotations

import math
from typing import Any

import horde_contract as hc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
TOOLS = [{"type": "function", "function": {"name": "f", "description": "é"}}]


def test_flatten() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}],
        },
        {"role": "assistant", "content": "calling", "tool_calls": [CALL]},
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}],
        },
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "assistant", "content": ""},
    ]
    call_json = '[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\\"a\\": 1}"}}]'
    expected = "\n".join(
        [
            "system: sys",
            "user: look\n[image]",
            f"assistant: calling\n{call_json}",
            "tool: r1\nr2",
            f"assistant: {call_json}",
            "tool: done",
            "assistant: ",
            '[{"type":"function","function":{"name":"f","description":"é"}}]',
        ]
    )
    assert hc.flatten_messages(messages, TOOLS) == expected
    assert hc.flatten_messages(messages) == expected.rsplit("\n", 1)[0]
    assert hc.estimate_chat_prompt_tokens(messages, TOOLS) == math.ceil(len(expected) / 4) + 512
    assert hc.estimate_chat_prompt_tokens(messages) == math.ceil(len(expected.rsplit("\n", 1)[0]) / 4) + 512
    assert hc.count_image_parts(messages) == 1
    assert hc.estimate_chat_prompt_tokens([], TOOLS) == math.ceil(len(hc.flatten_messages([], TOOLS)) / 4)
    assert (
        hc.estimate_text_tokens("abcde") == 2
        and hc.estimate_text_tokens(8) == 2
        and hc.estimate_text_tokens("") == 0
    )


def test_response_format_not_in_prompt() -> None:
    request = hc.parse_chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "q"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "secret_schema", "schema": {"type": "object"}},
            },
        }
    )
    assert "secret_schema" not in hc.flatten_messages(request.messages, request.tools)


def user(text: str = "u") -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str = "a") -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def test_turns() -> None:
    messages = [
        {"role": "system", "content": "s"},  # 0 kept
        user(),  # 1 turn with 2
        assistant(),  # 2
        assistant(),  # 3 alone
        user(),  # 4 turn with 5, 6
        {"role": "assistant", "content": None, "tool_calls": [CALL]},  # 5
        {"role": "tool", "tool_call_id": "c1", "content": "r"},  # 6
        {"role": "developer", "content": "d"},  # 7 kept
        {"role": "assistant", "content": None, "tool_calls": [CALL]},  # 8 turn with 9
        {"role": "tool", "tool_call_id": "c1", "content": "r"},  # 9
        user(),  # 10 turn alone (next is system)
        {"role": "system", "content": "s2"},  # 11 kept
        user(),  # 12 latest user: kept with the rest
        assistant(),  # 13 kept
    ]
    turns, kept = hc.chat_turns(messages)
    assert turns == [[1, 2], [3], [4, 5, 6], [8, 9], [10]]
    assert kept == {0, 7, 11, 12, 13}
    assert hc.chat_turns([assistant(), assistant()]) == ([[0], [1]], set())


def test_truncate_example() -> None:
    messages = [{"role": "system", "content": "s" * 40}]
    for i in range(10):
        messages += [user(f"{i}" * 400), assistant(f"{i}" * 400)]
    messages.append(user("latest"))
    before = hc.estimate_chat_prompt_tokens(messages)
    kept, adjustment = hc.truncate_oldest(messages, None, 1000)
    assert adjustment is not None
    dropped = len(messages) - len(kept)
    assert adjustment == {
        "from": before,
        "to": hc.estimate_chat_prompt_tokens(kept),
        "reason": "truncate_oldest",
        "dropped_messages": dropped,
    }
    assert adjustment["to"] <= 1000 and dropped % 2 == 0
    assert kept[0]["role"] == "system" and kept[-1] == user("latest")
    # one turn fewer dropped would not fit: the oldest turns go first and no more than needed
    assert hc.estimate_chat_prompt_tokens([kept[0], *messages[dropped - 1 : dropped + 1], *kept[1:]]) > 1000
    # already fitting: unchanged, no entry
    same, none = hc.truncate_oldest(messages, None, before)
    assert same is messages and none is None


def test_truncate_refuses_or_returns_minimum(refusal: Any) -> None:
    messages = [user("x" * 100), assistant("y" * 100), user("z" * 4000)]
    with pytest.raises(hc.HordeError) as info:
        hc.truncate_oldest(messages, TOOLS, 500)
    floor = hc.estimate_chat_prompt_tokens(messages[2:], TOOLS)
    refusal(
        info.value,
        400,
        "PromptExceedsContext",
        "messages",
        f"The messages are estimated at {floor} prompt tokens, above the 500 tokens the context leaves beside max_tokens.",
    )
    assert info.value.extra == {"estimated_prompt_tokens": floor, "max_prompt_tokens": 500}
    kept, adjustment = hc.truncate_oldest(messages, TOOLS, 500, refuse=False)
    assert kept == messages[2:] and adjustment is not None and adjustment["dropped_messages"] == 2
    nothing_to_drop = [user("z" * 4000)]
    kept, adjustment = hc.truncate_oldest(nothing_to_drop, None, 10, refuse=False)
    assert kept == nothing_to_drop and adjustment is None


def test_truncate_images_count() -> None:
    image_turn = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}
    messages = [image_turn, assistant("ok"), user("now")]
    kept, adjustment = hc.truncate_oldest(messages, None, 100)
    assert kept == [user("now")]
    assert (
        adjustment is not None
        and adjustment["from"] > 512
        and adjustment["to"] == hc.estimate_chat_prompt_tokens(kept)
    )


# -- properties --------------------------------------------------------------------------------------------------

_size = st.integers(0, 300)
_group = st.one_of(
    st.builds(lambda n: [{"role": "system", "content": "s" * n}], _size),
    st.builds(lambda n: [{"role": "developer", "content": "d" * n}], _size),
    st.builds(lambda n: [user("u" * n)], _size),
    st.builds(lambda n, m: [user("u" * n), assistant("a" * m)], _size, _size),
    st.builds(lambda n: [assistant("a" * n)], _size),
    st.builds(
        lambda n, k, img: [
            {
                "role": "user",
                "content": [{"type": "text", "text": "u" * n}]
                + [{"type": "image_url", "image_url": {"url": "x"}}] * img,
            },
            {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": f"c{i}"} for i in range(k)]},
            *[{"role": "tool", "tool_call_id": f"c{i}", "content": "r" * n} for i in range(k)],
        ],
        _size,
        st.integers(1, 3),
        st.integers(0, 1),
    ),
    st.builds(
        lambda n: [
            {"role": "assistant", "content": "x", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "r" * n},
        ],
        _size,
    ),
)
_conversations = st.lists(_group, min_size=1, max_size=12).map(lambda gs: [m for g in gs for m in g])


def _pinned(messages: list[dict[str, Any]]) -> set[int]:
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    last = users[-1] if users else len(messages)
    return {i for i, m in enumerate(messages) if m["role"] in ("system", "developer") or i >= last}


@settings(max_examples=200, deadline=None)
@given(messages=_conversations, tools=st.sampled_from([None, TOOLS]), budget=st.integers(0, 1500))
def test_truncate_properties(messages: list[dict[str, Any]], tools: Any, budget: int) -> None:
    pinned = _pinned(messages)
    floor = hc.estimate_chat_prompt_tokens([m for i, m in enumerate(messages) if i in pinned], tools)
    if floor > budget and hc.estimate_chat_prompt_tokens(messages, tools) > budget:
        with pytest.raises(hc.HordeError):
            hc.truncate_oldest(messages, tools, budget)
        kept, adjustment = hc.truncate_oldest(messages, tools, budget, refuse=False)
    else:
        kept, adjustment = hc.truncate_oldest(messages, tools, budget)
        # its result fits when a fitting result exists
        assert hc.estimate_chat_prompt_tokens(kept, tools) <= budget
    ids = [id(m) for m in kept]
    kept_index = {i for i, m in enumerate(messages) if id(m) in ids}
    assert len(kept_index) == len(kept)
    assert [messages[i] for i in sorted(kept_index)] == kept  # order preserved
    dropped = set(range(len(messages))) - kept_index
    # never drops a system/developer message, the latest user message or anything after it
    assert pinned <= kept_index
    # never splits a turn: the kept history still follows the tool rule, and a kept assistant after a user
    # (before the pinned tail) keeps its user
    hc.check_tool_history(kept)
    for i in dropped:
        nxt = i + 1
        if (
            messages[i]["role"] == "user"
            and nxt < len(messages)
            and nxt not in pinned
            and messages[nxt]["role"] == "assistant"
        ):
            assert nxt in dropped
    # oldest first: every dropped message comes before every kept droppable one
    droppable_kept = kept_index - pinned
    if dropped and droppable_kept:
        assert max(dropped) < min(droppable_kept)
    if adjustment is None:
        assert not dropped
    else:
        assert adjustment == {
            "from": hc.estimate_chat_prompt_tokens(messages, tools),
            "to": hc.estimate_chat_prompt_tokens(kept, tools),
            "reason": "truncate_oldest",
            "dropped_messages": len(dropped),
        }
        # no more than needed: the result with the last dropped turn restored would not fit
        turns, _ = hc.chat_turns(messages)
        dropped_turns = [t for t in turns if set(t) <= dropped]
        restored = kept_index | set(dropped_turns[-1])
        if hc.estimate_chat_prompt_tokens(kept, tools) <= budget:
            assert hc.estimate_chat_prompt_tokens([messages[i] for i in sorted(restored)], tools) > budget
