"""The text params model for the legacy text route (docs/native-api.md#text-route)."""

from __future__ import annotations

from typing import Any

import horde_contract as hc
import pytest

B = "BadRequest"
FAILED = "Input payload validation failed"

RANGE_CASES = [
    ("n", 0, "Input should be greater than or equal to 1"),
    ("n", 21, "Input should be less than or equal to 20"),
    ("max_length", 15, "Input should be greater than or equal to 16"),
    ("max_length", 16385, "Input should be less than or equal to 16384"),
    ("max_context_length", 79, "Input should be greater than or equal to 80"),
    ("max_context_length", 1_048_577, "Input should be less than or equal to 1048576"),
    ("temperature", -0.1, "Input should be greater than or equal to 0"),
    ("temperature", 5.1, "Input should be less than or equal to 5"),
    ("top_p", 0.0005, "Input should be greater than or equal to 0.001"),
    ("top_k", 201, "Input should be less than or equal to 200"),
    ("top_a", 1.5, "Input should be less than or equal to 1"),
    ("typical", -1, "Input should be greater than or equal to 0"),
    ("tfs", 2, "Input should be less than or equal to 1"),
    ("min_p", 1.1, "Input should be less than or equal to 1"),
    ("rep_pen", 0.9, "Input should be greater than or equal to 1"),
    ("rep_pen", 3.1, "Input should be less than or equal to 3"),
    ("rep_pen_range", 4097, "Input should be less than or equal to 4096"),
    ("rep_pen_slope", 11, "Input should be less than or equal to 10"),
    ("smoothing_factor", -1, "Input should be greater than or equal to 0"),
    ("dynatemp_range", 6, "Input should be less than or equal to 5"),
    ("dynatemp_exponent", 6, "Input should be less than or equal to 5"),
    ("n", 1.0, "Input should be a valid integer"),
    ("max_length", True, "Input should be a valid integer"),
    ("temperature", "1", "Input should be a valid number"),
    ("singleline", "yes", "Input should be a valid boolean"),
    ("stop_sequence", "x", "Input should be a valid list"),
]


@pytest.mark.parametrize(("field", "value", "text"), RANGE_CASES)
def test_ranges(field: str, value: Any, text: str, refusal: Any) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_text_params({field: value})
    refusal(info.value, 400, B, field, f"'{field}': {FAILED}: {field}: {text}")
    assert info.value.extra == {"errors": {field: text}}


def test_nested_field_path(refusal: Any) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_text_params({"sampler_order": [1, "x"]})
    refusal(
        info.value,
        400,
        B,
        "sampler_order",
        f"'sampler_order': {FAILED}: sampler_order.1: Input should be a valid integer",
    )


@pytest.mark.parametrize(
    ("params", "rc", "param", "message"),
    [
        (
            {"max_length": 4096},
            "TokenOverflow",
            "max_context_length",
            "max_context_length (2048) has to be at least max_length (4096).",
        ),
        (
            {"max_context_length": None, "max_length": 4096},  # null is the default, not a crash
            "TokenOverflow",
            "max_context_length",
            "max_context_length (2048) has to be at least max_length (4096).",
        ),
        (
            {"max_context_length": 100, "max_length": 200},
            "TokenOverflow",
            "max_context_length",
            "max_context_length (100) has to be at least max_length (200).",
        ),
        (
            {"sampler_order": [0, 1, 2, 3, 4, 5, 5]},
            "MissingFullSamplerOrder",
            "sampler_order",
            "sampler_order has to list at least 7 distinct samplers.",
        ),
        (
            {"stop_sequence": [str(i) for i in range(129)]},
            "TooManyStopSequences",
            "stop_sequence",
            "Too many stop sequences: 129 distinct, at most 128.",
        ),
        (
            {"stop_sequence": ["a" * 2001]},
            "ExcessiveStopSequence",
            "stop_sequence",
            "The stop sequences total 2001 characters, at most 2000.",
        ),
    ],
)
def test_cross_field(params: dict[str, Any], rc: str, param: str, message: str, refusal: Any) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_text_params(params)
    refusal(info.value, 400, rc, param, message)


def test_accepted() -> None:
    params = {
        "n": 20,
        "max_length": 16384,
        "max_context_length": 16384,
        "temperature": 5,
        "top_p": 0.001,
        "top_k": 0,
        "rep_pen": 1,
        "stop_sequence": ["a"] * 200,  # 200 entries, one distinct
        "sampler_order": [6, 0, 1, 2, 3, 4, 5],
        "use_default_badwordsids": True,
        "custom_key": {"passes": "through"},
    }
    out = hc.parse_text_params(params)
    assert out == {**params, "temperature": 5.0, "top_p": 0.001, "rep_pen": 1.0}
    assert hc.parse_text_params({}) == {}
    # Cross-field checks can be left to a later step.
    assert hc.parse_text_params({"max_length": 4096}, cross_field=False) == {"max_length": 4096}


def test_not_an_object(refusal: Any) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_text_params([])
    refusal(
        info.value, 400, B, "params", "'params': Input payload validation failed: params must be an object"
    )


def test_chat_params_model() -> None:
    out = hc.parse_text_params(
        {"frequency_penalty": 1, "presence_penalty": 0, "seed": 7, "reasoning_effort": "high"},
        model=hc.ChatTextParams,
    )
    assert out == {"frequency_penalty": 1.0, "presence_penalty": 0.0, "seed": 7, "reasoning_effort": "high"}


def test_null_limits_are_the_defaults():
    hc.check_text_params_cross_fields({"max_length": None, "max_context_length": None})
