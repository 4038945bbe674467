"""Instruments the janitor records (spec instrument names with ``_`` for ``.``; served on ``/metrics``).

- ``horde.text.stale_aborts`` (labels ``worker_trusted``, ``chat``): text and chat jobs aborted because their
  lease lapsed (docs/native-api.md#job-lease), counted when submit's FaultGeneration actually faulted the generation.
- ``horde.janitor.expired_requests`` (label ``chat``): requests deleted past their expiry.
- ``horde.janitor.passes`` (label ``outcome``: ok, error): janitor passes.
"""

from __future__ import annotations

from horde_core.metrics import counter

STALE_ABORTS = counter(
    "horde.text.stale_aborts",
    "Text and chat jobs aborted because the lease lapsed",
    ["horde.worker_trusted", "horde.chat"],
)

EXPIRED_REQUESTS = counter(
    "horde.janitor.expired_requests",
    "Requests deleted past their expiry",
    ["horde.chat"],
)

PASSES = counter("horde.janitor.passes", "Janitor passes by outcome", ["horde.outcome"])
