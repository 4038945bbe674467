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
    FilterBudgetExceeded,
    ReplacementFilter,
    corrupt_prompt_error,
    emptied,
    filter_budget_error,
    filter_messages,
    is_blank,
    matching_view,
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


def test_rules_run_as_one_pass_case_insensitively_and_literally() -> None:
    # One pass: a replacement is not scanned again, and where two rules match at one place the first wins.
    flt = ReplacementFilter([("cat", "dog"), ("DOG", r"wolf\1 $1"), ("^\\s+$", ""), ("(c)(a)t(s)", "x")])
    assert flt.apply("Cat and dog") == r"dog and wolf\1 $1"
    assert flt.apply("cats") == "dogs"
    assert flt.apply("   ") == ""
    assert ReplacementFilter([]).apply("anything") == "anything"
    # A rule with groups of its own does not shift which replacement the next rule gets.
    grouped = ReplacementFilter([("(a)(b)", "1"), ("(c)", "2"), ("d", "3")])
    assert grouped.apply("ab c d") == "1 2 3"
    # Empty matches advance (one per character boundary).
    assert ReplacementFilter([("x*", "-")]).apply("ab") == "-a-b-"
    # Which rule won depends on the match's context (\b, ^, $), not only on its text.
    context = ReplacementFilter([(r"\bab", "X"), ("^cd", "S"), ("(?m)^ef", "M"), ("ab|cd|ef", "y")])
    assert context.apply("cd ab cab cd xcd ef\nef") == "S X cy y xy y\nM"
    # A pattern that compiles alone but would swallow the others when joined is refused.
    with pytest.raises(ValueError, match="together"):
        ReplacementFilter([(r"\Qa", "x"), ("b", "y")])


def test_many_rules_cost_one_search_per_match() -> None:
    rules = [(rf"\bword{i}\b", f"w{i}") for i in range(MAX_REPLACEMENT_RULES - 1)] + [("kid", "adult")]
    flt = ReplacementFilter(rules)
    assert flt.apply("word7 kid word198 word1000") == "w7 adult w198 word1000"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ｌｏｌｉ", ""),  # fullwidth letters (NFKC)
        ("a ｌｏｌｉ scene", "a  scene"),
        ("lo\u00adli", ""),  # soft hyphen (Cf)
        ("lo\u200bli and a ki\u200dd", " and a adult"),  # zero-width space, joiner (Cf)
        ("\ufeffKID", "adult"),  # a BOM before the word
        ("KİD", "adult"),  # dotted capital I: a Latin letter with a mark
        ("KI\u0307D and k\u0301id", "adult and adult"),  # combining marks, decomposed
        ("a lólí", "a "),
        ("loli_chan", "_chan"),  # _ separates words
        ("my_kid_sister", "my_adult_sister"),
        ("a little-girl", "a woman"),
        ("a school-girl and a school_boy", "a woman and a man"),
        ("the little   girls", "the women"),
        ("she is 12 y.o. today", "she is adult today"),
        ("she is 12 y.o.", "she is adult"),
        ("she is 12y.o", "she is adult"),
        ("she is 12yrs", "she is adult"),
        ("she is 12yr, he 9years", "she is adult, he adult"),
        ("she is １２ years old", "she is adult"),  # fullwidth digits
        ("she is 12_years_old", "she is adult"),
        ("ＫＩＤＳ", "adults"),
        ("ﬁne kid", "ﬁne adult"),  # a ligature outside a match is kept as sent
        ("日本語のkidと", "日本語のadultと"),
        ("pre-teen, under-age, jail bait", ", , "),
    ],
)
def test_normalised_spellings_are_caught(text: str, expected: str) -> None:
    assert DEFAULT.apply(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Ünïcode stays: 日本語, ﬁ, ｆｕｌｌｗｉｄｔｈ, ZWJ 👨\u200d👩\u200d👧",  # untouched text is returned as sent
        "snake_case_names and dash-joined-words",
        "She is 18 y.o. and 25yrs old; 30 years. 9yoga, 5yonder, 2y.one",
    ],
)
def test_normalisation_does_not_rewrite_text_it_does_not_match(text: str) -> None:
    assert DEFAULT.apply(text) is text


def test_homoglyphs_from_other_scripts_are_a_documented_limit() -> None:
    # Cyrillic і (U+0456) in "kіd": NFKC keeps it, and no maintained library folds it cheaply
    # (docs/native-api.md#moderation). The Latin spelling is caught.
    assert DEFAULT.apply("k\u0456d") == "k\u0456d"
    assert DEFAULT.apply("kid") == "adult"


def test_matching_view_maps_back_to_the_text_as_sent() -> None:
    view, segments = matching_view("a\u00adb＿c")
    assert view == "ab c"
    assert [s[2:] for s in segments] == [(1, 2)]  # ＿ is one character: no segment
    assert matching_view("plain_text") == ("plain text", [])
    # A match inside an expanded character covers the whole character.
    assert ReplacementFilter([("i", "I")]).apply("ﬁx") == "Ix"


def test_the_cpu_budget_bounds_one_prompt() -> None:
    text = "kid " * 50_000
    with pytest.raises(FilterBudgetExceeded):
        DEFAULT.apply(text, cpu_seconds=0.0)
    assert DEFAULT.apply(text) == "adult " * 50_000
    error = filter_budget_error(nsfw_model=True)
    assert (error.status, error.rc) == (400, RC.CorruptPrompt) and "too long" in error.message


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
