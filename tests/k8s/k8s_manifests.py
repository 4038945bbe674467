"""Manifests for the k8s policy rules' tests, built from deploy/k8s/base: a clean set, which each test breaks
in one place. The rules need only PyYAML and the standard library, so they run in the
workspace's test environment; rendering and the schemas stay with ``make k8s-check``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"

from k8s_policy.model import Target  # noqa: E402  (conftest puts deploy/k8s on the path)

Objects = list[dict[str, Any]]


def _base_objects() -> Objects:
    """deploy/k8s/base as kustomize would render it, less the generated names: every resource file, the
    horde-config ConfigMap from config.env, the namespace an overlay sets."""
    objects: Objects = []
    for path in sorted(K8S.glob("base/**/*.yaml")):
        if path.name != "kustomization.yaml":
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    data = {}
    for line in (K8S / "base" / "config.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            data[key.strip()] = value.strip()
    objects.append(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "horde-config"}, "data": data}
    )
    for obj in objects:
        obj.setdefault("metadata", {})["namespace"] = "horde"
    return objects


BASE = _base_objects()
NETWORK = {"clusterCIDRs": ["10.244.0.0/16", "10.96.0.0/12"], "trustedProxyCIDRs": ["10.244.0.0/16"]}


def find(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o.get("kind") == kind and o["metadata"].get("name") == name)


def run(rule: Callable[[Target], None], objects: Objects, **kwargs: Any) -> list[str]:
    """The problems ``rule`` finds in ``objects`` (a render named "test", not deployable unless asked)."""
    target = Target("test", K8S / "base", deployable=kwargs.pop("deployable", False), **kwargs)
    target.objects = objects
    rule(target)
    errors: list[str] = target.errors
    return errors


def deploy(objects: Objects) -> Objects:
    """The base as an overlay deploys it: tagged images, the store Secret, the trusted proxies set."""
    import base64

    from k8s_policy.contract import STORE_SECRET, STORE_SECRET_KEYS

    values = {k: "x" for k in STORE_SECRET_KEYS}
    values["HORDE_PROXY_PASSKEYS"] = '["pass"]'
    values["HORDE_OAI_PROXY_PASSKEY"] = "pass"
    data = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": STORE_SECRET, "namespace": "horde"},
            "data": data,
        }
    )
    find(objects, "ConfigMap", "horde-config")["data"]["HORDE_FORWARDED_ALLOW_IPS"] = "10.244.0.0/16"
    for obj in objects:
        for c in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            c["image"] = f"{c['image']}:1.0.0"
    return objects
