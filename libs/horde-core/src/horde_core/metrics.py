"""Prometheus metrics: spec instrument names with ``_`` for ``.`` (README.md#architecture).

Each process uses the default registry; ``/metrics`` serves it. Instruments are created once at import of
the module that owns them, via :func:`counter` / :func:`histogram` / :func:`gauge`, which return the existing
collector when a name is registered twice (tests build several apps in one process). The label values several
services share are computed here: :func:`size_bucket`, :func:`flag`, :func:`requester_kind`; and so is the one
instrument two services record, ``horde.kudos.transferred`` (:func:`record_kudos`).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.registry import Collector

# Bucket sets shared by every service (the spec's horde/metrics.py): short operations in seconds (a native or
# store call), and the request lifecycle in seconds (queue wait, first content, request duration).
BUCKETS_SECONDS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
BUCKETS_REQUEST_LIFECYCLE_SECONDS: tuple[float, ...] = (
    0,
    1,
    2,
    5,
    10,
    15,
    20,
    30,
    45,
    60,
    90,
    120,
    180,
    240,
    300,
    450,
    600,
    900,
    1200,
    1800,
    3600,
)


#: The ``horde.size_bucket`` edges (TEXT_LENGTH_BUCKETS, docs/native-api.md#job-lease): a length's label is the first
#: bucket whose upper bound it does not pass, ``>4096`` past the last.
TEXT_LENGTH_BUCKETS: tuple[tuple[int, str], ...] = (
    (512, "<=512"),
    (1024, "513-1024"),
    (2048, "1025-2048"),
    (4096, "2049-4096"),
)
TEXT_LENGTH_OVER_LABEL = ">4096"


def size_bucket(tokens: int) -> str:
    """``horde.size_bucket`` of a length in tokens: <=512, 513-1024, 1025-2048, 2049-4096 or >4096."""
    for bound, label in TEXT_LENGTH_BUCKETS:
        if tokens <= bound:
            return label
    return TEXT_LENGTH_OVER_LABEL


def flag(value: bool) -> str:
    """A boolean label value: ``true`` or ``false``."""
    return "true" if value else "false"


def requester_kind(*, anonymous: bool, shared_key: bool) -> str:
    """``horde.requester``: ``anonymous`` (the anonymous user, id 0), ``shared_key`` (a request made with a
    registered user's shared key) or ``registered``."""
    if anonymous:
        return "anonymous"
    return "shared_key" if shared_key else "registered"


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


def gauge(spec_name: str, documentation: str, attributes: Sequence[str] = ()) -> Gauge:
    """A gauge named after the spec instrument, with one label per spec attribute."""
    name = metric_name(spec_name)
    found = _existing(name)
    if isinstance(found, Gauge):
        return found
    return Gauge(name, documentation, [label_name(a) for a in attributes])


#: The kinds of ``horde.kudos.transferred``: the worker's reward (paid to its owner, spendable and escrow) and
#: the requester's charge (the reward plus the burn, or the burn alone for a censored reply) at each settled
#: generation (submit), and the horde tax at a request's activation (admission).
KUDOS_KINDS: tuple[str, ...] = ("worker_reward", "requester_charge", "horde_tax")

KUDOS_TRANSFERRED = counter(
    "horde.kudos.transferred",
    "Kudos moved by committed transactions: worker_reward, requester_charge (settlement), horde_tax (activation)",
    ["horde.kind"],
)


def record_kudos(kind: str, amount: float) -> None:
    """Count ``amount`` kudos of ``kind`` (one of :data:`KUDOS_KINDS`) on ``horde.kudos.transferred``; call it
    once the transaction that moved them has committed. A non-positive amount counts nothing."""
    if amount > 0:
        KUDOS_TRANSFERRED.labels(kind).inc(amount)
