"""Rules on references between objects: ConfigMaps, Secrets, service accounts, HPA targets, Ingress
backends resolve inside the render or to the overlay's external-resources.yaml; the Ingress routes each
contract path to its Service; every component is rendered by some overlay."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .contract import EXPECTED_ROUTES, HERE, STORE_SECRET, STORE_SECRET_KEYS
from .model import Target, containers, ident, pod_template


@dataclass
class _Resolver:
    """Resolves references of a render: to its objects (by kind, then name) or to its external resources."""

    target: Target
    by_kind: dict[str, dict[str, dict[str, Any]]]
    external: dict[tuple[Any, Any], dict[str, Any]]

    @classmethod
    def of(cls, target: Target) -> _Resolver:
        by_kind: dict[str, dict[str, dict[str, Any]]] = {}
        for obj in target.objects:
            by_kind.setdefault(obj.get("kind", ""), {})[(obj.get("metadata") or {}).get("name", "")] = obj
        external = {(e.get("kind"), e.get("name")): e for e in target.external}
        return cls(target, by_kind, external)

    def need(self, where: str, kind: str, name: str | None, keys: list[str] | None = None) -> None:
        """``kind`` ``name`` is rendered (with ``keys`` in its data) or listed as external (with those keys)."""
        if not name:
            self.target.error(where, f"references a {kind} without a name")
            return
        if name in self.by_kind.get(kind, {}):
            data = self.by_kind[kind][name].get("data") or {}
            data = {**data, **(self.by_kind[kind][name].get("stringData") or {})}
            for k in keys or []:
                if k not in data:
                    self.target.error(where, f"{kind} {name} has no key {k}")
            return
        if (kind, name) in self.external:
            ext = self.external[(kind, name)]
            listed = {*(ext.get("requiredKeys") or []), *(ext.get("optionalKeys") or [])}
            if listed:
                for k in keys or []:
                    if k not in listed:
                        self.target.error(where, f"{kind} {name} (external) lists no key {k}")
            return
        self.target.error(
            where,
            f"references {kind} {name!r}, which is neither rendered nor listed in external-resources.yaml",
        )


def _check_store_secret(refs: _Resolver) -> None:
    """The store Secret has its keys, whether rendered or external."""
    target = refs.target
    secrets = refs.by_kind.get("Secret", {})
    stores = [n for n in secrets if re.fullmatch(rf"{STORE_SECRET}(-[a-z0-9]{{10}})?", n)]
    for n in stores:
        data = secrets[n].get("data") or {}
        for k in STORE_SECRET_KEYS:
            if k not in data:
                target.error(f"Secret/{n}", f"missing {k}")
    if (ext := refs.external.get(("Secret", STORE_SECRET))) is not None:
        missing = set(STORE_SECRET_KEYS) - set(ext.get("requiredKeys") or [])
        if missing:
            target.error("external-resources.yaml", f"{STORE_SECRET} must list {sorted(missing)}")


def _check_env_references(refs: _Resolver, where: str, c: dict[str, Any]) -> None:
    for src in c.get("envFrom") or []:
        for ref_kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = src.get(key)
            if ref is not None and not ref.get("optional"):
                refs.need(where, ref_kind, ref.get("name"))
    for env in c.get("env") or []:
        vf = env.get("valueFrom") or {}
        for ref_kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
            ref = vf.get(key)
            if ref is not None and not ref.get("optional"):
                refs.need(where, ref_kind, ref.get("name"), [ref.get("key")])


def _check_pod_references(refs: _Resolver, where: str, pod: dict[str, Any]) -> None:
    spec = pod.get("spec") or {}
    sa = spec.get("serviceAccountName")
    if sa and sa != "default":
        refs.need(where, "ServiceAccount", sa)
    for v in spec.get("volumes") or []:
        if "configMap" in v and not v["configMap"].get("optional"):
            refs.need(where, "ConfigMap", v["configMap"].get("name"))
        if "secret" in v and not v["secret"].get("optional"):
            refs.need(where, "Secret", v["secret"].get("secretName"))
    for _, c in containers(pod):
        _check_env_references(refs, where, c)


def _check_hpa(refs: _Resolver, where: str, spec: dict[str, Any]) -> None:
    """The HPA's target is rendered, its range holds the target's replicas, CPU scaling has CPU requests."""
    target = refs.target
    ref = spec.get("scaleTargetRef") or {}
    scaled = refs.by_kind.get(ref.get("kind", ""), {}).get(ref.get("name", ""))
    if scaled is None:
        target.error(where, f"scales {ref.get('kind')}/{ref.get('name')}, which is not rendered")
        return
    lo, hi = spec.get("minReplicas", 1), spec.get("maxReplicas", 0)
    if lo > hi:
        target.error(where, f"minReplicas {lo} > maxReplicas {hi}")
    replicas = (scaled.get("spec") or {}).get("replicas", 1)
    if not lo <= replicas <= hi:
        target.error(where, f"{ident(scaled)} starts with {replicas} replicas, outside {lo}..{hi}")
    uses_cpu = any((m.get("resource") or {}).get("name") == "cpu" for m in spec.get("metrics") or [])
    tpl = pod_template(scaled) or {}
    for _, c in containers(tpl):
        if uses_cpu and "cpu" not in ((c.get("resources") or {}).get("requests") or {}):
            target.error(where, f"CPU scaling needs a CPU request on {c.get('name')}")


def _has_port(ports: list[dict[str, Any]], port: dict[str, Any]) -> bool:
    """Whether a backend's port (by name, else by number) is one of the Service's ``ports``."""
    return any(
        port.get("name") == sp.get("name") if "name" in port else port.get("number") == sp.get("port")
        for sp in ports
    )


def _check_ingress(refs: _Resolver, where: str, spec: dict[str, Any]) -> None:
    """Every backend is a rendered Service port; every TLS Secret resolves."""
    target = refs.target
    for rule in spec.get("rules") or []:
        for p in (rule.get("http") or {}).get("paths") or []:
            backend = (p.get("backend") or {}).get("service") or {}
            svc = refs.by_kind.get("Service", {}).get(backend.get("name", ""))
            if svc is None:
                target.error(where, f"path {p.get('path')}: no Service {backend.get('name')!r}")
                continue
            port = backend.get("port") or {}
            if not _has_port((svc.get("spec") or {}).get("ports") or [], port):
                target.error(where, f"path {p.get('path')}: Service {backend.get('name')} has no port {port}")
    for tls in spec.get("tls") or []:
        refs.need(where, "Secret", tls.get("secretName"))


def check_references(target: Target) -> None:
    refs = _Resolver.of(target)
    if target.deployable:
        _check_store_secret(refs)
    for obj in target.objects:
        where = ident(obj)
        pod = pod_template(obj)
        if pod is not None:
            _check_pod_references(refs, where, pod)
        kind = obj.get("kind")
        spec = obj.get("spec") or {}
        if kind == "HorizontalPodAutoscaler":
            _check_hpa(refs, where, spec)
        if kind == "Ingress":
            _check_ingress(refs, where, spec)


def check_routes(target: Target) -> None:
    """The Ingress sends each contract path to its Service (longest Prefix/Exact match, as the spec says)."""
    ingresses = [o for o in target.objects if o.get("kind") == "Ingress"]
    if not ingresses:
        target.error("Ingress", "none rendered")
        return
    paths = [
        (p.get("path", ""), p.get("pathType"), ((p.get("backend") or {}).get("service") or {}).get("name"))
        for ing in ingresses
        for rule in (ing.get("spec") or {}).get("rules") or []
        for p in (rule.get("http") or {}).get("paths") or []
    ]
    for request, expected in EXPECTED_ROUTES.items():
        best: tuple[int, str | None] = (-1, None)
        for path, ptype, service in paths:
            if ptype == "Exact":
                hit = request == path
            elif ptype == "Prefix":
                hit = path == "/" or request == path.rstrip("/") or request.startswith(path.rstrip("/") + "/")
            else:
                target.error("Ingress", f"path {path}: use pathType Prefix or Exact, not {ptype}")
                continue
            score = len(path) + (1 if ptype == "Exact" else 0)
            if hit and score > best[0]:
                best = (score, service)
        if best[1] != expected:
            target.error("Ingress", f"{request} goes to {best[1] or 'nothing'}, expected {expected}")


def check_components(targets: list[Target]) -> list[str]:
    used: set[Path] = set()
    for t in targets:
        kust = yaml.safe_load((t.path / "kustomization.yaml").read_text()) or {}
        for comp in kust.get("components") or []:
            used.add((t.path / comp).resolve())
    problems = []
    for comp in sorted((HERE / "components").glob("*/kustomization.yaml")):
        if comp.parent.resolve() not in used:
            problems.append(f"component {comp.parent.name} is used by no overlay, so nothing renders it")
    return problems
