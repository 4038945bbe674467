"""The worker's strict-schema check is the Horde's bounded one: an empty schema registry (no
``file://`` or remote ``$ref``, not even a metaschema), RE2 patterns, and a check past its bounds submitted
unchecked for the Horde to judge rather than faulted."""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

import pytest
from horde_contract.reply_schema import DEFAULT_SCHEMA_LIMITS
from horde_worker.jobs import BackendFault, ChatJob, ChatOutput
from horde_worker.replies import build_chat_submit, check_strict_schema, schema_validator


def strict_job(schema: dict[str, Any]) -> ChatJob:
    return ChatJob(
        id="j1",
        messages=[{"role": "user", "content": "hi"}],
        max_length=64,
        max_context_length=1024,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "strict": True, "schema": schema},
        },
    )


@pytest.mark.parametrize(
    "ref",
    [
        "{server}/schema.json",
        "file:///etc/passwd",
        "https://json-schema.org/draft/2020-12/schema",
        "http://json-schema.org/draft-07/schema#",
    ],
    ids=["http", "file", "metaschema-2020-12", "metaschema-draft-07"],
)
def test_references_resolve_in_an_empty_registry(schema_server: Any, monkeypatch: Any, ref: str) -> None:
    base, hits = schema_server

    def no_fetch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the worker fetched a schema reference")

    monkeypatch.setattr(urllib.request, "urlopen", no_fetch)
    schema = {"type": "object", "properties": {"a": {"$ref": ref.format(server=base)}}}
    with pytest.raises(BackendFault) as err:
        check_strict_schema(strict_job(schema), '{"a": 1}', False)
    assert err.value.reason == "unbuildable_grammar"
    assert "does not resolve inside it" in str(err.value)
    assert hits == []


def test_validator_registry_holds_only_the_schema() -> None:
    schema = {
        "$defs": {"i": {"type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/i"}},
    }
    validator = schema_validator(schema)
    # The resolver's registry: the schema itself, nothing bundled, nothing retrievable.
    assert list(validator._resolver._registry) == [""]
    check_strict_schema(strict_job(schema), '{"a": 1}', False)
    with pytest.raises(BackendFault) as err:
        check_strict_schema(strict_job(schema), '{"a": "x"}', False)
    assert err.value.reason == "generation_error"


@pytest.mark.timeout(30)  # a hang guard: a backtracking engine takes hours (2**40 paths) on this reply
def test_catastrophic_pattern_faults_at_once() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"}}}
    with pytest.raises(BackendFault) as err:
        check_strict_schema(strict_job(schema), json.dumps({"s": "a" * 40 + "!"}), False)
    assert err.value.reason == "generation_error"


def test_pattern_re2_does_not_take_is_unbuildable_grammar() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": r"(?=a)a"}}}
    with pytest.raises(BackendFault) as err:
        check_strict_schema(strict_job(schema), '{"s": "a"}', False)
    assert err.value.reason == "unbuildable_grammar"


# 2**40 evaluations without a bound: ending at all proves the bound, which the warning names; the timeout is
# only a hang guard.
@pytest.mark.timeout(30)
def test_a_check_past_its_bounds_is_submitted_unchecked(caplog: Any) -> None:
    exponential = {
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
    content = "x"
    for _ in range(40):
        content = f"[{json.dumps(content) if content == 'x' else content}]"
    declared = frozenset({"structured_output_enforced"})
    with caplog.at_level(logging.WARNING, logger="horde_worker.replies"):
        body = build_chat_submit(strict_job(exponential), ChatOutput(content=content), "m", declared)
    assert body["message"]["content"] == content
    # 500,000 steps or 2 s of CPU, whichever comes first: the warning names the one reached.
    assert any(
        "not checked" in record.getMessage()
        and record.getMessage().endswith(
            (f"more than {DEFAULT_SCHEMA_LIMITS.max_steps} validation steps", "its CPU time bound")
        )
        for record in caplog.records
    ), [record.getMessage() for record in caplog.records]
