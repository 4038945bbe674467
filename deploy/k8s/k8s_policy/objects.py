"""Rules on single objects the schemas cannot see but the API server or a rollout rejects or breaks on: names,
labels and port names, one namespace, pod security and resources, probes, selectors, endpoint settings."""

from __future__ import annotations

from typing import Any

from .contract import (
    CLUSTER_SCOPED,
    DNS1035_LABEL,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENDPOINT,
    LABEL_NAME,
    LABEL_VALUE,
    PORT_NAME,
    PORT_SETTINGS,
    WORKLOAD_KINDS,
)
from .model import Target, container_port, containers, ident, pod_template, quantity, selects


def _check_name(target: Target, obj: dict[str, Any], kind: str, name: str) -> None:
    if kind in {"Service", "Namespace"}:
        if not DNS1035_LABEL.match(name) or len(name) > 63:
            target.error(ident(obj), f"name {name!r} is not a DNS-1035 label")
    elif not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        target.error(ident(obj), f"name {name!r} is not a DNS-1123 subdomain")


def _check_labels(target: Target, obj: dict[str, Any], labels: dict[str, Any]) -> None:
    for k, v in labels.items():
        kname = k.rsplit("/", 1)[-1]
        if len(kname) > 63 or not LABEL_NAME.match(kname):
            target.error(ident(obj), f"label key {k!r} is invalid")
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            target.error(ident(obj), f"label {k}={v!r}: invalid value")


def _check_port_names(target: Target, obj: dict[str, Any], ports: list[dict[str, Any]]) -> None:
    for p in ports:
        if "name" in p and (len(p["name"]) > 15 or not PORT_NAME.match(p["name"])):
            target.error(ident(obj), f"port name {p['name']!r} is not an IANA service name")


def _check_container_names(target: Target, obj: dict[str, Any], pod: dict[str, Any]) -> None:
    for _, c in containers(pod):
        cname = c.get("name", "")
        if not DNS1123_LABEL.match(cname) or len(cname) > 63:
            target.error(ident(obj), f"container name {cname!r} is not a DNS-1123 label")
        _check_port_names(target, obj, c.get("ports") or [])


def check_names(target: Target) -> None:
    seen: set[tuple[str, str, str]] = set()
    for obj in target.objects:
        meta = obj.get("metadata") or {}
        name, kind = meta.get("name", ""), obj.get("kind", "")
        key = (kind, meta.get("namespace", ""), name)
        if key in seen:
            target.error(ident(obj), "rendered twice")
        seen.add(key)
        _check_name(target, obj, kind, name)
        _check_labels(target, obj, meta.get("labels") or {})
        pod = pod_template(obj)
        if pod is not None:
            _check_labels(target, obj, (pod.get("metadata") or {}).get("labels") or {})
            _check_container_names(target, obj, pod)
        if kind == "Service":
            _check_port_names(target, obj, (obj.get("spec") or {}).get("ports") or [])


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


def _check_pod_spec(target: Target, where: str, spec: dict[str, Any]) -> None:
    psc = spec.get("securityContext") or {}
    if (psc.get("seccompProfile") or {}).get("type") not in {"RuntimeDefault", "Localhost"}:
        target.error(where, "pod securityContext.seccompProfile.type must be RuntimeDefault")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        target.error(where, "host namespaces are not allowed")
    for v in spec.get("volumes") or []:
        size = (v.get("emptyDir") or {}).get("sizeLimit")
        if size is not None and quantity(size) is None:
            target.error(where, f"volume {v.get('name')}: sizeLimit {size!r} is not a quantity")


def _check_container_security(target: Target, cw: str, csc: dict[str, Any], psc: dict[str, Any]) -> None:
    """The restricted profile; runAsNonRoot and runAsUser may come from the pod's securityContext."""
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


def _check_image_tag(target: Target, cw: str, image: str) -> None:
    last = image.rsplit("/", 1)[-1]
    # The base leaves tags to the overlays; what gets deployed must say which build it runs.
    if target.deployable and "@" not in image and (":" not in last or last.endswith(":latest")):
        target.error(cw, f"image {image!r} needs an explicit tag other than latest (or a digest)")


def _check_resources(target: Target, cw: str, res: dict[str, Any]) -> None:
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


def _check_probes(
    target: Target, cw: str, obj: dict[str, Any], pod: dict[str, Any], c: dict[str, Any]
) -> None:
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


def _check_container(
    target: Target, obj: dict[str, Any], pod: dict[str, Any], key: str, c: dict[str, Any]
) -> None:
    spec = pod.get("spec") or {}
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    cw = f"{ident(obj)} container {c.get('name')}"
    _check_container_security(target, cw, c.get("securityContext") or {}, spec.get("securityContext") or {})
    _check_image_tag(target, cw, c.get("image") or "")
    _check_resources(target, cw, c.get("resources") or {})
    for m in c.get("volumeMounts") or []:
        if m.get("name") not in volumes:
            target.error(cw, f"mounts volume {m.get('name')!r}, which the pod does not define")
    if key != "initContainers":
        _check_probes(target, cw, obj, pod, c)


def _check_prometheus_port(target: Target, where: str, pod: dict[str, Any]) -> None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get("prometheus.io/scrape") == "true":
        port = annotations.get("prometheus.io/port", "")
        if not port.isdigit() or not container_port(pod, int(port)):
            target.error(where, f"prometheus.io/port {port!r} is not a container port")


def check_pods(target: Target) -> None:
    """Pod security (restricted profile), resources, probes and images of every workload."""
    for obj in target.objects:
        pod = pod_template(obj)
        if pod is None:
            continue
        where = ident(obj)
        _check_pod_spec(target, where, pod.get("spec") or {})
        for key, c in containers(pod):
            _check_container(target, obj, pod, key, c)
        _check_prometheus_port(target, where, pod)


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
