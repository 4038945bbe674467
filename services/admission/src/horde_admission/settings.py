"""Admission settings: the shared ``HORDE_*`` settings plus the admission stage's own knobs.

Each field reads ``HORDE_<FIELD NAME IN CAPITALS>`` (e.g. ``HORDE_CHAT_REQUEST_2SEC_LIMIT_PER_IP``), the names
the spec gives (docs/native-api.md#rate-limits, #free-output-allowance).
"""

from __future__ import annotations

import horde_contract as contract
from horde_contract.moderation import ReplacementFilter
from horde_core.settings import HordeSettings
from pydantic import Field, field_validator

#: The text submit route's per-address limits, which the chat limits follow when unset (docs/native-api.md#rate-limits).
TEXT_REQUEST_2SEC_LIMIT = "2/second"
TEXT_REQUEST_90MIN_LIMIT = "90/minute"


class AdmissionSettings(HordeSettings):
    """Settings of the admission process."""

    # Rate limits (docs/native-api.md#rate-limits), in flask-limiter notation such as "5/second;300/minute".
    rate_limits_enabled: bool = True
    chat_request_2sec_limit_per_ip: str | None = None
    chat_request_90min_limit_per_ip: str | None = None
    text_request_2sec_limit_per_ip: str = TEXT_REQUEST_2SEC_LIMIT
    text_request_90min_limit_per_ip: str = TEXT_REQUEST_90MIN_LIMIT
    #: Whitelisted service addresses get these instead (docs/native-api.md#rate-limits).
    whitelisted_request_limits: str = "10/second;300/minute"
    #: Per API key (docs/native-api.md#rate-limits); the anonymous key and whitelisted addresses get the second.
    apikey_request_limit: str = "2/second"
    apikey_whitelisted_request_limit: str = "60/second"
    whitelisted_service_ips: list[str] = Field(default_factory=list)
    #: Proxy passkeys: a request carrying one in Proxy-Authorization is counted by its Proxied-For address.
    proxy_passkeys: list[str] = Field(default_factory=list)

    # Free output allowance (docs/native-api.md#free-output-allowance).
    text_free_output_ceiling: int = 4096
    text_free_output_floor: int = 512
    text_free_output_wait_full_seconds: float = 60.0
    text_free_output_wait_floor_seconds: float = 300.0
    upfront_kudos_on_workerlist: bool = False

    # Availability from dispatch's WorkerPool.
    availability_timeout_seconds: float = 5.0
    #: How long a request's availability (is_possible, eligible threads, impossible_reason) is cached for its
    #: status (docs/native-api.md#impossible-reason, 60 seconds). 0 disables the cache.
    availability_cache_seconds: float = 60.0
    #: How long the legacy text route reuses an availability answer for the same needs (it only
    #: picks the "no available workers" warning and the free allowance's wait). 0 asks dispatch every time.
    text_availability_memo_seconds: float = 1.0
    #: How long a status read reuses a request's queue position and the work ahead of it (an estimate that
    #: costs a count over the queue ahead). 0 reads it every time.
    status_queue_memo_seconds: float = 1.0
    #: How long a new request's free allowance reuses the queued work its eligible workers could take (an
    #: estimate of the wait that costs a sum over the queue). 0 reads it every time.
    competing_queue_memo_seconds: float = 1.0
    #: Timeout of a SettlementService call made by the cancel route.
    settlement_timeout_seconds: float = 5.0

    # Images: fetch private addresses too (local development and tests only; docs/native-api.md#images).
    image_fetch_allow_private: bool = False

    # Messages offload (docs/native-api.md#messages-offload); the bucket is HordeSettings' s3_messages_bucket
    # (the spec's R2_CHAT_MESSAGES_BUCKET), which dispatch and the janitor read too.
    chat_messages_offload_enabled: bool = False
    #: The largest messages size, bytes, that stays inline: the compact JSON a base64 worker would receive.
    chat_messages_offload_bytes: int = Field(default=contract.CHAT_MESSAGES_OFFLOAD_BYTES_DEFAULT, ge=0)
    #: Store the body gzipped (Content-Encoding: gzip) when that is smaller.
    chat_messages_offload_gzip: bool = False

    # Operator controls (docs/operator-guide.md#operator-controls).
    #: How long a process reuses its read of the maintenance mode row (0: read on every submission).
    modes_cache_seconds: float = Field(default=1.0, ge=0)
    #: The moderation replacement filter's rules, a JSON list of [RE2 pattern, replacement] pairs applied in
    #: order, case-insensitively; unset: horde_contract.moderation.DEFAULT_REPLACEMENT_RULES.
    moderation_replacements: list[tuple[str, str]] | None = None

    @field_validator("moderation_replacements")
    @classmethod
    def _rules_compile(cls, rules: list[tuple[str, str]] | None) -> list[tuple[str, str]] | None:
        """A rule RE2 does not take stops the process at start rather than at the first flagged request."""
        if rules is not None:
            ReplacementFilter(rules)
        return rules

    # Requests.
    request_ttl_seconds: int = 1200
    horde_tax: float = 1.0

    def chat_limits_per_ip(self) -> str:
        """The chat route's per-address limits, ``;``-joined (each follows the text limit when unset)."""
        two_sec = self.chat_request_2sec_limit_per_ip or self.text_request_2sec_limit_per_ip
        ninety = self.chat_request_90min_limit_per_ip or self.text_request_90min_limit_per_ip
        return f"{two_sec};{ninety}"

    def text_limits_per_ip(self) -> str:
        """The text route's per-address limits, ``;``-joined."""
        return f"{self.text_request_2sec_limit_per_ip};{self.text_request_90min_limit_per_ip}"
