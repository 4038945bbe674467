"""LiteLLM as a client of the horde's OpenAI-compatible front.

LiteLLM's route for an OpenAI-compatible server is the ``openai/`` provider prefix with ``api_base``:
``litellm.completion(model="openai/scripted/echo", api_base=<horde>/v1, api_key=<horde key>, ...)`` (the prefix
is removed: the horde sees ``scripted/echo``). ``LITELLM_LOCAL_MODEL_COST_MAP=True`` keeps LiteLLM from
fetching its model cost map from GitHub at import; it must be set before ``import litellm``.
"""

from __future__ import annotations

import json
import os

# Before `import litellm`, which reads it.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
import pytest
from litellm.types.utils import ChatCompletionMessageToolCall, ModelResponse, ModelResponseStream
from pydantic import BaseModel

from .conftest import Horde

pytestmark = [
    # LiteLLM imports modules lazily on the first completion, whatever the provider (its GitHub Copilot
    # authenticator among them), and builds pydantic schemas of its TypedDicts (_DeviceCode,
    # ChatCompletionThinkingBlock, ...); pydantic warns that their ReadOnly items are not protected from
    # mutation. LiteLLM's own types, nothing a client can change.
    pytest.mark.filterwarnings(
        r"ignore:Items? .* on TypedDict class '\w+' (is|are) using the `ReadOnly` qualifier:UserWarning"
    ),
    # A streamed chunk with usage (stream_options.include_usage) goes through LiteLLM's emptiness check, which
    # reads every attribute of the delta (dir(), then getattr) before skipping the "model_" ones, and pydantic
    # warns on model_fields / model_computed_fields read from an instance.
    pytest.mark.filterwarnings(
        r"ignore:Accessing the 'model_\w+' attribute on the instance is deprecated"
        r":pydantic.warnings.PydanticDeprecatedSince211"
    ),
]

GREETING = "Hello from the scripted backend:"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def route(horde: Horde) -> dict[str, str]:
    """The keyword arguments that send a LiteLLM call to the horde."""
    return {"model": f"openai/{horde.model}", "api_base": horde.front, "api_key": horde.api_key}


@pytest.fixture(autouse=True)
def _quiet_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    # LiteLLM prices every reply from its cost map; for a model it does not know ("scripted/echo" has no
    # provider prefix of its own) it prints a "Provider List: …" banner to stdout, which is noise, not an error.
    monkeypatch.setattr(litellm, "suppress_debug_info", True)


def test_local_cost_map_is_used() -> None:
    # Set before import (module docstring): the packaged map, no request to the internet.
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert litellm.model_cost, "the packaged model cost map is loaded"


def test_completion(route: dict[str, str], horde: Horde) -> None:
    response = litellm.completion(messages=[{"role": "user", "content": "Hello, LiteLLM!"}], **route)

    assert isinstance(response, ModelResponse)
    choice = response.choices[0]
    assert isinstance(choice, litellm.Choices)
    assert choice.message.content == f"{GREETING} Hello, LiteLLM!"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert response.model == horde.model
    assert response.id.startswith("chatcmpl-")
    usage = response.usage  # type: ignore[attr-defined]  # set on a ModelResponse, not declared
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (2, 7, 9)
    # The horde's own fields (request id, kudos, worker) come through as an extra attribute.
    extra = response.x_horde  # type: ignore[attr-defined]
    assert extra["request_id"] == response.id.removeprefix("chatcmpl-")
    assert extra["worker_name"] == "local-reference-worker"
    assert extra["kudos"] > 0


def test_stream(route: dict[str, str]) -> None:
    stream = litellm.completion(
        messages=[{"role": "user", "content": "Stream [[words:8]] [[pace:1]]"}],
        stream=True,
        stream_options={"include_usage": True},
        **route,
    )

    chunks = list(stream)
    assert all(isinstance(c, ModelResponseStream) for c in chunks)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) >= 3, texts  # word-sized pieces, paced by the front: several, whatever the load
    expected = f"{GREETING} Stream alpha bravo charlie delta echo foxtrot golf hotel"
    assert "".join(texts) == expected
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usages = [c.usage for c in chunks if getattr(c, "usage", None)]  # type: ignore[attr-defined]
    assert usages[-1].completion_tokens == len(expected.split())

    # LiteLLM's own reassembly agrees.
    rebuilt = litellm.stream_chunk_builder(chunks)
    assert isinstance(rebuilt, ModelResponse)
    assert rebuilt.choices[0].message.content == expected  # type: ignore[union-attr]


async def test_acompletion_stream(route: dict[str, str]) -> None:
    stream = await litellm.acompletion(
        messages=[{"role": "user", "content": "Async [[words:4]] [[pace:0.5]]"}], stream=True, **route
    )

    texts = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]  # type: ignore[union-attr]
    assert len(texts) >= 3
    assert "".join(texts) == f"{GREETING} Async alpha bravo charlie delta"


def test_tools(route: dict[str, str]) -> None:
    response = litellm.completion(
        messages=[
            {"role": "user", "content": 'Weather in Oslo? [[tool:get_weather:{"city":"Oslo","unit":"c"}]]'}
        ],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        **route,
    )

    assert isinstance(response, ModelResponse)
    choice = response.choices[0]
    assert isinstance(choice, litellm.Choices)
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert isinstance(calls[0], ChatCompletionMessageToolCall)
    assert (calls[0].id, calls[0].type, calls[0].function.name) == ("call_1", "function", "get_weather")
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo", "unit": "c"}


def test_tools_streamed(route: dict[str, str]) -> None:
    stream = litellm.completion(
        messages=[{"role": "user", "content": "Weather? [[tool:get_weather]]"}],
        tools=[WEATHER_TOOL],
        stream=True,
        **route,
    )

    rebuilt = litellm.stream_chunk_builder(list(stream))

    assert isinstance(rebuilt, ModelResponse)
    choice = rebuilt.choices[0]
    assert isinstance(choice, litellm.Choices)
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert isinstance(calls[0], ChatCompletionMessageToolCall)
    assert calls[0].function.name == "get_weather"
    # No arguments in the marker: sampled from the schema (the enum's first member, strings "scripted").
    assert json.loads(calls[0].function.arguments) == {"city": "scripted", "unit": "c"}


def test_response_format_pydantic(route: dict[str, str]) -> None:
    response = litellm.completion(
        messages=[{"role": "user", "content": "Describe a person."}], response_format=Person, **route
    )

    assert isinstance(response, ModelResponse)
    choice = response.choices[0]
    assert isinstance(choice, litellm.Choices)
    assert Person.model_validate_json(choice.message.content or "") == Person(name="scripted", age=0)
