"""Process settings, read from ``HORDE_*`` environment variables (pydantic-settings).

Every service builds one :class:`HordeSettings` in its ``__main__`` (or app factory) and passes it down;
nothing reads the environment at import time. Unset store URLs mean "use the embedded store" to
``make run`` and the test fixtures, which then export the URLs they started.
"""

from __future__ import annotations

import ipaddress

from horde_contract.limits import TEXT_JOB_LEASE_SECONDS
from limits import parse_many
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Upstream's per-address limits of the read and worker routes (docs/native-api.md#rate-limits, flask-limiter
#: notation): status GET/DELETE 60/minute per address, method and path (the path holds the request id); pop
#: and submit 60/second per address; undecorated routes (the worker look-ups) the application default,
#: 90/minute.
STATUS_REQUEST_LIMIT_PER_IP = "60/minute"
POP_REQUEST_LIMIT_PER_IP = "60/second"
SUBMIT_REQUEST_LIMIT_PER_IP = "60/second"
READ_REQUEST_LIMIT_PER_IP = "90/minute"
#: PUT /v2/workers/{id} per address (upstream: 30/minute).
MODIFY_REQUEST_LIMIT_PER_IP = "30/minute"


class HordeSettings(BaseSettings):
    """Settings shared by every Horde Chat process.

    Ports follow README.md#architecture. gRPC targets default to the local ports.
    """

    model_config = SettingsConfigDict(env_prefix="HORDE_", extra="ignore")

    # Stores
    database_url: str = "postgresql://postgres@127.0.0.1:5432/horde"
    redis_url: str = "redis://127.0.0.1:6379/0"
    s3_endpoint_url: str | None = None
    #: S3 credentials. Unset (the default): boto3's own provider chain (``AWS_ACCESS_KEY_ID``/
    #: ``AWS_SECRET_ACCESS_KEY``, a web identity token such as EKS IRSA, a profile, the instance role); set, they
    #: win over the chain. ``make run`` and the tests set the embedded S3's dev credentials.
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    s3_region: str = "us-east-1"
    s3_image_bucket: str = "horde-chat-images"
    s3_messages_bucket: str | None = None
    secret_key: str = "horde-chat-dev-salt"
    db_pool_min_size: int = 1
    db_pool_max_size: int = 10
    #: asyncpg's per-connection prepared statement cache (its ``statement_cache_size``; asyncpg's default,
    #: 100). 0 behind a transaction-mode pooler (PgBouncer ``pool_mode=transaction``): every statement is then
    #: an unnamed one, re-parsed each time, so none is looked up on a server connection that never saw it.
    database_statement_cache_size: int = Field(default=100, ge=0)

    # Network: every process binds loopback by default (k8s sets 0.0.0.0).
    bind_host: str = "127.0.0.1"
    #: Trusted proxies (comma-separated addresses or networks, e.g. "10.244.0.0/16"; "*" trusts every peer):
    #: a request from one of them is counted by the client address its X-Forwarded-For names (uvicorn's
    #: proxy headers, right-most untrusted entry), any other by its peer address. Empty (the default) trusts
    #: nobody, so no client can choose the address its rate limits, caps and worker IP checks count.
    forwarded_allow_ips: str = ""
    oai_http_port: int = 7002
    admission_http_port: int = 7101
    dispatch_http_port: int = 7102
    dispatch_grpc_port: int = 7202
    submit_http_port: int = 7103
    submit_grpc_port: int = 7203
    janitor_http_port: int = 7104
    dispatch_grpc_target: str | None = None
    submit_grpc_target: str | None = None
    #: gRPC servers close each client connection after this many seconds (plus the grace for the calls in
    #: flight on it); the client reconnects and re-resolves its target, so replicas added by a scale-up get
    #: calls within one age (horde_core.grpc, docs/operator-guide.md#scaling).
    grpc_max_connection_age_seconds: float = 30.0
    grpc_max_connection_age_grace_seconds: float = 10.0

    # Rate limits of the read and worker routes (horde_core.ratelimit.ROUTE_LIMITS), shared by every replica
    # through Redis; flask-limiter notation, several limits joined by ";". Off: nothing is counted.
    rate_limits_enabled: bool = True
    status_request_limit_per_ip: str = STATUS_REQUEST_LIMIT_PER_IP
    pop_request_limit_per_ip: str = POP_REQUEST_LIMIT_PER_IP
    #: Submit and progress posts, each route counted on its own.
    submit_request_limit_per_ip: str = SUBMIT_REQUEST_LIMIT_PER_IP
    #: Worker look-ups (GET /v2/workers...).
    read_request_limit_per_ip: str = READ_REQUEST_LIMIT_PER_IP
    #: Worker changes (PUT /v2/workers/{id}).
    modify_request_limit_per_ip: str = MODIFY_REQUEST_LIMIT_PER_IP
    #: The longest a rate-limit check waits on Redis; past it (or on any store error) the request is let
    #: through: a hung or lost store never takes a route down with it.
    rate_limit_timeout_seconds: float = Field(default=0.5, gt=0)

    #: Requests one process works on at once; past it a request is answered 503 ServiceAtCapacity with
    #: Retry-After at once (horde_core.capacity). 0: no cap. Long-polled pops do not count while they wait.
    max_in_flight_requests: int = Field(default=256, ge=0)

    # Behaviour
    chat_admission_enabled: bool = True
    log_level: str = "INFO"
    log_json: bool = True
    shutdown_grace_seconds: float = 10.0
    # The longest a client may take to send a request body; slower is 408 RequestBodyTimeout, so a stalled
    # upload cannot hold a connection and its buffer forever.
    body_read_timeout_seconds: float = Field(default=60.0, gt=0)
    janitor_interval_seconds: float = Field(default=60.0, gt=0)
    #: The job lease in seconds (docs/native-api.md#job-lease): the pop's ``ttl`` and the ``job_ttl`` it writes, the stream
    #: lease's expiry from it, and what a renewing progress post extends the lease to from the post. The
    #: spec's value is the default; tests shorten it to watch a lease lapse or be renewed. The speed gate keeps
    #: the contract's constant.
    text_job_lease_seconds: int = Field(default=TEXT_JOB_LEASE_SECONDS, ge=1)
    #: A local JSON file in the upstream text model reference's db.json format, read once at process start
    #: (horde_store.model_reference). Unset or empty: an empty reference, so a model is known only when an
    #: online chat worker serves it and every model prices as unknown.
    text_model_reference: str | None = None

    @field_validator(
        "status_request_limit_per_ip",
        "pop_request_limit_per_ip",
        "submit_request_limit_per_ip",
        "read_request_limit_per_ip",
    )
    @classmethod
    def _check_limits(cls, value: str) -> str:
        """Limits in flask-limiter notation (``"60/minute"``, ``;``-joined): a typo stops the process at start
        rather than failing every limited request."""
        try:
            if not parse_many(value):
                raise ValueError(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a rate limit such as '60/minute' or '2/second;90/minute'"
            ) from None
        return value

    @field_validator("s3_access_key_id", "s3_secret_access_key")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        """An empty key (a Secret holding ``""``) is no key: boto3's chain is used, not empty credentials."""
        return value or None

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _check_forwarded_allow_ips(cls, value: str) -> str:
        """Each entry an IP address or network (or ``*``): uvicorn would silently treat a typo as a literal
        that never matches, leaving the proxy untrusted, or trust more than meant."""
        entries = [e.strip() for e in value.split(",") if e.strip()]
        for entry in entries:
            if entry == "*":
                continue
            try:
                if "/" in entry:
                    ipaddress.ip_network(entry, strict=False)
                else:
                    ipaddress.ip_address(entry)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return ",".join(entries)

    def trusted_proxies(self) -> list[str]:
        """The trusted proxy entries of :attr:`forwarded_allow_ips` (empty: trust nobody)."""
        return [e for e in self.forwarded_allow_ips.split(",") if e]

    def dispatch_target(self) -> str:
        """gRPC target of dispatch's WorkerPoolService: ``host:port``, ``dns:///name:port`` or
        ``ipv4:a:p1,b:p2`` (every replica, balanced per call: horde_core.grpc)."""
        return self.dispatch_grpc_target or f"127.0.0.1:{self.dispatch_grpc_port}"

    def submit_target(self) -> str:
        """gRPC target of submit's SettlementService (forms as :meth:`dispatch_target`)."""
        return self.submit_grpc_target or f"127.0.0.1:{self.submit_grpc_port}"

    @property
    def messages_bucket(self) -> str:
        """The bucket offloaded messages go to; the image bucket unless set (docs/native-api.md#messages-offload)."""
        return self.s3_messages_bucket or self.s3_image_bucket
