"""A small, deterministic JSON value generator for JSON schemas (the scripted backend's structured replies)."""

from __future__ import annotations

from typing import Any


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return {}
        node = node[part]
    return node if isinstance(node, dict) else {}


def sample_value(schema: Any, root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A value that satisfies common JSON schemas: ``const``/``enum`` first members, every required and
    listed property of objects, ``minItems`` items of arrays, minimums of numbers, ``"scripted"`` strings
    padded to ``minLength``. Local ``$ref`` are followed; ``anyOf``/``oneOf`` take the first branch.
    Not a full solver: patterns, formats and cross-keyword constraints are ignored.
    """
    if not isinstance(schema, dict) or depth > 32:
        return None
    root = root if root is not None else schema
    if "$ref" in schema:
        return sample_value(_resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return sample_value(schema[key][0], root, depth + 1)
    typ = _schema_type(schema)
    if typ == "object":
        props = schema.get("properties") or {}
        return {name: sample_value(sub, root, depth + 1) for name, sub in props.items()}
    if typ == "array":
        count = int(schema.get("minItems", 0))
        items = schema.get("items") or {}
        return [sample_value(items, root, depth + 1) for _ in range(count)]
    return _sample_scalar(schema, typ)


def _schema_type(schema: dict[str, Any]) -> Any:
    """The type to sample: the first non-null one of a list, else inferred from ``properties``/``minLength``."""
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), typ[0] if typ else None)
    if typ is None:
        typ = "object" if "properties" in schema else "string" if "minLength" in schema else None
    return typ


def _sample_scalar(schema: dict[str, Any], typ: Any) -> Any:
    """A value of a type that holds no other schema; ``{}`` for an unknown type."""
    if typ == "string":
        return _sample_string(schema)
    if typ == "integer":
        return _least_number(schema, int)
    if typ == "number":
        return _least_number(schema, float)
    if typ == "boolean":
        return True
    if typ == "null":
        return None
    return {}


def _sample_string(schema: dict[str, Any]) -> str:
    text = "scripted"
    min_len = int(schema.get("minLength", 0))
    if len(text) < min_len:
        text = text + "x" * (min_len - len(text))
    max_len = schema.get("maxLength")
    return text[: int(max_len)] if isinstance(max_len, int) else text


def _least_number(schema: dict[str, Any], kind: type[int] | type[float]) -> int | float:
    """``minimum``, else just above ``exclusiveMinimum``, else zero, as ``kind``."""
    if "minimum" in schema:
        return kind(schema["minimum"])
    return kind(schema["exclusiveMinimum"]) + 1 if "exclusiveMinimum" in schema else kind(0)
