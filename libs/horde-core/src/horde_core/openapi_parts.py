"""Pieces several native services' OpenAPI documents share (:mod:`horde_core.openapi` builds the documents).

JSON schema builders for the component tables (a reference, an object, a nullable value's string, a tool
call) and the shape of a worker's POST route (dispatch's pop, submit's submit and progress): the worker
owner's ``apikey`` header, a JSON body and one 200 answer. The builders keep the key order the documents
are served with: ``type``, ``description``, ``properties``, ``required``, ``additionalProperties``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from horde_core.openapi import WORKER_APIKEY_HEADER, Answer, NativeOperation

#: A string value.
STRING: Mapping[str, Any] = {"type": "string"}


def ref(name: str) -> dict[str, Any]:
    """A reference to the component schema ``name``."""
    return {"$ref": f"#/components/schemas/{name}"}


def json_object(
    properties: Mapping[str, Any],
    required: Sequence[str] | None = None,
    *,
    additional: bool = True,
    description: str | None = None,
) -> dict[str, Any]:
    """An object schema: its ``properties``, the ``required`` keys (none when None) and whether keys beyond
    the properties are allowed (``additional``; a native route ignores unknown keys unless it refuses them)."""
    schema: dict[str, Any] = {"type": "object"}
    if description is not None:
        schema["description"] = description
    schema["properties"] = dict(properties)
    if required is not None:
        schema["required"] = list(required)
    schema["additionalProperties"] = additional
    return schema


def tool_call(call_id: Mapping[str, Any]) -> dict[str, Any]:
    """A function tool call ``{id, type: "function", function: {name, arguments}}``, as an assistant message
    carries it in a chat request and a chat reply: ``call_id`` is the schema of its ``id``."""
    function = json_object({"name": STRING, "arguments": STRING}, ["name", "arguments"], additional=False)
    return json_object(
        {"id": call_id, "type": {"type": "string", "enum": ["function"]}, "function": function},
        ["id", "type", "function"],
        additional=False,
    )


def worker_post(
    path: str,
    summary: str,
    description: str,
    *,
    body: str,
    answer: Answer,
    errors: Mapping[str, str],
) -> NativeOperation:
    """A worker's POST route: the ``body`` component schema, the worker owner's ``apikey`` header (an unknown
    key is 401 InvalidAPIKey, another user's 403 WrongCredentials) and ``answer`` as its 200."""
    return NativeOperation(
        method="post",
        path=path,
        summary=summary,
        description=description,
        body=body,
        headers=(WORKER_APIKEY_HEADER,),
        answers={"200": answer},
        errors=errors,
    )
