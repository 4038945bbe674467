"""Relayed deltas of one streamed request: from progress stream entries to ``chat.completion.chunk`` events.

See docs/openai-front.md#streaming,
#responses. :class:`DeltaRelay` is the per-request state machine, free of I/O: the front's driver feeds it
entry batches from the delta reader, asks it for due pieces, and ends it with the final completion or an error.

- **Pinning.** The first delta with seq 1 pins its generation. Before exposure, an ended marker of the pinned
  generation, or a gap in its seq, unpins it so the next attempt's first delta can pin again; a delta read
  in the same batch as its generation's ended marker is dropped.
- **Exposure.** The first delta with something to send emits the role chunk and is sent whole; later deltas
  are paced (:mod:`horde_oai.pacing`). Reasoning goes before content; ``horde.include_reasoning: false``
  discards reasoning (the seq still advances). Every chunk carries the first delta's model and fingerprint.
- **After exposure** a gap or an ended marker of the pinned generation breaks the relay: pending pieces are
  sent at once and no further delta is relayed (a restarted attempt never appends to a partly delivered
  choice); the final reply completes the stream.
- **Reconciliation** (the spec's list is cut short; our rule, also in the README): before exposure the final
  reply is delivered whole. After exposure, reasoning: when the final reasoning starts with the relayed
  reasoning the remainder is sent, otherwise no more reasoning. Content: when the final content starts with
  the relayed content the remainder is sent, otherwise the stream ends with the ``ChatStreamDiverged`` error
  event (type ``api_error``, ``metadata.request_id``) and ``data: [DONE]``.
- **Event ids (beyond the spec: resumable streams).** Every event carries ``id: <request>:<gen>:<r>:<c>``,
  where ``gen`` is the relayed generation (``-`` for a reply delivered whole) and ``r``/``c`` are the
  characters of reasoning and content the client has received; the finish chunk and what follows add ``:f``.
  A client reconnecting with ``Last-Event-ID`` gets the rest (see :func:`parse_event_id`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from horde_contract.errors import RC
from horde_core.chat_stream import StreamEntry

from horde_oai.completion import build_system_fingerprint, completion_id
from horde_oai.errors import OpenAIError
from horde_oai.metrics import (
    STREAM_PACING_LAG,
    STREAM_PIECES_PER_POST,
    STREAM_POST_GAP,
    STREAM_REASONING_SHARE,
)
from horde_oai.pacing import Pacer, Piece
from horde_oai.streaming import sse_json

WHOLE_GENERATION = "-"
FINAL_SUFFIX = "f"
REASONING = "reasoning_content"
CONTENT = "content"


@dataclass(frozen=True, slots=True)
class EventId:
    """A parsed event id: where a client's stream stopped."""

    request_id: str
    gen: str
    reasoning_chars: int
    content_chars: int
    final: bool = False

    def __str__(self) -> str:
        text = f"{self.request_id}:{self.gen}:{self.reasoning_chars}:{self.content_chars}"
        return f"{text}:{FINAL_SUFFIX}" if self.final else text


def parse_event_id(value: str) -> EventId | None:
    """``<request>:<gen>:<r>:<c>[:f]`` → :class:`EventId`; None for anything else (bounded: 200 characters)."""
    if not value or len(value) > 200:
        return None
    parts = value.strip().split(":")
    final = len(parts) == 5 and parts[4] == FINAL_SUFFIX
    if len(parts) != 4 and not final:
        return None
    request_id, gen, r, c = parts[:4]
    if not request_id or not gen or not _ascii_digits(r) or not _ascii_digits(c):
        return None
    return EventId(request_id, gen, int(r), int(c), final)


def _ascii_digits(text: str) -> bool:
    # str.isdigit() accepts superscripts and other digits int() refuses.
    return text.isascii() and text.isdecimal()


def sse_event(event_id: EventId | None, data: Mapping[str, Any] | str) -> str:
    """One SSE event, with an ``id:`` line when ``event_id`` is given."""
    payload = data if isinstance(data, str) else sse_json(data)
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {payload}\n\n"


def stream_diverged_error(request_id: str) -> OpenAIError:
    """The error event of a final reply that does not continue what was relayed (spec: Final reply
    reconciliation)."""
    return OpenAIError(
        502,
        "The reply was restarted after part of it was streamed, and the final reply does not continue the "
        "streamed text. Discard the streamed text of this choice.",
        RC.ChatStreamDiverged,
        type="api_error",
        metadata={"request_id": request_id},
    )


class DeltaRelay:
    """The relay of one request (see the module docstring).

    ``created`` is the chunks' ``created`` (Unix seconds); ``default_model`` the request's model or first
    listed model; ``max_window`` (seconds) and ``max_pieces_per_second`` are ``HORDE_OAI_DELTA_PACING_*``;
    each pinned generation gets a fresh :class:`Pacer`. Methods return SSE event strings to send, in order.
    """

    def __init__(
        self,
        *,
        request_id: str,
        created: int,
        default_model: str,
        include_reasoning: bool,
        max_window: float,
        max_pieces_per_second: float,
    ) -> None:
        self.request_id = request_id
        self.created = created
        self.default_model = default_model
        self.include_reasoning = include_reasoning
        self._pacing = (max_window, max_pieces_per_second)
        self.pacer = Pacer(max_window, max_pieces_per_second)
        self.pinned: str | None = None
        self.last_seq = 0
        self.model = default_model
        self.fingerprint: str | None = None
        self.exposed = False
        self.broken = False
        self.ended = False
        self.diverged = False
        self.sent_reasoning = ""
        self.sent_content = ""
        self.first_content_at: float | None = None
        self._lag_anchor: float | None = None  # when the delta whose pieces are pending was read
        self._skip: tuple[int, int] | None = (
            None  # a resume at "-": characters of the final reply already sent
        )

    # -- identity ----------------------------------------------------------------------------------------------

    def event_id(self, final: bool = False) -> EventId:
        return EventId(
            self.request_id,
            self.pinned if self.exposed and self.pinned else WHOLE_GENERATION,
            len(self.sent_reasoning),
            len(self.sent_content),
            final,
        )

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id(self.request_id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }

    def _send(self, field: str, text: str, now: float) -> str:
        if field == REASONING:
            self.sent_reasoning += text
        else:
            self.sent_content += text
        if self.first_content_at is None and text:
            self.first_content_at = now
        return sse_event(self.event_id(), self._chunk({field: text}))

    # -- deltas ------------------------------------------------------------------------------------------------

    def _pin(self, entry: StreamEntry) -> None:
        self.pacer = Pacer(*self._pacing)
        self.pinned = entry.gen
        self.last_seq = 0
        self.model = entry.model or self.default_model
        self.fingerprint = build_system_fingerprint(entry.worker, entry.model)

    def _unpin(self) -> None:
        self.pinned = None
        self.last_seq = 0
        self.model = self.default_model
        self.fingerprint = None

    def _break(self, now: float) -> list[str]:
        self.broken = True
        return self._flush(now)

    def on_batch(self, entries: list[StreamEntry], now: float | None = None) -> list[str]:
        """Apply one read's entries (in stream order); returns the events to send now."""
        now = time.time() if now is None else now
        events: list[str] = []
        ended_in_batch = {e.gen for e in entries if e.ended}
        for entry in entries:
            if self.broken or self.ended:
                break
            if entry.ended:
                if entry.gen == self.pinned:
                    if self.exposed:
                        events += self._break(now)
                    else:
                        self._unpin()
                continue
            if self.pinned is None:
                if entry.seq != 1 or entry.gen in ended_in_batch:
                    continue
                self._pin(entry)
            if entry.gen != self.pinned:
                continue
            if entry.seq != self.last_seq + 1:
                if self.exposed:
                    events += self._break(now)
                else:
                    self._unpin()
                continue
            if not self.exposed and entry.gen in ended_in_batch:
                continue
            self.last_seq = entry.seq
            events += self._delta(entry, now)
        return events

    def _delta(self, entry: StreamEntry, now: float) -> list[str]:
        reasoning = (entry.reasoning or "") if self.include_reasoning else ""
        content = entry.content
        if not reasoning and not content:
            self._observe_gap(self.pacer.observe_post(entry.time_seconds))
            return []
        # The pacer sends the first delta with text whole, and paces the later ones.
        scheduled = self.pacer.add(reasoning, content, entry.time_seconds, now)
        self._observe_gap(scheduled.gap)
        events: list[str] = []
        if not self.exposed:
            self.exposed = True
            events.append(sse_event(self.event_id(), self._chunk({"role": "assistant"})))
        elif scheduled.window > 0:
            STREAM_PIECES_PER_POST.observe(scheduled.pieces)
            if self._lag_anchor is None:
                self._lag_anchor = now
        return events + self.due(now)

    @staticmethod
    def _observe_gap(gap: float | None) -> None:
        if gap is not None:
            STREAM_POST_GAP.observe(gap)

    def due(self, now: float | None = None) -> list[str]:
        """The paced pieces whose time has come."""
        now = time.time() if now is None else now
        return self._pieces(self.pacer.due(now), now)

    def next_due(self) -> float | None:
        """When the next paced piece is due (Unix seconds), None when nothing is pending."""
        return self.pacer.next_due()

    def _pieces(self, pieces: list[Piece], now: float) -> list[str]:
        events = [self._send(piece.field, piece.text, now) for piece in pieces if piece.text]
        if events and self.pacer.next_due() is None and self._lag_anchor is not None:
            STREAM_PACING_LAG.observe(max(0.0, now - self._lag_anchor))
            self._lag_anchor = None
        return events

    def _flush(self, now: float) -> list[str]:
        return self._pieces(self.pacer.flush(), now)

    def drop(self) -> None:
        """The client left: pending pieces are dropped."""
        self.pacer.drop()

    # -- the end -----------------------------------------------------------------------------------------------

    def finish(
        self, completion: Mapping[str, Any], *, include_usage: bool, now: float | None = None
    ) -> list[str]:
        """Flush, reconcile with the final ``completion``, then the finish chunk, usage chunk and [DONE]."""
        now = time.time() if now is None else now
        events = self._flush(now)
        if self._skip is not None:
            self._skip_final(completion, self._skip)
        choice = completion["choices"][0]
        message = choice["message"]
        final_reasoning = message.get("reasoning_content") or ""
        final_content = message.get("content") or ""
        if not self.exposed:
            self.model = completion["model"]
            self.fingerprint = completion.get("system_fingerprint")
            events.append(sse_event(self.event_id(), self._chunk({"role": "assistant"})))
        if final_reasoning.startswith(self.sent_reasoning):
            rest = final_reasoning[len(self.sent_reasoning) :]
            if rest:
                events.append(self._send(REASONING, rest, now))
        if not final_content.startswith(self.sent_content):
            self.ended = self.diverged = True
            return [*events, *self.fail(stream_diverged_error(self.request_id))]
        rest = final_content[len(self.sent_content) :]
        if rest:
            events.append(self._send(CONTENT, rest, now))
        if message.get("tool_calls"):
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            events.append(sse_event(self.event_id(), self._chunk({"tool_calls": calls})))
        self.ended = True
        finish = self._chunk({}, choice["finish_reason"])
        finish["choices"][0]["native_finish_reason"] = choice.get("native_finish_reason")
        finish["x_horde"] = completion.get("x_horde")
        events.append(sse_event(self.event_id(final=True), finish))
        if include_usage:
            usage = self._chunk({})
            usage["choices"], usage["usage"] = [], completion.get("usage")
            events.append(sse_event(self.event_id(final=True), usage))
        events.append(sse_event(self.event_id(final=True), "[DONE]"))
        total = len(self.sent_reasoning) + len(self.sent_content)
        if self.exposed and total:
            STREAM_REASONING_SHARE.observe(len(self.sent_reasoning) / total)
        return events

    def fail(self, error: OpenAIError, now: float | None = None) -> list[str]:
        """Flush what is pending, then the error event (``metadata.retry_after`` mirrors a Retry-After) and
        [DONE] (docs/openai-front.md#streaming)."""
        events = [] if self.ended else self._flush(time.time() if now is None else now)
        self.ended = True
        body = error.body()
        retry_after = error.headers.get("Retry-After")
        if retry_after is not None:
            body["error"].setdefault("metadata", {})["retry_after"] = int(retry_after)
        final = self.event_id(final=True)
        return [*events, sse_event(final, body), sse_event(final, "[DONE]")]

    # -- resume ------------------------------------------------------------------------------------------------

    def resume(self, at: EventId, history: list[StreamEntry], now: float | None = None) -> list[str]:
        """Re-attach at ``at`` (a client's ``Last-Event-ID``) from the stream's ``history`` (XRANGE, in order).

        The relay takes the pinned generation, model and fingerprint of the original relay, counts the
        characters the client already has as sent, and returns the rest of what was relayed so far, whole.
        For ``gen`` ``-`` (nothing relayed, or a reply delivered whole) nothing is replayed: the final reply
        follows, cut at the client's offsets.
        """
        now = time.time() if now is None else now
        if at.gen == WHOLE_GENERATION:
            self._skip = (at.reasoning_chars, at.content_chars)
            return []
        reasoning: list[str] = []
        content: list[str] = []
        for entry in history:
            if entry.gen != at.gen:
                continue
            if entry.ended or entry.seq != self.last_seq + 1:
                self.broken = True
                break
            if self.last_seq == 0:
                self._pin(entry)
            self.last_seq = entry.seq
            self.pacer.observe_post(entry.time_seconds)
            if self.include_reasoning and entry.reasoning:
                reasoning.append(entry.reasoning)
            content.append(entry.content)
        if self.pinned is None:
            self.pinned = at.gen
        self.exposed = True
        all_reasoning, all_content = "".join(reasoning), "".join(content)
        self.sent_reasoning = all_reasoning[: at.reasoning_chars]
        self.sent_content = all_content[: at.content_chars]
        events = []
        if len(all_reasoning) > at.reasoning_chars:
            events.append(self._send(REASONING, all_reasoning[at.reasoning_chars :], now))
        if len(all_content) > at.content_chars:
            events.append(self._send(CONTENT, all_content[at.content_chars :], now))
        return events

    def _skip_final(self, completion: Mapping[str, Any], skip: tuple[int, int]) -> None:
        """For a resume at ``-``: count the part of the final reply the client already has as sent, so
        :meth:`finish` sends only the rest (and no second role chunk)."""
        message = completion["choices"][0]["message"]
        self.exposed = True
        self.pinned = None
        self.model = completion["model"]
        self.fingerprint = completion.get("system_fingerprint")
        self.sent_reasoning = (message.get("reasoning_content") or "")[: skip[0]]
        self.sent_content = (message.get("content") or "")[: skip[1]]
