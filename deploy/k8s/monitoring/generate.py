"""Dashboards and alerts as code: write Horde Chat's Grafana dashboard and the PrometheusRule object.

- ``dashboards/horde-chat.json``: one Grafana dashboard over every service's Prometheus metrics, built with
  grafana-foundation-sdk (the workspace's dev group pins it); ``dashboards/kustomization.yaml`` ships it as the
  ConfigMap Grafana's dashboard sidecar loads (label ``grafana_dashboard: "1"``).
- ``prometheus-operator/prometheusrule.yaml``: the PrometheusRule holding ``rules/horde-chat.rules.yaml``'s
  groups (the rule file is the source; plain Prometheus loads it with ``rule_files:``).

    uv run --no-sync python deploy/k8s/monitoring/generate.py          # write both
    uv run --no-sync python deploy/k8s/monitoring/generate.py --check  # exit 1 when the committed files differ

``make k8s-check`` runs ``--check`` (a dashboard edited by hand, or a generator change not regenerated, fails),
then checks that every series and label a query reads is one the code exports, and runs promtool on the rules.

Every query selects ``namespace="$namespace"`` (one horde per namespace) and tells the services apart by the
pod's name (``<deployment>-<hash>-<suffix>``): both the ``kubernetes-pods`` scrape job of the prometheus.io/*
annotations and the PodMonitor give ``namespace`` and ``pod``, and nothing else is common to both.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

HERE = Path(__file__).resolve().parent
DASHBOARD_FILE = HERE / "dashboards" / "horde-chat.json"
RULES_FILE = HERE / "rules" / "horde-chat.rules.yaml"
PROMETHEUS_RULE_FILE = HERE / "prometheus-operator" / "prometheusrule.yaml"

#: The horde's Deployments (the reference worker's too), and their pods' names.
SERVICES = ("admission", "dispatch", "submit", "janitor", "oai-front", "worker")
SERVICE_POD = f"({'|'.join(SERVICES)})-[a-z0-9]+-[a-z0-9]+"
#: The native services (horde_core's app factory; the front serves the same HTTP series, with no rc).
NATIVE = ("admission", "dispatch", "submit", "janitor")
NATIVE_POD = f"({'|'.join(NATIVE)})-[a-z0-9]+-[a-z0-9]+"
HTTP_REQUESTS = "horde_http_server_requests_total"
HTTP_DURATION = "horde_http_server_request_duration_seconds"
#: The worker routes whose latency the pop and submit panels draw (the routes' own templates).
POP_SUBMIT_ROUTES = 'route=~"/v2/generate/text/(pop|submit)"'
#: The rc values of kudos refusals (docs/native-api.md#kudos).
KUDOS_RCS = (
    'rc=~"KudosUpfront|SharedKeyInsufficientKudos|SharedKeyEmpty|SharedKeyExpired|ChatKudosCapExceeded"'
)
NS = 'namespace="$namespace"'
RATE = "$__rate_interval"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def by_service(expr: str) -> str:
    """``expr`` with a ``service`` label taken from the pod's name (the Deployment's name)."""
    return f'label_replace({expr}, "service", "$1", "pod", "{SERVICE_POD}")'


def sel(series: str, matchers: str = "") -> str:
    """``series{namespace="$namespace", matchers}``."""
    inner = f"{NS}, {matchers}" if matchers else NS
    return f"{series}{{{inner}}}"


def rate(series: str, matchers: str = "") -> str:
    return f"rate({sel(series, matchers)}[{RATE}])"


def quantile(q: float, histogram: str, by: Iterable[str] = (), matchers: str = "") -> str:
    labels = ", ".join(["le", *by])
    return f"histogram_quantile({q}, sum by ({labels}) ({rate(histogram + '_bucket', matchers)}))"


def native_rate(by: str, matchers: str = "") -> str:
    """``sum by (by) (rate(horde_http_server_requests_total{native pods, matchers}))``, ``service`` from the
    pod's name when ``by`` names it."""
    pods = f'pod=~"{NATIVE_POD}"' + (f", {matchers}" if matchers else "")
    return f"sum by ({by}) ({by_service(rate(HTTP_REQUESTS, pods))})"


# --- panels ------------------------------------------------------------------------------------------------


def _targets(queries: Iterable[tuple[str, str]]) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i))
        for i, (expr, legend) in enumerate(queries)
    ]


def graph(
    title: str,
    unit: str,
    *queries: tuple[str, str],
    description: str = "",
    span: int = 8,
    stacked: bool = False,
) -> timeseries.Panel:
    """A time series panel of PromQL ``(expr, legend)`` pairs."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(span)
        .fill_opacity(10 if not stacked else 40)
        .legend(
            VizLegendOptions()
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max"])
        )
        .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING))
        .min(0)
    )
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL))
    for target in _targets(queries):
        panel = panel.with_target(target)
    return panel


def single(
    title: str, unit: str, expr: str, legend: str = "", description: str = "", span: int = 4
) -> stat.Panel:
    """A stat panel: the last value of each series of ``expr``."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(4)
        .span(span)
        .graph_mode(BigValueGraphMode.AREA)
        .color_mode(BigValueColorMode.VALUE)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(_targets([(expr, legend)])[0])
    )


# --- the dashboard -----------------------------------------------------------------------------------------


def _overview() -> list[Any]:
    return [
        single(
            "Pods up",
            "none",
            "sum by (service) (" + by_service(sel("up", f'pod=~"{SERVICE_POD}"')) + ")",
            "{{service}}",
            "Pods of each service whose /metrics answers (Prometheus's up).",
            span=8,
        ),
        single(
            "Jobs waiting",
            "none",
            f"max(horde_text_queue_jobs{{{NS}}})",
            description="The queue horde-wide (dispatch reads it from PostgreSQL; every replica reports it).",
        ),
        single(
            "Completions open",
            "none",
            f"sum(horde_oai_completions_in_flight{{{NS}}})",
            description="Chat completions the fronts hold open: waiting on the horde or streaming.",
        ),
        single(
            "Front service faults",
            "percentunit",
            "sum(" + rate("horde_oai_request_duration_count", 'outcome_class="service_fault"') + ") "
            "/ sum(" + rate("horde_oai_request_duration_count") + ")",
            description="Share of the front's requests that ended in a fault of the horde (alert: HordeFront5xxRatioHigh).",
            span=4,
        ),
        single(
            "Native 5xx share",
            "percentunit",
            "sum("
            + rate(HTTP_REQUESTS, f'pod=~"{NATIVE_POD}", status=~"5..", rc!="ServiceAtCapacity"')
            + ") "
            "/ sum(" + rate(HTTP_REQUESTS, f'pod=~"{NATIVE_POD}"') + ")",
            description="Share of the native services' HTTP requests answered 5xx, at-capacity refusals aside "
            "(alert: HordeService5xxRatioHigh).",
        ),
        single(
            "Requests in flight",
            "none",
            f"sum(horde_http_requests_in_flight{{{NS}}})",
            description="Requests the native services are working on (the in-flight cap's count).",
        ),
        graph(
            "Front requests by outcome class",
            "reqps",
            (f"sum by (outcome_class) ({rate('horde_oai_request_duration_count')})", "{{outcome_class}}"),
            description="Every finished chat completion request of the front, by outcome class.",
            span=12,
            stacked=True,
        ),
        graph(
            "Requests in flight by service",
            "none",
            (
                f"sum by (service) ({by_service(f'horde_http_requests_in_flight{{{NS}}}')})",
                "{{service}}",
            ),
            (f"sum(horde_oai_completions_in_flight{{{NS}}})", "oai-front completions"),
            span=12,
        ),
    ]


def _requests() -> list[Any]:
    return [
        graph(
            "Native requests by service and status",
            "reqps",
            (native_rate("service, status"), "{{service}} {{status}}"),
            description="Every HTTP request the native services answered (horde_http_server_requests_total; "
            "/healthz, /readyz and /metrics are not counted).",
            stacked=True,
        ),
        graph(
            "Native requests by route",
            "reqps",
            (native_rate("service, route, method"), "{{service}} {{method}} {{route}}"),
            description="By route template (a native route's own /v2/... template, whether called at /api/v2 or "
            "/v2; unmatched: no route).",
        ),
        graph(
            "Native refusals by rc",
            "reqps",
            (native_rate("service, status, rc", 'rc!=""'), "{{service}} {{status}} {{rc}}"),
            description="Answers in the Horde error envelope, by its rc (docs/native-api.md#refusals).",
            stacked=True,
        ),
        graph(
            "Native 5xx share by service",
            "percentunit",
            (
                native_rate("service", 'status=~"5..", rc!="ServiceAtCapacity"')
                + " / "
                + native_rate("service"),
                "{{service}}",
            ),
            description="5xx answers (at-capacity refusals aside) as a share of each service's requests. "
            "Alert: HordeService5xxRatioHigh.",
        ),
        graph(
            "Front refusals by status and code",
            "reqps",
            (
                f"sum by (http_status, code) ({rate('horde_oai_requests_refused_total')})",
                "{{http_status}} {{code}}",
            ),
            description="Admission and validation refusals of the OpenAI front (before the horde takes the request).",
        ),
        graph(
            "Front errors by status and code",
            "reqps",
            (
                f"sum by (http_status, code, stage) ({rate('horde_oai_requests_errors_total')})",
                "{{http_status}} {{code}} ({{stage}})",
            ),
            (f"sum by (code) ({rate('horde_oai_stream_failures_total')})", "SSE error {{code}}"),
            description="Admitted requests that ended with an error before any header, and errors sent as SSE error events.",
        ),
        graph(
            "Native calls by route and status",
            "reqps",
            (
                f"sum by (route, status_class) ({rate('horde_oai_native_duration_count')})",
                "{{route}} {{status_class}}",
            ),
            description="The front's calls to the native routes (admission, submit) by status class; error = no answer.",
        ),
        graph(
            "Rate-limit refusals (429) by route",
            "reqps",
            (f"sum by (route) ({rate('horde_rate_limit_refusals_total')})", "{{route}}"),
        ),
        graph(
            "Refused at the in-flight cap (503) by service",
            "reqps",
            (
                f"sum by (service) ({by_service(rate('horde_http_requests_refused_at_capacity_total'))})",
                "{{service}}",
            ),
            (
                "sum(" + rate("horde_oai_request_duration_count", 'outcome_class="front_capacity"') + ")",
                "oai-front FrontAtCapacity",
            ),
        ),
        graph(
            "Front request duration",
            "s",
            (quantile(0.5, "horde_oai_request_duration", ["streamed"]), "p50 streamed={{streamed}}"),
            (quantile(0.95, "horde_oai_request_duration", ["streamed"]), "p95 streamed={{streamed}}"),
            description="Seconds from a chat completion request's arrival to its end.",
        ),
    ]


def _queue() -> list[Any]:
    return [
        graph(
            "Queue depth and waiting pops",
            "none",
            (f"max(horde_text_queue_jobs{{{NS}}})", "jobs waiting"),
            (f"sum(horde_pop_longpoll_waiting{{{NS}}})", "pops waiting (long-poll)"),
            description="Jobs waiting to be handed out (horde-wide) and workers' pops waiting for a job.",
        ),
        graph(
            "Queue wait (creation to pop)",
            "s",
            (quantile(0.5, "horde_text_queue_wait_seconds"), "p50"),
            (quantile(0.9, "horde_text_queue_wait_seconds"), "p90"),
            (quantile(0.99, "horde_text_queue_wait_seconds"), "p99"),
            description="Each assignment's time from request creation to pop (dispatch). Alert: HordeQueueWaitHigh.",
        ),
        graph(
            "Queue wait p90 by requester",
            "s",
            (
                quantile(0.9, "horde_text_queue_wait_seconds", ["requester", "chat"]),
                "{{requester}} chat={{chat}}",
            ),
        ),
        graph(
            "Front queue wait",
            "s",
            (quantile(0.5, "horde_oai_queue_wait", ["streamed"]), "p50 streamed={{streamed}}"),
            (quantile(0.9, "horde_oai_queue_wait", ["streamed"]), "p90 streamed={{streamed}}"),
            description="Seconds a request the front got served waited in the queue before a worker took it.",
        ),
        graph(
            "Long-poll waits by outcome",
            "ops",
            (f"sum by (outcome) ({rate('horde_pop_longpoll_waits_total')})", "{{outcome}}"),
            (f"sum by (cause) ({rate('horde_pop_longpoll_wakes_total')})", "wake: {{cause}}"),
        ),
        graph(
            "Pops offered less than declared",
            "ops",
            (f"sum by (gentype) ({rate('horde_pop_lease_capacity_limited_total')})", "{{gentype}}"),
            (
                f"sum by (size_bucket) ({rate('horde_text_gate_shadow_assignments_total')})",
                "over capacity {{size_bucket}}",
            ),
            description="Chat pops capped by the worker's measured speed; legacy text jobs assigned over capacity.",
        ),
    ]


def _pop_submit() -> list[Any]:
    by = ["route"]
    return [
        graph(
            "Pop and submit latency",
            "s",
            (quantile(0.5, HTTP_DURATION, by, POP_SUBMIT_ROUTES), "p50 {{route}}"),
            (quantile(0.95, HTTP_DURATION, by, POP_SUBMIT_ROUTES), "p95 {{route}}"),
            (quantile(0.99, HTTP_DURATION, by, POP_SUBMIT_ROUTES), "p99 {{route}}"),
            description="Seconds from a worker's pop or submit arriving to its answer (dispatch, submit). A pop "
            "long-polls: its time includes the wait for a job.",
        ),
        graph(
            "Pops and submits by status and rc",
            "reqps",
            (native_rate("route, status, rc", POP_SUBMIT_ROUTES), "{{route}} {{status}} {{rc}}"),
            stacked=True,
        ),
        graph(
            "Submits by outcome",
            "ops",
            (f"sum by (outcome) ({rate('horde_submit_outcomes_total')})", "{{outcome}}"),
            stacked=True,
        ),
        graph(
            "Native call latency by route",
            "s",
            (quantile(0.5, "horde_oai_native_duration", ["route"]), "p50 {{route}}"),
            (quantile(0.95, "horde_oai_native_duration", ["route"]), "p95 {{route}}"),
            description="Seconds of each call the front makes to the native routes (async submit, status, cancel).",
        ),
        graph(
            "Lease renewals",
            "ops",
            (
                f"sum by (outcome, worker_trusted) ({rate('horde_text_lease_renewals_total')})",
                "{{outcome}} trusted={{worker_trusted}}",
            ),
            description="Progress posts that extended a job lease, and posts that found it at its cap.",
        ),
        graph(
            "Worker pops and submits (reference worker)",
            "ops",
            (f"sum by (outcome) ({rate('horde_worker_pops_total')})", "pop {{outcome}}"),
            (f"sum by (status) ({rate('horde_worker_submit_attempts_total')})", "submit {{status}}"),
            description="The reference worker's own view (components/worker; its pods' /metrics on 7300).",
        ),
        graph(
            "Worker generation time",
            "s",
            (quantile(0.5, "horde_worker_generation_seconds", ["kind"]), "p50 {{kind}}"),
            (quantile(0.95, "horde_worker_generation_seconds", ["kind"]), "p95 {{kind}}"),
            description="Backend time per job (reference worker).",
        ),
        graph(
            "Pop to submit (over-capacity legacy jobs)",
            "s",
            (quantile(0.9, "horde_text_gate_shadow_service_seconds", ["size_bucket"]), "p90 {{size_bucket}}"),
        ),
    ]


def _faults() -> list[Any]:
    return [
        graph(
            "Worker faults by reason",
            "ops",
            (f"sum by (reason) ({rate('horde_chat_worker_faults_total')})", "{{reason}}"),
            description="Faulted chat submits by the fault_reason the worker sent. Alert: HordeWorkerFaultRateHigh.",
            stacked=True,
        ),
        graph(
            "Fault share of submits",
            "percentunit",
            (
                f"sum({rate('horde_chat_worker_faults_total')}) / "
                "sum(" + rate("horde_submit_outcomes_total", 'outcome=~"stored|faulted"') + ")",
                "faults / (stored + faulted)",
            ),
            (
                f"sum by (worker_trusted) ({rate('horde_chat_worker_faults_total')})",
                "faults/s trusted={{worker_trusted}}",
            ),
        ),
        graph(
            "Stale aborts and empty generations",
            "ops",
            (
                f"sum by (chat, worker_trusted) ({rate('horde_text_stale_aborts_total')})",
                "lease lapsed chat={{chat}} trusted={{worker_trusted}}",
            ),
            (f"sum by (model) ({rate('horde_text_empty_generations_total')})", "empty {{model}}"),
        ),
    ]


def _streaming() -> list[Any]:
    return [
        graph(
            "First content",
            "s",
            (quantile(0.5, "horde_oai_stream_first_content", ["relayed"]), "p50 relayed={{relayed}}"),
            (quantile(0.95, "horde_oai_stream_first_content", ["relayed"]), "p95 relayed={{relayed}}"),
            description="Seconds from a streamed request's arrival to its first reasoning or content chunk.",
        ),
        graph(
            "Relay gaps",
            "s",
            (quantile(0.95, "horde_oai_stream_post_gap"), "post gap p95"),
            (quantile(0.95, "horde_oai_stream_pacing_lag"), "pacing lag p95"),
            description="Seconds between two posts of a relayed generation; from reading a delta to sending its last piece.",
        ),
        graph(
            "Streams by outcome",
            "ops",
            (f"sum by (outcome) ({rate('horde_oai_stream_relays_total')})", "{{outcome}}"),
            (
                "sum(" + rate("horde_oai_delta_reads_total", 'outcome!="entries"') + ") by (outcome)",
                "delta reads {{outcome}}",
            ),
        ),
        graph(
            "Completions by finish reason",
            "ops",
            (
                f"sum by (finish_reason, streamed) ({rate('horde_oai_completions_total')})",
                "{{finish_reason}} streamed={{streamed}}",
            ),
            stacked=True,
        ),
        graph(
            "Cancels",
            "ops",
            (f"sum by (outcome) ({rate('horde_oai_cancels_total')})", "{{outcome}}"),
        ),
        graph(
            "Request sizes",
            "none",
            (quantile(0.5, "horde_oai_request_max_tokens", ["source"]), "max_tokens p50 {{source}}"),
            (quantile(0.95, "horde_oai_request_max_tokens", ["source"]), "max_tokens p95 {{source}}"),
        ),
    ]


def _kudos() -> list[Any]:
    return [
        graph(
            "Kudos flow",
            "none",
            (f"sum by (kind) ({rate('horde_kudos_transferred_total')})", "{{kind}}"),
            description="Kudos per second moved by committed transactions: the workers' rewards and the "
            "requesters' charges at settlement (submit; the charge holds the burn of 1 per generation) and the "
            "horde tax at activation (admission).",
        ),
        graph(
            "Native kudos refusals by rc",
            "reqps",
            (native_rate("route, rc", KUDOS_RCS), "{{rc}} {{route}}"),
            description="Requests the native routes refused for kudos, whoever sent them (front or client).",
        ),
        graph(
            "Free allowance decisions",
            "ops",
            (
                f"sum by (outcome, requester) ({rate('horde_text_free_allowance_decisions_total')})",
                "{{outcome}} {{requester}}",
            ),
            description="Request creations by the free output allowance's outcome (admission): the kudos gate.",
            stacked=True,
        ),
        graph(
            "Kudos refusals",
            "reqps",
            (
                "sum by (code) (" + rate("horde_oai_requests_refused_total", 'outcome_class="kudos"') + ")",
                "front {{code}}",
            ),
            (
                "sum by (outcome_class) "
                "(" + rate("horde_oai_requests_errors_total", 'outcome_class=~"kudos|rate_limited"') + ")",
                "front errors {{outcome_class}}",
            ),
            description="Requests refused for kudos upfront (KudosUpfront) or rate-limited, as the front answered them.",
        ),
        graph(
            "Estimated wait behind the allowance",
            "s",
            (
                quantile(0.5, "horde_text_free_allowance_estimated_wait_seconds", ["chat"]),
                "p50 chat={{chat}}",
            ),
            (
                quantile(0.9, "horde_text_free_allowance_estimated_wait_seconds", ["chat"]),
                "p90 chat={{chat}}",
            ),
        ),
        graph(
            "Request sizing",
            "ops",
            (
                f"sum by (dry_run) ({rate('horde_chat_max_length_lowered_total')})",
                "max_length lowered dry_run={{dry_run}}",
            ),
            (
                f"sum by (outcome, mode) ({rate('horde_text_context_fit_total')})",
                "context fit {{outcome}} {{mode}}",
            ),
        ),
    ]


def _grpc() -> list[Any]:
    handled = "horde_grpc_server_handled_total"
    return [
        graph(
            "gRPC handled by code",
            "ops",
            (f"sum by (grpc_code) ({rate(handled)})", "{{grpc_code}}"),
            stacked=True,
        ),
        graph(
            "gRPC handled by method",
            "ops",
            (f"sum by (grpc_method) ({rate(handled)})", "{{grpc_method}}"),
        ),
        graph(
            "gRPC handled by pod",
            "ops",
            (f"sum by (pod) ({rate(handled)})", "{{pod}}"),
            description="Every replica should serve its share (clients balance per call over the headless Services).",
        ),
    ]


def _stores() -> list[Any]:
    return [
        graph(
            "Store up",
            "none",
            (
                f"min by (store) (horde_store_up{{{NS}}})",
                "{{store}} (worst pod)",
            ),
            (
                f"count by (store) (horde_store_up{{{NS}}} == 0)",
                "{{store}} pods failing",
            ),
            description="1 while every pod's /readyz ping of the store answers within 2 s (PostgreSQL, Redis; "
            "S3 is probed there without failing readiness). Alert: HordeStoreDown.",
        ),
        graph(
            "Redis errors",
            "ops",
            (
                f"sum by (route) ({rate('horde_rate_limit_store_errors_total')})",
                "rate limit failing open {{route}}",
            ),
            (
                "sum by (outcome) (" + rate("horde_queue_announcements_total", 'outcome!="published"') + ")",
                "announcement {{outcome}}",
            ),
            (
                "sum(" + rate("horde_pop_longpoll_subscriber_total", 'event="failed"') + ")",
                "long-poll subscriber failed",
            ),
            ("sum(" + rate("horde_oai_delta_reads_total", 'outcome="failed"') + ")", "delta reads failed"),
            description="Redis failures as each user counts them. Alert: HordeRedisErrors.",
        ),
        graph(
            "Janitor passes (PostgreSQL)",
            "ops",
            (f"sum by (outcome) ({rate('horde_janitor_passes_total')})", "pass {{outcome}}"),
            (f"sum by (chat) ({rate('horde_janitor_expired_requests_total')})", "expired chat={{chat}}"),
            description="A failing pass is usually PostgreSQL. Alert: HordeJanitorPassesFailing.",
        ),
        graph(
            "Ready pods by service",
            "none",
            (
                "sum by (service) ("
                + by_service(f'kube_pod_status_ready{{{NS}, condition="true", pod=~"{SERVICE_POD}"}}')
                + ")",
                "{{service}}",
            ),
            description="/readyz pings PostgreSQL and Redis: no ready pod means its stores do not answer "
            "(kube-state-metrics). Alert: HordeServiceUnready.",
        ),
    ]


def _processes() -> list[Any]:
    pods = f'{NS}, pod=~"{SERVICE_POD}"'
    return [
        graph(
            "CPU by pod",
            "percentunit",
            (f"sum by (pod) (rate(process_cpu_seconds_total{{{pods}}}[{RATE}]))", "{{pod}}"),
        ),
        graph(
            "Resident memory by pod",
            "bytes",
            (f"sum by (pod) (process_resident_memory_bytes{{{pods}}})", "{{pod}}"),
        ),
        graph(
            "Scrape health and dropped log records",
            "none",
            (f"sum by (pod) (up{{{pods}}})", "up {{pod}}"),
            (f"sum by (pod) ({rate('horde_log_records_dropped_total')})", "log records dropped/s {{pod}}"),
        ),
    ]


ROWS = (
    ("Overview", _overview),
    ("Requests and refusals", _requests),
    ("Queue", _queue),
    ("Pop and submit", _pop_submit),
    ("Worker faults", _faults),
    ("Streaming (front relay)", _streaming),
    ("Kudos and sizing", _kudos),
    ("gRPC", _grpc),
    ("Stores", _stores),
    ("Processes", _processes),
)


def build_dashboard() -> dict[str, Any]:
    """The Horde Chat dashboard as Grafana's JSON model."""
    board = (
        dashboard.Dashboard("Horde Chat")
        .uid("horde-chat")
        .description(
            "Horde Chat's services: requests, queue, workers, streaming, kudos, gRPC, stores. "
            "Generated by deploy/k8s/monitoring/generate.py: do not edit by hand."
        )
        .tags(["horde-chat"])
        .editable()
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("namespace")
            .label("Namespace")
            .datasource(DATASOURCE)
            .query("label_values(horde_http_requests_in_flight, namespace)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
        )
    )
    for title, panels in ROWS:
        board = board.with_row(dashboard.Row(title))
        for panel in panels():
            board = board.with_panel(panel)
    model = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    # Stable ids: the builder leaves them 0 (panels) or a zero UUID (variables); Grafana wants them unique.
    for i, panel in enumerate(model["panels"], start=1):
        panel["id"] = i
    for variable in model["templating"]["list"]:
        variable.pop("id", None)
    result: dict[str, Any] = model
    return result


# --- the PrometheusRule ------------------------------------------------------------------------------------

PROMETHEUS_RULE_HEADER = """\
# Generated by deploy/k8s/monitoring/generate.py from ../rules/horde-chat.rules.yaml: edit that file, then run
#   uv run --no-sync python deploy/k8s/monitoring/generate.py
# (make k8s-check fails while this file and the rule file differ).
"""


def build_prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The prometheus-operator PrometheusRule holding the rule file's groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "horde-chat", "labels": {"app.kubernetes.io/name": "horde-chat-alerts"}},
        "spec": {"groups": rules["groups"]},
    }


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    """Multi-line strings (the longer expressions) as literal blocks, as the rule file writes them."""
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


#: A SafeDumper of its own, so the representer does not change yaml's.
_Dumper: Any = type("_Dumper", (yaml.SafeDumper,), {})
_Dumper.add_representer(str, _str)


def outputs() -> dict[Path, str]:
    """Each generated file and its text."""
    board = json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n"
    rules = yaml.safe_load(RULES_FILE.read_text())
    rule = yaml.dump(build_prometheus_rule(rules), Dumper=_Dumper, sort_keys=False, width=120)
    return {DASHBOARD_FILE: board, PROMETHEUS_RULE_FILE: PROMETHEUS_RULE_HEADER + rule}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    args = ap.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.is_file() else ""
        if current == text:
            continue
        if args.check:
            stale.append(path)
            rel = path.relative_to(HERE.parent.parent.parent)
            diff = difflib.unified_diff(
                current.splitlines(),
                text.splitlines(),
                f"{rel} (committed)",
                f"{rel} (generated)",
                lineterm="",
                n=1,
            )
            print("\n".join(list(diff)[:40]))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent.parent.parent)}")
    if stale:
        print(
            f"FAIL monitoring: {len(stale)} generated file(s) differ from deploy/k8s/monitoring/generate.py's output: run "
            "`uv run --no-sync python deploy/k8s/monitoring/generate.py` and commit",
            file=sys.stderr,
        )
        return 1
    if args.check:
        print("ok   monitoring: the dashboard and the PrometheusRule are what generate.py writes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
