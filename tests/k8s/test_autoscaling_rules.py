"""k8s_policy.autoscaling: HPAs keep CPU; the metrics they scale on are exposed by the Prometheus adapter's
rules (deploy/k8s/monitoring/prometheus-adapter/config.yaml), which read only series the code exports; the
example component's metrics pass, and each rule is fed a manifest or config that breaks it."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from k8s_manifests import K8S, Objects, find, run
from k8s_policy.autoscaling import adapter_metrics, check_adapter_rules, check_hpa_metrics
from k8s_policy.contract import ADAPTER_CONFIG
from k8s_policy.metrics import exported_metrics

CONFIG: dict[str, Any] = yaml.safe_load(ADAPTER_CONFIG.read_text())


def _component_metrics() -> dict[str, dict[str, Any]]:
    """HPA name -> the metric components/autoscaling-queue adds to it (its JSON patches' values)."""
    kust = yaml.safe_load((K8S / "components" / "autoscaling-queue" / "kustomization.yaml").read_text())
    added = {}
    for patch in kust["patches"]:
        [op] = yaml.safe_load(patch["patch"])
        assert (op["op"], op["path"]) == ("add", "/spec/metrics/-")
        added[patch["target"]["name"]] = op["value"]
    return added


def _hpa_metrics(objects: Objects, name: str) -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = find(objects, "HorizontalPodAutoscaler", name)["spec"]["metrics"]
    return metrics


def test_the_code_exports_the_scaling_signals() -> None:
    exported = exported_metrics()
    assert exported["horde_text_queue_jobs"] == {"dispatch"}
    assert exported["horde_worker_faults_total"] == {"worker"}
    assert exported["horde_oai_completions_in_flight"] == {"oai-front"}
    assert exported["horde_grpc_server_handled_total"] == {"*"}
    assert exported["horde_http_requests_in_flight"] == {"*"}
    assert "horde_text_queue_wait_seconds_bucket" in exported


def test_the_adapter_config_is_clean_and_exposes_the_signals() -> None:
    adapter = adapter_metrics(CONFIG)
    assert adapter.problems == []
    assert adapter.exposed == {
        "custom": {"horde_oai_completions_in_flight": {"horde_oai_completions_in_flight"}},
        "external": {"horde_text_queue_jobs": {"horde_text_queue_jobs"}},
    }


def test_adapter_rules_that_read_no_exported_series_are_refused() -> None:
    config = copy.deepcopy(CONFIG)
    config["externalRules"][0]["seriesQuery"] = 'horde_queue_depth{namespace!=""}'
    config["rules"][0]["resources"]["overrides"].pop("pod")
    config["rules"][0]["metricsQuery"] = "sum(up)"
    config["rules"].append({"seriesQuery": '{__name__=~"horde_nothing_.*"}', "metricsQuery": "x", "typo": 1})
    config["resourcesRules"] = {}
    problems = adapter_metrics(config).problems
    assert problems == [
        "unknown key 'resourcesRules'",
        "rules[0]: metricsQuery reads neither <<.Series>> nor its series",
        "rules[0]: a Pods metric's rule must map labels to the namespace and pod resources",
        "rules[1]: unknown key 'typo'",
        "rules[1]: seriesQuery '{__name__=~\"horde_nothing_.*\"}': __name__=~'horde_nothing_.*' matches no "
        "series the code exports",
        "rules[1]: metricsQuery reads neither <<.Series>> nor its series",
        "rules[1]: a Pods metric's rule must map labels to the namespace and pod resources",
        "externalRules[0]: seriesQuery 'horde_queue_depth{namespace!=\"\"}': horde_queue_depth is exported by no "
        "code (services/*/src/**/*.py, libs/*/src/**/*.py, "
        "worker/src/**/*.py)",
    ]


def test_name_matches_and_name_regex_selectors() -> None:
    config = {
        "rules": [
            {
                "seriesQuery": '{__name__=~"horde_pop_longpoll_waiting|horde_http_requests_in_flight"}',
                "resources": {"template": "<<.Resource>>"},
                "name": {"matches": "^horde_(.*)$", "as": "horde_per_pod_$1"},
                "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
            }
        ]
    }
    adapter = adapter_metrics(config)
    assert adapter.problems == []
    assert set(adapter.exposed["custom"]) == {
        "horde_per_pod_pop_longpoll_waiting",
        "horde_per_pod_http_requests_in_flight",
    }


def test_the_adapter_configmap_is_checked_where_it_renders() -> None:
    config = copy.deepcopy(CONFIG)
    config["rules"][0]["seriesQuery"] = "horde_oai_renamed_gauge"
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "adapter-config", "namespace": "monitoring"},
        "data": {"config.yaml": yaml.safe_dump(config)},
    }
    assert run(check_adapter_rules, [cm]) == [
        "ConfigMap/adapter-config: config.yaml rules[0]: seriesQuery 'horde_oai_renamed_gauge': "
        "horde_oai_renamed_gauge is exported by no code (services/*/src/**/*.py, libs/*/src/**/*.py, "
        "worker/src/**/*.py)"
    ]
    cm["data"]["config.yaml"] = yaml.safe_dump(CONFIG)
    assert run(check_adapter_rules, [cm]) == []


def test_the_base_and_the_example_component_are_clean(objects: Objects) -> None:
    assert run(check_hpa_metrics, objects) == []
    for name, metric in _component_metrics().items():
        _hpa_metrics(objects, name).append(metric)
    assert {m["type"] for m in _hpa_metrics(objects, "dispatch")} == {"Resource", "External"}
    assert {m["type"] for m in _hpa_metrics(objects, "oai-front")} == {"Resource", "Pods"}
    assert run(check_hpa_metrics, objects) == []


def test_hpa_metrics_must_be_exposed_and_cpu_kept(objects: Objects) -> None:
    added = _component_metrics()
    dispatch = _hpa_metrics(objects, "dispatch")
    dispatch[:] = [added["dispatch"], copy.deepcopy(added["oai-front"])]
    dispatch[0]["external"]["metric"]["name"] = "horde_queue_depth"
    _hpa_metrics(objects, "submit").append(
        {
            "type": "Object",
            "object": {
                "metric": {"name": "horde_text_queue_jobs"},
                "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "submit"},
                "target": {"type": "Value", "value": "1"},
            },
        }
    )
    assert run(check_hpa_metrics, objects) == [
        "HorizontalPodAutoscaler/dispatch: no CPU target: every HPA keeps its CPU metric (custom metrics add to it)",
        "HorizontalPodAutoscaler/dispatch: External metric 'horde_queue_depth' is exposed by no external rule of "
        "the adapter config",
        "HorizontalPodAutoscaler/dispatch: Pods metric 'horde_oai_completions_in_flight' is not exported by "
        "Deployment/dispatch's pods",
        "HorizontalPodAutoscaler/submit: Object metric 'horde_text_queue_jobs' is exposed by no custom rule of "
        "the adapter config",
    ]
