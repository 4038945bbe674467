"""The cluster's inner walls: NetworkPolicy ingress per port (only the callers), admission's egress (the
internet's web ports, never private, metadata or cluster ranges), and the trusted proxies of every service
behind the Ingress."""

from __future__ import annotations

import ipaddress
import json
from typing import Any, TypeAlias

from .contract import (
    DNS_PORTS,
    EGRESS_RESTRICTED,
    EXPECTED_ROUTES,
    FORBIDDEN_EGRESS,
    GRPC_CALLERS,
    HTTP_CALLERS,
    INTERNET_PORTS,
    METADATA_RANGES,
    STORE_PORTS,
    TRUSTED_PROXY_SETTING,
    WORKLOAD_KINDS,
)
from .model import Target, Workload, env_sources, ident, np_selects, workloads

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


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


def _check_policies_select_pods(target: Target, policies: list[dict[str, Any]]) -> None:
    for np in policies:
        spec = np.get("spec") or {}
        if not any(np_selects(spec.get("podSelector"), w.labels) for w in workloads(target, WORKLOAD_KINDS)):
            target.error(ident(np), "selects no pods")


def _ingress_sources(
    target: Target, rw: str, peers: list[dict[str, Any]], deps: list[Workload], ingress_peers: set[str]
) -> set[str]:
    """The callers an ingress rule's peers admit: ``"ingress"`` and workload names (each ingress controller
    peer is added to ``ingress_peers``, to find it named more than one way)."""
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
    return sources


def _allowed_callers(
    target: Target, w: Workload, mine: list[dict[str, Any]], deps: list[Workload], ingress_peers: set[str]
) -> dict[int, set[str]]:
    """Port -> the callers (``"ingress"``, workload names) the ingress rules of ``mine`` admit to ``w``."""
    allowed: dict[int, set[str]] = {}
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
            sources = _ingress_sources(target, rw, peers, deps, ingress_peers)
            for p in ports:
                number = _port_number(p.get("port"), w)
                if number is None:
                    target.error(rw, f"port {p.get('port')!r} is not a container port of {w.name}")
                    continue
                allowed.setdefault(number, set()).update(sources)
    return allowed


def _expected_callers(
    port_name: str, w: Workload, deployed: set[str], routed: set[str]
) -> tuple[set[str], set[str]]:
    """Who may call the port (permitted) and who of the render does (needed)."""
    ingress = {"ingress"} if w.name in routed else set()
    if port_name == "grpc":
        permitted = GRPC_CALLERS.get(w.name, set())
        return permitted, permitted & deployed
    if port_name == "http":
        callers = HTTP_CALLERS.get(w.name, set())
        return callers | ingress, (callers & deployed) | ingress
    return set(), set()


def _check_port_callers(
    target: Target, w: Workload, allowed: dict[int, set[str]], deployed: set[str], routed: set[str]
) -> None:
    where = f"Deployment/{w.name}"
    for name, number in w.ports.items():
        who = allowed.get(number, set())
        permitted, needed = _expected_callers(name, w, deployed, routed)
        for extra in sorted(who - permitted):
            target.error(where, f"port {name} ({number}) admits {extra}, which does not call it")
        for missing in sorted(needed - who):
            target.error(where, f"port {name} ({number}) does not admit {missing}, which calls it")
    for number in sorted(set(allowed) - set(w.ports.values())):
        target.error(where, f"a NetworkPolicy opens port {number}, which it does not serve")


def check_network_policies(target: Target) -> None:
    """Every Deployment is selected by a NetworkPolicy with ingress rules; each port admits only its callers:
    gRPC the calling services (GRPC_CALLERS), HTTP the ingress controller (services the Ingress routes to) and
    the in-cluster callers (HTTP_CALLERS), any other port no one. Every rule names its sources and ports."""
    policies = [o for o in target.objects if o.get("kind") == "NetworkPolicy"]
    deps = workloads(target)
    deployed = {w.name for w in deps}
    ingress_peers: set[str] = set()
    routed = set(EXPECTED_ROUTES.values())
    _check_policies_select_pods(target, policies)
    for w in deps:
        mine = [np for np in policies if np_selects((np.get("spec") or {}).get("podSelector"), w.labels)]
        types = {t for np in mine for t in (np.get("spec") or {}).get("policyTypes") or ["Ingress"]}
        if not mine or "Ingress" not in types:
            target.error(f"Deployment/{w.name}", "no NetworkPolicy restricts its ingress")
            continue
        allowed = _allowed_callers(target, w, mine, deps, ingress_peers)
        _check_port_callers(target, w, allowed, deployed, routed)
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


def _ip_block_reach(
    target: Target, rw: str, block: dict[str, Any], numbers: set[Any], cluster: list[Network]
) -> set[str]:
    """Check an egress ipBlock: a store rule (store ports, a narrow block) must keep out metadata and the
    cluster, any other rule the private ranges too and use web ports only. What a 0/0 block reaches."""
    try:
        cidr = ipaddress.ip_network(block.get("cidr", ""), strict=False)
        excepts = _networks(block.get("except"))
    except ValueError as exc:
        target.error(rw, f"ipBlock {block}: {exc}")
        return set()
    store_rule = numbers <= STORE_PORTS and cidr.prefixlen >= (16 if cidr.version == 4 else 48)
    forbidden = [*METADATA_RANGES, *cluster] if store_rule else [*FORBIDDEN_EGRESS, *cluster]
    for f in forbidden:
        if _uncovered(cidr, excepts, f):
            target.error(rw, f"ipBlock {cidr} reaches {f} (add it to `except`)")
    if store_rule:
        return set()
    if not numbers <= INTERNET_PORTS:
        target.error(rw, f"ipBlock {cidr} on ports {sorted(numbers)}: only {sorted(INTERNET_PORTS)}")
    return {f"internet{cidr.version}"} if cidr.prefixlen == 0 else set()


def _namespace_reach(target: Target, rw: str, peer: dict[str, Any], numbers: set[Any]) -> set[str]:
    ns = (peer.get("namespaceSelector") or {}).get("matchLabels") or {}
    if not ns or not numbers <= DNS_PORTS or not (peer.get("podSelector") or {}):
        target.error(rw, f"egress to another namespace is for DNS pods on 53 only: {peer}")
        return set()
    return {"dns"}


def _pod_reach(
    target: Target, rw: str, peer: dict[str, Any], numbers: set[Any], deps: dict[str, Workload]
) -> set[str]:
    """Egress to pods of the namespace: only ports they serve (or the stores'); ``name:port`` it reaches."""
    sel = peer.get("podSelector")
    chosen = [o for o in deps.values() if np_selects(sel, o.labels)] if sel else []
    served = {n for o in chosen for n in o.ports.values()}
    if not sel:
        if not numbers <= STORE_PORTS:
            target.error(rw, f"egress to every pod of the namespace on {sorted(numbers)}")
    elif not numbers <= served | STORE_PORTS:
        target.error(rw, f"egress to {sel} on ports it does not serve: {sorted(numbers - served)}")
    return {
        f"{o.name}:{port_name}" for o in chosen for port_name, number in o.ports.items() if number in numbers
    }


def _egress_rule_reach(
    target: Target, rw: str, rule: dict[str, Any], cluster: list[Network], deps: dict[str, Workload]
) -> set[str]:
    """Check one egress rule; what it reaches (``dns``, ``internet4``/``internet6``, ``name:port``)."""
    peers, ports = rule.get("to") or [], rule.get("ports") or []
    numbers = {p.get("port") for p in ports}
    if not peers:
        target.error(rw, "an egress rule without `to` reaches every address")
    if not ports or any(not isinstance(n, int) for n in numbers):
        target.error(rw, "an egress rule must list numeric ports")
        return set()
    reaches: set[str] = set()
    for peer in peers:
        if "ipBlock" in peer:
            reaches |= _ip_block_reach(target, rw, peer["ipBlock"], numbers, cluster)
        elif "namespaceSelector" in peer:
            reaches |= _namespace_reach(target, rw, peer, numbers)
        else:
            reaches |= _pod_reach(target, rw, peer, numbers, deps)
    return reaches


def _egress_rules(policies: list[dict[str, Any]], w: Workload) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(policy, egress rule) of every Egress policy selecting ``w``."""
    mine = [np for np in policies if np_selects((np.get("spec") or {}).get("podSelector"), w.labels)]
    return [
        (np, rule)
        for np in mine
        if "Egress" in ((np.get("spec") or {}).get("policyTypes") or [])
        for rule in (np.get("spec") or {}).get("egress") or []
    ]


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
        rules = _egress_rules(policies, w)
        if not rules:
            target.error(where, "no NetworkPolicy restricts its egress")
            continue
        reaches: set[str] = set()
        for np, rule in rules:
            reaches |= _egress_rule_reach(target, f"{ident(np)} (egress of {name})", rule, cluster, deps)
        needed = {"dns", "internet4"} | {
            f"{svc}:grpc" for svc, callers in GRPC_CALLERS.items() if name in callers
        }
        for missing in sorted(needed - reaches):
            target.error(where, f"its egress does not reach {missing}, which it needs")


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
        _, value = env_sources(target, w).get(TRUSTED_PROXY_SETTING, ("", None))
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
