"""The worker's Prometheus metrics and the small HTTP server for ``/metrics`` and ``/healthz``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)


class WorkerMetrics:
    """Instruments of one worker, on their own registry (so tests can run several workers in one process).

    - ``horde_worker_pops_total{outcome}``: pops by outcome ``job``, ``empty``, ``error``;
    - ``horde_worker_jobs_total{kind, outcome}``: jobs (``chat``/``text``) by how they ended: ``submitted``,
      ``faulted``, ``dropped`` (404/AbortedGen/gave up), ``refused`` (400 on the reply, then faulted),
      ``cancelled`` (a streamed job the horde stopped: generation aborted, nothing submitted);
    - ``horde_worker_progress_posts_total{outcome}``: progress posts of streamed jobs by answer: ``accepted``,
      ``cancelled`` (200 with ``cancelled: true``), ``aborted`` (404 ChatJobAborted), ``not_streaming`` (other
      404), ``out_of_sequence`` (409), ``cap_reached`` (413), ``forbidden`` (403), ``refused`` (other 4xx),
      ``unavailable`` (503), ``error`` (no answer, 5xx or 429: resent unchanged);
    - ``horde_worker_faults_total{reason}``: fault submits by fault reason (``none`` without one);
    - ``horde_worker_submit_attempts_total{status}``: submit HTTP answers by status (``error``: no answer);
    - ``horde_worker_generation_seconds{kind}``: backend time per job;
    - ``horde_worker_jobs_in_flight``: jobs held now.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pops = Counter("horde_worker_pops", "Pops by outcome", ["outcome"], registry=r)
        self.jobs = Counter("horde_worker_jobs", "Jobs by kind and outcome", ["kind", "outcome"], registry=r)
        self.faults = Counter("horde_worker_faults", "Fault submits by reason", ["reason"], registry=r)
        self.submits = Counter(
            "horde_worker_submit_attempts", "Submit answers by status", ["status"], registry=r
        )
        self.generation = Histogram(
            "horde_worker_generation_seconds",
            "Backend time per job",
            ["kind"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 180),
            registry=r,
        )
        self.progress_posts = Counter(
            "horde_worker_progress_posts", "Progress posts by answer", ["outcome"], registry=r
        )
        self.in_flight = Gauge("horde_worker_jobs_in_flight", "Jobs held now", registry=r)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


class MetricsServer:
    """``GET /metrics`` (Prometheus text) and ``GET /healthz`` (``{"status"}``, 200 when ``health()`` is
    ``"ok"``, else 503) on a background thread. ``port`` 0 picks a free port (read :attr:`port` after
    :meth:`start`)."""

    def __init__(self, metrics: WorkerMetrics, host: str, port: int, health: Callable[[], str]) -> None:
        self.metrics = metrics
        self.health = health
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, status, ctype = outer.metrics.render(), 200, CONTENT_TYPE_LATEST
                elif path == "/healthz":
                    state = outer.health()
                    body = json.dumps({"status": state}).encode()
                    status, ctype = (200 if state == "ok" else 503), "application/json"
                else:
                    body, status, ctype = b'{"message": "not found"}', 404, "application/json"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # quiet: scraped every few seconds
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.2,), name="worker-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
