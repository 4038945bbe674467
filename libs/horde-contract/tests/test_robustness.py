"""Any JSON a client or worker sends ends in a result or a HordeError, never another exception."""

from __future__ import annotations

import copy
from typing import Any

import horde_contract as hc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(
        ["user", "assistant", "tool", "function", "text", "image_url", "json_schema", "object", "c1"]
    ),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)

VALID_BODY: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "s"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "t"},
                {"type": "image_url", "image_url": {"url": "https://a/b"}},
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ],
    "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": False}}
    ],
    "tool_choice": "auto",
    "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
    "max_tokens": 64,
    "temperature": 0.5,
    "horde": {"context_fit": "grow"},
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, sub in value.items():
            out += _paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            out += _paths(sub, (*prefix, index))
    return out


PATHS = _paths(VALID_BODY)


def _replace(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(body)
    target = out
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return out


def _call(fn: Any, value: Any) -> None:
    try:
        fn(value)
    except hc.HordeError as exc:
        assert exc.status in (400, 403, 404, 409, 413) and exc.rc and exc.message


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=_json)
def test_mutated_chat_bodies(path: tuple[Any, ...], value: Any) -> None:
    body = _replace(VALID_BODY, path, value)
    try:
        request = hc.parse_chat_request(body)
    except hc.HordeError:
        return
    hc.build_operation_fingerprint(request)
    hc.estimate_chat_prompt_tokens(request.messages, request.tools)
    hc.build_chat_job_payload(
        messages=request.messages,
        text_params=request.text_params,
        chat_extras=request.chat_extras,
        max_length=request.max_length,
        max_context_length=4096,
    )


@settings(max_examples=200, deadline=None)
@given(_json)
def test_arbitrary_json_everywhere(value: Any) -> None:
    for fn in (hc.parse_chat_request, hc.parse_submit_body, hc.parse_progress_body, hc.parse_text_params):
        _call(fn, value)
    if isinstance(value, dict):
        _call(hc.parse_chat_declaration, {"chat_jobs": True, "models": ["m"], "model_id": "m", **value})
        _call(hc.parse_horde_options, value)


@settings(max_examples=200, deadline=None)
@given(
    message=st.fixed_dictionaries(
        {"role": st.just("assistant")},
        optional={"content": _json, "tool_calls": _json, "reasoning_content": _json},
    ),
    finish=_json,
)
def test_arbitrary_replies(message: dict[str, Any], finish: Any) -> None:
    extras = {
        "tools": VALID_BODY["tools"],
        "tool_choice": "required",
        "response_format": {"type": "json_object"},
    }
    try:
        parsed = hc.parse_submit_body(
            {"id": "g", "model_id": "m", "message": message, "finish_reason": finish}
        )
    except hc.HordeError:
        return
    for conformance in ("strict", "best_effort"):
        _call(lambda s, mode=conformance: hc.verify_chat_reply(s, extras, mode), parsed)
