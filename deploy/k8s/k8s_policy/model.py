"""The checked render (Target) and the helpers every rule uses to read objects: pod templates, containers,
quantities, label selectors, workloads and the env settings they receive."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import BINARY_SUFFIX, DECIMAL_SUFFIX, QUANTITY, WORKLOAD_KINDS


@dataclass
class Target:
    """One kustomization to render: base or an overlay."""

    name: str
    path: Path
    deployable: bool
    external: list[dict[str, Any]] = field(default_factory=list)
    #: The overlay's cluster-network.yaml (clusterCIDRs, trustedProxyCIDRs); empty for the base.
    network: dict[str, Any] = field(default_factory=dict)
    objects: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def error(self, where: str, message: str) -> None:
        self.errors.append(f"{where}: {message}" if where else message)


def ident(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('name', '?')}"


def pod_template(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    if obj.get("kind") in WORKLOAD_KINDS:
        return spec.get("template") or {}
    return None


def containers(pod: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            yield key, c


def quantity(value: Any) -> float | None:
    """A Kubernetes quantity as a number, or None when it is not one."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not QUANTITY.match(value):
        return None
    m = re.match(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(.*)$", value)
    assert m is not None
    number, suffix = float(m.group(1)), m.group(2)
    if suffix in BINARY_SUFFIX:
        return number * BINARY_SUFFIX[suffix]
    if suffix in DECIMAL_SUFFIX:
        return number * DECIMAL_SUFFIX[suffix]
    return float(number * 10 ** int(suffix[1:]))  # e.g. 1e3


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions or a plain map) matches ``labels``."""
    if not selector:
        return False
    match = (
        selector.get("matchLabels")
        if "matchLabels" in selector or "matchExpressions" in selector
        else selector
    )
    for k, v in (match or {}).items():
        if labels.get(k) != v:
            return False
    expressions = (selector.get("matchExpressions") or []) if "matchExpressions" in selector else []
    for expr in expressions:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def container_port(pod: dict[str, Any], port: Any) -> bool:
    """Whether ``port`` (a number or a port name) is a container port of ``pod``."""
    for _, c in containers(pod):
        for p in c.get("ports") or []:
            if port == p.get("containerPort") or port == p.get("name"):
                return True
    return False


def np_selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A NetworkPolicy label selector: empty (``{}``) selects every pod, unlike a Service's."""
    if not selector:
        return True
    return selects(selector, labels)


@dataclass
class Workload:
    """A Deployment (or the Job): its name, pod labels and container ports (name -> number)."""

    name: str
    obj: dict[str, Any]
    labels: dict[str, str]
    ports: dict[str, int]


def workloads(target: Target, kinds: set[str] | None = None) -> list[Workload]:
    found = []
    for obj in target.objects:
        if obj.get("kind") not in (kinds or {"Deployment"}):
            continue
        pod = pod_template(obj) or {}
        ports = {
            str(p.get("name", p.get("containerPort"))): int(p["containerPort"])
            for _, c in containers(pod)
            for p in c.get("ports") or []
            if "containerPort" in p
        }
        labels = (pod.get("metadata") or {}).get("labels") or {}
        found.append(Workload((obj.get("metadata") or {}).get("name", ""), obj, labels, ports))
    return found


def env_sources(target: Target, w: Workload) -> dict[str, tuple[str, Any]]:
    """Each env setting of the workload's containers: ``("value", v)``, ``("configmap", v)`` (from an envFrom
    ConfigMap or a configMapKeyRef) or ``("secret", (name, key))``."""
    maps = {
        (o.get("metadata") or {}).get("name"): o.get("data") or {}
        for o in target.objects
        if o.get("kind") == "ConfigMap"
    }
    found: dict[str, tuple[str, Any]] = {}
    for _, c in containers(pod_template(w.obj) or {}):
        for src in c.get("envFrom") or []:
            ref = src.get("configMapRef")
            if ref is not None:
                for k, v in (maps.get(ref.get("name")) or {}).items():
                    found[(src.get("prefix") or "") + k] = ("configmap", v)
            if src.get("secretRef") is not None:
                found[f"*{src['secretRef'].get('name')}"] = ("secret", (src["secretRef"].get("name"), "*"))
        for env in c.get("env") or []:
            vf = env.get("valueFrom") or {}
            if "value" in env:
                found[env["name"]] = ("value", env["value"])
            elif "secretKeyRef" in vf:
                ref = vf["secretKeyRef"]
                found[env["name"]] = ("secret", (ref.get("name"), ref.get("key")))
            elif "configMapKeyRef" in vf:
                ref = vf["configMapKeyRef"]
                found[env["name"]] = ("configmap", (maps.get(ref.get("name")) or {}).get(ref.get("key")))
    return found


def name_of(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))
