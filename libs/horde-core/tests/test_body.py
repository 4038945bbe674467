"""The body reader's JSON structure bound (horde_core.body): exact counts, the refusals, and every legal body
(a chat request at every cap at once) passing with room."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from horde_contract import HordeError, parse_chat_request
from horde_contract.limits import (
    MAX_CHAT_BODY_BYTES,
    MAX_CHAT_IMAGE_COUNT,
    MAX_CHAT_IMAGE_TOTAL_BYTES,
    MAX_CHAT_MESSAGE_COUNT,
    MAX_CHAT_SCHEMA_NESTING,
    MAX_CHAT_TEXT_BYTES,
    MAX_CHAT_TOOL_COUNT,
    MAX_CHAT_TOOL_SPEC_BYTES,
)
from horde_core import body as body_module
from horde_core.body import (
    CHAT_BODY_LIMITS,
    BodyLimits,
    BodyTooLarge,
    JsonStructureError,
    check_json_structure,
    parse_json_body,
    read_json_body,
)

ALPHABET = ["a", '"', "\\", "[", "]", "{", "}", ",", " ", "\n", "é", "\u0001", "😀", ":"]


def shape(value: Any) -> tuple[int, int]:
    """(elements, depth) of a parsed value, counted as the scanner counts them in its JSON."""
    if isinstance(value, dict | list):
        children = list(value.values()) if isinstance(value, dict) else value
        counts = [shape(child) for child in children]
        elements = 1 + max(len(children) - 1, 0) + sum(e for e, _ in counts)
        return elements, 1 + max((d for _, d in counts), default=0)
    return 0, 0


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))


def random_value(rng: random.Random, level: int = 0) -> Any:
    roll = rng.random()
    if level < 7 and roll < 0.3:
        return [random_value(rng, level + 1) for _ in range(rng.randint(0, 4))]
    if level < 7 and roll < 0.6:
        return {random_text(rng): random_value(rng, level + 1) for _ in range(rng.randint(0, 4))}
    if roll < 0.85:
        return random_text(rng)
    return rng.choice([0, -1.5e3, None, True, False])


@pytest.mark.parametrize("scan_slice", [1, 2, 7, 64 * 1024])
def test_counts_are_exact_and_each_bound_refuses_one_past_it(
    monkeypatch: pytest.MonkeyPatch, scan_slice: int
) -> None:
    monkeypatch.setattr(body_module, "_SCAN_SLICE", scan_slice)  # strings cross slice boundaries
    rng = random.Random(scan_slice)
    for _ in range(400):
        value = random_value(rng)
        elements, depth = shape(value)
        for raw in (
            json.dumps(value).encode(),
            json.dumps(value, ensure_ascii=False).encode(),
            json.dumps(value, indent=2, separators=(" , ", " : ")).encode(),
        ):
            assert check_json_structure(raw, elements, depth) == (elements, depth), raw
            if elements:
                with pytest.raises(JsonStructureError) as refused:
                    check_json_structure(raw, elements - 1, 64)
                assert refused.value.kind == "elements"
            if depth:
                with pytest.raises(JsonStructureError) as refused:
                    check_json_structure(raw, elements, depth - 1)
                assert refused.value.kind == "depth"


def test_strings_and_escapes_hide_their_brackets() -> None:
    raw = rb'{"a\\": "[[[{{{,,,\"]]]", "b": ["\\\\", "\\\"[", "\u005b"]}'
    assert json.loads(raw) == {"a\\": '[[[{{{,,,"]]]', "b": ["\\\\", '\\"[', "["]}
    assert check_json_structure(raw, 100, 100) == shape(json.loads(raw)) == (5, 2)


def test_amplifying_bodies_are_refused_with_the_bound_in_the_message() -> None:
    flat = b"[" + b"{}," * 3_000_000 + b"{}]"
    with pytest.raises(JsonStructureError) as refused:
        check_json_structure(flat, CHAT_BODY_LIMITS.max_elements, CHAT_BODY_LIMITS.max_depth)
    assert refused.value.message == (
        "The JSON body has more than 524288 elements (arrays, objects and their items)."
    )
    deep = b'{"a":' * 65 + b"1" + b"}" * 65
    with pytest.raises(JsonStructureError) as refused:
        check_json_structure(deep, CHAT_BODY_LIMITS.max_elements, CHAT_BODY_LIMITS.max_depth)
    assert str(refused.value) == refused.value.message == "The JSON body nests deeper than 64 levels."
    assert check_json_structure(b'{"a":' * 63 + b"[1]" + b"}" * 63, 1000, 64) == (64, 64)
    # Two strings an element at most: a body of quotes is refused before it is split.
    with pytest.raises(JsonStructureError):
        check_json_structure(b'"' * 100_000, 1000, 64)


@pytest.mark.parametrize(
    "raw",
    [b"", b"]]]]", b"[[[[", b'["abc', b'"\\', b"\\", b'{"a": 1]', b"nul", b'"\\u00"', b"\xff\xfe["],
)
def test_bodies_that_are_not_json_are_left_to_the_parser(raw: bytes) -> None:
    check_json_structure(raw, 64, 64)
    with pytest.raises(HordeError) as refused:
        parse_json_body(raw, BodyLimits(100, 64))
    assert refused.value.status == 400


def test_parse_keeps_the_contract_rules() -> None:
    limits = BodyLimits(1000, 100, 4)
    assert parse_json_body(b'{"a": [1, "\\u00e9"]}', limits) == {"a": [1, "é"]}
    assert parse_json_body(b"", limits, allow_empty=True) is None
    for raw, rc in [
        (b'{"a": NaN}', "BadRequest"),
        (b'{"a": "\\ud800"}', "BadRequest"),
        (b'{"a": "\\u0000"}', "NulByteInPayload"),
    ]:
        with pytest.raises(HordeError) as refused:
            parse_json_body(raw, limits)
        assert refused.value.rc == rc
    assert parse_json_body(b'{"a": "\\u0000"}', limits, refuse_nul=False) == {"a": "\x00"}
    with pytest.raises(JsonStructureError):
        parse_json_body(b"[[[[[1]]]]]", limits)


def _schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "enum": ["[", "{", ","]}
    for _ in range(levels):
        schema = {
            "type": "object",
            "properties": {"a": schema},
            "required": ["a"],
            "additionalProperties": False,
        }
    return schema


def maximal_chat_body() -> bytes:
    """A chat request at every cap at once: 20 data-URL images of 25 MiB in all, 1024 messages of content
    parts and tool calls, 128 tools whose spec is 256 KiB of dense enums, a schema nested 10 levels."""
    per_image = MAX_CHAT_IMAGE_TOTAL_BYTES // MAX_CHAT_IMAGE_COUNT
    url = "data:image/jpeg;base64," + base64.b64encode(bytes(per_image)).decode()
    images = [
        {"type": "image_url", "image_url": {"url": url, "detail": "high"}}
        for _ in range(MAX_CHAT_IMAGE_COUNT)
    ]
    text = {"type": "text", "text": 'Compare [these], {those} and, "quoted" ones.'}
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful, [terse]."}]
    messages.append({"role": "user", "content": [text, *images]})
    turn = 0
    while len(messages) + 4 <= MAX_CHAT_MESSAGE_COUNT - 1:
        calls = [
            {
                "id": f"call_{turn}_{n}",
                "type": "function",
                "function": {"name": "tool_0", "arguments": '{"v": 1}'},
            }
            for n in range(2)
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages.extend({"role": "tool", "tool_call_id": call["id"], "content": "[1, 2]"} for call in calls)
        messages.append({"role": "user", "content": [text] * 12})
        turn += 1
    while len(messages) < MAX_CHAT_MESSAGE_COUNT:
        messages.append({"role": "user", "content": [text] * 12})
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {"name": "tool_0", "strict": True, "parameters": _schema(MAX_CHAT_SCHEMA_NESTING)},
        }
    ]
    for index in range(1, MAX_CHAT_TOOL_COUNT):
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{index}",
                    "parameters": {"type": "object", "properties": {"v": {"type": "integer", "enum": []}}},
                },
            }
        )
    spec = len(json.dumps(tools, separators=(",", ":")).encode())
    room = (MAX_CHAT_TOOL_SPEC_BYTES - spec - 200) // 2  # two bytes a dense enum entry ("0,")
    for index in range(1, MAX_CHAT_TOOL_COUNT):
        share = room // (MAX_CHAT_TOOL_COUNT - 1)
        tools[index]["function"]["parameters"]["properties"]["v"]["enum"] = [n % 10 for n in range(share)]
    body = {
        "models": ["m1", "m2", "m3", "m4", "m5"],
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "max_tokens": 16384,
        "stop": ["\n\n", "[END]", "}", ","],
    }
    return json.dumps(body).encode()


def test_a_chat_request_at_every_cap_passes_with_room() -> None:
    raw = maximal_chat_body()
    assert MAX_CHAT_BODY_BYTES * 0.9 < len(raw) <= MAX_CHAT_BODY_BYTES
    parsed = json.loads(raw)
    request = parse_chat_request(parsed, defer_length_limits=True)  # legal: the contract accepts it
    assert len(request.messages) == MAX_CHAT_MESSAGE_COUNT
    tool_spec = json.dumps(parsed["tools"], separators=(",", ":")).encode()
    assert MAX_CHAT_TOOL_SPEC_BYTES * 0.95 < len(tool_spec) + len(b'"auto"') <= MAX_CHAT_TOOL_SPEC_BYTES
    text_bytes = sum(
        len(part["text"].encode())
        for m in parsed["messages"]
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "text"
    )
    assert text_bytes < MAX_CHAT_TEXT_BYTES
    elements, depth = check_json_structure(raw, CHAT_BODY_LIMITS.max_elements, CHAT_BODY_LIMITS.max_depth)
    assert (elements, depth) == shape(parsed)
    assert elements * 2 < CHAT_BODY_LIMITS.max_elements  # room: over half the bound is left
    assert depth * 2 < CHAT_BODY_LIMITS.max_depth
    assert parse_json_body(raw, CHAT_BODY_LIMITS) == parsed


def _app(limits: BodyLimits) -> FastAPI:
    app = FastAPI()

    @app.post("/body")
    async def read(request: Request) -> dict[str, Any]:
        try:
            value = await read_json_body(request, limits, 5.0)
        except BodyTooLarge as exc:
            return {"refused": 413, "message": str(exc)}
        except JsonStructureError as exc:
            return {"refused": 400, "message": exc.message}
        return {"value": value}

    return app


async def test_read_json_body_bounds_bytes_declared_or_chunked_and_structure() -> None:
    app = _app(BodyLimits(max_bytes=64, max_elements=4, max_depth=2))

    async def chunked(raw: bytes):  # type: ignore[no-untyped-def]
        for index in range(0, len(raw), 8):
            yield raw[index : index + 8]

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.post("/body", content=b'{"a": [1, 2]}')).json() == {"value": {"a": [1, 2]}}
        too_large = {"refused": 413, "message": "The request body is larger than 64 bytes."}
        assert (await client.post("/body", content=b" " * 65)).json() == too_large
        assert (await client.post("/body", content=chunked(b" " * 65))).json() == too_large
        assert (await client.post("/body", content=b"[[[1]]]")).json() == {
            "refused": 400,
            "message": "The JSON body nests deeper than 2 levels.",
        }
        assert (await client.post("/body", content=b"[1,2,3,4,5]")).json()["refused"] == 400
