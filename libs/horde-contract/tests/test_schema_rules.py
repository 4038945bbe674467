"""Schema walking: nesting depth and OpenAI's strict structural rules (docs/native-api.md#tools)."""

from __future__ import annotations

import horde_contract as hc


def test_nesting_depth() -> None:
    assert hc.schema_nesting_depth(True) == 0
    assert hc.schema_nesting_depth({}) == 0
    assert hc.schema_nesting_depth({"properties": {"a": {}}}) == 1
    tuple_items = {"items": [{"type": "string"}, {"items": {"type": "integer"}}, True]}
    assert hc.schema_nesting_depth(tuple_items) == 2
    mixed = {
        "$defs": {"d": {"not": {"anyOf": [{}, 5]}}, "skip": 1},
        "prefixItems": [{}],
        "additionalProperties": False,
        "patternProperties": {"^x": {"if": {}, "then": {"properties": {"y": {}}}}},
    }
    assert hc.schema_nesting_depth(mixed) == 3
    deep: dict = {}
    for _ in range(50):
        deep = {"items": deep}
    assert hc.schema_nesting_depth(deep) == 50
    assert hc.schema_nesting_depth(deep, limit=10) == 11


def test_strict_rules() -> None:
    ok = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert hc.strict_schema_violation(ok) is None
    assert hc.strict_schema_violation("x") is None
    assert hc.strict_schema_violation({"type": "string"}) is None
    # an untyped schema with properties is an object schema
    assert hc.strict_schema_violation({"properties": {}}) == (
        "In context=(), 'additionalProperties' is required to be supplied and to be false."
    )
    # an object without properties needs no required
    assert hc.strict_schema_violation({"type": "object", "additionalProperties": False}) is None
    # required that is not an array
    assert hc.strict_schema_violation({**ok, "required": "a"}) == (
        "In context=(), 'required' is required to be supplied and to be an array including every key in "
        "properties. Missing 'a'."
    )
    tuple_items = {"type": "array", "items": [{"type": "string"}, {"type": "object"}]}
    assert hc.strict_schema_violation(tuple_items) == (
        "In context=('items', 1), 'additionalProperties' is required to be supplied and to be false."
    )
    # the first breach in keyword order is reported
    two = {**ok, "properties": {"a": {"type": "object"}, "b": {"type": "object"}}, "required": ["a", "b"]}
    assert hc.strict_schema_violation(two) == (
        "In context=('properties', 'a'), 'additionalProperties' is required to be supplied and to be false."
    )


def test_keywords_of_the_wrong_shape_are_not_subschemas() -> None:
    assert hc.schema_nesting_depth({"anyOf": {"a": {}}, "properties": [{}], "not": [{}]}) == 0


def test_a_strict_object_whose_properties_is_no_object_is_refused():
    schema = {"type": "object", "properties": ["city"], "required": ["city"], "additionalProperties": False}
    assert hc.strict_schema_violation(schema) == "In context=(), 'properties' is required to be an object."
    nested = {
        "type": "object",
        "properties": {"where": {"type": "object", "properties": "city", "additionalProperties": False}},
        "required": ["where"],
        "additionalProperties": False,
    }
    assert hc.strict_schema_violation(nested) == (
        "In context=('properties', 'where'), 'properties' is required to be an object."
    )
