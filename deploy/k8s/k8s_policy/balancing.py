"""Balanced gRPC: every gRPC client target (GRPC_TARGETS) is ``dns:///<headless Service>:<port>``, and that
Service is headless, has the port, selects the Deployment that serves it and maps the port to the container
port of the same number (a headless Service has no virtual IP: clients dial each pod at the port they were
given). Every caller of a gRPC service (GRPC_CALLERS) receives its target."""

from __future__ import annotations

from typing import Any

from .contract import GRPC_CALLERS, GRPC_TARGET, GRPC_TARGETS
from .model import Target, containers, env_sources, ident, name_of, pod_template, selects, workloads


def _target_settings(target: Target) -> list[tuple[str, str, str]]:
    """(where, key, value) of every gRPC target setting in ConfigMaps and literal env values."""
    found: list[tuple[str, str, str]] = []
    for obj in target.objects:
        if obj.get("kind") == "ConfigMap":
            data = obj.get("data") or {}
            found += [(ident(obj), k, str(v)) for k, v in data.items() if k in GRPC_TARGETS]
        pod = pod_template(obj)
        for _, c in containers(pod or {}):
            found += [
                (ident(obj), e["name"], str(e["value"]))
                for e in c.get("env") or []
                if e.get("name") in GRPC_TARGETS and "value" in e
            ]
    return found


def _container_port_number(pod: dict[str, Any], port: Any) -> int | None:
    for _, c in containers(pod):
        for p in c.get("ports") or []:
            if port in (p.get("containerPort"), p.get("name")):
                return int(p["containerPort"])
    return None


def _check_service(target: Target, where: str, key: str, value: str, svc: dict[str, Any], port: int) -> None:
    spec = svc.get("spec") or {}
    if spec.get("clusterIP") != "None":
        target.error(
            where,
            f"{key}={value}: Service {name_of(svc)} is not headless (clusterIP: None): its one virtual IP "
            "pins each gRPC client to one pod",
        )
    service_port = next((p for p in spec.get("ports") or [] if p.get("port") == port), None)
    if service_port is None:
        target.error(where, f"{key}={value}: Service {name_of(svc)} has no port {port}")
        return
    server = GRPC_TARGETS[key]
    dep = next((o for o in target.objects if o.get("kind") == "Deployment" and name_of(o) == server), None)
    if dep is None:
        return
    pod = pod_template(dep) or {}
    if not selects(spec.get("selector") or {}, (pod.get("metadata") or {}).get("labels") or {}):
        target.error(where, f"{key}={value}: Service {name_of(svc)} does not select Deployment/{server}")
        return
    number = _container_port_number(pod, service_port.get("targetPort", port))
    if number != port:
        target.error(
            where,
            f"{key}={value}: Service {name_of(svc)} port {port} targets container port {number} of "
            f"Deployment/{server}; a headless Service is dialled at the pod's own port, so they must be equal",
        )


def check_grpc_targets(target: Target) -> None:
    """Each gRPC target is a ``dns:///`` name of a headless Service that serves the right pods on that port;
    in what gets deployed, every caller receives its targets."""
    services = {name_of(o): o for o in target.objects if o.get("kind") == "Service"}
    for where, key, value in _target_settings(target):
        m = GRPC_TARGET.match(value)
        if m is None:
            target.error(
                where,
                f"{key}={value}: must be dns:///<headless Service>:<port> (round_robin over every pod's "
                "address; host:port resolves to one address)",
            )
            continue
        name, namespace, port = m.group(1), m.group(2), int(m.group(3))
        svc = services.get(name)
        if svc is None:
            target.error(where, f"{key}={value}: no Service {name!r}")
            continue
        svc_namespace = (svc.get("metadata") or {}).get("namespace")
        if namespace is not None and svc_namespace is not None and namespace != svc_namespace:
            target.error(
                where, f"{key}={value}: Service {name} is in namespace {svc_namespace}, not {namespace}"
            )
        _check_service(target, where, key, value, svc, port)
    if not target.deployable:
        return
    for w in workloads(target):
        received = env_sources(target, w)
        for key, server in GRPC_TARGETS.items():
            if w.name in GRPC_CALLERS.get(server, set()) and key not in received:
                target.error(
                    f"Deployment/{w.name}",
                    f"calls {server} over gRPC but {key} is unset (it would dial 127.0.0.1)",
                )
