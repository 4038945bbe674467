"""Response models, as serialized, for the OpenAPI description (the handlers build plain dicts)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class FunctionCall(BaseModel):
    name: str = Field(description="The function's name.")
    arguments: str = Field(description="The arguments as a JSON string, as the worker submitted them.")


class ToolCall(BaseModel):
    id: str = Field(description="The call id, as minted by the worker's backend.")
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="The reply text; null only when the reply is tool calls alone.")
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="Present only when the worker made calls."
    )
    reasoning_content: str | None = Field(
        default=None,
        description="The model's reasoning, separate from content; omitted under horde.include_reasoning false.",
    )


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length", "content_filter", "tool_calls"]
    native_finish_reason: str | None = Field(default=None, description="The backend's own finish reason.")


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="Reported by the worker, or estimated from the reasoning text.")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = Field(description="Includes reasoning, reply text and tool calls.")
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None


class HordeCompletionInfo(BaseModel):
    request_id: str = Field(description="The native chat request id.")
    kudos: float | None = Field(default=None, description="Kudos the request consumed.")
    worker_id: str | None = None
    worker_name: str | None = None
    context_adjustments: list[dict[str, Any]] | None = Field(
        default=None, description="The Horde's changes to the context or completion limit; omitted when none."
    )
    notice: str | None = Field(
        default=None, description="Set for a reply without visible text or tool calls."
    )
    estimated_usage: bool | None = Field(default=None, description="True when a usage count is an estimate.")


class ChatCompletionResponse(BaseModel):
    id: str = Field(description="`chatcmpl-<native request id>`.")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(description="The model that served the request.")
    system_fingerprint: str | None = Field(
        description="`fp_` + 10 hex of the worker and model; null without."
    )
    choices: list[Choice]
    usage: Usage
    x_horde: HordeCompletionInfo


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: None = None
    finish_reason: str | None = None
    native_finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChunkChoice]
    usage: Usage | None = None
    x_horde: HordeCompletionInfo | None = None


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None = Field(description="The Horde return code or the front's error code.")
    metadata: dict[str, Any] | None = Field(
        default=None, description="request_id of a cancelled request, rc, kudos_estimate, retry_after, ..."
    )


class OpenAIErrorEnvelope(BaseModel):
    error: OpenAIErrorBody


class ModelArchitecture(BaseModel):
    input_modalities: list[str]
    output_modalities: list[str]


class TopProvider(BaseModel):
    context_length: int | None
    max_completion_tokens: int | None
    is_moderated: bool


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(
        description="Unix seconds of the earliest online chat worker's creation; 0 if unknown."
    )
    owned_by: str
    name: str
    context_length: int | None = Field(description="The largest context an online chat worker declares.")
    architecture: ModelArchitecture
    top_provider: TopProvider
    supported_parameters: list[str]
    x_horde: dict[str, Any] = Field(description="Worker count, declared features and the queued work.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
