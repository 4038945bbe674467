"""Dashboards and alerts (monitoring/): every query of the Grafana dashboards and every expression of the alerting
rules reads only series and labels the code exports (the catalogue of ``metrics``); the rule file passes
``promtool check rules`` and its unit tests ``promtool test rules``; the dashboards' queries parse as PromQL
(promtool checks them as recording rules, with Grafana's variables filled in). On a render: a ConfigMap for
Grafana's dashboard sidecar (label ``grafana_dashboard``) holds dashboards that pass, a PrometheusRule's
expressions pass. Across renders: the PodMonitor scrapes every pod the overlays mark with prometheus.io/*."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .contract import DASHBOARDS_DIR, PROMTOOL_MIN_VERSION, RULES_FILE, RULES_TESTS
from .metrics import check_query, substitute_grafana_variables
from .model import Target, ident, pod_template, selects, workloads

#: The label Grafana's dashboard sidecar (kube-prometheus-stack, the Grafana Helm chart) looks for.
DASHBOARD_LABEL = "grafana_dashboard"


def dashboard_queries(model: Any) -> list[tuple[str, str]]:
    """Every PromQL query of a Grafana dashboard model: ``(where, expr)``, from panel targets (rows' panels
    too) and query variables (``label_values(<selector>, label)`` reads the selector)."""
    if not isinstance(model, dict):
        return []
    found = []
    panels = list(model.get("panels") or [])
    for panel in panels:
        panels += panel.get("panels") or []  # a collapsed row holds its panels
        for target in panel.get("targets") or []:
            if isinstance(target, dict) and target.get("expr"):
                found.append(
                    (f"panel {panel.get('title')!r} query {target.get('refId', '?')}", target["expr"])
                )
    for variable in (model.get("templating") or {}).get("list") or []:
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") != "query" or not isinstance(query, str):
            continue
        m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_]\w*\s*\)\s*", query)
        expr = m.group(1) if m else query
        if re.fullmatch(r"\s*(label_names|metrics)\(.*\)\s*", query):
            continue
        found.append((f"variable {variable.get('name')!r}", expr))
    return found


def dashboard_problems(model: Any) -> list[str]:
    """Problems of one dashboard model: queries of unknown series or labels; a missing uid or title."""
    if not isinstance(model, dict):
        return ["a dashboard must be a JSON object"]
    problems = [f"no {key}" for key in ("uid", "title") if not model.get(key)]
    queries = dashboard_queries(model)
    if not queries:
        problems.append("no PromQL query")
    for where, expr in queries:
        problems += [f"{where}: {p}" for p in check_query(expr)]
    return problems


def rule_problems(rules: Any) -> list[str]:
    """Problems of a Prometheus rule file's groups (or a PrometheusRule's spec): expressions of unknown series or
    labels, alerts without a severity or summary."""
    if not isinstance(rules, dict) or not isinstance(rules.get("groups"), list):
        return ["rules must be a mapping with a list of groups"]
    problems = []
    for group in rules["groups"]:
        for rule in (group or {}).get("rules") or []:
            name = rule.get("alert") or rule.get("record") or "?"
            where = f"{group.get('name')}/{name}"
            problems += [f"{where}: {p}" for p in check_query(str(rule.get("expr", "")))]
            if "alert" in rule:
                if not (rule.get("labels") or {}).get("severity"):
                    problems.append(f"{where}: an alert needs a severity label")
                if not (rule.get("annotations") or {}).get("summary"):
                    problems.append(f"{where}: an alert needs a summary annotation")
    return problems


def check_dashboards(target: Target) -> None:
    """A rendered ConfigMap for Grafana's sidecar holds dashboards whose queries read exported series."""
    for obj in target.objects:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if obj.get("kind") != "ConfigMap" or DASHBOARD_LABEL not in labels:
            continue
        if not obj.get("data"):
            target.error(ident(obj), "a grafana_dashboard ConfigMap holds no dashboard")
        for key, text in (obj.get("data") or {}).items():
            try:
                model = json.loads(text)
            except json.JSONDecodeError as exc:
                target.error(ident(obj), f"{key} is not JSON: {exc}")
                continue
            for problem in dashboard_problems(model):
                target.error(ident(obj), f"{key}: {problem}")


def check_prometheus_rules(target: Target) -> None:
    """A rendered PrometheusRule's expressions read exported series, and its alerts have severity and summary."""
    for obj in target.objects:
        if obj.get("kind") == "PrometheusRule":
            for problem in rule_problems(obj.get("spec")):
                target.error(ident(obj), problem)


# --- promtool ----------------------------------------------------------------------------------------------


def promtool_version(promtool: str) -> tuple[int, ...] | None:
    out = subprocess.run([promtool, "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"version (\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    return tuple(int(x) for x in m.groups()) if m else None


def _run(cmd: list[str], cwd: Path) -> str | None:
    """None when the command passed, else its output."""
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    if out.returncode == 0:
        return None
    return (out.stdout + out.stderr).strip()


def dashboards_as_rules(models: list[tuple[str, Any]]) -> dict[str, Any]:
    """The dashboards' queries as recording rules (Grafana variables filled in), for promtool to parse."""
    rules = []
    for name, model in models:
        for i, (_, expr) in enumerate(dashboard_queries(model)):
            record = f"dashboard:{re.sub(r'[^a-zA-Z0-9_]', '_', name)}:q{i}"
            rules.append({"record": record, "expr": substitute_grafana_variables(expr)})
    return {"groups": [{"name": "dashboard-queries", "rules": rules}]}


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> list[tuple[str, Any]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def check_monitoring_files(promtool: str | None) -> tuple[list[str], list[str]]:
    """Check the rule file, its tests and the dashboards (with promtool when given): (problems, what passed)."""
    problems: list[str] = []
    passed: list[str] = []
    rules = yaml.safe_load(RULES_FILE.read_text())
    rel = f"rules/{RULES_FILE.name}"
    problems += [f"{rel}: {p}" for p in rule_problems(rules)]
    dashboards = load_dashboards()
    for name, model in dashboards:
        problems += [f"dashboards/{name}.json: {p}" for p in dashboard_problems(model)]
    count = sum(len(g.get("rules") or []) for g in rules.get("groups") or [])
    queries = sum(len(dashboard_queries(m)) for _, m in dashboards)
    if not problems:
        passed.append(f"{count} rules and {queries} dashboard queries read only exported series and labels")
    if promtool is None:
        return problems, passed
    version = promtool_version(promtool)
    if version is None or version[:2] < PROMTOOL_MIN_VERSION:
        problems.append(f"promtool {version} is older than {PROMTOOL_MIN_VERSION}")
        return problems, passed
    for cmd, what in (
        (["check", "rules", RULES_FILE.name], "promtool check rules"),
        (["test", "rules", RULES_TESTS.name], "promtool test rules"),
    ):
        failure = _run([promtool, *cmd], RULES_FILE.parent)
        if failure:
            problems.append(f"{what} failed:\n{failure}")
        else:
            passed.append(what)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dashboard-queries.yaml"
        path.write_text(yaml.safe_dump(dashboards_as_rules(dashboards), sort_keys=False))
        failure = _run([promtool, "check", "rules", path.name], Path(tmp))
        if failure:
            problems.append(f"a dashboard query does not parse as PromQL:\n{failure}")
        else:
            passed.append("the dashboards' queries parse (promtool)")
    passed.append(f"promtool {'.'.join(map(str, version))}")
    return problems, passed


def find_promtool(mode: str) -> str | None:
    """promtool on PATH; None when ``mode`` is never (or auto and there is none); SystemExit when always and none."""
    if mode == "never":
        return None
    found = shutil.which("promtool")
    if found is None and mode == "always":
        raise SystemExit("promtool is not on PATH (make k8s-check installs it: see mk/k8s.mk)")
    return found


# --- scraping ----------------------------------------------------------------------------------------------


def _endpoints(podmonitor: dict[str, Any]) -> list[dict[str, Any]]:
    spec = podmonitor.get("spec") or {}
    return list(spec.get("podMetricsEndpoints") or [])


def check_scrape_targets(targets: list[Target]) -> list[str]:
    """The PodMonitors (monitoring renders) scrape every pod an overlay marks with prometheus.io/scrape, at the
    annotated port and path, in any namespace: the two ways of scraping find the same /metrics."""
    monitors = [o for t in targets if not t.deployable for o in t.objects if o.get("kind") == "PodMonitor"]
    problems: list[str] = []
    if not monitors:
        return problems
    for t in (t for t in targets if t.deployable):
        for w in workloads(t):
            pod = pod_template(w.obj) or {}
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if annotations.get("prometheus.io/scrape") != "true":
                continue
            port = str(annotations.get("prometheus.io/port", ""))
            path = annotations.get("prometheus.io/path", "/metrics")
            scraped = [
                ident(m)
                for m in monitors
                if ((m.get("spec") or {}).get("namespaceSelector") or {}).get("any")
                and selects((m.get("spec") or {}).get("selector") or {}, w.labels)
                and any(
                    str(w.ports.get(str(e.get("port")), "")) == port and e.get("path", "/metrics") == path
                    for e in _endpoints(m)
                )
            ]
            if not scraped:
                problems.append(
                    f"{t.name}: Deployment/{w.name} is scraped through prometheus.io/* at :{port}{path}, but no "
                    "PodMonitor (any namespace) selects its pods at that port and path"
                )
    return problems
