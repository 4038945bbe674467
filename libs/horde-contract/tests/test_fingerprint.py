"""The operation fingerprint: invariant under the stated equivalences, changed by every fingerprinted input
(docs/native-api.md#operation-key)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import horde_contract as hc
from hypothesis import given, settings
from hypothesis import strategies as st

TOOL = {"type": "function", "function": {"name": "f"}}


def fp(body: dict[str, Any]) -> str:
    return hc.build_operation_fingerprint(hc.parse_chat_request(body))


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
_message = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, _text),
    st.builds(lambda t: {"role": "system", "content": t}, _text),
    st.builds(lambda t: {"role": "assistant", "content": t}, _text),
    st.builds(lambda t: {"role": "user", "content": [{"type": "text", "text": t}]}, _text),
)
_models = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=4), min_size=1, max_size=5, unique=True)
_horde_defaults = st.fixed_dictionaries(
    {},
    optional={key: st.just(value) for key, value in hc.HORDE_OPTION_DEFAULTS.items()},
)
_excluded = st.fixed_dictionaries(
    {},
    optional={
        "availability_mode": st.sampled_from(["wait", "fail_fast"]),
        "dry_run": st.booleans(),
        "include_reasoning": st.booleans(),
        "max_kudos": st.integers(1, 10**6),
        "operation_key": st.uuids().map(str),
    },
)
_base = st.fixed_dictionaries(
    {"messages": st.lists(_message, min_size=1, max_size=4), "models": _models},
    optional={
        "temperature": st.floats(0, 2),
        "seed": st.integers(-(2**31), 2**31),
        "tools": st.just([TOOL]),
        "stop": st.lists(_text, min_size=1, max_size=3),
        "max_tokens": st.integers(16, 16384),
    },
)


@settings(max_examples=200, deadline=None)
@given(
    base=_base,
    data=st.data(),
)
def test_invariant_under_equivalences(base: dict[str, Any], data: st.DataObject) -> None:
    reference = fp(base)
    variant = copy.deepcopy(base)
    # model order
    variant["models"] = data.draw(st.permutations(base["models"]))
    # max_tokens as max_completion_tokens, or both with one value; 512 sent = left out
    limit = variant.pop("max_tokens", None)
    form = data.draw(st.sampled_from(["max_tokens", "max_completion_tokens", "both"]))
    if limit is None:
        limit = 512 if data.draw(st.booleans()) else None
    if limit is not None:
        if form in ("max_tokens", "both"):
            variant["max_tokens"] = limit
        if form in ("max_completion_tokens", "both"):
            variant["max_completion_tokens"] = limit
    # horde options at their defaults, and the excluded options at any value
    variant["horde"] = {**data.draw(_horde_defaults), **data.draw(_excluded)}
    # keys outside the fingerprint
    variant["stream"] = data.draw(st.booleans())
    variant["stream_options"] = {"include_usage": data.draw(st.booleans())}
    variant["user"] = data.draw(_text)
    variant["metadata"] = {"k": data.draw(_text)}
    # sampling values sent at the job's defaults
    if "temperature" not in base and data.draw(st.booleans()):
        variant["temperature"] = 1
    if data.draw(st.booleans()):
        variant["presence_penalty"] = 0
    # a single model as model
    if len(base["models"]) == 1 and data.draw(st.booleans()):
        variant["model"] = variant.pop("models")[0]
    assert fp(variant) == reference


MUTATIONS = [
    ("message-text", lambda b: b["messages"].append({"role": "user", "content": "more"})),
    ("role", lambda b: b["messages"].insert(0, {"role": "system", "content": "s"})),
    ("max_tokens", lambda b: b.update(max_tokens=b.get("max_tokens", 512) + 1)),
    ("temperature", lambda b: b.update(temperature=0.123)),
    ("seed", lambda b: b.update(seed=b.get("seed", 0) + 1)),
    ("stop", lambda b: b.update(stop=["zz-stop"])),
    ("model", lambda b: b["models"].__setitem__(0, b["models"][0] + "z")),
    ("tools", lambda b: b.update(tools=[TOOL, {"type": "function", "function": {"name": "g"}}])),
    ("tool_choice", lambda b: b.update(tools=[TOOL], tool_choice="required")),
    ("response_format", lambda b: b.update(response_format={"type": "json_object"})),
    ("reasoning_effort", lambda b: b.update(reasoning_effort="high")),
    ("horde.context_fit", lambda b: b.update(horde={"context_fit": "reject"})),
    ("horde.conformance", lambda b: b.update(horde={"conformance": "best_effort"})),
    ("horde.slow_workers", lambda b: b.update(horde={"slow_workers": False})),
    ("horde.trusted_workers", lambda b: b.update(horde={"trusted_workers": True})),
    ("horde.validated_backends", lambda b: b.update(horde={"validated_backends": True})),
    ("horde.only", lambda b: b.update(horde={"only": ["w"]})),
    ("horde.ignore", lambda b: b.update(horde={"ignore": ["w"]})),
    ("horde.max_context_length", lambda b: b.update(horde={"max_context_length": 4096})),
    ("horde.openai_guards", lambda b: b.update(horde={"openai_guards": True})),
]


@settings(max_examples=100, deadline=None)
@given(base=_base, mutation=st.sampled_from(MUTATIONS))
def test_changes_with_each_input(base: dict[str, Any], mutation: Any) -> None:
    name, mutate = mutation
    variant = copy.deepcopy(base)
    mutate(variant)
    if variant == base:  # pragma: no cover - every mutation changes the body
        return
    assert fp(variant) != fp(base), name


def test_known_digest_and_shape() -> None:
    request = hc.parse_chat_request({"model": "a", "messages": [{"role": "developer", "content": "x"}]})
    doc = hc.operation_fingerprint_inputs(request)
    assert doc == {
        "messages": [{"role": "system", "content": "x"}],
        "params": {
            "max_length": 512,
            "temperature": 1.0,
            "top_p": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
        },
        "models": ["a"],
        "horde": {
            "only": None,
            "ignore": None,
            "trusted_workers": False,
            "validated_backends": False,
            "slow_workers": True,
            "max_context_length": None,
            "context_fit": "truncate_oldest",
            "conformance": "strict",
            "openai_guards": False,
        },
    }
    digest = hc.build_operation_fingerprint(request)
    assert digest == hashlib.sha256(hc.canonical_json(doc)).hexdigest()
    assert len(digest) == 64
    assert hc.canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    # developer rewritten to system gives the fingerprint of the system message
    assert digest == fp({"models": ["a"], "messages": [{"role": "system", "content": "x"}]})
    # worker lists are sets
    assert fp(
        {"model": "a", "messages": [{"role": "user", "content": "x"}], "horde": {"only": ["w2", "w1", "w1"]}}
    ) == fp({"model": "a", "messages": [{"role": "user", "content": "x"}], "horde": {"only": ["w1", "w2"]}})
    # the stream hint alone gives no chat_extras
    streamed = hc.parse_chat_request(
        {"model": "a", "messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    assert "chat_extras" not in hc.operation_fingerprint_inputs(streamed)
