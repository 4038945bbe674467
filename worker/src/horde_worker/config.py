"""Worker settings: command-line flags and ``HORDE_WORKER_*`` environment variables (pydantic-settings).

Flags win over the environment, which wins over the defaults. Every field is a flag in kebab case
(``--api-key``, ``--max-context-length``) and an env variable in upper case (``HORDE_WORKER_API_KEY``). Lists
(``models``, ``features``, ``disable-features``) take comma-separated values in both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from horde_contract.limits import MAX_POP_WAIT_SECONDS
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, CliApp, NoDecode, SettingsConfigDict

#: The local stack's dispatch and submit (README.md#architecture), used when no horde URL is set.
LOCAL_DISPATCH_URL = "http://127.0.0.1:7102"
LOCAL_SUBMIT_URL = "http://127.0.0.1:7103"

CsvList = Annotated[list[str], NoDecode]


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            import json

            return json.loads(value)
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list):
        out: list[str] = []
        for v in value:
            out.extend(_split_csv(v) if isinstance(v, str) else [v])
        return out
    return value


class WorkerSettings(BaseSettings):
    """Settings of one worker process."""

    model_config = SettingsConfigDict(
        env_prefix="HORDE_WORKER_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="horde-worker",
        extra="ignore",
        populate_by_name=True,
    )

    api_key: str = Field(
        "0000000000", description="API key of the worker's owner (sent as the apikey header)"
    )
    name: str = Field("horde-chat-worker", description="Worker name; unique per owner")
    horde_url: str | None = Field(
        None, description="Horde base URL serving /api/v2/...; pop and submit default to it"
    )
    dispatch_url: str | None = Field(
        None,
        description=f"Base URL for POST /api/v2/generate/text/pop (default horde_url, else {LOCAL_DISPATCH_URL})",
    )
    submit_url: str | None = Field(
        None,
        description=f"Base URL for POST /api/v2/generate/text/submit (default horde_url, else {LOCAL_SUBMIT_URL})",
    )
    models: CsvList = Field(default_factory=list, description="Models to serve; default [model_id]")
    model_id: str | None = Field(
        None,
        description="Model chat jobs are served with; one of models (default: models[0], else the backend's)",
    )
    threads: int = Field(1, ge=1, le=50, description="Concurrent jobs: one pop loop per thread")
    prompt_jobs: bool = Field(True, description="Also accept legacy text (prompt) jobs")
    pop_wait_seconds: float = Field(
        10.0,
        ge=0,
        le=MAX_POP_WAIT_SECONDS,
        description=(
            f"Long-poll: seconds (at most {MAX_POP_WAIT_SECONDS}) dispatch may hold an empty pop until a job "
            "is queued (the pop's wait_seconds); 0 disables it and backs off 1/2/3 s after empty pops"
        ),
    )
    backend: Literal["scripted", "openai", "llamacpp"] = Field("scripted", description="Generator kind")
    backend_url: str = Field(
        "http://127.0.0.1:8080", description="openai backend: server base URL (with or without /v1)"
    )
    backend_model: str | None = Field(
        None, description="openai backend: model name sent to the server (discovered)"
    )
    backend_api_key: str | None = Field(None, description="openai backend: bearer token for the server")
    openai_flavor: Literal[
        "auto", "koboldcpp", "llama-server", "vllm", "ollama", "llama-cpp-python", "generic"
    ] = Field("auto", description="openai backend: server kind, probed when auto")
    model_path: str | None = Field(
        None, description="llamacpp backend: GGUF path (default: the gemma3-270m package)"
    )
    llama_threads: int | None = Field(
        None, ge=1, description="llamacpp backend: CPU threads (default llama.cpp's)"
    )
    seed: int = Field(42, description="llamacpp backend: seed when a job sends none")
    max_length: int = Field(512, ge=1, description="Largest output in tokens")
    max_context_length: int = Field(2048, ge=16, description="Largest context (prompt + output) in tokens")
    features: CsvList = Field(
        default_factory=list, description="Replace the computed chat_features (operator's responsibility)"
    )
    disable_features: CsvList = Field(default_factory=list, description="Remove values from chat_features")
    bridge_url: str = Field("horde-chat", description="The url part of bridge_agent")
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Serve /metrics and /healthz on this port; 0 disables"
    )
    metrics_host: str = Field("127.0.0.1", description="Address for the metrics server")
    progress: bool = Field(
        True, description="Stream: post progress for chat jobs carrying the stream hint (stream_progress)"
    )
    progress_interval: float = Field(
        1.0, gt=0, description="Seconds between progress posts of a streamed job (deltas merged in between)"
    )
    shutdown_grace: float = Field(
        30.0, ge=0, description="Seconds a held job may still finish after SIGTERM before it is faulted"
    )
    messages_url: bool = Field(
        False,
        description="Declare the messages_url transport: offloaded messages arrive as a URL the worker fetches "
        "(plain or gzip, 36 MiB cap) instead of inline",
    )
    log_level: str = Field("INFO", description="Logging level")

    @field_validator("models", "features", "disable_features", mode="before")
    @classmethod
    def _csv(cls, value: Any) -> Any:
        return _split_csv(value)

    @model_validator(mode="after")
    def _defaults(self) -> WorkerSettings:
        if self.horde_url:
            self.horde_url = self.horde_url.rstrip("/")
        self.dispatch_url = (self.dispatch_url or self.horde_url or LOCAL_DISPATCH_URL).rstrip("/")
        self.submit_url = (self.submit_url or self.horde_url or LOCAL_SUBMIT_URL).rstrip("/")
        if self.model_id is None and self.models:
            self.model_id = self.models[0]
        if self.model_id is not None and self.model_id not in self.models:
            self.models = [self.model_id, *self.models]
        return self


def load_settings(argv: list[str] | None = None) -> WorkerSettings:
    """Settings from ``argv`` flags (``None``: no flags) over ``HORDE_WORKER_*`` env over defaults.

    Raises ``SystemExit`` on bad flags (with a usage message), ``pydantic.ValidationError`` on bad values.
    """
    return CliApp.run(WorkerSettings, cli_args=argv or [])
