"""k8s_policy.metrics and k8s_policy.monitoring: the metric catalogue reads the code's instruments with their
labels; the PromQL reader names the series and labels a query uses; the committed dashboard and alerting rules
read only exported series and labels and are what monitoring/generate.py writes; a rendered dashboard ConfigMap
or PrometheusRule that reads a renamed series fails; the custom resources are validated strictly; promtool
checks the rules and their unit tests (which fail when an alert is broken)."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml
from k8s_manifests import K8S, Objects, run
from k8s_policy.contract import DASHBOARDS_DIR, RULES_FILE, RULES_TESTS
from k8s_policy.metrics import check_query, code_catalogue, instruments, query_names
from k8s_policy.model import Target
from k8s_policy.monitoring import (
    check_dashboards,
    check_monitoring_files,
    check_prometheus_rules,
    check_scrape_targets,
    dashboard_problems,
    dashboard_queries,
    rule_problems,
)
from k8s_policy.schemas import crd_schema

DASHBOARD: dict[str, Any] = json.loads((DASHBOARDS_DIR / "horde-chat.json").read_text())
RULES: dict[str, Any] = yaml.safe_load(RULES_FILE.read_text())
#: promtool as make test / make k8s-check install it (mk/k8s.mk, target ``promtool``), else from PATH.
PROMTOOL = next(
    (str(p) for p in (K8S.parents[1] / ".local" / "k8s-tools" / "promtool" / "promtool",) if p.is_file()),
    shutil.which("promtool"),
)


def needs_promtool(test: Any) -> Any:
    """The test runs promtool; it fails (never skips) when promtool is missing: make test installs it."""

    def run(*args: Any, **kwargs: Any) -> Any:
        assert PROMTOOL is not None, "promtool is not installed: run `make promtool` (make test does)"
        return test(*args, **kwargs)

    return functools.wraps(test)(run)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("monitoring_generate", K8S / "monitoring" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_instruments_are_read_with_their_labels() -> None:
    source = """
from horde_core.metrics import counter, histogram
from prometheus_client import Counter, Gauge
A = counter("horde.x.faults", "doc", ["horde.reason", "horde.worker_trusted"])
B = histogram(
    "horde.x.wait_seconds",
    "doc " "continued",
    attributes=["horde.chat"],
    buckets=(1, 2),
)
C = Counter(
    "horde_raw_total", "doc", labelnames=["route"]
)
D = Gauge("horde_g", "doc", LABELS)
"""
    found = {(i.kind, i.name): i.labels for i in instruments(source)}
    assert found == {
        ("counter", "horde_x_faults"): ("reason", "worker_trusted"),
        ("histogram", "horde_x_wait_seconds"): ("chat",),
        ("counter", "horde_raw_total"): ("route",),
        ("gauge", "horde_g"): None,
    }


def test_the_catalogue_has_the_code_series_and_labels() -> None:
    catalogue = code_catalogue()
    assert catalogue.labels["horde_chat_worker_faults_total"] == {"reason", "worker_trusted"}
    assert catalogue.labels["horde_text_queue_wait_seconds_bucket"] == {
        "requester",
        "chat",
        "requested_bucket",
        "le",
    }
    assert catalogue.labels["horde_text_queue_wait_seconds_count"] == {
        "requester",
        "chat",
        "requested_bucket",
    }
    assert catalogue.labels["horde_grpc_server_handled_total"] == {"grpc_method", "grpc_code"}
    assert catalogue.owners["horde_worker_pops_total"] == {"worker"}


def test_query_names() -> None:
    names = query_names(
        'histogram_quantile(0.9, sum by (le, chat) (rate(horde_text_queue_wait_seconds_bucket{namespace="$namespace"}'
        "[$__rate_interval] offset 5m))) > 120 and on (namespace) "
        'sum(label_replace(up{pod=~"a-.*"}, "service", "$1", "pod", "(.*)")) without (instance) '
        'or {__name__="horde_text_queue_jobs", job!=""} or max_over_time(horde_pop_longpoll_waiting[1h:5m])'
    )
    assert names.problems == []
    assert names.series == {
        "horde_text_queue_wait_seconds_bucket",
        "up",
        "horde_text_queue_jobs",
        "horde_pop_longpoll_waiting",
    }
    assert names.matchers == [
        ("horde_text_queue_wait_seconds_bucket", "namespace"),
        ("up", "pod"),
        (None, "job"),
    ]
    assert names.grouping == {"le", "chat", "namespace", "instance"}
    assert names.created == {"service"}


def test_queries_of_unknown_series_or_labels_are_refused() -> None:
    assert check_query('sum by (reason) (rate(horde_chat_worker_faults_total{namespace="x"}[5m]))') == []
    assert check_query('sum by (service) (label_replace(up, "service", "$1", "pod", "(.*)"))') == []
    assert check_query('process_resident_memory_bytes{pod=~"dispatch-.*"}') == []
    assert check_query(
        'sum by (fault_reason, le) (rate(horde_chat_worker_fault_total{outcome="x"}[5m])) '
        '+ sum by (status) (horde_oai_completions_in_flight{model="m"})'
    ) == [
        "horde_chat_worker_fault_total is exported by no code (services/*/src/**/*.py, libs/*/src/**/*.py, "
        "worker/src/**/*.py)",
        "horde_oai_completions_in_flight has no label 'model'",
        "grouping by 'fault_reason', a label none of ['horde_chat_worker_fault_total', "
        "'horde_oai_completions_in_flight'] has",
        "grouping by 'le', a label none of ['horde_chat_worker_fault_total', 'horde_oai_completions_in_flight'] has",
        "grouping by 'status', a label none of ['horde_chat_worker_fault_total', "
        "'horde_oai_completions_in_flight'] has",
    ]
    assert check_query("sum by (service) (up)") == ["grouping by 'service', a label none of ['up'] has"]
    assert check_query("rate(up[5m]") == []  # the syntax is promtool's to judge; the names are read
    assert check_query("sum(rate(horde_submit_outcomes_total[5m])) ~ 1") == ["cannot read PromQL at '~ 1'"]


def test_the_dashboard_and_the_rules_are_clean() -> None:
    assert dashboard_problems(DASHBOARD) == []
    assert rule_problems(RULES) == []
    queries = dashboard_queries(DASHBOARD)
    assert len(queries) > 50
    text = " ".join(expr for _, expr in queries)
    # The families the dashboard covers: requests and refusals, queue, pop and submit, faults, streaming, kudos,
    # gRPC, stores, processes.
    for series in (
        "horde_oai_requests_refused_total",
        "horde_rate_limit_refusals_total",
        "horde_text_queue_jobs",
        "horde_text_queue_wait_seconds_bucket",
        "horde_submit_outcomes_total",
        "horde_chat_worker_faults_total",
        "horde_oai_stream_first_content_bucket",
        "horde_text_free_allowance_decisions_total",
        "horde_grpc_server_handled_total",
        "horde_janitor_passes_total",
        "process_cpu_seconds_total",
    ):
        assert series in text, series
    alerts = {r["alert"] for g in RULES["groups"] for r in g["rules"] if "alert" in r}
    assert {
        "HordeProcessDown",
        "HordeServiceDown",
        "HordeServiceUnready",
        "HordeRedisErrors",
        "HordeFront5xxRatioHigh",
        "HordeQueueWaitHigh",
        "HordeWorkerFaultRateHigh",
        "HordeGrpcErrors",
    } <= alerts
    tested = {
        t["alertname"]
        for test in yaml.safe_load(RULES_TESTS.read_text())["tests"]
        for t in test["alert_rule_test"]
    }
    assert alerts <= tested, f"alerts without a promtool unit test: {sorted(alerts - tested)}"


def test_the_generated_files_are_current() -> None:
    generate = _generator()
    for path, text in generate.outputs().items():
        assert path.read_text() == text, f"{path} is stale: run deploy/k8s/monitoring/generate.py"
    rule = yaml.safe_load(generate.PROMETHEUS_RULE_FILE.read_text())
    assert rule["spec"]["groups"] == RULES["groups"]


def test_a_dashboard_configmap_is_checked_where_it_renders() -> None:
    model = copy.deepcopy(DASHBOARD)
    model["panels"][1]["targets"][0]["expr"] = 'sum(horde_pops_total{namespace="$namespace"})'
    model["templating"]["list"][1]["query"] = (
        'label_values(horde_http_requests_in_flight{route="x"}, namespace)'
    )
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "horde-chat-dashboards", "labels": {"grafana_dashboard": "1"}},
        "data": {"horde-chat.json": json.dumps(model), "broken.json": "{"},
    }
    title = model["panels"][1]["title"]
    assert run(check_dashboards, [cm]) == [
        f"ConfigMap/horde-chat-dashboards: horde-chat.json: panel {title!r} query A: horde_pops_total is exported "
        "by no code (services/*/src/**/*.py, libs/*/src/**/*.py, worker/src/**/*.py)",
        "ConfigMap/horde-chat-dashboards: horde-chat.json: variable 'namespace': horde_http_requests_in_flight "
        "has no label 'route'",
        "ConfigMap/horde-chat-dashboards: broken.json is not JSON: Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)",
    ]
    cm["metadata"]["labels"] = {}
    assert run(check_dashboards, [cm]) == []  # not the sidecar's


def test_a_prometheus_rule_is_checked_where_it_renders() -> None:
    rule = yaml.safe_load((K8S / "monitoring" / "prometheus-operator" / "prometheusrule.yaml").read_text())
    assert run(check_prometheus_rules, [rule]) == []
    first = rule["spec"]["groups"][0]["rules"][0]
    first["expr"] = 'up{service="dispatch"} == 0'
    del first["labels"]
    assert run(check_prometheus_rules, [rule]) == [
        "PrometheusRule/horde-chat: horde-chat.availability/HordeProcessDown: up has no label 'service'",
        "PrometheusRule/horde-chat: horde-chat.availability/HordeProcessDown: an alert needs a severity label",
    ]


def _crd_errors(obj: dict[str, Any]) -> list[str]:
    schema = crd_schema(obj["kind"], obj["apiVersion"])
    assert schema is not None
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


def test_custom_resources_are_validated_strictly() -> None:
    """PodMonitor and PrometheusRule against the vendored CRDs (tools/crds), strict as the core schemas are."""
    podmonitor, rule = (
        yaml.safe_load((K8S / "monitoring" / "prometheus-operator" / name).read_text())
        for name in ("podmonitor.yaml", "prometheusrule.yaml")
    )
    assert _crd_errors(podmonitor) == []
    assert _crd_errors(rule) == []
    podmonitor["spec"]["podMetricsEndpoints"][0]["prot"] = "http"
    rule["spec"]["groups"][0]["rules"][0]["for"] = 5
    rule["kind"] = "PrometheusRules"
    assert _crd_errors(podmonitor) == [
        "spec.podMetricsEndpoints.0: Additional properties are not allowed ('prot' was unexpected)"
    ]
    assert crd_schema("PrometheusRules", rule["apiVersion"]) is None  # check.py: "no schema for ..."
    rule["kind"] = "PrometheusRule"
    assert _crd_errors(rule) == ["spec.groups.0.rules.0.for: 5 is not of type 'string'"]


@needs_promtool
def test_promtool_passes_the_rules_their_tests_and_the_dashboard_queries() -> None:
    problems, passed = check_monitoring_files(PROMTOOL)
    assert problems == []
    assert {"promtool check rules", "promtool test rules", "the dashboards' queries parse (promtool)"} <= set(
        passed
    )


@needs_promtool
def test_the_unit_tests_catch_a_broken_alert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A threshold raised past what the tests' series reach, or a label lost, fails `promtool test rules`."""
    import k8s_policy.monitoring as monitoring

    for broken in (
        ("> 0.2\n", "> 0.5\n"),  # HordeWorkerFaultRateHigh would no longer fire at 30 % faults
        (
            "sum by (namespace) (rate(horde_rate_limit_store_errors_total",
            "sum (rate(horde_rate_limit_store_errors_total",
        ),
    ):
        text = RULES_FILE.read_text()
        assert broken[0] in text
        (tmp_path / RULES_FILE.name).write_text(text.replace(broken[0], broken[1], 1))
        shutil.copy(RULES_TESTS, tmp_path / RULES_TESTS.name)
        monkeypatch.setattr(monitoring, "RULES_FILE", tmp_path / RULES_FILE.name)
        monkeypatch.setattr(monitoring, "RULES_TESTS", tmp_path / RULES_TESTS.name)
        problems, _ = check_monitoring_files(PROMTOOL)
        assert [p.split("\n")[0] for p in problems] == ["promtool test rules failed:"], problems


def test_the_podmonitor_scrapes_every_annotated_pod(deployed: Objects) -> None:
    podmonitor = yaml.safe_load((K8S / "monitoring" / "prometheus-operator" / "podmonitor.yaml").read_text())
    for obj in deployed:  # what the base's `labels:` (includeTemplates) adds when kustomize renders it
        if obj["kind"] == "Deployment":
            obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] = "horde-chat"
    overlay = Target("overlays/test", K8S / "base", deployable=True)
    overlay.objects = deployed
    monitoring = Target("monitoring/prometheus-operator", K8S / "monitoring", deployable=False)
    monitoring.objects = [podmonitor]
    assert check_scrape_targets([overlay, monitoring]) == []
    assert check_scrape_targets([overlay]) == []  # no PodMonitor rendered: the annotations alone
    podmonitor["spec"]["podMetricsEndpoints"][0]["port"] = "web"
    podmonitor["spec"]["selector"]["matchExpressions"][0]["values"].remove("janitor")
    problems = check_scrape_targets([overlay, monitoring])
    assert problems == [
        f"overlays/test: Deployment/{name} is scraped through prometheus.io/* at :{port}/metrics, but no "
        "PodMonitor (any namespace) selects its pods at that port and path"
        for name, port in (
            ("admission", 7101),
            ("dispatch", 7102),
            ("janitor", 7104),
            ("oai-front", 7002),
            ("submit", 7103),
        )
    ]
