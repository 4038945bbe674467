"""Requirements, the chat declaration, eligibility rules 1–3 and the declaration gap (docs/native-api.md
#chat-declaration, #guarantees, #tool-temperature-limit, #eligibility, #impossible-reason)."""

from __future__ import annotations

from typing import Any

import horde_contract as hc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

USER: dict[str, Any] = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f"}}
TOOL_G = {"type": "function", "function": {"name": "g"}}
CALL: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
IMAGE_MSG: dict[str, Any] = {
    "role": "user",
    "content": [{"type": "image_url", "image_url": {"url": "https://a/b.png"}}],
}
STRICT_FMT = {
    "type": "json_schema",
    "json_schema": {"name": "n", "schema": {"type": "object", "additionalProperties": False}, "strict": True},
}
LOOSE_FMT = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
FORCED = {"type": "function", "function": {"name": "f"}}
P = "prompt_overflow_refused"

FEATURE_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("nothing", {}, [P]),
    ("seed", {"seed": 0}, [P, "seed"]),
    ("reasoning-none", {"reasoning_effort": "none"}, [P, "reasoning_effort"]),
    ("presence-zero", {"presence_penalty": 0}, [P]),
    ("presence", {"presence_penalty": 0.5}, [P, "presence_penalty"]),
    ("frequency-zero", {"frequency_penalty": 0.0}, [P]),
    ("frequency", {"frequency_penalty": -1}, ["frequency_penalty", P]),
    ("vision", {"messages": [IMAGE_MSG]}, [P, "vision"]),
    ("tools-auto-default", {"tools": [TOOL]}, [P, "tools"]),
    ("tools-none", {"tools": [TOOL], "tool_choice": "none"}, [P]),
    ("tools-required", {"tools": [TOOL], "tool_choice": "required"}, [P, "tool_choice_enforced", "tools"]),
    ("tools-forced", {"tools": [TOOL], "tool_choice": FORCED}, [P, "tool_choice_enforced", "tools"]),
    (
        "tool-history",
        {
            "messages": [
                USER,
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ]
        },
        [P, "tools"],
    ),
    (
        "tool-history-under-none",
        {
            "tools": [TOOL],
            "tool_choice": "none",
            "messages": [
                USER,
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        },
        [P, "tools"],
    ),
    ("json-object", {"response_format": {"type": "json_object"}}, ["json_object", P]),
    ("json-schema", {"response_format": LOOSE_FMT}, ["json_schema", P]),
    ("json-schema-strict", {"response_format": STRICT_FMT}, ["json_schema", P, "structured_output_enforced"]),
    (
        "tools-with-format",
        {"tools": [TOOL], "response_format": {"type": "json_object"}},
        ["json_object", P, "tools", "tools_with_response_format"],
    ),
    (
        "tools-none-with-format",
        {"tools": [TOOL], "tool_choice": "none", "response_format": {"type": "json_object"}},
        ["json_object", P],
    ),
    ("text-format", {"tools": [TOOL], "response_format": {"type": "text"}}, [P, "tools"]),
]


@pytest.mark.parametrize(("case", "extra", "expected"), FEATURE_CASES, ids=[c[0] for c in FEATURE_CASES])
def test_required_features(case: str, extra: dict[str, Any], expected: list[str]) -> None:
    body = {"model": "m", "messages": [USER], **extra}
    request = hc.parse_chat_request(body)
    assert request.required_features == sorted(expected)
    assert hc.chat_request_requirements(body) == sorted(expected)
    assert hc.chat_request_requirements(request) == sorted(expected)
    # best_effort keeps the features and drops every guarantee.
    relaxed = hc.parse_chat_request({**body, "horde": {"conformance": "best_effort"}})
    guarantees = {g.value for g in hc.ChatGuarantee}
    assert relaxed.required_features == sorted(v for v in expected if v not in guarantees)


def test_required_chat_guarantees() -> None:
    assert hc.required_chat_guarantees(None) == [P]
    assert hc.required_chat_guarantees(
        {"tools": [TOOL], "tool_choice": "required", "response_format": STRICT_FMT}
    ) == [
        P,
        "structured_output_enforced",
        "tool_choice_enforced",
    ]
    assert hc.required_chat_guarantees({"tools": [TOOL], "tool_choice": "none"}) == [P]


def test_chat_tools_temperature() -> None:
    assert hc.chat_tools_temperature({}, None) is None
    assert hc.chat_tools_temperature({"temperature": 0.3}, {"tools": [TOOL]}) == 0.3
    assert hc.chat_tools_temperature({}, {"tools": [TOOL], "tool_choice": "auto"}) == 1.0
    assert hc.chat_tools_temperature({"temperature": 2}, {"tools": [TOOL], "tool_choice": "none"}) is None
    assert hc.chat_tools_temperature({"temperature": 2}, {"response_format": {"type": "json_object"}}) is None


# -- declaration -----------------------------------------------------------------------------------------------

DECL = {
    "models": ["m", "other"],
    "chat_jobs": True,
    "model_id": "m",
    "chat_limits": {"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1},
    "chat_features": ["tools", "seed", "future_feature", 5, "prompt_overflow_refused"],
    "image_transports": ["base64", "carrier_pigeon", "url"],
}
D = "ChatDeclarationInvalid"

DECLARATION_REFUSALS = [
    ("chat-jobs-type", {"chat_jobs": "yes"}, "chat_jobs", "'chat_jobs': has to be a boolean."),
    ("prompt-jobs-type", {"prompt_jobs": 0}, "prompt_jobs", "'prompt_jobs': has to be a boolean."),
    (
        "prompt-jobs-false-no-chat",
        {"chat_jobs": False, "prompt_jobs": False},
        "prompt_jobs",
        "'prompt_jobs': prompt_jobs false needs chat_jobs true (a chat-only worker).",
    ),
    (
        "prompt-jobs-false-chat-absent",
        {"chat_jobs": None, "prompt_jobs": False},
        "prompt_jobs",
        "'prompt_jobs': prompt_jobs false needs chat_jobs true (a chat-only worker).",
    ),
    ("no-limits", {"chat_limits": None}, "chat_limits", "'chat_limits': chat_jobs needs chat_limits."),
    ("limits-type", {"chat_limits": [1]}, "chat_limits", "'chat_limits': has to be an object."),
    (
        "limits-context",
        {"chat_limits": {"max_length": 1}},
        "chat_limits.max_context_length",
        "'chat_limits.max_context_length': has to be a positive integer.",
    ),
    (
        "limits-length",
        {"chat_limits": {"max_context_length": 1, "max_length": 0}},
        "chat_limits.max_length",
        "'chat_limits.max_length': has to be a positive integer.",
    ),
    (
        "limits-length-bool",
        {"chat_limits": {"max_context_length": 1, "max_length": True}},
        "chat_limits.max_length",
        "'chat_limits.max_length': has to be a positive integer.",
    ),
    (
        "tools-max-negative",
        {"chat_limits": {"max_context_length": 1, "max_length": 1, "tools_max_temperature": -0.1}},
        "chat_limits.tools_max_temperature",
        "'chat_limits.tools_max_temperature': cannot be negative.",
    ),
    (
        "tools-max-type",
        {"chat_limits": {"max_context_length": 1, "max_length": 1, "tools_max_temperature": "1"}},
        "chat_limits.tools_max_temperature",
        "'chat_limits.tools_max_temperature': has to be a number.",
    ),
    (
        "tools-max-inf",
        {"chat_limits": {"max_context_length": 1, "max_length": 1, "tools_max_temperature": float("inf")}},
        "chat_limits.tools_max_temperature",
        "'chat_limits.tools_max_temperature': has to be a number.",
    ),
    ("no-model-id", {"model_id": None}, "model_id", "'model_id': chat_jobs needs model_id."),
    ("model-id-type", {"model_id": 1}, "model_id", "'model_id': has to be a string."),
    (
        "model-id-not-in-models",
        {"model_id": "zzz"},
        "model_id",
        "'model_id': model_id 'zzz' has to be one of models.",
    ),
    ("models-missing", {"models": None}, "model_id", "'model_id': model_id 'm' has to be one of models."),
    (
        "features-type",
        {"chat_features": "tools"},
        "chat_features",
        "'chat_features': has to be an array of strings.",
    ),
    (
        "transports-type",
        {"image_transports": "url"},
        "image_transports",
        "'image_transports': has to be an array of strings.",
    ),
]


@pytest.mark.parametrize(
    ("case", "change", "param", "message"), DECLARATION_REFUSALS, ids=[c[0] for c in DECLARATION_REFUSALS]
)
def test_declaration_refusals(
    case: str, change: dict[str, Any], param: str, message: str, refusal: Any
) -> None:
    pop = {**DECL, **change}
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_declaration(pop)
    refusal(info.value, 400, D, param, message)


def test_declaration_accepted() -> None:
    decl = hc.parse_chat_declaration(DECL)
    assert decl.accepts_chat_jobs and decl.accepts_prompt_jobs
    assert decl.chat_features == ("prompt_overflow_refused", "seed", "tools")
    assert decl.image_transports == ("base64", "url")
    assert decl.receives_images
    assert (decl.chat_max_context_length, decl.chat_max_length, decl.chat_tools_max_temperature) == (
        8192,
        1024,
        1.0,
    )
    assert decl.chat_model_id == "m"
    assert decl.details() == {
        "model_id": "m",
        "features": ["prompt_overflow_refused", "seed", "tools"],
        "limits": {"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0},
        "image_transports": ["base64", "url"],
    }
    chat_only = hc.parse_chat_declaration(
        {
            **DECL,
            "prompt_jobs": False,
            "chat_limits": {"max_context_length": 2, "max_length": 1},
            "image_transports": ["messages_url"],
            "chat_features": None,
        }
    )
    assert not chat_only.accepts_prompt_jobs and not chat_only.receives_images
    assert chat_only.chat_features == () and chat_only.chat_tools_max_temperature is None
    assert chat_only.details()["limits"] == {"max_context_length": 2, "max_length": 1}  # type: ignore[index]
    # A pop without chat_jobs withdraws the whole declaration, whatever else it carries.
    for pop in (
        {},
        {"chat_jobs": False, "chat_features": ["tools"], "chat_limits": "junk"},
        {"chat_jobs": None},
    ):
        withdrawn = hc.parse_chat_declaration(pop)
        assert withdrawn == hc.ChatDeclaration()
        assert withdrawn.details() is None


# -- eligibility -----------------------------------------------------------------------------------------------


def reasons(decl: hc.ChatDeclaration, **overrides: Any) -> list[str]:
    args: dict[str, Any] = {
        "declaration": decl,
        "models": ["m"],
        "required_features": [P],
        "max_length": 512,
        "max_context_length": 4096,
        "tools_temperature": None,
        "has_images": False,
    }
    args.update(overrides)
    first = hc.chat_refusal_reason(**args)
    every = hc.chat_refusal_reasons(**args)
    assert first == (every[0] if every else None)
    return every


def test_refusal_reasons() -> None:
    decl = hc.parse_chat_declaration(DECL)
    assert reasons(decl) == []
    assert reasons(hc.ChatDeclaration()) == ["chat_jobs"]
    assert reasons(decl, models=["x", "y"]) == ["model"]
    assert reasons(decl, models=["x", "m"]) == []
    assert reasons(decl, required_features=[P, "tool_choice_enforced", "vision"]) == [
        "tool_choice_enforced",
        "vision",
    ]
    assert reasons(decl, has_images=True) == []
    no_transport = hc.parse_chat_declaration(
        {**DECL, "image_transports": ["messages_url"], "chat_features": ["vision", P]}
    )
    assert reasons(no_transport, required_features=["vision", P], has_images=True) == ["image_transports"]
    assert reasons(decl, max_context_length=8193) == ["max_context_length"]
    assert reasons(decl, max_context_length=8192, max_length=1024) == []
    assert reasons(decl, max_length=1025) == ["max_length"]
    assert reasons(decl, tools_temperature=1.0) == []
    assert reasons(decl, tools_temperature=1.01) == ["tools_max_temperature"]
    unlimited = hc.parse_chat_declaration(
        {**DECL, "chat_limits": {"max_context_length": 8192, "max_length": 1024}}
    )
    assert reasons(unlimited, tools_temperature=2.0) == []
    assert reasons(
        decl, required_features=["seed", "vision"], has_images=True, max_length=2000, tools_temperature=3
    ) == [
        "vision",
        "max_length",
        "tools_max_temperature",
    ]
    # A hand-built declaration (no feature_set cache) behaves the same.
    plain = hc.ChatDeclaration(accepts_chat_jobs=True, chat_model_id="m", chat_features=("seed",))
    assert reasons(plain, required_features=["seed"]) == []


def test_declaration_gap() -> None:
    assert hc.declaration_gap([]) is None
    assert hc.declaration_gap([None]) is None
    assert hc.declaration_gap(["vision", None]) is None
    assert hc.declaration_gap(["vision", "untrusted"]) is None
    assert hc.declaration_gap([["vision", "lease_speed"]]) is None
    assert hc.declaration_gap(["model"]) is None
    assert hc.declaration_gap(["tool_choice_enforced"]) == {
        "kind": "declaration_gap",
        "missing_declarations": ["tool_choice_enforced"],
        "exceeded_limits": [],
    }
    assert hc.declaration_gap([["vision", "max_length"], "image_transports", ("tools_max_temperature",)]) == {
        "kind": "declaration_gap",
        "missing_declarations": ["image_transports", "vision"],
        "exceeded_limits": ["max_length", "tools_max_temperature"],
    }
    assert hc.declaration_gap([[], "vision"]) is None


# -- parity of the client-side and stored derivations ----------------------------------------------------------

_messages = st.lists(
    st.sampled_from(
        [
            [USER],
            [IMAGE_MSG],
            [{"role": "developer", "content": "d"}, USER],
            [
                USER,
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
            [{"role": "assistant", "content": "a"}, USER],
        ]
    ),
    min_size=1,
    max_size=3,
).map(lambda groups: [m for group in groups for m in group])

_bodies = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": _messages},
    optional={
        "seed": st.one_of(st.none(), st.integers(-5, 5)),
        "reasoning_effort": st.one_of(st.none(), st.sampled_from([e.value for e in hc.ChatReasoningEffort])),
        "presence_penalty": st.one_of(st.none(), st.sampled_from([0, 0.0, 1.5, -2])),
        "frequency_penalty": st.one_of(st.none(), st.sampled_from([0, 0.5])),
        "temperature": st.one_of(st.none(), st.floats(0, 2)),
        "tools": st.one_of(st.none(), st.just([]), st.just([TOOL]), st.just([TOOL, TOOL_G])),
        "response_format": st.one_of(
            st.none(),
            st.sampled_from([{"type": "text"}, {"type": "json_object"}, LOOSE_FMT, STRICT_FMT]),
        ),
        "stream": st.booleans(),
        "horde": st.fixed_dictionaries(
            {}, optional={"conformance": st.sampled_from(["strict", "best_effort"])}
        ),
    },
).flatmap(lambda body: _add_tool_keys(body))


def _add_tool_keys(body: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    if not body.get("tools"):
        return st.just(body)
    return st.fixed_dictionaries(
        {},
        optional={
            "tool_choice": st.sampled_from([None, "none", "auto", "required", FORCED]),
            "parallel_tool_calls": st.sampled_from([None, True, False]),
        },
    ).map(lambda extra: {**body, **extra})


@settings(max_examples=200, deadline=None)
@given(_bodies)
def test_requirement_parity(body: dict[str, Any]) -> None:
    """TestRequirementParity: the client-side derivation equals the stored one over generated requests."""
    request = hc.parse_chat_request(body)
    assert hc.chat_request_requirements(body) == request.required_features
    assert request.required_features == sorted(set(request.required_features))
    assert all(v in hc.KNOWN_CHAT_FEATURES for v in request.required_features)
