"""Admission's OpenAPI 3.1 document: valid, every route described, and the chat and text
bodies' schemas agreeing with the spec's tables (docs/native-api.md#request-body, #tools,
#refused-keys-and-values; docs/native-api.md#text-route)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import jsonschema
import pytest
from horde_admission.app import create_app
from horde_admission.settings import AdmissionSettings
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

CHAT = "/api/v2/generate/chat/async"
TEXT = "/api/v2/generate/text/async"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    doc: dict[str, Any] = create_app(AdmissionSettings()).openapi()
    return doc


def body_validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": doc["components"]},
        format_checker=jsonschema.FormatChecker(),
    )


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    validate(document)
    assert list(OpenAPIV31SpecValidator(document).iter_errors()) == []


def test_every_route_is_described_with_the_horde_envelope(document: dict[str, Any]) -> None:
    assert set(document["paths"]) == {
        CHAT,
        TEXT,
        "/api/v2/generate/chat/status/{request_id}",
        "/api/v2/generate/text/status/{request_id}",
        "/api/v2/status/models",
        "/api/v2/status/models/{model_name}",
        "/api/v2/find_user",
        "/api/v2/users/{user_id}",
        "/api/v2/status/heartbeat",
        "/api/v2/status/performance",
        "/api/v2/status/modes",
        "/api/v2/status/news",
        "/api/v2/stats/text/models",
        "/api/v2/stats/text/totals",
    }
    text = json.dumps(document)
    assert set(re.findall(r'"#/components/schemas/([^"]+)"', text)) <= set(document["components"]["schemas"])
    assert not {"HTTPValidationError", "ValidationError"} & set(document["components"]["schemas"])
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)
            assert "503" in responses, (method, path)
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/HordeError"}, (method, path, status)
    envelope = document["components"]["schemas"]["HordeError"]
    assert envelope["required"] == ["message", "rc"]


@pytest.mark.parametrize("path", [CHAT, TEXT])
def test_the_generate_routes_take_a_json_body_and_the_apikey_header(
    document: dict[str, Any], path: str
) -> None:
    post = document["paths"][path]["post"]
    assert post["requestBody"]["required"] is True
    assert set(post["requestBody"]["content"]) == {"application/json"}
    headers = {p["name"] for p in post["parameters"] if p["in"] == "header"}
    assert {"apikey", "Client-Agent", "Proxy-Authorization", "Proxied-For"} == headers
    assert {"200", "202", "400", "401", "403", "404", "408", "413", "429", "503"} <= set(post["responses"])


VALID_CHAT = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    {
        "models": ["a", "b"],
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be brief"}], "name": "d"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
                    },
                ],
            },
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
        "max_tokens": 16,
        "max_completion_tokens": 16,
        "temperature": 5,
        "top_p": 1,
        "frequency_penalty": -2,
        "presence_penalty": 2,
        "seed": 7,
        "reasoning_effort": "xhigh",
        "stop": "\n",
        "n": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u",
        "metadata": {},
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": False}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {}, "strict": True},
        },
        "horde": {
            "only": ["w"],
            "trusted_workers": True,
            "slow_workers": None,
            "max_context_length": 4096,
            "context_fit": "reject",
            "conformance": "best_effort",
            "availability_mode": "fail_fast",
            "max_kudos": 10,
            "dry_run": True,
            "operation_key": str(uuid.uuid4()),
        },
    },
]
INVALID_CHAT = [
    {"messages": [{"role": "user", "content": "hi"}]},  # neither model nor models
    {"model": "m", "models": ["m"], "messages": [{"role": "user", "content": "hi"}]},  # both
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "function", "content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": []}]},
    {
        "model": "m",
        "messages": [
            {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}
        ],
    },
    {"model": "m", "messages": [{"role": "tool", "content": "x"}]},  # no tool_call_id
    {"model": "m", "messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 15},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16385},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "max"},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "horde": {"models": ["x"]}},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "horde": {"only": []}},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "horde": {"context_fit": "ignore"}},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "horde": {"max_kudos": 0}},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "horde": {"operation_key": "nope"}},
    {"models": ["a", "b", "c", "d", "e", "f"], "messages": [{"role": "user", "content": "hi"}]},
    {"models": ["a", "a"], "messages": [{"role": "user", "content": "hi"}]},
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "bad name"}}],
    },
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
    },
]


@pytest.mark.parametrize("body", VALID_CHAT)
def test_valid_chat_bodies_match_the_schema(document: dict[str, Any], body: dict[str, Any]) -> None:
    body_validator(document, "ChatAsyncRequest").validate(body)


@pytest.mark.parametrize("body", INVALID_CHAT)
def test_refused_chat_bodies_do_not_match_the_schema(document: dict[str, Any], body: dict[str, Any]) -> None:
    assert not body_validator(document, "ChatAsyncRequest").is_valid(body)


def test_the_text_body_follows_the_text_params_model(document: dict[str, Any]) -> None:
    validator = body_validator(document, "TextAsyncRequest")
    validator.validate(
        {"prompt": "p", "params": {"max_length": 16384, "n": 20, "custom": 1}, "models": ["m"]}
    )
    validator.validate({"prompt": "", "webhook": "https://x", "workers": ["w"], "dry_run": None})
    assert not validator.is_valid({"params": {}})
    assert not validator.is_valid({"prompt": "p", "params": {"max_length": 16385}})
    assert not validator.is_valid({"prompt": "p", "params": {"temperature": "1"}})
    assert not validator.is_valid({"prompt": "p", "trusted_workers": "yes"})
