"""Submit's OpenAPI 3.1 document: valid, both routes described, and the submit and progress
bodies' schemas agreeing with the spec's tables (docs/native-api.md#submit,
#progress; docs/native-api.md#submit)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from horde_submit.app import create_app
from horde_submit.settings import SubmitSettings
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

SUBMIT = "/api/v2/generate/text/submit"
PROGRESS = "/api/v2/generate/text/progress"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    doc: dict[str, Any] = create_app(SubmitSettings()).openapi()
    return doc


def validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    )


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    validate(document)
    assert list(OpenAPIV31SpecValidator(document).iter_errors()) == []


def test_both_routes_are_described_with_the_horde_envelope(document: dict[str, Any]) -> None:
    assert set(document["paths"]) == {SUBMIT, PROGRESS}
    text = json.dumps(document)
    assert set(re.findall(r'"#/components/schemas/([^"]+)"', text)) <= set(document["components"]["schemas"])
    for path, body in ((SUBMIT, "SubmitRequest"), (PROGRESS, "ProgressRequest")):
        post = document["paths"][path]["post"]
        assert "422" not in post["responses"]
        assert post["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{body}"
        }
        assert [p["name"] for p in post["parameters"] if p["in"] == "header"] == ["apikey"]
    progress = document["paths"][PROGRESS]["post"]["responses"]
    assert {"200", "400", "403", "404", "409", "413", "503"} <= set(progress)
    assert "ChatProgressOutOfSequence" in progress["409"]["description"]


def test_the_submit_body_is_a_text_chat_or_fault_submit(document: dict[str, Any]) -> None:
    submit = validator(document, "SubmitRequest")
    submit.validate({"id": "g", "generation": "text", "state": "censored", "seed": 3, "gen_metadata": [{}]})
    submit.validate(
        {
            "id": "g",
            "model_id": "m",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                "reasoning_content": "r",
            },
            "finish_reason": "tool_calls",
            "native_finish_reason": "x" * 32,
            "prompt_tokens": 0,
            "completion_tokens": 10_000_000,
        }
    )
    submit.validate({"id": "g", "state": "faulted", "model_id": "m", "fault_reason": "prompt_overflow"})
    assert not submit.is_valid({"id": "g"})
    assert not submit.is_valid({"id": "", "generation": "x"})
    assert not validator(document, "ChatSubmit").is_valid(
        {"id": "g", "model_id": "m", "message": {"role": "user", "content": "x"}, "finish_reason": "stop"}
    )
    assert not validator(document, "ChatSubmit").is_valid(
        {
            "id": "g",
            "model_id": "m",
            "message": {"role": "assistant", "content": "x"},
            "finish_reason": "done",
        }
    )
    assert not validator(document, "ChatSubmit").is_valid(
        {
            "id": "g",
            "model_id": "m",
            "message": {"role": "assistant", "content": "x"},
            "finish_reason": "stop",
            "native_finish_reason": "x" * 33,
        }
    )


def test_the_progress_body(document: dict[str, Any]) -> None:
    progress = validator(document, "ProgressRequest")
    progress.validate({"id": "g", "seq": 1, "delta": {"content": "a"}})
    progress.validate({"id": "g", "seq": 2, "delta": {"content": "", "reasoning_content": "r"}})
    assert not progress.is_valid({"id": "g", "seq": 0, "delta": {"content": "a"}})
    assert not progress.is_valid({"id": "g", "seq": 1})
    assert not progress.is_valid({"id": "g", "seq": 1, "delta": {"content": 5}})
