"""The moderation replacement filter, its refusal, the operator-control refusals and the reference's nsfw
marks (docs/native-api.md#moderation, #operator-controls)."""

from __future__ import annotations

from typing import Any

import pytest
from horde_contract import TextModelReference, flatten_messages
from horde_contract.errors import RC
from horde_contract.moderation import (
    DEFAULT_REPLACEMENT_RULES,
    MAX_REPLACEMENT_RULES,
    ReplacementFilter,
    corrupt_prompt_error,
    emptied,
    filter_messages,
    is_blank,
    message_texts,
)
from horde_contract.operator_controls import (
    MAINTENANCE_MODE_MESSAGE,
    MAINTENANCE_RETRY_AFTER_SECONDS,
    maintenance_mode_error,
    timeout_ip_error,
)

DEFAULT = ReplacementFilter()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a story about a 12 year old", "a story about a adult"),
        ("She is 15-year-old.", "She is adult."),
        ("he is 9yo and she is 16 y/o", "he is adult and she is adult"),
        ("Two little girls and a schoolboy", "Two women and a man"),
        ("A young girl met a young boy", "A woman met a man"),
        ("The Children played with the kid", "The adults played with the adult"),
        ("Teenagers and a teen", "adults and a adult"),
        ("loli", ""),
        ("a Loli shotacon jailbait scene", "a    scene"),
        ("a pre-teen and an underage", "a  and an "),
    ],
)
def test_default_rules_rewrite_minors_into_adults(text: str, expected: str) -> None:
    assert DEFAULT.apply(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "An adult woman of 18 years old, 25 years old, 30yo.",
        "Kidneys, childhood and minority reports stay.",  # whole words only
        "",
        "Ünïcode stays: 日本語",
    ],
)
def test_default_rules_leave_other_text_alone(text: str) -> None:
    assert DEFAULT.apply(text) == text


def test_the_default_list_is_ours_and_bounded() -> None:
    assert len(DEFAULT) == len(DEFAULT_REPLACEMENT_RULES) <= MAX_REPLACEMENT_RULES
    assert all(isinstance(p, str) and isinstance(r, str) for p, r in DEFAULT_REPLACEMENT_RULES)


def test_rules_apply_in_order_case_insensitively_and_literally() -> None:
    flt = ReplacementFilter([("cat", "dog"), ("DOG", r"wolf\1 $1"), ("^\\s+$", "")])
    assert flt.apply("Cat and dog") == r"wolf\1 $1 and wolf\1 $1"
    assert flt.apply("   ") == ""
    assert ReplacementFilter([]).apply("anything") == "anything"


@pytest.mark.parametrize(
    ("rules", "fragment"),
    [
        ([("(?<=a)b", "x")], "rule 0"),  # lookbehind: not RE2
        ([("ok", "x"), ("(", "x")], "rule 1"),
        ([("only-one",)], "rule 0 is not a [pattern, replacement] pair"),
        ([("a", 1)], "rule 0 is not a [pattern, replacement] pair"),
        ([("a", "b")] * (MAX_REPLACEMENT_RULES + 1), "at most"),
    ],
)
def test_bad_rules_are_refused_with_their_index(rules: list[tuple[object, ...]], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        ReplacementFilter(rules)  # type: ignore[arg-type]


def test_a_pathological_pattern_stays_linear() -> None:
    # (a+)+$ backtracks exponentially in Python's re; RE2 answers at once.
    flt = ReplacementFilter([("(a+)+$", "x")])
    assert flt.apply("a" * 50_000 + "b") == "a" * 50_000 + "b"


def test_filter_messages_rewrites_texts_only_and_keeps_the_input() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a teen."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at the child"},
                {"type": "image_url", "image_url": {"url": "https://example.com/child.png"}},
            ],
            "name": "kid",
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "find", "arguments": '{"q": "child"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a kid"},
    ]
    snapshot = repr(messages)
    out = filter_messages(messages, DEFAULT)
    assert repr(messages) == snapshot  # not changed in place
    assert out[0]["content"] == "You are a adult."
    assert out[1]["content"][0] == {"type": "text", "text": "look at the adult"}
    assert out[1]["content"][1] == messages[1]["content"][1]  # image part untouched
    assert out[1]["name"] == "kid"
    assert out[2] == messages[2]  # tool call arguments are JSON documents: not rewritten
    assert out[3]["content"] == "a adult"
    assert message_texts(out) == ["You are a adult.", "look at the adult", "a adult"]
    # The prompt is flattened again from the result.
    assert "child" not in flatten_messages(out).split("[image]")[0]


def test_emptied_needs_text_before_and_none_after() -> None:
    assert is_blank(["", "  \n"]) and is_blank("\t") and not is_blank(["", "x"])
    assert emptied("loli", "")
    assert emptied(["loli", " shota "], ["", "  "])
    assert not emptied("a kid", "a adult")
    assert not emptied([], [])  # an image-only request had no text to empty
    assert not emptied(["", ""], ["", ""])


def test_refusals_carry_status_rc_message_and_retry_hints() -> None:
    nsfw = corrupt_prompt_error(nsfw_model=True)
    assert (nsfw.status, nsfw.rc) == (400, RC.CorruptPrompt)
    assert "NSFW models" in nsfw.message
    flagged = corrupt_prompt_error(nsfw_model=False)
    assert "this account" in flagged.message and flagged.rc == RC.CorruptPrompt

    maintenance = maintenance_mode_error()
    assert (maintenance.status, maintenance.rc, maintenance.message) == (
        400,
        RC.MaintenanceMode,
        MAINTENANCE_MODE_MESSAGE,
    )
    assert maintenance.headers == {
        "Retry-After": str(MAINTENANCE_RETRY_AFTER_SECONDS),
        "x-should-retry": "false",
    }

    timeout = timeout_ip_error(42)
    assert (timeout.status, timeout.rc) == (403, RC.TimeoutIP)
    assert "42 seconds" in timeout.message
    assert timeout.headers == {"Retry-After": "42", "x-should-retry": "false"}
    assert timeout_ip_error(0).headers == {"Retry-After": "1", "x-should-retry": "false"}


def test_the_reference_marks_nsfw_models_under_every_name() -> None:
    ref = TextModelReference.from_mapping(
        {
            "org/Spicy-13B": {"parameters": 13e9, "nsfw": True},
            "org/Plain-7B": {"parameters": 7e9, "nsfw": False},
            "koboldcpp/Other": {"parameters": 1e9},
        }
    )
    for name in (
        "org/Spicy-13B",
        "aphrodite/org/Spicy-13B",
        "koboldcpp/Spicy-13B",
        "koboldcpp/Spicy-13B-GGUF-Q4_K_M",
    ):
        assert ref.is_nsfw(name), name
    assert ref.is_nsfw("org/Spicy-13B::user#5")
    for other in ("org/Plain-7B", "koboldcpp/Other", "unknown/model", None, ""):
        assert not ref.is_nsfw(other), other
    assert ref.has_nsfw(["org/Plain-7B", "koboldcpp/Spicy-13B"])
    assert not ref.has_nsfw(["org/Plain-7B"]) and not ref.has_nsfw([])
    assert TextModelReference().nsfw_names == frozenset()
