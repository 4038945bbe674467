"""Settings of the OpenAI-compatible front (``HORDE_OAI_*`` beside the shared ``HORDE_*``).

See docs/openai-front.md (budgets, grace, cancel retries); README.md#architecture (the front talks to admission over HTTP
and reads Redis for signals).
"""

from __future__ import annotations

from horde_core.settings import HordeSettings
from pydantic import Field


class OaiSettings(HordeSettings):
    """Front settings. Every field reads ``HORDE_<FIELD>``, so ``oai_horde_url`` is ``HORDE_OAI_HORDE_URL``."""

    # The horde the front forwards to: the native routes live under ``<oai_horde_url>/v2/...``.
    oai_horde_url: str = "http://127.0.0.1:7101/api"
    # Redis for completion signals (pub/sub reaches any logical db, so only the host matters).
    # None means HORDE_REDIS_URL; an empty string runs without Redis (status polling only).
    oai_redis_url: str | None = None
    # Seconds between status re-reads while waiting for a signal (also the done-without-generation recheck).
    oai_signal_recheck_seconds: float = Field(default=5.0, gt=0)
    # Budget of a non-streamed request, from submit to the completion (spec: 408 ChatRequestTimeout). It ends
    # before the OpenAI SDKs' default 600 s timeout, so a client gets the front's 408 (request cancelled)
    # rather than timing out on its own and retrying into a second request.
    oai_nonstream_timeout_seconds: float = Field(default=540.0, gt=0)
    # Budget of a streamed request.
    oai_stream_timeout_seconds: float = Field(default=600.0, gt=0)
    # How long a request the status reports impossible (no declaration gap) may wait for a worker.
    oai_fail_fast_grace_seconds: float = Field(default=30.0, ge=0)
    # Seconds between SSE keepalive comments on a stream.
    oai_stream_keepalive_seconds: float = Field(default=10.0, gt=0)
    # Timeout of one native HTTP call.
    oai_native_timeout_seconds: float = Field(default=30.0, gt=0)
    # Retries of a native submit that failed in transport or with a 5xx (safe: the operation key dedupes).
    oai_submit_retries: int = Field(default=2, ge=0)
    # Seconds between retries of a cancel that failed.
    oai_cancel_retry_seconds: float = Field(default=30.0, gt=0)
    # Logical database of the progress streams (the chat signal database, where the horde writes them).
    oai_stream_redis_db: int = Field(default=7, ge=0)
    # Pacing of relayed deltas (docs/openai-front.md#streaming): the longest window a delta's pieces are spread
    # over (0 sends each delta as it arrives).
    oai_delta_pacing_max_window_seconds: float = Field(default=2.0, ge=0)
    # The most pieces per second of a paced window.
    oai_delta_pacing_max_chunks_per_second: float = Field(default=20.0, gt=0)
    # How long a dropped relayed stream waits for its client to resume it (Last-Event-ID) before the front
    # cancels the request. 0 cancels at once.
    oai_stream_resume_grace_seconds: float = Field(default=3.0, ge=0)
    # How long the request of a client that left waits for a retry of the same call
    # (docs/openai-front.md#retries-and-idempotency) before the front cancels it. The OpenAI SDKs retry a
    # dropped connection within 0.5 to 8 s.
    # Needs Redis; 0 cancels at once.
    oai_retry_grace_seconds: float = Field(default=10.0, ge=0)
    # Largest body the front reads (the native MAX_CHAT_BODY_BYTES); larger returns 413.
    oai_max_body_bytes: int = Field(default=36 * 1024 * 1024, gt=0)

    # In-flight chat completions per process in total (503 FrontAtCapacity past it).
    oai_max_in_flight: int = Field(default=1024, gt=0)
    # In-flight chat completions per process from one client address (503 FrontAtCapacity past it).
    oai_max_in_flight_per_address: int = Field(default=64, gt=0)
    # A proxy passkey the horde knows (its HORDE_PROXY_PASSKEYS): the native submit then carries the client's
    # address, so each client gets its own per-address rate limits instead of sharing the front's.
    oai_proxy_passkey: str | None = None

    def front_redis_url(self) -> str | None:
        """The Redis URL signals are read from, or None when the front runs without Redis."""
        if self.oai_redis_url is None:
            return self.redis_url
        return self.oai_redis_url or None
