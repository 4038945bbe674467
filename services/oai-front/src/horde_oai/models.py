"""``GET /v1/models``: the OpenAI model list from the native chat model list (docs/openai-front.md
#model-cards; docs/native-api.md#model-list)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from horde_oai.errors import OpenAIError
from horde_oai.native_errors import map_native_error
from horde_oai.state import get_state

router = APIRouter()

BASE_PARAMETERS = ("max_tokens", "temperature", "top_p", "stop")
# Features that add the parameter with the same name, in this order.
FEATURE_PARAMETERS = ("seed", "frequency_penalty", "presence_penalty", "reasoning_effort")


def supported_parameters(features: Sequence[str]) -> list[str]:
    """max_tokens, temperature, top_p and stop; then the parameters the chat workers' features add."""
    declared = set(features)
    out = list(BASE_PARAMETERS)
    out += [f for f in FEATURE_PARAMETERS if f in declared]
    if "tools" in declared:
        out += ["tools", "parallel_tool_calls"]
        if "tool_choice_enforced" in declared:
            out.append("tool_choice")
    if declared & {"json_object", "json_schema"}:
        out.append("response_format")
    return out


def build_model_card(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """One OpenAI model card from a native ``/v2/status/models?chat=true`` entry, or None without chat."""
    chat = entry.get("chat")
    if not isinstance(chat, Mapping) or not chat.get("workers"):
        return None
    features = [str(f) for f in chat.get("features") or ()]
    inputs = ["text", "image"] if "vision" in features else ["text"]
    return {
        "id": entry.get("name"),
        "object": "model",
        "created": chat.get("created") or 0,
        "owned_by": "aihorde",
        "name": entry.get("name"),
        "context_length": chat.get("max_context_length"),
        "architecture": {"input_modalities": inputs, "output_modalities": ["text"]},
        "top_provider": {
            "context_length": chat.get("max_context_length"),
            "max_completion_tokens": chat.get("max_length"),
            "is_moderated": False,
        },
        "supported_parameters": supported_parameters(features),
        "x_horde": {
            "workers": chat.get("workers"),
            "features": features,
            "queued": entry.get("queued"),
            "jobs": entry.get("jobs"),
            "eta": entry.get("eta"),
        },
    }


def build_model_list(entries: Any) -> dict[str, Any]:
    """``{"object": "list", "data": [cards]}`` over the entries with online chat workers."""
    cards = []
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, Mapping):
            card = build_model_card(entry)
            if card is not None:
                cards.append(card)
    return {"object": "list", "data": cards}


def chat_entries_by_model(entries: Any) -> dict[str, Mapping[str, Any]]:
    """``{model: chat object}`` from the native chat model list (for the size-limit message)."""
    out: dict[str, Mapping[str, Any]] = {}
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, Mapping) and isinstance(entry.get("chat"), Mapping):
            out[str(entry.get("name"))] = entry["chat"]
    return out


@router.get("/v1/models", response_model=None)
async def list_models(request: Request) -> JSONResponse:
    """The text models at least one online chat worker serves, as OpenAI model cards."""
    response = await get_state(request).horde.chat_models()
    if not response.ok:
        return map_native_error(response.status, response.body, headers=response.headers).response()
    return JSONResponse(build_model_list(response.body))


@router.get("/v1/models/{model_id:path}", response_model=None)
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    """One model card, as ``GET /v1/models`` lists it (the SDK's ``models.retrieve``); model ids may hold
    ``/``. 404 ``model_not_found`` when no online chat worker serves the model."""
    response = await get_state(request).horde.chat_models()
    if not response.ok:
        return map_native_error(response.status, response.body, headers=response.headers).response()
    for card in build_model_list(response.body)["data"]:
        if card["id"] == model_id:
            return JSONResponse(card)
    return OpenAIError(
        404,
        f"The model '{model_id}' does not exist or no online worker serves it with chat.",
        "model_not_found",
        param="model",
        type="invalid_request_error",
    ).response()
