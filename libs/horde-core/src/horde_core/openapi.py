"""OpenAPI 3.1 documents of the native services (admission, dispatch, submit), served at ``/openapi.json``.

The native handlers read their bodies by hand, so FastAPI's generator sees neither the request bodies nor the
answers. A service describes each route in a table of :class:`NativeOperation` (its header parameters, its
JSON body as a component schema, its answers by status) and installs the document with
:func:`install_native_openapi`. FastAPI keeps what it does know (the path and query parameters); its 422 is
removed everywhere, with its schemas, since a native service answers a bad request with 400 in the Horde
envelope (``{"message", "rc"}``, :data:`HORDE_ERROR_SCHEMA`).

Every documented route must be served and every served route documented: :func:`build_native_openapi`
raises ``ValueError`` otherwise, so a route added without its description fails the service's tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

# FastAPI's request validation response and its schemas: a native service answers 400 BadRequest instead.
FASTAPI_VALIDATION_STATUS = "422"
FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")

ERROR_SCHEMA_NAME = "HordeError"
HORDE_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "The Horde error envelope. `rc` is the return code naming the refusal; some refusals add keys, such "
        "as `errors` (the failing field), `param` (the request path) or `expected_seq`."
    ),
    "required": ["message", "rc"],
    "properties": {
        "message": {"type": "string", "description": "What was refused and why."},
        "rc": {"type": "string", "description": "The return code, such as `BadRequest`."},
    },
    "additionalProperties": True,
}

RETRY_AFTER_HEADER: dict[str, Any] = {
    "description": "Seconds to wait before retrying.",
    "schema": {"type": "string"},
}
# Statuses whose refusals may carry Retry-After: rate limits and a store outage.
RETRY_AFTER_STATUSES = frozenset({"429", "503"})

# A store that refuses or drops connections is answered 503 ServiceUnavailable by every route (horde_core.app),
# and a request past the process's in-flight cap 503 ServiceAtCapacity (horde_core.capacity).
STORE_OUTAGE_ERROR = (
    "ServiceUnavailable (a store this service needs is unreachable; retry after Retry-After); "
    "ServiceAtCapacity (the process has too many requests in flight; retry after Retry-After)"
)


def header(name: str, description: str, *, required: bool = False) -> dict[str, Any]:
    """A string header parameter."""
    return {
        "name": name,
        "in": "header",
        "required": required,
        "description": description,
        "schema": {"type": "string"},
    }


APIKEY_HEADER = header(
    "apikey",
    "The API key. Without one the anonymous key 0000000000 applies where a route allows it; an unknown key is "
    "401 InvalidAPIKey.",
)
WORKER_APIKEY_HEADER = header(
    "apikey",
    "The worker owner's API key: an unknown key is 401 InvalidAPIKey, another user's key 403 "
    "WrongCredentials.",
)


@dataclass(frozen=True)
class Answer:
    """A successful answer: its description and the component schema of its JSON body."""

    description: str
    schema: str


@dataclass(frozen=True)
class NativeOperation:
    """One route of a native service as the document describes it.

    ``path`` is the served path under ``/api`` (``/api/v2/...``; the same route also answers at ``/v2/...``).
    ``body``: the component schema of the JSON request body (None for a route without a body).
    ``answers``: the successful answers by status. ``errors``: the refusals by status, each listing its return
    codes; every route also lists 503 for a store outage.
    """

    method: str
    path: str
    summary: str
    description: str
    answers: Mapping[str, Answer]
    errors: Mapping[str, str]
    body: str | None = None
    body_description: str = ""
    headers: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


def _error_responses(errors: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    merged = dict(errors)
    merged["503"] = f"{merged['503']}; {STORE_OUTAGE_ERROR}" if "503" in merged else STORE_OUTAGE_ERROR
    for status in sorted(merged):
        response: dict[str, Any] = {
            "description": f"Return codes: {merged[status]}.",
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{ERROR_SCHEMA_NAME}"}}
            },
        }
        if status in RETRY_AFTER_STATUSES:
            response["headers"] = {"Retry-After": RETRY_AFTER_HEADER}
        out[status] = response
    return out


def _served_operations(doc: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, item in doc.get("paths", {}).items()
        for method, operation in item.items()
        if isinstance(operation, dict)
    }


def build_native_openapi(
    app: FastAPI,
    *,
    description: str,
    operations: Sequence[NativeOperation],
    schemas: Mapping[str, Any],
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a native service: FastAPI's paths and parameters, with each route's
    headers, request body and answers from ``operations`` and the component ``schemas`` (plus
    :data:`HORDE_ERROR_SCHEMA` as ``HordeError``).

    Raises ``ValueError`` when ``operations`` and the served routes differ, or a body or answer names a
    schema not in ``schemas``."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description=description)
    served = _served_operations(doc)
    described = {(op.method, op.path) for op in operations}
    if served != described:
        raise ValueError(
            f"OpenAPI operations differ from the served routes: undocumented {sorted(served - described)}, "
            f"not served {sorted(described - served)}"
        )
    components = doc.setdefault("components", {})
    old_schemas = components.get("schemas", {})
    for name in FASTAPI_VALIDATION_SCHEMAS:
        old_schemas.pop(name, None)
    # FastAPI's own body models (Body_<route>) describe nothing: the tables below replace them.
    kept = {name: schema for name, schema in old_schemas.items() if not name.startswith("Body_")}
    components["schemas"] = {**kept, **schemas, ERROR_SCHEMA_NAME: HORDE_ERROR_SCHEMA}
    for op in operations:
        operation = doc["paths"][op.path][op.method]
        operation["summary"] = op.summary
        operation["description"] = op.description
        names = {h["name"].lower() for h in op.headers}
        parameters = [
            p
            for p in operation.get("parameters", [])
            if not (p.get("in") == "header" and p.get("name", "").lower() in names)
        ]
        parameters.extend(dict(h) for h in op.headers)
        if parameters:
            operation["parameters"] = parameters
        operation.pop("requestBody", None)
        if op.body is not None:
            if op.body not in schemas:
                raise ValueError(f"{op.method} {op.path}: unknown body schema {op.body}")
            operation["requestBody"] = {
                "required": True,
                "description": op.body_description or None,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{op.body}"}}},
            }
            if not op.body_description:
                del operation["requestBody"]["description"]
        responses: dict[str, Any] = {}
        for status, answer in op.answers.items():
            if answer.schema not in schemas:
                raise ValueError(f"{op.method} {op.path}: unknown answer schema {answer.schema}")
            responses[status] = {
                "description": answer.description,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{answer.schema}"}}
                },
            }
        responses.update(_error_responses(op.errors))
        operation["responses"] = responses
    return doc


def install_native_openapi(
    app: FastAPI,
    *,
    description: str,
    operations: Sequence[NativeOperation],
    schemas: Mapping[str, Any],
) -> None:
    """Serve :func:`build_native_openapi`'s document at the app's ``openapi_url`` (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_native_openapi(
                app, description=description, operations=operations, schemas=schemas
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def pydantic_schema(model: Any, *, mode: str = "validation") -> tuple[dict[str, Any], dict[str, Any]]:
    """A pydantic model's JSON schema with references into ``#/components/schemas``: ``(schema, defs)``,
    ``defs`` being the nested definitions to add beside it."""
    schema: dict[str, Any] = model.model_json_schema(mode=mode, ref_template="#/components/schemas/{model}")
    defs: dict[str, Any] = schema.pop("$defs", {})
    return schema, defs


def nullable(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` or null (a native route reads a null optional value as its default)."""
    return {"anyOf": [dict(schema), {"type": "null"}]}
