"""Dispatch's OpenAPI 3.1 document: valid, every route described, and the pop body's schema
agreeing with the validating model and the spec's chat declaration table (docs/native-api.md
#chat-declaration; docs/native-api.md#pop)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from horde_dispatch.app import create_app
from horde_dispatch.pop_body import TextPopBody
from horde_dispatch.settings import DispatchSettings
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

POP = "/api/v2/generate/text/pop"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    doc: dict[str, Any] = create_app(DispatchSettings()).openapi()
    return doc


def pop_validator(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/PopRequest", "components": doc["components"]}
    )


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    validate(document)
    assert list(OpenAPIV31SpecValidator(document).iter_errors()) == []


def test_every_route_is_described_with_the_horde_envelope(document: dict[str, Any]) -> None:
    assert set(document["paths"]) == {
        POP,
        "/api/v2/workers",
        "/api/v2/workers/name/{worker_name}",
        "/api/v2/workers/{worker_id}",
    }
    text = json.dumps(document)
    assert set(re.findall(r'"#/components/schemas/([^"]+)"', text)) <= set(document["components"]["schemas"])
    assert not any(name.startswith("Body_") for name in document["components"]["schemas"])
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert "422" not in operation["responses"], (method, path)
    post = document["paths"][POP]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PopRequest"
    }
    assert [p["name"] for p in post["parameters"] if p["in"] == "header"] == ["apikey"]
    assert {"200", "400", "401", "403", "503"} <= set(post["responses"])


def test_the_pop_body_is_the_models_fields_and_the_declaration(document: dict[str, Any]) -> None:
    properties = set(document["components"]["schemas"]["PopRequest"]["properties"])
    declaration = {"chat_jobs", "prompt_jobs", "chat_features", "chat_limits", "model_id", "image_transports"}
    assert properties == set(TextPopBody.model_fields) | declaration
    validator = pop_validator(document)
    validator.validate({"name": "w", "models": ["abc"]})
    validator.validate(
        {
            "name": "w",
            "models": ["abc"],
            "threads": 50,
            "amount": 20,
            "chat_jobs": True,
            "model_id": "abc",
            "chat_limits": {"max_context_length": 4096, "max_length": 512, "tools_max_temperature": 0},
            "chat_features": ["tools", "unknown-is-ignored"],
            "image_transports": ["url"],
            "unknown_key": "ignored",
        }
    )
    assert not validator.is_valid({"models": ["abc"]})
    assert not validator.is_valid({"name": "w", "models": ["ab"]})
    assert not validator.is_valid({"name": "w", "models": ["abc"], "threads": 51})
    assert not validator.is_valid({"name": "w", "models": ["abc"], "chat_limits": {"max_length": 5}})
    assert not validator.is_valid({"name": "w", "models": ["abc"], "chat_jobs": "yes"})
