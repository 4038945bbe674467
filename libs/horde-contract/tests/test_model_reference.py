"""TextModelReference: the naming expansion, the lookup rules and the multiplier."""

from __future__ import annotations

from typing import Any

import horde_contract as hc
import pytest
from horde_contract.model_reference import QUANT_SUFFIX

DB: dict[str, Any] = {
    "mistralai/Mistral-7B-Instruct-v0.2": {
        "name": "mistralai/Mistral-7B-Instruct-v0.2",
        "parameters": 7000000000,
    },
    "alpindale/goliath-120b": {"name": "alpindale/goliath-120b", "parameters": 120000000000},
    # already-derived rows, as the published db.json lists them: kept as they are
    "aphrodite/alpindale/goliath-120b": {"parameters": 120000000000},
    "koboldcpp/goliath-120b": {"parameters": 120000000000},
    # an explicit row wins over the name another row derives
    "koboldcpp/Llama-3-8B": {"parameters": 9000000000},
    "meta-llama/Llama-3-8B": {"parameters": 8000000000},
    # a row without an org (convert.py derives its names too), parameters as a string and as a float
    "Pygmalion-2.7b": {"parameters": "2700000000"},
    "org/half-model": {"parameters": 1.5e9},
}

REFERENCE = hc.TextModelReference.from_mapping(DB)


@pytest.mark.parametrize(
    ("name", "known", "billion"),
    [
        # exact rows and their derived names
        ("mistralai/Mistral-7B-Instruct-v0.2", True, 7.0),
        ("aphrodite/mistralai/Mistral-7B-Instruct-v0.2", True, 7.0),
        ("koboldcpp/Mistral-7B-Instruct-v0.2", True, 7.0),
        ("alpindale/goliath-120b", True, 120.0),
        ("aphrodite/alpindale/goliath-120b", True, 120.0),
        ("koboldcpp/goliath-120b", True, 120.0),
        ("meta-llama/Llama-3-8B", True, 8.0),
        ("aphrodite/meta-llama/Llama-3-8B", True, 8.0),
        ("koboldcpp/Llama-3-8B", True, 9.0),
        ("Pygmalion-2.7b", True, 2.7),
        ("aphrodite/Pygmalion-2.7b", True, 2.7),
        ("koboldcpp/Pygmalion-2.7b", True, 2.7),
        ("org/half-model", True, 1.5),
        # a derived row is not derived again
        ("aphrodite/aphrodite/alpindale/goliath-120b", False, None),
        ("aphrodite/koboldcpp/goliath-120b", False, None),
        # the org is dropped only under koboldcpp/, and the match is exact (case included)
        ("Mistral-7B-Instruct-v0.2", False, None),
        ("aphrodite/Mistral-7B-Instruct-v0.2", False, None),
        ("mistralai/mistral-7b-instruct-v0.2", False, None),
        ("koboldcpp/mistralai/Mistral-7B-Instruct-v0.2", False, None),
        # a ::user#id suffix is dropped; only one :: separates it
        ("koboldcpp/goliath-120b::someone#42", True, 120.0),
        ("alpindale/goliath-120b::a::b", False, None),
        # quantization suffixes are retried without (upstream's pattern needs a tag before the Q part)
        ("koboldcpp/Mistral-7B-Instruct-v0.2-GGUF-Q4_K_M", True, 7.0),
        ("koboldcpp/Mistral-7B-Instruct-v0.2.i1-Q8_0", True, 7.0),
        ("koboldcpp/goliath-120b-GGUF-Q5_K_S", True, 120.0),
        ("koboldcpp/goliath-120b-GGUF-Q-Int8", True, 120.0),
        ("koboldcpp/goliath-120b-GGUF-Q4_K_M.gguf", True, 120.0),
        ("koboldcpp/goliath-120b.i1-Q4_K_M::someone#42", True, 120.0),
        ("alpindale/goliath-120b-GGUF-Q6_K", True, 120.0),
        # ... so a bare .Q4_K_M is not stripped, and a Q1 or Q10 is no quantization
        ("koboldcpp/goliath-120b.Q4_K_M", False, None),
        ("koboldcpp/goliath-120b-GGUF-Q1", False, None),
        ("koboldcpp/goliath-120b-GGUF-Q10", False, None),
        ("koboldcpp/other-7b-GGUF-Q4_K_M", False, None),
        # unknown and empty names
        ("model-abc", False, None),
        ("", False, None),
        (None, False, None),
    ],
)
def test_lookup(name: str | None, known: bool, billion: float | None) -> None:
    assert REFERENCE.is_known(name) is known
    found = REFERENCE.parameters_billion(name)
    assert found == (pytest.approx(billion) if billion is not None else None)
    assert REFERENCE.multiplier(name) == (pytest.approx(billion) if billion is not None else 1.0)


@pytest.mark.parametrize(
    ("names", "highest"),
    [
        ([], 1.0),
        (["model-abc"], 1.0),
        (["koboldcpp/Mistral-7B-Instruct-v0.2", "alpindale/goliath-120b"], 120.0),
        (["alpindale/goliath-120b", "model-abc"], 120.0),
        (["org/half-model", "model-abc"], 1.5),
    ],
)
def test_highest_multiplier(names: list[str], highest: float) -> None:
    assert REFERENCE.highest_multiplier(names) == pytest.approx(highest)


def test_size_and_empty_reference() -> None:
    # 8 explicit rows; derived: 3 rows x 2 + Pygmalion x 2 + half-model x 2, less the explicit koboldcpp/Llama
    assert len(REFERENCE) == 8 + 2 * 4 - 1
    empty = hc.TextModelReference()
    assert len(empty) == 0 and not empty.is_known("alpindale/goliath-120b")
    assert empty.multiplier("alpindale/goliath-120b") == 1.0
    assert hc.TextModelReference.from_mapping({}) == empty


@pytest.mark.parametrize(
    ("db", "message"),
    [
        ({"a/b": []}, "text model reference entry 'a/b' is not an object"),
        ({"a/b": {}}, "text model reference entry 'a/b' has no numeric 'parameters'"),
        ({"a/b": {"parameters": True}}, "text model reference entry 'a/b' has no numeric 'parameters'"),
        ({"a/b": {"parameters": "seven"}}, "text model reference entry 'a/b' has no numeric 'parameters'"),
        (
            {"a/b": {"parameters": float("inf")}},
            "text model reference entry 'a/b' has no numeric 'parameters'",
        ),
        ({"a/b": {"parameters": 0}}, "text model reference entry 'a/b' has 'parameters' 0, not positive"),
        ({"": {"parameters": 1}}, "text model reference key '' is not a model name"),
        ({1: {"parameters": 1}}, "text model reference key 1 is not a model name"),
    ],
)
def test_invalid_entries_are_refused(db: dict[Any, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        hc.TextModelReference.from_mapping(db)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("name", "stripped"),
    [
        ("Model-7B-GGUF-Q5_K_S", "Model-7B"),
        ("Model-7B.i1-Q4_K_M", "Model-7B"),
        ("Model-7B-GGUF-Q-Int4", "Model-7B"),
        ("Model-7B-GGUFQ4", "Model-7B"),
        ("Model-7B-GGUF-Q4_K_M.gguf", "Model-7B"),
        # quirks of upstream's pattern, kept: the tag before Q may be the size, a bare .Q4 is not stripped
        ("Model-7B-Q8_0", "Model"),
        ("Mistral-7B-Instruct-v0.2-Q8_0", "Mistral-7B-Instruct-v0"),
        ("Model-7B.Q4_K_M", "Model-7B.Q4_K_M"),
        ("Model-7B-GGUF-Q1", "Model-7B-GGUF-Q1"),
        ("Model-7B", "Model-7B"),
    ],
)
def test_quant_suffix(name: str, stripped: str) -> None:
    assert QUANT_SUFFIX.sub("", name) == stripped
