"""LangChain's OpenAI chat model (langchain-openai) against the horde's OpenAI-compatible front.

Pointed at the horde as at any OpenAI-compatible server: ``ChatOpenAI(base_url=<horde>/v1, api_key=<horde key>,
model="scripted/echo")``. The scripted worker's replies are deterministic: an echo after its greeting, a tool
call on a ``[[tool:NAME:{json}]]`` marker, a JSON value sampled from the response schema (strings
``"scripted"``, integers their minimum, arrays their ``minItems`` items).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from .conftest import Horde

GREETING = "Hello from the scripted backend:"
FILLER = "alpha bravo charlie delta echo foxtrot golf hotel india juliett"


class Person(BaseModel):
    """A person to describe."""

    name: str = Field(description="the person's name")
    age: int = Field(ge=18, description="age in years")
    languages: list[str] = Field(min_length=2, description="languages spoken")


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """The current weather in a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def llm(horde: Horde) -> ChatOpenAI:
    # No retries: a failure shows at once instead of being hidden behind the SDK's backoff.
    return ChatOpenAI(
        base_url=horde.front, api_key=horde.api_key, model=horde.model, max_retries=0, timeout=120
    )


def _joined(chunks: Iterable[BaseMessage]) -> AIMessageChunk:
    """The chunks added up as LangChain does (content concatenated, tool call chunks merged, usage summed)."""
    parts = list(chunks)
    ai = [p for p in parts if isinstance(p, AIMessageChunk)]
    assert ai and len(ai) == len(parts), parts
    whole = ai[0]
    for part in ai[1:]:
        whole = whole + part
    return whole


def test_invoke_returns_the_reply_with_usage_and_metadata(llm: ChatOpenAI, horde: Horde) -> None:
    reply = llm.invoke("Hello, LangChain!")

    assert isinstance(reply, AIMessage)
    assert reply.content == f"{GREETING} Hello, LangChain!"
    assert reply.tool_calls == []
    assert reply.response_metadata["finish_reason"] == "stop"
    assert reply.response_metadata["model_name"] == horde.model
    assert str(reply.response_metadata["id"]).startswith("chatcmpl-")
    # The scripted backend counts whitespace-separated words: 2 prompt words, 7 reply words.
    assert reply.usage_metadata is not None
    assert (reply.usage_metadata["input_tokens"], reply.usage_metadata["output_tokens"]) == (2, 7)
    assert reply.usage_metadata["total_tokens"] == 9


def test_stream_yields_several_chunks_that_add_up_to_the_reply(llm: ChatOpenAI) -> None:
    # [[pace]] makes the worker write the reply word by word over a second, relayed as it is written.
    chunks = list(llm.stream("Stream this [[words:10]] [[pace:1]]", stream_usage=True))

    # Word-sized pieces as written (the front paces them): several, however the machine's load groups them.
    texts = [c.content for c in chunks if c.content]
    assert len(texts) >= 3, texts
    whole = _joined(chunks)
    assert whole.content == f"{GREETING} Stream this {FILLER}"
    assert whole.response_metadata["finish_reason"] == "stop"
    assert whole.usage_metadata is not None
    assert whole.usage_metadata["output_tokens"] == len(whole.content.split())


async def test_astream_and_ainvoke(llm: ChatOpenAI) -> None:
    chunks = [c async for c in llm.astream("Async [[words:5]] [[pace:0.5]]")]
    assert len([c for c in chunks if c.content]) >= 3
    assert _joined(chunks).content == f"{GREETING} Async alpha bravo charlie delta echo"

    reply = await llm.ainvoke([HumanMessage("Awaited")])
    assert reply.content == f"{GREETING} Awaited"


def test_bind_tools_returns_a_parsed_tool_call(llm: ChatOpenAI) -> None:
    with_tools = llm.bind_tools([get_weather])

    reply = with_tools.invoke('What is the weather in Paris? [[tool:get_weather:{"city":"Paris"}]]')

    assert isinstance(reply, AIMessage)
    assert reply.tool_calls == [
        {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    ]
    assert reply.invalid_tool_calls == []
    assert reply.response_metadata["finish_reason"] == "tool_calls"


def test_bind_tools_arguments_built_from_the_schema_and_the_result_sent_back(llm: ChatOpenAI) -> None:
    with_tools = llm.bind_tools([get_weather], tool_choice="get_weather")
    question = HumanMessage("Weather, please. [[tool]]")

    call = with_tools.invoke([question])

    # No arguments in the marker: the worker samples them from get_weather's JSON schema (strings "scripted").
    assert isinstance(call, AIMessage)
    assert len(call.tool_calls) == 1
    assert call.tool_calls[0]["name"] == "get_weather"
    assert call.tool_calls[0]["args"] == {"city": "scripted", "unit": "scripted"}
    result = get_weather.invoke(call.tool_calls[0])
    assert isinstance(result, ToolMessage)
    assert result.tool_call_id == call.tool_calls[0]["id"]

    # The conversation goes on with the tool's answer and a new user turn, which the worker echoes.
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(
        [question, call, result, HumanMessage("Thanks!")]
    )
    assert isinstance(answer, AIMessage)
    assert (answer.content, answer.tool_calls) == (f"{GREETING} Thanks!", [])


def test_streamed_tool_call_is_sent_whole(llm: ChatOpenAI) -> None:
    with_tools = llm.bind_tools([get_weather])

    whole = _joined(with_tools.stream('Weather? [[tool:get_weather:{"city":"Lima","unit":"kelvin"}]]'))

    assert whole.tool_calls == [
        {
            "name": "get_weather",
            "args": {"city": "Lima", "unit": "kelvin"},
            "id": "call_1",
            "type": "tool_call",
        }
    ]
    assert whole.response_metadata["finish_reason"] == "tool_calls"


def test_with_structured_output_default_method_is_json_schema(llm: ChatOpenAI) -> None:
    # ChatOpenAI's default method (langchain-openai 1.x) is json_schema: a response_format the worker fills.
    structured = llm.with_structured_output(Person)

    person = structured.invoke("Describe a person.")

    assert person == Person(name="scripted", age=18, languages=["scripted", "scripted"])


def test_with_structured_output_json_schema_with_raw(llm: ChatOpenAI) -> None:
    structured = llm.with_structured_output(Person, method="json_schema", strict=True, include_raw=True)

    out = structured.invoke("Describe a person.")

    assert isinstance(out, dict)
    assert out["parsing_error"] is None
    assert out["parsed"] == Person(name="scripted", age=18, languages=["scripted", "scripted"])
    raw = out["raw"]
    assert isinstance(raw, AIMessage)
    assert raw.response_metadata["finish_reason"] == "stop"


def test_with_structured_output_function_calling(llm: ChatOpenAI) -> None:
    # BaseChatOpenAI's default method: a forced call of a tool named after the schema; [[tool]] is the
    # scripted worker's cue to make it.
    structured = llm.with_structured_output(Person, method="function_calling")

    person = structured.invoke("Describe a person. [[tool]]")

    assert person == Person(name="scripted", age=18, languages=["scripted", "scripted"])


def test_with_structured_output_json_mode(llm: ChatOpenAI) -> None:
    class Reply(BaseModel):
        reply: str

    # json_object carries no schema: the scripted worker answers {"reply": "scripted"}.
    structured = llm.with_structured_output(Reply, method="json_mode")

    assert structured.invoke("Answer in JSON.") == Reply(reply="scripted")
