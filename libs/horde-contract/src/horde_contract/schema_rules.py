"""Structural rules for JSON schemas in tools and response formats.

See docs/native-api.md#tools (nesting depth MAX_CHAT_SCHEMA_NESTING; OpenAI's strict structural rules).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Keywords whose value is one subschema, a map of subschemas, or a list of subschemas.
_SINGLE, _MAP, _LIST = 1, 2, 3
_KEYWORDS = {
    **dict.fromkeys(
        (
            "items",
            "additionalProperties",
            "not",
            "if",
            "then",
            "else",
            "contains",
            "propertyNames",
            "additionalItems",
            "unevaluatedItems",
            "unevaluatedProperties",
        ),
        _SINGLE,
    ),
    **dict.fromkeys(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"), _MAP),
    **dict.fromkeys(("anyOf", "oneOf", "allOf", "prefixItems"), _LIST),
}


def iter_subschemas(schema: dict[str, Any]) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Yield ``(relative path, subschema)`` for each direct subschema of ``schema``, in document order.

    Walks the schema's own keys (usually a handful) rather than probing every keyword.
    """
    for key, value in schema.items():
        kind = _KEYWORDS.get(key)
        if kind is None:
            continue
        if isinstance(value, dict):
            if kind == _MAP:
                for name, sub in value.items():
                    if isinstance(sub, dict):
                        yield (key, name), sub
            elif kind == _SINGLE:
                yield (key,), value
        elif isinstance(value, list) and (kind == _LIST or key == "items"):
            for index, sub in enumerate(value):
                if isinstance(sub, dict):
                    yield (key, index), sub


def schema_nesting_depth(schema: Any, limit: int | None = None) -> int:
    """Levels of subschemas below the root (the root alone is 0); counting stops once past ``limit``.

    A level is one step through a schema keyword (properties, items, $defs, anyOf, ...), so an object
    property of an object property is 2 levels down. Iterative, so a hostile depth cannot overflow the stack.
    """
    if not isinstance(schema, dict):
        return 0
    deepest = 0
    stack: list[tuple[dict[str, Any], int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if limit is not None and deepest > limit:
                return deepest
        for _, sub in iter_subschemas(node):
            stack.append((sub, depth + 1))
    return deepest


def _is_object_schema(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        return True
    return kind is None and "properties" in schema


def strict_schema_violation(schema: Any) -> str | None:
    """The first breach of OpenAI's strict structural rules, as OpenAI words it, or None.

    Every object schema, at the root and in every subschema, sets ``additionalProperties: false`` and lists
    each of its properties in ``required``. The text is ``In context=(...), ...`` with the path as a Python
    tuple, e.g. ``In context=('properties', 'shade'), 'additionalProperties' is required to be supplied and
    to be false.``
    """
    if not isinstance(schema, dict):
        return None
    stack: list[tuple[tuple[str | int, ...], dict[str, Any]]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if _is_object_schema(node):
            if node.get("additionalProperties") is not False:
                return (
                    f"In context={path!r}, 'additionalProperties' is required to be supplied and to be false."
                )
            props = node.get("properties")
            if props is not None and not isinstance(props, dict):
                # Not a schema at all: every worker would fail the job until the request faults.
                return f"In context={path!r}, 'properties' is required to be an object."
            names = list(props) if isinstance(props, dict) else []
            required = node.get("required")
            required_set = (
                {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
            )
            missing = [name for name in names if name not in required_set]
            if missing:
                return (
                    f"In context={path!r}, 'required' is required to be supplied and to be an array including "
                    f"every key in properties. Missing '{missing[0]}'."
                )
        # Reverse so the first subschema in keyword order is checked first.
        children = list(iter_subschemas(node))
        for rel, sub in reversed(children):
            stack.append((path + rel, sub))
    return None
