"""Instruments submit records (spec instrument names with ``_`` for ``.``; served on ``/metrics``).

- ``horde.chat.worker_faults`` (labels ``reason``, ``worker_trusted``): faulted chat submits, by the reason the
  worker sent (a known ``fault_reason``, ``unknown`` or ``none``), counted before the fault is applied
  (docs/native-api.md#worker-fault-reasons).
- ``horde.text.empty_generations`` (label ``model``): stored replies with empty content and no tool calls, per
  served model (docs/native-api.md#submit).
- ``horde.text.gate_shadow.outcomes`` (labels ``worker_trusted``, ``size_bucket``, ``outcome``: completed,
  faulted, aborted) and the histogram ``horde.text.gate_shadow.service_seconds`` (pop to submit of a completed
  one): how legacy text jobs assigned over the worker's capacity ended (docs/native-api.md#job-lease).
- ``horde.submit.outcomes`` (label ``outcome``): every submit by its outcome, for dashboards and the bench.
"""

from __future__ import annotations

from horde_core.metrics import counter, histogram

WORKER_FAULTS = counter(
    "horde.chat.worker_faults",
    "Faulted chat submits, by the fault_reason the worker sent",
    ["horde.reason", "horde.worker_trusted"],
)

SUBMIT_OUTCOMES = counter(
    "horde.submit.outcomes",
    "Submits by outcome (stored, faulted, refused, duplicate, aborted, ...)",
    ["horde.outcome"],
)


EMPTY_GENERATIONS = counter(
    "horde.text.empty_generations",
    "Stored replies with empty content and no tool calls, per served model",
    ["horde.model"],
)

GATE_SHADOW_OUTCOMES = counter(
    "horde.text.gate_shadow.outcomes",
    "How legacy text jobs assigned over the worker's capacity ended",
    ["horde.worker_trusted", "horde.size_bucket", "horde.outcome"],
)

GATE_SHADOW_SERVICE_SECONDS = histogram(
    "horde.text.gate_shadow.service_seconds",
    "Pop to submit seconds of completed over-capacity legacy text jobs",
    ["horde.worker_trusted", "horde.size_bucket"],
    buckets=(5, 10, 30, 60, 90, 120, 150, 200, 300, 600),
)
