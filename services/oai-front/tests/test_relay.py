"""The relay state machine (docs/openai-front.md#streaming,
#responses) and the resumable streams' event ids, without I/O: entries in, SSE events out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from horde_core.chat_stream import StreamEntry
from horde_oai.completion import build_system_fingerprint
from horde_oai.relay import DeltaRelay, EventId, parse_event_id

T0 = 1_700_000_000.0


def delta(
    gen: str,
    seq: int,
    content: str = "",
    reasoning: str | None = None,
    *,
    at: float = 0.0,
    worker: str | None = "w1",
    model: str | None = "m1",
) -> StreamEntry:
    fields: dict[str, Any] = {"gen": gen, "seq": str(seq), "content": content}
    if reasoning is not None:
        fields["reasoning_content"] = reasoning
    if worker:
        fields["worker"] = worker
    if model:
        fields["model"] = model
    return StreamEntry.from_fields(f"{int((T0 + at) * 1000)}-0", fields)


def ended(gen: str, at: float = 0.0) -> StreamEntry:
    return StreamEntry.from_fields(f"{int((T0 + at) * 1000)}-1", {"gen": gen, "ended": "1"})


def relay(*, include_reasoning: bool = True, window: float = 0.0) -> DeltaRelay:
    return DeltaRelay(
        request_id="req",
        created=123,
        default_model="asked",
        include_reasoning=include_reasoning,
        max_window=window,
        max_pieces_per_second=20.0,
    )


def parse(events: list[str]) -> list[tuple[str | None, Any]]:
    """``[(event id, data)]``; data is the parsed JSON, or the raw text for [DONE]."""
    out = []
    for event in events:
        event_id, data = None, None
        for line in event.strip("\n").split("\n"):
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                raw = line[6:]
                data = raw if raw == "[DONE]" else json.loads(raw)
        out.append((event_id, data))
    return out


def deltas_of(events: list[str]) -> list[dict[str, Any]]:
    return [d["choices"][0]["delta"] for _, d in parse(events) if isinstance(d, dict) and d.get("choices")]


def completion(content: str, reasoning: str | None = None, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {
        "id": "chatcmpl-req",
        "object": "chat.completion",
        "created": 123,
        "model": "final-model",
        "system_fingerprint": "fp_final",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "native_finish_reason": "eos"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        "x_horde": {"request_id": "req"},
        **extra,
    }


def test_first_seq_pins_and_first_content_exposes_with_role_chunk():
    r = relay()
    events = r.on_batch([delta("g1", 1, "Hello", at=0.0)], now=T0)
    chunks = parse(events)
    assert [d["choices"][0]["delta"] for _, d in chunks] == [{"role": "assistant"}, {"content": "Hello"}]
    fingerprint = build_system_fingerprint("w1", "m1")
    assert all(d["model"] == "m1" and d["system_fingerprint"] == fingerprint for _, d in chunks)
    assert all(d["id"] == "chatcmpl-req" and d["object"] == "chat.completion.chunk" for _, d in chunks)
    assert chunks[-1][0] == "req:g1:0:5"
    assert r.pinned == "g1" and r.exposed


def test_delta_without_seq_1_does_not_pin():
    r = relay()
    assert r.on_batch([delta("g1", 2, "late")]) == []
    assert r.pinned is None and not r.exposed


def test_entry_without_model_uses_the_requested_model_and_no_worker_no_fingerprint():
    r = relay()
    (_, role), _ = parse(r.on_batch([delta("g1", 1, "x", worker=None, model=None)], now=T0))
    assert role["model"] == "asked" and role["system_fingerprint"] is None


def test_reasoning_before_content_and_reasoning_only_delta_advances_seq():
    r = relay()
    events = r.on_batch([delta("g1", 1, "", "think "), delta("g1", 2, "Answer", "more ")], now=T0)
    assert deltas_of(events) == [
        {"role": "assistant"},
        {"reasoning_content": "think "},
        {"reasoning_content": "more "},
        {"content": "Answer"},
    ]


def test_include_reasoning_false_discards_reasoning_but_keeps_the_sequence():
    r = relay(include_reasoning=False)
    assert r.on_batch([delta("g1", 1, "", "hidden")], now=T0) == []
    assert r.last_seq == 1 and not r.exposed
    events = r.on_batch([delta("g1", 2, "Visible", "hidden too")], now=T0)
    assert deltas_of(events) == [{"role": "assistant"}, {"content": "Visible"}]


def test_before_exposure_an_ended_marker_unpins_and_the_next_attempt_pins():
    r = relay(include_reasoning=False)
    r.on_batch([delta("g1", 1, "", "r")], now=T0)
    assert r.pinned == "g1"
    assert r.on_batch([ended("g1")], now=T0) == []
    assert r.pinned is None
    events = r.on_batch([delta("g2", 1, "second attempt", worker="w2")], now=T0)
    assert deltas_of(events)[-1] == {"content": "second attempt"}
    assert parse(events)[0][1]["system_fingerprint"] == build_system_fingerprint("w2", "m1")


def test_a_delta_read_with_its_ended_marker_is_dropped_before_exposure():
    r = relay()
    assert r.on_batch([delta("g1", 1, "doomed"), ended("g1")], now=T0) == []
    assert not r.exposed and r.pinned is None


def test_a_gap_before_exposure_unpins():
    r = relay(include_reasoning=False)
    r.on_batch([delta("g1", 1, "", "r")], now=T0)
    assert r.on_batch([delta("g1", 3, "skipped two")], now=T0) == []
    assert r.pinned is None and not r.exposed


def test_other_generations_are_ignored_while_pinned():
    r = relay()
    r.on_batch([delta("g1", 1, "one")], now=T0)
    assert r.on_batch([delta("g2", 1, "other")], now=T0) == []
    assert deltas_of(r.on_batch([delta("g1", 2, " two")], now=T0)) == [{"content": " two"}]


def test_unexposed_request_is_delivered_whole_with_the_final_model_and_fingerprint():
    r = relay()
    events = parse(r.finish(completion("All of it", "why"), include_usage=True, now=T0))
    assert [d["choices"][0]["delta"] for _, d in events[:3]] == [
        {"role": "assistant"},
        {"reasoning_content": "why"},
        {"content": "All of it"},
    ]
    finish = events[3][1]
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["choices"][0]["native_finish_reason"] == "eos"
    assert finish["x_horde"] == {"request_id": "req"}
    assert all(d["model"] == "final-model" and d["system_fingerprint"] == "fp_final" for _, d in events[:4])
    assert events[4][1]["choices"] == [] and events[4][1]["usage"]["total_tokens"] == 7
    assert events[5][1] == "[DONE]"
    assert [e for e, _ in events] == [
        "req:-:0:0",
        "req:-:3:0",
        "req:-:3:9",
        "req:-:3:9:f",
        "req:-:3:9:f",
        "req:-:3:9:f",
    ]


def test_after_exposure_the_final_reply_sends_the_remainder_with_the_first_delta_identity():
    r = relay()
    r.on_batch([delta("g1", 1, "Hello", "Thinking")], now=T0)
    events = r.finish(completion("Hello world", "Thinking hard"), include_usage=False, now=T0)
    assert deltas_of(events) == [{"reasoning_content": " hard"}, {"content": " world"}, {}]
    assert all(d["model"] == "m1" for _, d in parse(events)[:-1])
    assert parse(events)[-1][1] == "[DONE]"


def test_reasoning_that_does_not_continue_is_not_sent_but_content_continues():
    r = relay()
    r.on_batch([delta("g1", 1, "Hi", "first idea")], now=T0)
    events = r.finish(completion("Hi there", "a different idea"), include_usage=False, now=T0)
    assert deltas_of(events) == [{"content": " there"}, {}]


def test_a_restart_after_exposure_is_never_appended_and_a_diverging_reply_errors():
    r = relay()
    r.on_batch([delta("g1", 1, "Attempt one says")], now=T0)
    assert r.on_batch([ended("g1"), delta("g2", 1, "Attempt two")], now=T0) == []
    assert r.broken
    events = parse(r.finish(completion("Attempt two says something else"), include_usage=True, now=T0))
    error = events[0][1]["error"]
    assert error["code"] == "ChatStreamDiverged" and error["type"] == "api_error"
    assert error["metadata"] == {"request_id": "req"}
    assert events[1][1] == "[DONE]" and len(events) == 2
    assert r.diverged


def test_a_restart_that_repeats_the_relayed_text_completes_the_stream():
    r = relay()
    r.on_batch([delta("g1", 1, "Same start")], now=T0)
    r.on_batch([ended("g1")], now=T0)
    events = r.finish(completion("Same start, same end"), include_usage=False, now=T0)
    assert deltas_of(events) == [{"content": ", same end"}, {}]


def test_a_gap_after_exposure_breaks_the_relay():
    r = relay()
    r.on_batch([delta("g1", 1, "one")], now=T0)
    assert r.on_batch([delta("g1", 3, "three")], now=T0) == []
    assert r.broken
    assert r.on_batch([delta("g1", 4, "four")], now=T0) == []


def test_paced_pieces_are_flushed_before_the_final_reconciliation():
    r = relay(window=2.0)
    r.on_batch([delta("g1", 1, "First.", at=0.0)], now=T0)
    later = "alpha beta gamma delta epsilon zeta eta theta"
    sent_now = r.on_batch([delta("g1", 2, " " + later, at=1.0)], now=T0 + 1.0)
    assert r.next_due() is not None  # pieces wait for their turn
    events = r.finish(completion("First. " + later + "!"), include_usage=False, now=T0 + 1.0)
    text = "".join(d.get("content", "") for d in deltas_of(sent_now + events))
    assert text == " " + later + "!"


def test_drop_forgets_pending_pieces():
    r = relay(window=2.0)
    r.on_batch([delta("g1", 1, "First.", at=0.0)], now=T0)
    r.on_batch([delta("g1", 2, " a b c d e f g h i j", at=1.0)], now=T0 + 1.0)
    r.drop()
    assert r.next_due() is None and r.due(T0 + 10) == []


def test_an_error_event_mirrors_retry_after_and_ends_with_done():
    from horde_oai.errors import no_eligible_worker

    r = relay()
    r.on_batch([delta("g1", 1, "part")], now=T0)
    events = parse(r.fail(no_eligible_worker("gone", stage="grace", request_id="req")))
    assert events[0][1]["error"]["metadata"]["retry_after"] == 30
    assert events[1][1] == "[DONE]"
    assert events[0][0] == "req:g1:0:4:f"


@pytest.mark.parametrize(
    "value, parsed",
    [
        ("req:g1:3:10", EventId("req", "g1", 3, 10)),
        ("req:-:0:0:f", EventId("req", "-", 0, 0, True)),
        ("req:g1:3", None),
        ("req:g1:x:1", None),
        (":g1:1:1", None),
        ("req:g1:1:1:z", None),
        ("a" * 201, None),
        ("req:g1:\u00b3:0", None),
        ("req:g1:1:\u0663", None),
        ("", None),
    ],
)
def test_event_ids_parse(value, parsed):
    assert parse_event_id(value) == parsed
    if parsed is not None:
        assert str(parsed) == value


def test_resume_replays_what_the_client_missed_and_continues():
    history = [
        delta("g0", 1, "old attempt"),
        ended("g0"),
        delta("g1", 1, "Hello", "Hmm"),
        delta("g1", 2, " brave", " ok"),
        delta("g1", 3, " new world"),
    ]
    r = relay()
    catchup = r.resume(EventId("req", "g1", 3, 8), history, now=T0)
    assert deltas_of(catchup) == [{"reasoning_content": " ok"}, {"content": "ave new world"}]
    assert parse(catchup)[-1][0] == "req:g1:6:21"
    assert r.last_seq == 3 and r.exposed and r.model == "m1"
    assert deltas_of(r.on_batch([delta("g1", 4, "!")], now=T0)) == [{"content": "!"}]
    events = r.finish(completion("Hello brave new world!?", "Hmm ok"), include_usage=False, now=T0)
    assert deltas_of(events) == [{"content": "?"}, {}]


def test_resume_of_a_whole_delivery_sends_only_the_rest_of_the_final_reply():
    r = relay()
    assert r.resume(EventId("req", "-", 0, 4), [], now=T0) == []
    events = r.finish(completion("All of it"), include_usage=False, now=T0)
    assert deltas_of(events) == [{"content": "of it"}, {}]


def test_line_separators_are_escaped_so_line_readers_keep_each_event_whole():
    r = relay()
    events = r.on_batch([delta("g1", 1, "a\u2028b\u2029c\u0085d")], now=T0)
    for event in events:
        assert len(event.strip("\n").splitlines()) == 2  # id: and data:, whatever the text holds
    assert deltas_of(events)[-1] == {"content": "a\u2028b\u2029c\u0085d"}
