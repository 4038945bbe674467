"""The policy rules of ``make k8s-check`` (deploy/k8s/check.py runs them), one module per rule family:

- ``render``: kustomize renders, and the ``kubectl kustomize`` cross-check;
- ``schemas``: strict Kubernetes schema validation (kubernetes-validate's schemas);
- ``objects``: names, labels, namespaces, pod security and resources, probes, selectors, endpoint settings;
- ``references``: references resolve, the Ingress routes, every component is rendered;
- ``routing``: the Ingress paths equal the one routing table (horde_testing/routes.py, which the local proxy of
  ``make run`` is generated from);
- ``balancing``: gRPC targets name headless Services (clients balance over every pod);
- ``metrics``: the metric catalogue (every series and label the code exports) and the PromQL reader every rule
  that reads a query uses;
- ``autoscaling``: HPAs keep CPU; metrics they scale on are ones the Prometheus adapter example exposes, from
  series the code exports;
- ``monitoring``: the Grafana dashboards and the alerting rules read only exported series and labels; promtool
  checks the rules and runs their unit tests;
- ``network``: NetworkPolicy ingress and egress, trusted proxies;
- ``secrets``: the Secret keys each workload reads, the proxy passkeys;
- ``images``: the root Dockerfile, the image table and their agreement with the manifests.

``contract`` holds the facts the rules check against; ``model`` the render (Target) and object helpers.
A rule takes a Target and records each problem with ``Target.error``; tests under tests/k8s feed each rule a
manifest that breaks it.
"""

from __future__ import annotations

from collections.abc import Callable

from .autoscaling import check_adapter_rules, check_hpa_metrics
from .balancing import check_grpc_targets
from .model import Target
from .monitoring import check_dashboards, check_prometheus_rules
from .network import check_egress_ranges, check_network_policies, check_trusted_proxies
from .objects import check_config, check_names, check_namespaces, check_pods, check_selectors
from .references import check_references, check_routes
from .routing import check_routing_table
from .secrets import check_secret_keys

#: The rules run on every render (base and overlays).
EVERY_RENDER: list[Callable[[Target], None]] = [
    check_names,
    check_namespaces,
    check_pods,
    check_selectors,
    check_config,
    check_network_policies,
    check_egress_ranges,
    check_secret_keys,
    check_routing_table,
    check_grpc_targets,
    check_adapter_rules,
    check_hpa_metrics,
    check_dashboards,
    check_prometheus_rules,
]
#: The rules run only on what gets deployed (overlays): references, routes and proxies need the whole cluster.
DEPLOYABLE_ONLY: list[Callable[[Target], None]] = [check_references, check_routes, check_trusted_proxies]
