"""Process settings, read from ``HORDE_*`` environment variables (pydantic-settings).

Every service builds one :class:`HordeSettings` in its ``__main__`` (or app factory) and passes it down;
nothing reads the environment at import time. Unset store URLs mean "use the embedded store" to
``make run`` and the test fixtures, which then export the URLs they started.
"""

from __future__ import annotations

from horde_contract.limits import TEXT_JOB_LEASE_SECONDS
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class HordeSettings(BaseSettings):
    """Settings shared by every Horde Chat process.

    Ports follow ARCHITECTURE.md ("Local stack and ports"). gRPC targets default to the local ports.
    """

    model_config = SettingsConfigDict(env_prefix="HORDE_", extra="ignore")

    # Stores
    database_url: str = "postgresql://postgres@127.0.0.1:5432/horde"
    redis_url: str = "redis://127.0.0.1:6379/0"
    s3_endpoint_url: str | None = None
    s3_access_key_id: str = "horde"
    s3_secret_access_key: str = "horde-secret"
    s3_region: str = "us-east-1"
    s3_image_bucket: str = "horde-chat-images"
    s3_messages_bucket: str | None = None
    secret_key: str = "horde-chat-dev-salt"
    db_pool_min_size: int = 1
    db_pool_max_size: int = 10

    # Network: every process binds loopback by default (k8s sets 0.0.0.0).
    bind_host: str = "127.0.0.1"
    oai_http_port: int = 7002
    admission_http_port: int = 7101
    dispatch_http_port: int = 7102
    dispatch_grpc_port: int = 7202
    submit_http_port: int = 7103
    submit_grpc_port: int = 7203
    janitor_http_port: int = 7104
    dispatch_grpc_target: str | None = None
    submit_grpc_target: str | None = None

    # Behaviour
    chat_admission_enabled: bool = True
    log_level: str = "INFO"
    log_json: bool = True
    shutdown_grace_seconds: float = 10.0
    # The longest a client may take to send a request body; slower is 408 RequestBodyTimeout, so a stalled
    # upload cannot hold a connection and its buffer forever.
    body_read_timeout_seconds: float = Field(default=60.0, gt=0)
    janitor_interval_seconds: float = Field(default=60.0, gt=0)
    #: The job lease in seconds (spec: Job lease): the pop's ``ttl`` and the ``job_ttl`` it writes, the stream
    #: lease's expiry from it, and what a renewing progress post extends the lease to from the post. The
    #: spec's value is the default; tests shorten it to watch a lease lapse or be renewed. The speed gate keeps
    #: the contract's constant.
    text_job_lease_seconds: int = Field(default=TEXT_JOB_LEASE_SECONDS, ge=1)
    #: A local JSON file in the upstream text model reference's db.json format, read once at process start
    #: (horde_store.model_reference). Unset or empty: an empty reference, so a model is known only when an
    #: online chat worker serves it and every model prices as unknown.
    text_model_reference: str | None = None

    def dispatch_target(self) -> str:
        """gRPC target of dispatch's WorkerPoolService (``host:port``)."""
        return self.dispatch_grpc_target or f"127.0.0.1:{self.dispatch_grpc_port}"

    def submit_target(self) -> str:
        """gRPC target of submit's SettlementService (``host:port``)."""
        return self.submit_grpc_target or f"127.0.0.1:{self.submit_grpc_port}"

    @property
    def messages_bucket(self) -> str:
        """The bucket offloaded messages go to; the image bucket unless set (spec: Messages offload)."""
        return self.s3_messages_bucket or self.s3_image_bucket
