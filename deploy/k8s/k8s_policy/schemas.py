"""Strict validation of every rendered object against the Kubernetes OpenAPI schemas that the
kubernetes-validate wheel ships (unknown fields are errors), for each Kubernetes version asked for; custom
resources (prometheus-operator's PodMonitor and PrometheusRule) against the CRDs kept in tools/crds, made strict
the same way."""

from __future__ import annotations

import importlib.resources
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource

from .contract import CRD_SCHEMAS
from .model import Target, ident


class Schemas:
    """Strict JSON schemas of one Kubernetes minor version, from the kubernetes-validate wheel."""

    def __init__(self, version: str) -> None:
        root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
        wanted = _minor(version)
        available = sorted(
            (_minor(p.name[1:].split("-", 1)[0]), p.name)
            for p in root.iterdir()
            if p.name.endswith("-local-strict")
        )
        if not available:
            raise SystemExit("kubernetes-validate ships no strict schemas")
        if wanted > available[-1][0]:
            raise SystemExit(
                f"kubernetes-validate has schemas up to {'.'.join(map(str, available[-1][0]))}, not {version}"
            )
        older = [name for minor, name in available if minor <= wanted]
        if not older:
            raise SystemExit(f"kubernetes-validate has no schemas as old as {version}")
        self.version = version
        self.dir = root / older[-1]
        definitions = json.loads((self.dir / "_definitions.json").read_text())
        self.registry: Registry = Resource.from_contents(definitions) @ Registry()
        self.validators: dict[tuple[str, str], jsonschema.protocols.Validator | None] = {}

    def validator(self, kind: str, api_version: str) -> jsonschema.protocols.Validator | None:
        key = (kind, api_version)
        if key not in self.validators:
            # rbac.authorization.k8s.io/v1 -> rbac-v1; v1 -> v1
            api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
            path = self.dir / f"{kind.lower()}-{api}.json"
            if not path.is_file():
                crd = crd_schema(kind, api_version)
                self.validators[key] = None if crd is None else jsonschema.Draft202012Validator(crd)
            else:
                schema = json.loads(path.read_text())
                registry = Resource.from_contents(schema) @ self.registry
                self.validators[key] = jsonschema.Draft202012Validator(schema, registry=registry)
        return self.validators[key]


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as a strict JSON schema: an object with properties admits no others
    (unless it preserves unknown fields), an int-or-string is either."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


@cache
def crd_schema(kind: str, api_version: str, crds: Path = CRD_SCHEMAS) -> dict[str, Any] | None:
    """The strict schema of a custom resource from the CRDs in ``crds`` (None when none defines it)."""
    group, _, version = api_version.rpartition("/")
    for path in sorted(crds.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            spec = (crd or {}).get("spec") or {}
            if spec.get("group") != group or (spec.get("names") or {}).get("kind") != kind:
                continue
            for v in spec.get("versions") or []:
                if v.get("name") == version and v.get("served", True):
                    schema = _strict((v.get("schema") or {}).get("openAPIV3Schema") or {})
                    props = schema.setdefault("properties", {})
                    props["apiVersion"] = {"type": "string", "enum": [api_version]}
                    props["kind"] = {"type": "string", "enum": [kind]}
                    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind"})
                    result: dict[str, Any] = schema
                    return result
    return None


def _minor(version: str) -> tuple[int, int]:
    parts = version.lstrip("v").split(".")
    return int(parts[0]), int(parts[1])


def validate_schemas(target: Target, schemas: list[Schemas]) -> None:
    for obj in target.objects:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if not isinstance(kind, str) or not isinstance(api_version, str):
            target.error(ident(obj), "no kind/apiVersion")
            continue
        for s in schemas:
            validator = s.validator(kind, api_version)
            if validator is None:
                target.error(ident(obj), f"no schema for {api_version} {kind} in Kubernetes {s.version}")
                continue
            for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
                where = ".".join(str(p) for p in err.absolute_path) or "(object)"
                target.error(f"{ident(obj)} [k8s {s.version}]", f"{where}: {err.message[:300]}")
