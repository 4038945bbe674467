"""The pacing of relayed deltas (docs/openai-front.md, "Relayed deltas" > "Pacing").

A worker posts its reply in bursts, one stream entry every second or so. Relayed as they
arrive, the bursts make a client's text jump. The front therefore sends the first exposed
delta whole and splits the text and reasoning of each later delta into pieces that it sends
evenly over a window, the estimated interval between the generation's posts.

This module is the pure part: it decides the pieces and their send times. It does no I/O and
knows nothing of asyncio; the caller passes every time explicitly (seconds, any monotonic
clock for ``now``; the posts' stream-id times for ``post_time``), sleeps until
``Pacer.next_due()`` and emits one SSE chunk per ``Piece`` returned by ``Pacer.due()``.

Units: times and windows are seconds, text lengths and offsets are Python ``str`` code points.
Cuts never split an extended grapheme cluster (the ``regex`` package's ``\\X``), so an accent,
vowel sign, keycap, variation selector or skin-tone modifier stays with its base character and
a zero-width-joiner sequence or a flag stays whole.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

import regex

__all__ = [
    "EMA_NEWEST_GAP_WEIGHT",
    "MIN_WINDOW_SECONDS",
    "Field",
    "Pacer",
    "Piece",
    "Scheduled",
    "split_pieces",
]

Field: TypeAlias = Literal["reasoning_content", "content"]
"""The delta field a piece belongs to: ``delta.reasoning_content`` or ``delta.content``."""

MIN_WINDOW_SECONDS = 0.05
"""The lower clamp of the window estimate, in seconds (docs/openai-front.md#streaming)."""

EMA_NEWEST_GAP_WEIGHT = 0.5
"""The weight of the newest post gap in the window's exponential moving average (docs/openai-front.md#streaming)."""

_GRAPHEME = regex.compile(r"\X")
# Absorbs float error in rate * window (0.7 * 10 = 7.000000000000001, 0.1 * 3 = 0.30000000000000004).
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Piece:
    """One paced piece of a relayed delta, sent as one chat.completion.chunk.

    ``field`` is the delta field, ``text`` is non-empty, and ``send_at`` is the time (seconds,
    on the caller's ``now`` clock) the piece is scheduled for; ``now - send_at`` when it is
    actually sent is the pacing lag (docs/openai-front.md#streaming; Histogram buckets).
    """

    field: Field
    text: str
    send_at: float


@dataclass(frozen=True, slots=True)
class Scheduled:
    """What one ``Pacer.add`` did, for the metrics (docs/openai-front.md#streaming; Histogram buckets).

    ``gap`` is the post gap in seconds since the previous post's stream-id time (None for the
    generation's first post or a post older than the last one). ``window`` is the window in
    seconds the pieces were spread over, 0.0 when the delta was sent whole (the first exposed
    delta, or a maximum window of 0). ``pieces`` is the number of pieces scheduled, including
    pending text merged into this window; 0 when the delta carried no text.
    """

    gap: float | None
    window: float
    pieces: int


# The regex module's \X pairs regional indicators by looking back over the whole run, which is quadratic in
# the run's length (a 240 KB post of flag letters froze the event loop for seconds). Each run is therefore
# segmented as a stand-in of the same length that \X pairs the same way in linear time: a pair becomes a
# letter and a combining mark (one cluster), an odd last indicator a letter; marks that follow still attach.
_REGIONAL_INDICATOR_RUN = regex.compile("[\U0001f1e6-\U0001f1ff]+")
_PAIR_STAND_IN = "A\u0301"


def _regional_stand_in(run: regex.Match[str]) -> str:
    pairs, odd = divmod(len(run.group()), 2)
    return _PAIR_STAND_IN * pairs + ("A" if odd else "")


def _grapheme_boundaries(text: str) -> list[int]:
    """The offsets strictly inside ``text`` between two extended grapheme clusters, ascending.

    Linear in ``len(text)``, runs of regional indicators included."""
    segmented = _REGIONAL_INDICATOR_RUN.sub(_regional_stand_in, text)
    return [match.end() for match in _GRAPHEME.finditer(segmented)][:-1]


def split_pieces(text: str, count: int) -> list[str]:
    """Split ``text`` into at most ``count`` non-empty pieces of about even length (docs/openai-front.md#streaming).

    The k-th cut aims at the even offset ``k * len(text) / n`` (code points), where ``n`` is
    ``count`` capped at ``len(text)``. It is placed before a whitespace character within half a
    piece (``len(text) / (2 * n)``) of that offset, the nearest one (the earlier on a tie), so
    a piece starts with its separating whitespace as model tokens do. Without such whitespace
    the cut is at the first offset at or after the even offset that does not split an extended
    grapheme cluster: a character is never separated from a following mark, variation selector
    or skin-tone modifier, and a zero-width-joiner sequence, a flag or CRLF stays whole. Cuts
    only move forward, so text with few cluster boundaries yields fewer pieces.

    ``"".join(split_pieces(text, count)) == text`` always; ``""`` gives ``[]``.
    Raises ValueError when ``count`` is below 1.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if not text:
        return []
    length = len(text)
    pieces = min(count, length)
    if pieces == 1:
        return [text]
    boundaries = _grapheme_boundaries(text)
    spaces = [offset for offset in boundaries if text[offset].isspace()]
    size = length / pieces
    half = size / 2
    cuts: list[int] = []
    previous = 0
    for k in range(1, pieces):
        target = k * size
        cut: int | None = None
        low = bisect_left(spaces, target - half)
        high = bisect_right(spaces, target + half)
        for offset in spaces[low:high]:
            if offset > previous and (cut is None or abs(offset - target) < abs(cut - target)):
                cut = offset
        if cut is None:
            index = bisect_left(boundaries, max(target, previous + 1))
            if index == len(boundaries):
                break
            cut = boundaries[index]
        cuts.append(cut)
        previous = cut
    ends = [*cuts, length]
    starts = [0, *cuts]
    return [text[start:end] for start, end in zip(starts, ends, strict=True)]


def _apportion(lengths: list[int], count: int) -> list[int]:
    """Divide ``count`` pieces among segments by length, at least 1 and at most its length each.

    ``count`` must lie between ``len(lengths)`` and ``sum(lengths)``; every length is >= 1.
    Largest remainders take the pieces left over by the floors.
    """
    total = sum(lengths)
    shares = [max(1, count * length // total) for length in lengths]
    by_remainder = sorted(range(len(lengths)), key=lambda i: (-(count * lengths[i] % total), i))
    while sum(shares) < count:
        for i in by_remainder:
            if sum(shares) < count and shares[i] < lengths[i]:
                shares[i] += 1
    while sum(shares) > count:  # the minimum of one piece each pushed the sum over
        largest = max(range(len(shares)), key=lambda i: (shares[i], -i))
        shares[largest] -= 1
    return shares


class Pacer:
    """The pacing state of one relayed generation (docs/openai-front.md, Relayed deltas > Pacing).

    ``max_window`` is HORDE_OAI_DELTA_PACING_MAX_WINDOW_SECONDS (seconds; 0 sends each delta
    whole as it arrives) and ``max_pieces_per_second`` is
    HORDE_OAI_DELTA_PACING_MAX_CHUNKS_PER_SECOND (pieces a window may hold per second of its
    length; at least one piece per field with text is always allowed).

    The window is an exponential moving average of the gaps between the posts' stream-id
    times, weight ``EMA_NEWEST_GAP_WEIGHT`` on the newest gap, kept (stored clamped) between
    ``MIN_WINDOW_SECONDS`` and ``max_window``. Feed every post of the generation through
    ``add`` (a post with text to send) or ``observe_post`` (a post with nothing to send, such
    as discarded reasoning), in stream order.
    """

    def __init__(self, max_window: float, max_pieces_per_second: float) -> None:
        """Raises ValueError for a negative or non-finite setting."""
        if not math.isfinite(max_window) or max_window < 0:
            raise ValueError(f"max_window must be a finite number >= 0, got {max_window}")
        if not math.isfinite(max_pieces_per_second) or max_pieces_per_second < 0:
            raise ValueError(
                f"max_pieces_per_second must be a finite number >= 0, got {max_pieces_per_second}"
            )
        self._max_window = max_window
        self._min_window = min(MIN_WINDOW_SECONDS, max_window)
        self._max_pieces_per_second = max_pieces_per_second
        self._pending: deque[Piece] = deque()
        self._last_post: float | None = None
        self._estimate: float | None = None
        self._exposed = False

    @property
    def window(self) -> float:
        """The current window estimate in seconds (0.0 with a maximum window of 0).

        Before the first post gap is known it is the lower clamp, ``MIN_WINDOW_SECONDS``.
        """
        if self._max_window == 0:
            return 0.0
        return self._min_window if self._estimate is None else self._estimate

    def observe_post(self, post_time: float) -> float | None:
        """Feed a post's stream-id time (seconds) to the window estimate; return the post gap.

        The gap (seconds since the previous post) is None for the first post. A post older
        than the last one seen is ignored and also gives None.
        """
        previous = self._last_post
        if previous is None:
            self._last_post = post_time
            return None
        gap = post_time - previous
        if gap < 0:
            return None
        self._last_post = post_time
        if self._estimate is None:
            average = gap
        else:
            average = EMA_NEWEST_GAP_WEIGHT * gap + (1 - EMA_NEWEST_GAP_WEIGHT) * self._estimate
        self._estimate = min(max(average, self._min_window), self._max_window)
        return gap

    def add(self, reasoning: str, content: str, post_time: float, now: float) -> Scheduled:
        """Schedule a delta that arrived at ``now`` (seconds) from the post at ``post_time``.

        The post feeds the window estimate first. The first delta with text, and every delta
        under a maximum window of 0, is scheduled whole at ``now``: one piece per field with
        text, reasoning first. Any later delta is merged after the pending pieces (same-field
        neighbours joined), the merged text is split (``split_pieces``) into at most
        ``max(fields, min(floor(max_pieces_per_second * window), characters))`` pieces divided
        among the fields by length, and the pieces are spread evenly over a new window starting
        at ``now``: piece i of n at ``now + i * window / n``. A delta without text only feeds
        the estimate.
        """
        gap = self.observe_post(post_time)
        fields: tuple[tuple[Field, str], ...] = (("reasoning_content", reasoning), ("content", content))
        segments = [(field, text) for field, text in fields if text]
        if not segments:
            return Scheduled(gap=gap, window=0.0, pieces=0)
        if not self._exposed or self._max_window == 0:
            self._exposed = True
            self._pending = deque(replace(piece, send_at=min(piece.send_at, now)) for piece in self._pending)
            self._pending.extend(Piece(field, text, now) for field, text in segments)
            return Scheduled(gap=gap, window=0.0, pieces=len(segments))
        merged: list[tuple[Field, str]] = []
        for field, text in [*((piece.field, piece.text) for piece in self._pending), *segments]:
            if merged and merged[-1][0] == field:
                merged[-1] = (field, merged[-1][1] + text)
            else:
                merged.append((field, text))
        window = self.window
        lengths = [len(text) for _, text in merged]
        allowed = math.floor(self._max_pieces_per_second * window + _EPSILON)
        count = max(len(merged), min(allowed, sum(lengths)))
        texts = [
            (field, piece)
            for (field, text), share in zip(merged, _apportion(lengths, count), strict=True)
            for piece in split_pieces(text, share)
        ]
        step = window / len(texts)
        self._pending = deque(Piece(field, text, now + i * step) for i, (field, text) in enumerate(texts))
        return Scheduled(gap=gap, window=window, pieces=len(texts))

    def due(self, now: float) -> list[Piece]:
        """Remove and return, in order, the pending pieces whose ``send_at`` is at or before ``now``."""
        ready: list[Piece] = []
        while self._pending and self._pending[0].send_at <= now:
            ready.append(self._pending.popleft())
        return ready

    def next_due(self) -> float | None:
        """The ``send_at`` (seconds) of the next pending piece, None when nothing is pending."""
        return self._pending[0].send_at if self._pending else None

    def flush(self) -> list[Piece]:
        """Remove and return every pending piece in order (the request finished or the relay broke).

        The caller sends them at once, before the final reply's reconciliation.
        """
        pieces = list(self._pending)
        self._pending.clear()
        return pieces

    def drop(self) -> None:
        """Discard every pending piece (the client disconnected)."""
        self._pending.clear()
