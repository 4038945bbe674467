"""Autoscaling: every HPA keeps its CPU target; a metric an HPA scales on (External, Pods, Object) is one the
Prometheus adapter's rules expose (monitoring/prometheus-adapter/config.yaml), and a Pods metric comes from the
Deployment it scales; the adapter's rules are well formed and read only series the code exports (the metric
catalogue of ``metrics``), so a renamed metric fails the check instead of an HPA."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from .contract import ADAPTER_CONFIG, REPO, SERVICE_DEPLOYMENTS
from .metrics import exported_metrics, not_exported
from .model import Target, ident

_SERIES_NAME = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
_NAME_LABEL = re.compile(r"__name__\s*(=~|=)\s*\"([^\"]*)\"")
_RULE_KEYS = {"seriesQuery", "seriesFilters", "resources", "name", "metricsQuery"}
#: Which adapter rule list serves which kind of HPA metric.
_RULE_LISTS = {"rules": "custom", "externalRules": "external"}
_HPA_SOURCES = {
    "External": ("external", "external"),
    "Pods": ("pods", "custom"),
    "Object": ("object", "custom"),
}


@dataclass
class AdapterMetrics:
    """What an adapter config exposes: metric name -> the series it reads, per API (custom, external)."""

    exposed: dict[str, dict[str, set[str]]] = field(default_factory=lambda: {"custom": {}, "external": {}})
    problems: list[str] = field(default_factory=list)


def _query_series(query: str, exported: dict[str, set[str]]) -> tuple[set[str], list[str]]:
    """The series a seriesQuery selects (by name, or by a ``__name__`` matcher), and its problems."""
    names: set[str] = set()
    m = _SERIES_NAME.match(query)
    if m:
        names.add(m.group(1))
    for op, value in _NAME_LABEL.findall(query):
        if op == "=":
            names.add(value)
        else:
            matched = {s for s in exported if re.fullmatch(value, s)}
            if not matched:
                return set(), [
                    f"seriesQuery {query!r}: __name__=~{value!r} matches no series the code exports"
                ]
            names |= matched
    if not names:
        return set(), [f"seriesQuery {query!r} names no metric"]
    missing = sorted(n for n in names if n not in exported)
    return names, [f"seriesQuery {query!r}: {not_exported(n)}" for n in missing]


def _exposed_names(rule: dict[str, Any], series: set[str]) -> set[str]:
    """The metric names a rule exposes (``name.as``, a ``name.matches`` substitution, else the series names)."""
    naming = rule.get("name") or {}
    matches, as_ = naming.get("matches"), naming.get("as")
    if as_ and not matches:
        return {as_}
    if matches:
        # The adapter's default for ``as``: the first capture group, or the whole name without one.
        default = "$1" if re.compile(matches).groups else "$0"
        template = re.sub(r"\$(\d+)", r"\\g<\1>", as_ or default)
        return {re.sub(f"^(?:{matches})$", template, s) for s in series if re.fullmatch(matches, s)}
    return set(series)


def _check_rule(where: str, api: str, rule: Any, exported: dict[str, set[str]], out: AdapterMetrics) -> None:
    if not isinstance(rule, dict):
        out.problems.append(f"{where}: a rule must be a mapping")
        return
    for key in sorted(set(rule) - _RULE_KEYS):
        out.problems.append(f"{where}: unknown key {key!r}")
    query, metrics_query = rule.get("seriesQuery"), rule.get("metricsQuery")
    if not isinstance(query, str) or not isinstance(metrics_query, str):
        out.problems.append(f"{where}: seriesQuery and metricsQuery are required")
        return
    series, problems = _query_series(query, exported)
    out.problems += [f"{where}: {p}" for p in problems]
    if "<<.Series>>" not in metrics_query and not any(s in metrics_query for s in series):
        out.problems.append(f"{where}: metricsQuery reads neither <<.Series>> nor its series")
    resources = (rule.get("resources") or {}).get("overrides") or {}
    mapped = {(v or {}).get("resource") for v in resources.values()}
    if (
        api == "custom"
        and not {"namespace", "pod"} <= mapped
        and not (rule.get("resources") or {}).get("template")
    ):
        out.problems.append(
            f"{where}: a Pods metric's rule must map labels to the namespace and pod resources"
        )
    for name in _exposed_names(rule, series):
        out.exposed[api].setdefault(name, set()).update(series)


def adapter_metrics(config: Any, exported: dict[str, set[str]] | None = None) -> AdapterMetrics:
    """Check a prometheus-adapter config (its ``config.yaml`` as parsed YAML) against the code's series."""
    exported = exported if exported is not None else exported_metrics()
    out = AdapterMetrics()
    if not isinstance(config, dict):
        out.problems.append("the adapter config must be a mapping")
        return out
    for key in sorted(set(config) - {*_RULE_LISTS, "resourceRules"}):
        out.problems.append(f"unknown key {key!r}")
    for key, api in _RULE_LISTS.items():
        for i, rule in enumerate(config.get(key) or []):
            _check_rule(f"{key}[{i}]", api, rule, exported, out)
    return out


def check_adapter_rules(target: Target) -> None:
    """A rendered ConfigMap holding a prometheus-adapter ``config.yaml`` reads only series the code exports."""
    for obj in target.objects:
        text = (obj.get("data") or {}).get("config.yaml") if obj.get("kind") == "ConfigMap" else None
        if text is None:
            continue
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            target.error(ident(obj), f"config.yaml does not parse: {exc}")
            continue
        for problem in adapter_metrics(config).problems:
            target.error(ident(obj), f"config.yaml {problem}")


def _check_hpa(target: Target, hpa: dict[str, Any], adapter: AdapterMetrics | None) -> None:
    where = ident(hpa)
    spec = hpa.get("spec") or {}
    metrics = spec.get("metrics") or []
    if not any(
        m.get("type") == "Resource" and (m.get("resource") or {}).get("name") == "cpu" for m in metrics
    ):
        target.error(where, "no CPU target: every HPA keeps its CPU metric (custom metrics add to it)")
    scaled = (spec.get("scaleTargetRef") or {}).get("name")
    for m in metrics:
        source = _HPA_SOURCES.get(m.get("type", ""))
        if source is None:
            continue
        field_name, api = source
        name = ((m.get(field_name) or {}).get("metric") or {}).get("name")
        if adapter is None:
            target.error(where, f"scales on {name!r}, but {ADAPTER_CONFIG.name} is missing")
            continue
        series = adapter.exposed[api].get(name or "")
        if series is None:
            target.error(
                where, f"{m.get('type')} metric {name!r} is exposed by no {api} rule of the adapter config"
            )
            continue
        if api == "custom" and m.get("type") == "Pods":
            owners = set().union(*(exported_metrics().get(s, set()) for s in series))
            services = {SERVICE_DEPLOYMENTS.get(o) for o in owners} if "*" not in owners else {scaled}
            if scaled not in services:
                target.error(where, f"Pods metric {name!r} is not exported by Deployment/{scaled}'s pods")


def check_hpa_metrics(target: Target) -> None:
    """Every HPA keeps a CPU target; its External/Pods/Object metrics are exposed by the adapter config's rules
    (a Pods metric from the pods it scales)."""
    hpas = [o for o in target.objects if o.get("kind") == "HorizontalPodAutoscaler"]
    custom = [
        m for h in hpas for m in (h.get("spec") or {}).get("metrics") or [] if m.get("type") in _HPA_SOURCES
    ]
    adapter = None
    if custom and ADAPTER_CONFIG.is_file():
        adapter = adapter_metrics(yaml.safe_load(ADAPTER_CONFIG.read_text()))
        for problem in adapter.problems:
            target.error(str(ADAPTER_CONFIG.relative_to(REPO)), problem)
    for hpa in hpas:
        _check_hpa(target, hpa, adapter)
