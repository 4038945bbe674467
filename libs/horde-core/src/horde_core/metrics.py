"""Prometheus metrics: spec instrument names with ``_`` for ``.`` (ARCHITECTURE.md, last table).

Each process uses the default registry; ``/metrics`` serves it. Counters are created once at import of
the module that owns them, via :func:`counter` / :func:`histogram`, which return the existing collector
when a name is registered twice (tests build several apps in one process).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.registry import Collector


def metric_name(spec_name: str) -> str:
    """``horde.chat.worker_faults`` → ``horde_chat_worker_faults``."""
    return spec_name.replace(".", "_")


def label_name(spec_attribute: str) -> str:
    """``horde.reason`` → ``reason``: the ``horde.`` attribute prefix is dropped for Prometheus labels."""
    return spec_attribute.removeprefix("horde.").replace(".", "_")


def _existing(name: str) -> Collector | None:
    names_to_collectors = getattr(REGISTRY, "_names_to_collectors", {})
    collector: Collector | None = names_to_collectors.get(name)
    return collector


def counter(spec_name: str, documentation: str, attributes: Sequence[str] = ()) -> Counter:
    """A counter named after the spec instrument, with one label per spec attribute."""
    name = metric_name(spec_name)
    found = _existing(name) or _existing(name + "_total")
    if isinstance(found, Counter):
        return found
    return Counter(name, documentation, [label_name(a) for a in attributes])


def histogram(
    spec_name: str,
    documentation: str,
    attributes: Sequence[str] = (),
    buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
) -> Histogram:
    """A histogram named after the spec instrument, with one label per spec attribute."""
    name = metric_name(spec_name)
    found = _existing(name) or _existing(name + "_bucket")
    if isinstance(found, Histogram):
        return found
    return Histogram(name, documentation, [label_name(a) for a in attributes], buckets=buckets)
