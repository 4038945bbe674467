"""Strict validation of every rendered object against the Kubernetes OpenAPI schemas that the
kubernetes-validate wheel ships (unknown fields are errors), for each Kubernetes version asked for."""

from __future__ import annotations

import importlib.resources
import json
import re

import jsonschema
from referencing import Registry, Resource

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
                self.validators[key] = None
            else:
                schema = json.loads(path.read_text())
                registry = Resource.from_contents(schema) @ self.registry
                self.validators[key] = jsonschema.Draft202012Validator(schema, registry=registry)
        return self.validators[key]


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
