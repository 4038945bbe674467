"""The front's OpenAPI 3.1 document (docs/openai-front.md#routes,
#routes), as the running front serves it, checked with a real OpenAPI validator."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from horde_contract import ChatHordeOptions
from horde_oai.openapi import plain_description
from horde_oai.responses import ChatCompletionResponse, ModelCard, OpenAIErrorEnvelope
from horde_oai.schema import (
    KEY_DROPPING_MODELS,
    ChatCompletionRequest,
    ChatMessage,
    JsonSchemaFormat,
    ResponseFormat,
    StreamOptions,
)
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from pydantic import BaseModel


@pytest.fixture(scope="module")
def document(lone_front) -> dict[str, Any]:
    response = httpx.get(f"{lone_front.url}/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    doc: dict[str, Any] = response.json()
    return doc


def test_the_document_is_valid_openapi_3_1(document):
    assert document["openapi"].startswith("3.1.")
    validate(document)  # raises on any error, a dangling $ref included
    assert list(OpenAPIV31SpecValidator(document).iter_errors()) == []


def test_every_reference_resolves_and_fastapis_422_is_gone(document):
    text = json.dumps(document)
    schemas = document["components"]["schemas"]
    referenced = set(re.findall(r'"#/components/schemas/([^"]+)"', text))
    assert referenced and referenced <= set(schemas)
    assert not {"HTTPValidationError", "ValidationError"} & set(schemas)
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert "422" not in operation["responses"], (path, method)


def test_the_routes_and_their_responses(document):
    assert set(document["paths"]) == {"/v1/chat/completions", "/v1/models", "/v1/models/{model_id}"}
    retrieve = document["paths"]["/v1/models/{model_id}"]["get"]
    assert set(retrieve["responses"]) == {"200", "404", "500", "502"}
    assert retrieve["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ModelCard"
    }
    assert "model_not_found" in retrieve["responses"]["404"]["description"]
    (parameter,) = retrieve["parameters"]
    assert (parameter["name"], parameter["in"], parameter["required"]) == ("model_id", "path", True)
    completions = document["paths"]["/v1/chat/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert set(completions["responses"]) == {
        "200",
        "400",
        "401",
        "404",
        "408",
        "409",
        "413",
        "429",
        "500",
        "502",
        "503",
    }
    assert "UnknownChatModel" in completions["responses"]["404"]["description"]
    assert "model_not_found" not in completions["responses"]["404"]["description"]
    listing = document["paths"]["/v1/models"]["get"]
    assert set(listing["responses"]) == {"200", "500", "502"}


def test_error_responses_document_the_retry_headers(document):
    envelope = {"$ref": "#/components/schemas/OpenAIErrorEnvelope"}
    for path, item in document["paths"].items():
        for operation in item.values():
            for status, response in operation["responses"].items():
                if status.startswith("2"):
                    assert "headers" not in response
                    continue
                assert response["content"]["application/json"]["schema"] == envelope, (path, status)
                headers = response["headers"]
                assert headers["x-should-retry"]["schema"] == {"type": "string", "enum": ["true", "false"]}
                if status in ("429", "502", "503"):
                    assert headers["Retry-After"]["schema"] == {"type": "integer", "minimum": 0}
                else:
                    assert "Retry-After" not in headers, (path, status)


def _documented_fields(model: type[BaseModel], seen: set[str]) -> list[tuple[str, str, str]]:
    """``(model, property name, docstring)`` for every field of ``model`` and the models it nests."""
    out: list[tuple[str, str, str]] = []
    if model.__name__ in seen:
        return out
    seen.add(model.__name__)
    for name, info in model.model_fields.items():
        out.append((model.__name__, info.alias or name, info.description or ""))
        for arg in _model_args(info.annotation):
            out += _documented_fields(arg, seen)
    return out


def _model_args(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _model_args(arg)]


@pytest.mark.parametrize(
    "root", [ChatCompletionRequest, ChatCompletionResponse, ModelCard, OpenAIErrorEnvelope]
)
def test_each_field_description_is_its_docstring(document, root):
    schemas = document["components"]["schemas"]
    fields = _documented_fields(root, set())
    assert fields
    for model, name, docstring in fields:
        assert docstring, f"{model}.{name} has no docstring"
        described = schemas[model]["properties"][name]["description"]
        assert described == plain_description(docstring), (model, name)
        assert "][" not in described and "(see " not in described, (model, name)


def test_the_docstrings_are_the_source():
    # Descriptions come from the field docstrings (use_attribute_docstrings), not from Field(description=...).
    for model in (
        ChatCompletionRequest,
        ChatMessage,
        StreamOptions,
        ResponseFormat,
        JsonSchemaFormat,
        ChatHordeOptions,
    ):
        assert model.model_config.get("use_attribute_docstrings") is True, model
    assert StreamOptions.model_fields["include_usage"].description == (
        "Send one last chunk with `choices: []` and the request's usage before `data: [DONE]`."
    )
    assert ChatHordeOptions.model_fields["dry_run"].description == "Return the kudos cost without queueing."


def test_cross_references_render_as_the_spec_says(document):
    assert plain_description("Options (see [`StreamOptions`][horde_oai.schema.StreamOptions]).") == "Options."
    assert plain_description("Validated by [`parse`][horde_contract.request.parse_horde_options] first.") == (
        "Validated by `parse` first."
    )
    assert (
        plain_description("One line\nand the next.\n\nA paragraph.")
        == "One line and the next.\n\nA paragraph."
    )
    request = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert request["horde"]["description"].startswith(
        "AI Horde options OpenAI has no key for, validated with the native route's rules. `horde.operation_key`"
    )
    assert request["stream_options"]["description"] == "Options of a streamed response."
    json_schema = document["components"]["schemas"]["ResponseFormat"]["properties"]["json_schema"]
    assert json_schema["description"] == "With type `json_schema`: the schema."


def test_the_adjustments_of_the_generated_schemas(document):
    schemas = document["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]
    # The no-op keys that are not request fields, accepted only at their default.
    assert request["properties"]["logprobs"]["enum"] == [False, None]
    assert request["properties"]["n"]["description"] == "Only 1: the AI Horde returns one choice."
    # Objects whose unknown keys are dropped allow other keys; the top level and the strict objects do not.
    for name in KEY_DROPPING_MODELS:
        if name in ("ChatMessage", "ToolDefinition", "ToolChoiceFunction"):
            assert schemas[name]["additionalProperties"] is True, name
    for name in (
        "ChatCompletionRequest",
        "StreamOptions",
        "ResponseFormat",
        "JsonSchemaFormat",
        "ChatHordeOptions",
    ):
        assert schemas[name]["additionalProperties"] is False, name
    # A response model that shares a name with a key-dropping request object is left as it is.
    assert "additionalProperties" not in schemas["ToolCall"]
    # json_schema's key is "schema" (the Python name schema_ is not a key).
    assert "schema" in schemas["JsonSchemaFormat"]["properties"]
    assert "schema_" not in schemas["JsonSchemaFormat"]["properties"]
    assert "schema" in schemas["JsonSchemaFormat"]["required"]
    # Every choice carries native_finish_reason, null when the worker gave none; content may be null.
    choice = schemas["Choice"]
    assert "native_finish_reason" in choice["required"]
    assert {"type": "null"} in choice["properties"]["native_finish_reason"]["anyOf"]
    assert {"type": "null"} in schemas["AssistantMessage"]["properties"]["content"]["anyOf"]
