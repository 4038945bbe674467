"""The front's instruments (docs/openai-front.md#metrics-and-logs), Prometheus names with ``_`` for ``.``.

Attributes are bounded: codes, outcome classes, stages, reasons, statuses, parameter labels and the served
model id. Never API keys, prompts, addresses or request ids.
"""

from __future__ import annotations

from horde_contract import MAX_CHAT_BODY_BYTES, MAX_CHAT_MAX_TOKENS, MIN_CHAT_MAX_TOKENS
from horde_contract.errors import RC
from horde_core.metrics import BUCKETS_REQUEST_LIFECYCLE_SECONDS, BUCKETS_SECONDS, counter, gauge, histogram

# Request body sizes in bytes: a text-only chat is a few KiB; images as data URLs reach the 36 MiB cap.
BUCKETS_BODY_BYTES = (
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    8388608,
    16777216,
    33554432,
    MAX_CHAT_BODY_BYTES,
)
# Completion limits: the contract's range, from its least to its most.
BUCKETS_MAX_TOKENS = (
    MIN_CHAT_MAX_TOKENS,
    64,
    128,
    256,
    512,
    768,
    1024,
    2048,
    4096,
    8192,
    MAX_CHAT_MAX_TOKENS,
)
BUCKETS_POST_GAP_SECONDS = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10)
BUCKETS_PIECES_PER_POST = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80)
BUCKETS_REASONING_SHARE = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1)

# Outcome class by code (docs/openai-front.md#metrics-and-logs). A code not listed is unclassified on purpose.
OUTCOME_CLASS_BY_CODE: dict[str, str] = {
    "ok": "served",
    RC.ChatRequestTimeout: "capacity",
    "queue_unavailable": "capacity",
    RC.FrontAtCapacity: "front_capacity",
    "no_worker_supports_features": "unservable",
    "no_worker_supports_limit": "unservable",
    RC.UnknownChatModel: "unservable",  # the native rc, passed through (a 404 for an unknown model)
    RC.ChatRequestFaulted: "service_fault",
    RC.ChatRequestNoGeneration: "service_fault",
    RC.ChatStreamDiverged: "service_fault",
    "stream_not_found": "client_error",
    "stream_busy": "client_error",
    RC.HordeUnavailable: "service_fault",
    RC.InternalServerError: "service_fault",
    RC.BadRequest: "client_error",
    RC.UnsupportedChatParameter: "client_error",
    RC.ChatRequestConflict: "client_error",
    RC.RequestTooLarge: "client_error",
    RC.RequestBodyTimeout: "client_error",
    "max_kudos_exceeded": "client_error",
    RC.PromptExceedsContext: "client_error",
    RC.OperationKeyConflict: "client_error",
    RC.InvalidAPIKey: "auth",
    "invalid_api_key": "auth",
    RC.KudosUpfront: "kudos",
    "rate_limit_exceeded": "rate_limited",
    "client_disconnected": "client_cancelled",
}


def outcome_class_for(code: str | None, stage: str = "") -> str:
    """The outcome class of a finished request (``unclassified`` for a code not in the table)."""
    if code == "no_eligible_worker":
        return "capacity" if stage == "grace" else "unservable"
    return OUTCOME_CLASS_BY_CODE.get(code or "", "unclassified")


def max_tokens_bucket(limit: int) -> str:
    """The upper bound of ``limit``'s BUCKETS_MAX_TOKENS bucket, or ``over``."""
    for bound in BUCKETS_MAX_TOKENS:
        if limit <= bound:
            return str(bound)
    return "over"


REQUESTS_REFUSED = counter(
    "horde.oai.requests.refused",
    "Admission and validation refusals of the front",
    ["horde.http_status", "horde.code", "horde.parameter", "horde.outcome_class"],
)
REQUESTS_ERRORS = counter(
    "horde.oai.requests.errors",
    "Admitted requests that ended with an error before any header",
    [
        "horde.http_status",
        "horde.code",
        "horde.reason",
        "horde.stage",
        "horde.max_tokens_bucket",
        "horde.outcome_class",
    ],
)
COMPLETIONS = counter(
    "horde.oai.completions",
    "Delivered completions",
    ["horde.model", "horde.finish_reason", "horde.lowered", "horde.content", "horde.streamed"],
)
REQUEST_DURATION = histogram(
    "horde.oai.request.duration",
    "Seconds from the request's arrival to its end",
    ["horde.streamed", "horde.outcome_class"],
    buckets=BUCKETS_REQUEST_LIFECYCLE_SECONDS,
)
CANCELS = counter("horde.oai.cancels", "Cancel attempts of native requests", ["horde.outcome"])
COMPLETIONS_IN_FLIGHT = gauge(
    "horde.oai.completions.in_flight",
    "Chat completions this process holds open: waiting on the horde or streaming (the in-flight cap's count)",
)
"""Completions in flight: ``POST /v1/chat/completions`` requests this process admitted past its in-flight cap
and has not finished answering (a stream until its last byte), set by :class:`horde_oai.capacity.InFlightCap`.
No labels. The front's autoscaling signal: its average over the front's pods is the waiting completions per
replica (docs/operator-guide.md#scaling)."""
REQUEST_MAX_TOKENS = histogram(
    "horde.oai.request.max_tokens",
    "Completion limit of each request the Horde accepted",
    ["horde.source"],
    buckets=BUCKETS_MAX_TOKENS,
)


# --- relayed deltas (docs/openai-front.md#streaming, #metrics-and-logs) ---------------------------------------------------

DELTA_READS = counter(
    "horde.oai.delta_reads",
    "Reads of the progress streams by the process's delta reader: entries, failed, abandoned (over 5 s)",
    ["horde.outcome"],
)
STREAM_RELAYS = counter(
    "horde.oai.stream.relays",
    "Relayed streams by outcome: relayed (deltas exposed), whole (delivered whole), diverged, dropped (the "
    "client left), resumed (a Last-Event-ID re-attach)",
    ["horde.outcome"],
)
STREAM_FAILURES = counter(
    "horde.oai.stream.failures",
    "Errors sent as an SSE error event after a stream's headers",
    ["horde.code", "horde.outcome_class"],
)
STREAM_POST_GAP = histogram(
    "horde.oai.stream.post_gap",
    "Seconds between two posts of the relayed generation (their stream id times)",
    buckets=BUCKETS_POST_GAP_SECONDS,
)
STREAM_PACING_LAG = histogram(
    "horde.oai.stream.pacing_lag",
    "Seconds from reading a delta to sending its last piece",
    buckets=BUCKETS_POST_GAP_SECONDS,
)
STREAM_PIECES_PER_POST = histogram(
    "horde.oai.stream.pieces_per_post",
    "Pieces a paced delta was cut into",
    buckets=BUCKETS_PIECES_PER_POST,
)
STREAM_FIRST_CONTENT = histogram(
    "horde.oai.stream.first_content",
    "Seconds from a streamed request's arrival to its first reasoning or content chunk",
    ["horde.relayed"],
    buckets=BUCKETS_REQUEST_LIFECYCLE_SECONDS,
)
STREAM_REASONING_SHARE = histogram(
    "horde.oai.stream.reasoning_share",
    "Share of a relayed stream's characters that were reasoning",
    buckets=BUCKETS_REASONING_SHARE,
)


# --- native calls and request sizes (docs/openai-front.md#metrics-and-logs) ----------------------------------------------------

# The native routes the front calls, by ``horde.route`` label (bounded: never a request id).
NATIVE_ROUTES = ("submit", "status", "cancel", "models")

NATIVE_CALL_DURATION = histogram(
    "horde.oai.native.duration",
    "Seconds of each call the front makes to the native routes, by route and status class",
    ["horde.route", "horde.status_class"],
    buckets=BUCKETS_SECONDS,
)
"""Native call latency: seconds from sending one native call to its parsed answer (or its failure), recorded by
:class:`horde_oai.horde_client.HordeClient` for every call. ``route``: one of :data:`NATIVE_ROUTES`;
``status_class``: ``2xx`` … ``5xx``, or ``error`` when no HTTP answer came (transport error, timeout). Each
attempt of a retried submit, and the repeat of a status read, is one call."""

REQUEST_BODY_SIZE = histogram(
    "horde.oai.request.body_size",
    "Bytes of each chat completion request body the front read whole",
    buckets=BUCKETS_BODY_BYTES,
)
"""Request body size: bytes of each ``POST /v1/chat/completions`` body the front read whole, recorded once per
request before the body is parsed. No labels. A body refused as too large (413) or left unfinished (408) is not
recorded: it counts on ``horde.oai.requests.refused``."""

QUEUE_WAIT = histogram(
    "horde.oai.queue_wait",
    "Seconds a request the Horde served waited in its queue before a worker took it",
    ["horde.streamed"],
    buckets=BUCKETS_REQUEST_LIFECYCLE_SECONDS,
)
"""Queue wait: seconds from the native request's creation to its generation's assignment to a worker (the first
finished generation's ``queue_wait_seconds`` on the native status), recorded once when a request ends with a
generation. ``streamed``: ``true`` or ``false``, whether the client asked for a stream."""


def status_class(status: int | None) -> str:
    """The ``horde.status_class`` of a native answer: ``2xx`` … ``5xx``, ``error`` for no HTTP answer."""
    if status is None or not 100 <= status <= 599:
        return "error"
    return f"{status // 100}xx"
