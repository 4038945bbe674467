"""Bounded reply validation (horde_contract.reply_schema): patterns in RE2, references inside the
schema only, steps, reference expansions and CPU time capped, error messages cut, replies bounded by the job."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import horde_contract as hc
import pytest
import re2
from horde_contract.reply import (
    check_chat_reply_size,
    check_text_reply_size,
    max_reply_bytes,
    reply_validates_schema,
)
from horde_contract.reply_schema import (
    DEFAULT_SCHEMA_LIMITS,
    MAX_SCHEMA_ERROR_MESSAGE_CHARS,
    SchemaBoundExceeded,
    SchemaLimits,
    SchemaUncompilable,
    compile_pattern,
    compile_reply_schema,
    reply_schema_error,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from referencing import Registry
from referencing.exceptions import Unresolvable

REDOS = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"}},
    "required": ["s"],
    "additionalProperties": False,
}

# Two branches that both fail only at the bottom of a nested array: 2**depth evaluations without a bound.
EXPONENTIAL = {
    "$defs": {
        "n": {
            "anyOf": [
                {"type": "array", "items": {"$ref": "#/$defs/n"}},
                {"type": "array", "items": {"$ref": "#/$defs/n"}},
            ]
        }
    },
    "$ref": "#/$defs/n",
}


def nested(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def validate(schema: Any, instance: Any, limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS) -> Any:
    return reply_schema_error(compile_reply_schema(schema, limits), instance, limits)


def strict(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "strict": True, "schema": schema},
        }
    }


def reply(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


# -- patterns -----------------------------------------------------------------------------------------------


# A backtracking engine takes hours (2**40 paths) on these tests' inputs: answering at all proves the linear
# engine, and the timeout is only a hang guard.
@pytest.mark.timeout(30)
def test_catastrophic_pattern_is_linear() -> None:
    """``^(a|a)*$`` against 40 a's and a '!' takes hours with a backtracking engine; RE2 answers at once."""
    assert isinstance(compile_pattern("^(a|a)*$"), re2._Regexp)
    error = validate(REDOS, {"s": "a" * 40 + "!"})
    assert error is not None
    assert error.message == f"'{'a' * 40}!' does not match '^(a|a)*$'"
    assert validate(REDOS, {"s": "a" * 40}) is None
    assert validate(REDOS, {"s": "a" * 200_000 + "!"}) is not None


@pytest.mark.timeout(30)  # a hang guard (see above)
def test_catastrophic_pattern_property_is_linear() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^(a|a)*$": {"type": "integer"}},
        "additionalProperties": False,
    }
    error = validate(schema, {"a" * 40 + "!": 1})
    assert error is not None
    assert error.message == f"'{'a' * 40}!' does not match any of the regexes: '^(a|a)*$'"
    assert validate(schema, {"aaaa": 1}) is None
    assert validate(schema, {"aaaa": "x"}) is not None


@pytest.mark.parametrize(
    "pattern",
    [r"(a)\1", r"(?=a)b", r"(?<!a)b", r"a\Z", "a{1001}"],
    ids=["backref", "lookahead", "lookbehind", "Z", "repeat"],
)
def test_pattern_re2_does_not_take_is_uncompilable_whatever_the_reply(pattern: str) -> None:
    # The pattern sits in $defs, which this reply never reaches: the schema still does not compile.
    schema = {"type": "object", "$defs": {"unused": {"type": "string", "pattern": pattern}}}
    with pytest.raises(SchemaUncompilable, match="is not one RE2 takes"):
        compile_reply_schema(schema)
    with pytest.raises(SchemaUncompilable):
        compile_reply_schema({"patternProperties": {pattern: {}}})


def test_pattern_semantics_are_jsonschemas() -> None:
    schema = {"type": "string", "pattern": "b+"}
    assert validate(schema, "abbc") is None  # unanchored search
    assert validate(schema, "ac") is not None
    assert validate({"pattern": "^é.$"}, "éx") is None  # UTF-8 aware
    assert validate({"pattern": "^.$"}, "\ud800") is None  # a lone surrogate does not break matching
    props = {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^x-": {"type": "string"}, "^y-": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert validate(props, {"id": 1, "x-a": "s", "y-b": 2}) is None
    error = validate(props, {"id": 1, "z": 1})
    assert error is not None
    assert error.message == "'z' does not match any of the regexes: '^x-', '^y-'"
    assert validate(props, {"x-a": 3}) is not None


def test_unevaluated_properties_beside_pattern_properties_is_uncompilable() -> None:
    with pytest.raises(SchemaUncompilable, match="unevaluatedProperties beside patternProperties"):
        compile_reply_schema({"patternProperties": {"^a": {}}, "unevaluatedProperties": False})
    assert validate({"properties": {"a": {}}, "unevaluatedProperties": False}, {"a": 1}) is None
    assert validate({"properties": {"a": {}}, "unevaluatedProperties": False}, {"b": 1}) is not None


def test_nested_dialect_is_uncompilable() -> None:
    # jsonschema would switch to its own, unbounded, validator class for that subschema.
    schema = {"$defs": {"d": {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": "^(a|a)*$"}}}
    with pytest.raises(SchemaUncompilable, match="names the dialect"):
        compile_reply_schema(schema)
    assert validate({"$schema": "http://json-schema.org/draft-07/schema#", "type": "integer"}, 1) is None


# -- references ---------------------------------------------------------------------------------------------


def test_remote_file_and_metaschema_references_do_not_resolve(schema_server: Any, monkeypatch: Any) -> None:
    base, hits = schema_server

    def no_fetch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a reference was fetched")

    monkeypatch.setattr(urllib.request, "urlopen", no_fetch)
    for ref in (
        f"{base}/schema.json",
        "file:///etc/passwd",
        "https://json-schema.org/draft/2020-12/schema",
        "http://json-schema.org/draft-07/schema#",
    ):
        schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
        with pytest.raises(SchemaUncompilable, match="does not resolve inside it"):
            validate(schema, {"a": 1})
    assert hits == []
    # Inside the schema, references resolve.
    local = {"$defs": {"i": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/i"}}}
    assert validate(local, {"a": 1}) is None
    assert validate(local, {"a": "x"}) is not None


# -- budgets -------------------------------------------------------------------------------------------------


# 2**40 evaluations without a bound: ending at all proves the bound, which the error names; the timeout is
# only a hang guard.
@pytest.mark.timeout(30)
def test_exponential_schema_stops_at_its_cpu_bound() -> None:
    limits = SchemaLimits(max_steps=10**9, max_ref_expansions=10**9, cpu_seconds=0.3)
    with pytest.raises(SchemaBoundExceeded, match=r"^its CPU time bound$"):
        validate(EXPONENTIAL, nested(40), limits)


@pytest.mark.timeout(30)
def test_default_bounds_end_a_pathological_check_within_seconds() -> None:
    # 500,000 steps or 2 s of CPU, whichever comes first: the error names the one reached.
    with pytest.raises(SchemaBoundExceeded) as info:
        validate(EXPONENTIAL, nested(40))
    assert str(info.value) in {
        f"more than {DEFAULT_SCHEMA_LIMITS.max_steps} validation steps",
        "its CPU time bound",
    }


def test_step_and_reference_caps_are_deterministic() -> None:
    limits = SchemaLimits(max_steps=1000, max_ref_expansions=10**9, cpu_seconds=60)
    schema = {"type": "array", "items": {"type": "integer"}}
    assert validate(schema, list(range(100)), limits) is None
    with pytest.raises(SchemaBoundExceeded, match="more than 1000 validation steps"):
        validate(schema, list(range(1000)), limits)
    refs = SchemaLimits(max_steps=10**9, max_ref_expansions=50, cpu_seconds=60)
    tree = {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"}
    assert validate(tree, nested(20, []), refs) is None
    with pytest.raises(SchemaBoundExceeded, match="more than 50 reference expansions"):
        validate(tree, nested(60, []), refs)


def test_false_subschemas_count_and_messages_are_cut() -> None:
    # A false branch reaches no keyword; it still counts, and its error does not copy the 256 KiB reply.
    limits = SchemaLimits(max_steps=5000, max_ref_expansions=10**9, cpu_seconds=60)
    with pytest.raises(SchemaBoundExceeded, match="validation steps"):
        validate({"anyOf": [False] * 20000}, "a" * 262_144, limits)
    error = validate({"anyOf": [False, {"type": "integer"}]}, "a" * 262_144)
    assert error is not None
    assert len(error.message) <= MAX_SCHEMA_ERROR_MESSAGE_CHARS
    assert all(len(e.message) <= MAX_SCHEMA_ERROR_MESSAGE_CHARS for e in error.context)


def test_deep_reply_is_bounded_not_a_crash() -> None:
    tree = {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"}
    with ThreadPoolExecutor(1) as pool:  # as the submit runs it: in a thread
        with pytest.raises(SchemaBoundExceeded, match="recursion limit"):
            pool.submit(validate, tree, nested(3000, [])).result()


def test_unique_items_is_linear_and_keeps_jsonschemas_equality() -> None:
    schema = {"type": "array", "uniqueItems": True}
    items = [{"a": i, "b": [i]} for i in range(30_000)]
    assert validate(schema, items) is None
    # One counted step per item (jsonschema's own check compares every pair of objects, uncounted).
    assert (
        validate(schema, items, SchemaLimits(max_steps=30_100, max_ref_expansions=10**9, cpu_seconds=60))
        is None
    )
    with pytest.raises(SchemaBoundExceeded, match="more than 30000 validation steps"):
        validate(schema, items, SchemaLimits(max_steps=30_000, max_ref_expansions=10**9, cpu_seconds=60))
    assert validate(schema, [{"a": 1}, {"a": 1}]) is not None
    assert validate(schema, [1, 1.0]) is not None
    assert validate(schema, [1, True]) is None
    assert validate(schema, [[0], [False]]) is None
    assert validate(schema, [{"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}]) is not None


def test_a_large_legal_reply_fits_the_default_bounds() -> None:
    """About 285 KB of objects (more than a 16,384-token job may reply) under a strict schema: well inside the
    step and reference bounds (about 94,000 steps). The CPU bound is the safety net for what steps do not count;
    it is not asserted here (a traced or crowded run may take 10x the 0.2 s it takes alone)."""
    item = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string", "pattern": "^[A-Za-z ]+$"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["id", "name", "tags"],
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": item}},
        "required": ["items"],
        "additionalProperties": False,
    }
    value = {"items": [{"id": i, "name": "Name Here", "tags": ["a", "b"]} for i in range(5200)]}
    untimed = replace(DEFAULT_SCHEMA_LIMITS, cpu_seconds=600.0)
    assert validate(schema, value, untimed) is None
    # Well inside: it fits a quarter of the default step bound too.
    assert validate(schema, value, replace(untimed, max_steps=DEFAULT_SCHEMA_LIMITS.max_steps // 4)) is None


def test_compile_outcome_is_cached() -> None:
    schema = {"type": "object", "properties": {"p": {"pattern": "(?=x)"}}}
    for _ in range(2):
        with pytest.raises(SchemaUncompilable):
            compile_reply_schema(schema)
    assert compile_reply_schema(REDOS) is compile_reply_schema(json.loads(json.dumps(REDOS)))


# -- through verify_chat_reply ------------------------------------------------------------------------------


def test_verify_refuses_a_check_past_its_bounds_as_nonconformant() -> None:
    limits = SchemaLimits(max_steps=10**9, max_ref_expansions=10**9, cpu_seconds=0.2)
    with pytest.raises(hc.HordeError) as info:
        hc.verify_chat_reply(reply(json.dumps(nested(40))), strict(EXPONENTIAL), "strict", limits)
    assert (info.value.status, info.value.rc, info.value.param) == (
        400,
        "ChatSubmitNonconformant",
        "message.content",
    )
    assert info.value.message == (
        "'message.content': The reply cannot be shown to match the response format schema: checking it exceeded "
        "its CPU time bound."
    )
    # best_effort never validates the schema.
    assert hc.verify_chat_reply(reply(json.dumps(nested(40))), strict(EXPONENTIAL), "best_effort", limits)


@pytest.mark.timeout(30)  # a hang guard: a backtracking engine would take hours
def test_verify_catastrophic_pattern_is_nonconformant_at_once() -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.verify_chat_reply(reply(json.dumps({"s": "a" * 40 + "!"})), strict(REDOS), "strict")
    assert info.value.rc == "ChatSubmitNonconformant"
    assert info.value.message == (
        "'message.content': The reply content does not match the response format schema at '/s': "
        f"'{'a' * 40}!' does not match '^(a|a)*$'"
    )


def test_verify_uncompilable_pattern_names_it() -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.verify_chat_reply(
            reply('{"s": "aa"}'), strict({"type": "object", "properties": {"s": {"pattern": r"(a)\1"}}})
        )
    assert info.value.rc == "ChatSubmitNonconformant"
    assert info.value.param == "response_format"
    assert info.value.message == (
        "'response_format': The request's response format schema cannot be compiled (the pattern '(a)\\\\1' is not "
        "one RE2 takes (no backreferences or lookarounds)), so the reply cannot be shown to match it."
    )


def test_reply_validates_schema() -> None:
    assert reply_validates_schema(strict({}), "strict")
    assert not reply_validates_schema(strict({}), "best_effort")
    assert not reply_validates_schema({"response_format": {"type": "json_object"}}, "strict")
    loose = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}
    assert not reply_validates_schema(loose, "strict")
    assert not reply_validates_schema(None, "strict")


# -- replies bounded by the job -----------------------------------------------------------------------------


def test_chat_reply_size_is_bounded_by_max_length() -> None:
    assert max_reply_bytes(80) == 1280
    check_chat_reply_size(reply("a" * 1280), 80)
    check_chat_reply_size(reply("é" * 640), 80)  # two bytes each: exactly the cap
    with pytest.raises(hc.HordeError) as info:
        check_chat_reply_size(reply("é" * 641), 80)
    assert (info.value.status, info.value.rc, info.value.param) == (400, "ChatSubmitInvalid", "message")
    assert info.value.message == (
        "'message': the content and tool calls take 1282 bytes of UTF-8; at most 1280 are allowed for a job of "
        "max_length 80 (16 per token)."
    )
    call = {"id": "c" * 10, "type": "function", "function": {"name": "f" * 10, "arguments": "a" * 1000}}
    check_chat_reply_size({"role": "assistant", "content": "x" * 260, "tool_calls": [call]}, 80)
    with pytest.raises(hc.HordeError):
        check_chat_reply_size({"role": "assistant", "content": "x" * 261, "tool_calls": [call]}, 80)
    # Reasoning has its own bound (MAX_CHAT_TEXT_BYTES, at parse).
    check_chat_reply_size({"role": "assistant", "content": "", "reasoning_content": "r" * 100_000}, 80)


def test_text_reply_size_is_bounded_by_max_length() -> None:
    check_text_reply_size("a" * 1280, 80)
    with pytest.raises(hc.HordeError) as info:
        check_text_reply_size("a" * 8_000_000, 80)
    assert (info.value.status, info.value.rc, info.value.param) == (400, "ChatSubmitInvalid", "generation")
    assert info.value.message == (
        "'generation': takes 8000000 bytes of UTF-8; at most 1280 are allowed for a job of max_length 80 "
        "(16 per token)."
    )


# -- the same answers as jsonschema -------------------------------------------------------------------------

_PATTERNS = ["^a", "b$", "[0-9]+", "^x-", "é", "^$"]
_leaf = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": ["string", "null"]},
        {"pattern": "^a"},
        {"pattern": "[0-9]+"},
        {"enum": [1, "a", None, [1]]},
        {"const": {"a": 1}},
        {"minimum": 2},
        {"maxLength": 2},
        {"uniqueItems": True},
        True,
        False,
    ]
)


def _compose(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.sampled_from(["a", "b", "x-1", "é"])
    return st.one_of(
        st.builds(lambda p: {"type": "object", "properties": p}, st.dictionaries(keys, children, max_size=3)),
        st.builds(
            lambda p, ap: {"patternProperties": p, "additionalProperties": ap},
            st.dictionaries(st.sampled_from(_PATTERNS), children, max_size=2),
            st.one_of(st.booleans(), children),
        ),
        st.builds(lambda r: {"type": "object", "required": r}, st.lists(keys, max_size=2, unique=True)),
        st.builds(lambda i: {"type": "array", "items": i}, children),
        st.builds(lambda i: {"prefixItems": i, "uniqueItems": True}, st.lists(children, max_size=2)),
        st.builds(lambda s: {"anyOf": s}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda s: {"oneOf": s}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda s: {"allOf": s}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda s: {"not": s}, children),
        st.builds(lambda s: {"$defs": {"d": s}, "$ref": "#/$defs/d"}, children),
    )


_schemas = st.recursive(_leaf, _compose, max_leaves=8)
_instances = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.sampled_from([1.0, 2.5]),
        st.sampled_from(["", "a", "ab", "b", "x-1", "é", "a1", "\ud800"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "x-1", "é", "zz"]), children, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas, instance=_instances)
def test_guarded_validator_agrees_with_jsonschema(schema: Any, instance: Any) -> None:
    """On patterns both engines read alike, the bounded validator gives jsonschema's answer and message (the
    schema is compiled with its keys sorted, as its cache key is, and as JSONB reorders them anyway)."""
    schema = json.loads(json.dumps(schema, sort_keys=True))
    try:
        Draft202012Validator.check_schema(schema)
        expected = best_match(Draft202012Validator(schema, registry=Registry()).iter_errors(instance))
    except SchemaError:
        with pytest.raises(SchemaUncompilable):
            validate(schema, instance)
        return
    except Unresolvable:
        with pytest.raises(SchemaUncompilable, match="does not resolve"):
            validate(schema, instance)
        return
    except RecursionError:  # a reference that leads back to itself
        with pytest.raises(SchemaBoundExceeded):
            validate(schema, instance)
        return
    got = validate(schema, instance)
    assert (got is None) == (expected is None), (schema, instance, expected, got)
    if expected is not None and got is not None:
        assert got.message == expected.message
        assert list(got.absolute_path) == list(expected.absolute_path)
