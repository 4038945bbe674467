"""What the manifests must agree with: the project's routes, Secret keys, callers, ports and ranges, and the
Kubernetes name and quantity grammars the API server enforces. Every rule module reads its facts from here."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

#: deploy/k8s, and the repository root (the workspace the images are built from).
HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent.parent


#: The Ingress contract (README.md#architecture, the brief of the deploy files): request path -> Service.
EXPECTED_ROUTES = {
    "/api/v2/generate/text/pop": "dispatch",
    "/api/v2/generate/text/submit": "submit",
    "/api/v2/generate/text/progress": "submit",
    "/api/v2/generate/chat/async": "admission",
    "/api/v2/generate/chat/status/abc": "admission",
    "/api/v2/generate/text/async": "admission",
    "/api/v2/generate/text/status/abc": "admission",
    "/api/v2/status/models": "admission",
    "/api/v2/status/models/koboldcpp/some-model": "admission",
    "/api/v2/stats/text/totals": "admission",
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

#: NetworkPolicies. gRPC: the services that call each gRPC port (README.md#architecture). HTTP: the in-cluster
#: callers of each HTTP port besides the ingress controller (the front calls admission's native routes; the
#: worker component pops and submits over the Services). A service the Ingress routes to admits the controller.
GRPC_CALLERS = {"dispatch": {"admission"}, "submit": {"admission", "janitor"}}
#: gRPC client targets: the setting and the Deployment whose gRPC port it reaches. Each must be
#: ``dns:///<headless Service>:<port>`` (horde_core.grpc balances per call over every address DNS answers; a
#: ClusterIP Service answers one, and each client would stay on the pod its connection landed on).
GRPC_TARGETS = {"HORDE_DISPATCH_GRPC_TARGET": "dispatch", "HORDE_SUBMIT_GRPC_TARGET": "submit"}
GRPC_TARGET = re.compile(
    r"^dns:///([a-z][-a-z0-9]*)(?:\.([a-z0-9][-a-z0-9]*)\.svc(?:\.cluster\.local)?)?:(\d+)$"
)
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

#: Autoscaling: the Prometheus adapter's rules (monitoring/prometheus-adapter) and where the code defines its
#: Prometheus instruments (horde_core.metrics: spec names with ``.``; or prometheus_client's classes directly).
ADAPTER_CONFIG = HERE / "monitoring" / "prometheus-adapter" / "config.yaml"
METRIC_SOURCES = ("services/*/src/**/*.py", "libs/*/src/**/*.py", "worker/src/**/*.py")
#: services/<dir> (and the worker) -> the Deployment running it (a lib's instruments are in every service).
SERVICE_DEPLOYMENTS = {
    "admission": "admission",
    "dispatch": "dispatch",
    "submit": "submit",
    "janitor": "janitor",
    "oai-front": "oai-front",
    "worker": "worker",
}
#: Series every service serves without an instrument of ours: prometheus_client's default registry (the
#: services' /metrics serves it: horde_core.app) adds the process and garbage-collector collectors. Name -> labels.
RUNTIME_SERIES: dict[str, tuple[str, ...]] = {
    "process_cpu_seconds_total": (),
    "process_resident_memory_bytes": (),
    "process_virtual_memory_bytes": (),
    "process_start_time_seconds": (),
    "process_open_fds": (),
    "process_max_fds": (),
    "python_gc_objects_collected_total": ("generation",),
    "python_gc_collections_total": ("generation",),
    "python_info": ("implementation", "major", "minor", "patchlevel", "version"),
}
#: Series the monitoring itself adds: Prometheus's per scrape target (``up``: 0 when the scrape failed), and the
#: one kube-state-metrics series the alerts read (pod readiness: ``/readyz`` answers 503 when a store does not).
SCRAPE_SERIES: dict[str, tuple[str, ...]] = {
    "up": (),
    "scrape_duration_seconds": (),
    "kube_pod_status_ready": ("condition", "uid"),
}
#: The labels a pod scrape attaches to every series: the usual ``kubernetes-pods`` job that reads the
#: prometheus.io/* annotations (namespace, pod) and a PodMonitor (namespace, pod, container, endpoint).
TARGET_LABELS = ("namespace", "pod", "container", "job", "instance", "endpoint")

#: Dashboards and alerts as code (monitoring/): the generator, the Grafana dashboards it writes, the Prometheus
#: rule file with its unit tests, and the PrometheusRule object generated from it.
MONITORING = HERE / "monitoring"
MONITORING_GENERATOR = MONITORING / "generate.py"
DASHBOARDS_DIR = MONITORING / "dashboards"
RULES_FILE = MONITORING / "rules" / "horde-chat.rules.yaml"
RULES_TESTS = MONITORING / "rules" / "horde-chat.rules.test.yaml"
PROMETHEUS_RULE = MONITORING / "prometheus-operator" / "prometheusrule.yaml"
#: Custom resource definitions the schema check validates custom resources against (prometheus-operator's
#: PodMonitor and PrometheusRule, copied from its example/prometheus-operator-crd, v0.93.0).
CRD_SCHEMAS = HERE / "tools" / "crds"
#: promtool's lowest version the rule tests are written for (Debian bookworm ships 2.42).
PROMTOOL_MIN_VERSION = (2, 42)

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
