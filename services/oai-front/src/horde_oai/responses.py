"""Response models, as serialized, for the OpenAPI description (the handlers build plain dicts).

Each field's docstring is its description in the document (use_attribute_docstrings), public text for API users,
as in :mod:`horde_oai.schema`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Documented(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)


class FunctionCall(_Documented):
    """The function a tool call calls."""

    name: str
    """The function's name."""

    arguments: str
    """The arguments as a JSON string, as the worker submitted them."""


class ToolCall(_Documented):
    """One tool call of the reply."""

    id: str
    """The call id, as minted by the worker's backend."""

    type: Literal["function"] = "function"
    """Always `function`."""

    function: FunctionCall
    """The function and its arguments."""


class AssistantMessage(_Documented):
    """The reply."""

    role: Literal["assistant"] = "assistant"
    """Always `assistant`."""

    content: str | None
    """The reply text. Always present; null only when the worker returned tool calls without text."""

    tool_calls: list[ToolCall] | None = None
    """Present only when the worker made calls."""

    reasoning_content: str | None = None
    """The model's reasoning, separate from `content`, when the worker returned any; omitted under
    `horde.include_reasoning: false`."""


class Choice(_Documented):
    """One choice; the AI Horde returns one."""

    index: int
    """Always 0."""

    message: AssistantMessage
    """The assistant's reply."""

    logprobs: None = None
    """Always null: the AI Horde does not return log probabilities."""

    finish_reason: Literal["stop", "length", "content_filter", "tool_calls"]
    """Why the reply ended."""

    native_finish_reason: str | None
    """The finish reason the worker's backend reported, as it reported it; null when the worker gave none."""


class CompletionTokensDetails(_Documented):
    """A breakdown of the completion tokens."""

    reasoning_tokens: int
    """Reported by the worker, or estimated from the reasoning text (then `x_horde.estimated_usage` is true)."""


class Usage(_Documented):
    """Token counts. Informational: the AI Horde charges kudos on the measured reply."""

    prompt_tokens: int
    """Reported by the worker, or estimated from the messages."""

    completion_tokens: int
    """Includes reasoning, reply text and tool calls."""

    total_tokens: int
    """prompt_tokens plus completion_tokens."""

    completion_tokens_details: CompletionTokensDetails | None = None
    """Present when the reply has reasoning or the worker reported a reasoning count."""


class HordeCompletionInfo(_Documented):
    """AI Horde details of the completion."""

    request_id: str
    """The native chat request id."""

    kudos: float | None = None
    """Kudos the request consumed."""

    worker_id: str | None = None
    """The id of the worker that served the request."""

    worker_name: str | None = None
    """The name of the worker that served the request."""

    context_adjustments: list[dict[str, Any]] | None = None
    """The AI Horde's changes to the context or completion limit, as the native status lists them; omitted when
    none."""

    notice: str | None = None
    """Set for a reply without visible text or tool calls."""

    estimated_usage: bool | None = None
    """True when a usage count is an estimate."""


class ChatCompletionResponse(_Documented):
    """A chat completion."""

    id: str
    """`chatcmpl-<native request id>`."""

    object: Literal["chat.completion"] = "chat.completion"
    """Always `chat.completion`."""

    created: int
    """Unix seconds."""

    model: str
    """The model that served the request."""

    system_fingerprint: str | None
    """`fp_` and 10 hex digits derived from the worker and model; null when the worker is unknown."""

    choices: list[Choice]
    """One choice."""

    usage: Usage
    """Token counts."""

    x_horde: HordeCompletionInfo
    """AI Horde details."""


class ChunkDelta(_Documented):
    """What a chunk adds to the reply."""

    role: Literal["assistant"] | None = None
    """`assistant` on the first chunk."""

    content: str | None = None
    """Reply text."""

    reasoning_content: str | None = None
    """Reasoning text."""

    tool_calls: list[dict[str, Any]] | None = None
    """Every tool call whole, each with its 0-based `index`, in one chunk without content."""


class ChunkChoice(_Documented):
    """The choice of a chunk."""

    index: int
    """Always 0."""

    delta: ChunkDelta
    """What the chunk adds; `{}` on the finish chunk."""

    logprobs: None = None
    """Always null."""

    finish_reason: str | None = None
    """Set on the finish chunk only."""

    native_finish_reason: str | None = None
    """On the finish chunk: the finish reason the worker's backend reported, or null when it gave none."""


class ChatCompletionChunk(_Documented):
    """One server-sent event of a streamed completion (`data: <chunk>`); the stream ends with `data: [DONE]`."""

    id: str
    """The same on every chunk of a stream."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    """Always `chat.completion.chunk`."""

    created: int
    """Unix seconds."""

    model: str
    """The model that served the request."""

    system_fingerprint: str | None
    """The same on every chunk of a stream."""

    choices: list[ChunkChoice]
    """One choice; empty on the usage chunk."""

    usage: Usage | None = None
    """Set only on the last chunk before `data: [DONE]` under `stream_options.include_usage`."""

    x_horde: HordeCompletionInfo | None = None
    """AI Horde details, on the finish chunk."""


class OpenAIErrorBody(_Documented):
    """An error, in OpenAI's shape."""

    message: str
    """What went wrong."""

    type: str
    """OpenAI's error type, such as `invalid_request_error` or `api_error`."""

    param: str | None
    """The request path the error is about, or null."""

    code: str | None
    """The AI Horde's return code, passed through, or the front's error code."""

    metadata: dict[str, Any] | None = None
    """Extra details: the `request_id` of a cancelled request, `rc`, `kudos_estimate`, `retry_after`, ..."""


class OpenAIErrorEnvelope(_Documented):
    """An error response, or an SSE error event after a stream's headers."""

    error: OpenAIErrorBody
    """The error."""


class ModelArchitecture(_Documented):
    """What the model takes and returns."""

    input_modalities: list[str]
    """`text`, and `image` when a worker serving the model declares vision."""

    output_modalities: list[str]
    """`text`."""


class TopProvider(_Documented):
    """The largest limits an online worker serving the model declares."""

    context_length: int | None
    """The largest declared context length."""

    max_completion_tokens: int | None
    """The largest declared completion limit."""

    is_moderated: bool
    """Always false."""


class ModelCard(_Documented):
    """A model with at least one online chat worker."""

    id: str
    """The model id; it may hold `/`."""

    object: Literal["model"] = "model"
    """Always `model`."""

    created: int
    """Unix seconds of the earliest online chat worker's creation; 0 if unknown."""

    owned_by: str
    """Always `aihorde`."""

    name: str
    """The model id."""

    context_length: int | None
    """The largest context an online chat worker declares."""

    architecture: ModelArchitecture
    """Input and output modalities."""

    top_provider: TopProvider
    """The largest declared limits."""

    supported_parameters: list[str]
    """The request parameters the model's online workers support."""

    x_horde: dict[str, Any]
    """Worker count, declared features and the queued work."""


class ModelList(_Documented):
    """The models with at least one online chat worker."""

    object: Literal["list"] = "list"
    """Always `list`."""

    data: list[ModelCard]
    """The model cards."""
