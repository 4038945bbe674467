"""Pacing of relayed deltas (docs/openai-front.md, Relayed deltas > Pacing): cuts, piece counts, the
window estimate, merging, flush and drop. Pure: every time is passed explicitly, nothing sleeps."""

from __future__ import annotations

from typing import Final

import pytest
import regex
from horde_oai.pacing import (
    MIN_WINDOW_SECONDS,
    Pacer,
    Piece,
    Scheduled,
    _apportion,
    split_pieces,
)
from hypothesis import given
from hypothesis import strategies as st

R: Final = "reasoning_content"
C: Final = "content"

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"  # 👨‍👩‍👧‍👦
THUMBS_MEDIUM = "\U0001f44d\U0001f3fd"  # 👍🏽
FR, DE, IT = "\U0001f1eb\U0001f1f7", "\U0001f1e9\U0001f1ea", "\U0001f1ee\U0001f1f9"
KEYCAP = ["1\ufe0f\u20e3", "2\ufe0f\u20e3", "3\ufe0f\u20e3"]
HEART = "\u2764\ufe0f"  # ❤️ (emoji presentation selector)
E_ACUTE = "e\u0301"
KI = "\u0915\u093f"  # कि: ka + vowel sign i


def clusters(text: str) -> list[str]:
    return regex.findall(r"\X", text)


def cluster_boundaries(text: str) -> set[int]:
    offsets, position = {0}, 0
    for cluster in clusters(text):
        position += len(cluster)
        offsets.add(position)
    return offsets


# --- split_pieces: one table per cut rule ---------------------------------------------------

WHITESPACE_CASES = [
    pytest.param("Hello world", 2, ["Hello", " world"], id="two-words"),
    pytest.param(
        "The quick brown fox jumps over the lazy dog",
        4,
        ["The quick", " brown fox", " jumps over the", " lazy dog"],
        id="nearest-space-to-each-even-offset",
    ),
    pytest.param("aaaa bbbb cccc dddd", 2, ["aaaa bbbb", " cccc dddd"], id="space-at-middle"),
    pytest.param("aaaaaaaaa bb", 2, ["aaaaaaaaa", " bb"], id="space-within-half-a-piece-after"),
    pytest.param("ab cdefghijkl", 2, ["ab cdef", "ghijkl"], id="space-beyond-half-a-piece-ignored"),
    pytest.param("one\ntwo\nthree", 3, ["one", "\ntwo", "\nthree"], id="newlines"),
    pytest.param("一二三\u3000四五六", 2, ["一二三", "\u3000四五六"], id="ideographic-space"),
]

NO_WHITESPACE_CASES = [
    pytest.param("abcdefgh", 4, ["ab", "cd", "ef", "gh"], id="even"),
    pytest.param("abcdefgh", 3, ["abc", "def", "gh"], id="next-offset-after-fraction"),
    pytest.param("abc", 5, ["a", "b", "c"], id="count-capped-by-characters"),
    pytest.param("x", 3, ["x"], id="single-character"),
    pytest.param("", 3, [], id="empty"),
    pytest.param("abcdef", 1, ["abcdef"], id="one-piece"),
    pytest.param("你好世界今天天气很好", 3, ["你好世界", "今天天", "气很好"], id="cjk-without-spaces"),
]

GRAPHEME_CASES = [
    pytest.param(E_ACUTE * 4, 4, [E_ACUTE] * 4, id="combining-acute-stays-with-e"),
    pytest.param(E_ACUTE * 4, 8, [E_ACUTE] * 4, id="combining-acute-more-pieces-than-clusters"),
    pytest.param("abe\u0301cd", 2, ["abe\u0301", "cd"], id="cut-moves-past-the-mark"),
    pytest.param(KI * 3, 6, [KI] * 3, id="devanagari-vowel-sign"),
    pytest.param(
        "\u0928\u092e\u0938\u094d\u0924\u0947",  # नमस्ते
        6,
        ["\u0928", "\u092e", "\u0938\u094d\u0924\u0947"],
        id="devanagari-conjunct",
    ),
    pytest.param("".join(KEYCAP), 3, KEYCAP, id="keycaps"),
    pytest.param("".join(KEYCAP), 9, KEYCAP, id="keycaps-never-split"),
    pytest.param(HEART * 2, 4, [HEART, HEART], id="variation-selector"),
    pytest.param(THUMBS_MEDIUM * 3, 6, [THUMBS_MEDIUM] * 3, id="skin-tone-modifier"),
    pytest.param(FAMILY * 2, 4, [FAMILY, FAMILY], id="zwj-sequence"),
    pytest.param(FAMILY, 7, [FAMILY], id="zwj-sequence-alone"),
    pytest.param(FR + DE, 4, [FR, DE], id="flags-side-by-side"),
    pytest.param(FR + DE + IT, 2, [FR + DE, IT], id="flags-odd-count"),
    pytest.param("a\r\nb", 4, ["a", "\r\n", "b"], id="crlf-kept-whole"),
    # 13 code points, even offsets 3.25, 6.5, 9.75: the space, then the end of the family (12), then none left.
    pytest.param(f"ok {THUMBS_MEDIUM}{FAMILY}!", 4, ["ok", f" {THUMBS_MEDIUM}{FAMILY}", "!"], id="mixed"),
]


@pytest.mark.parametrize(
    ("text", "count", "expected"), WHITESPACE_CASES + NO_WHITESPACE_CASES + GRAPHEME_CASES
)
def test_split_pieces(text: str, count: int, expected: list[str]) -> None:
    pieces = split_pieces(text, count)
    assert pieces == expected
    assert "".join(pieces) == text
    assert len(pieces) <= count


@pytest.mark.parametrize("count", [0, -1])
def test_split_pieces_refuses_a_count_below_one(count: int) -> None:
    with pytest.raises(ValueError):
        split_pieces("abc", count)


SPECIAL = [
    E_ACUTE,
    KI,
    *KEYCAP,
    HEART,
    THUMBS_MEDIUM,
    FAMILY,
    FR,
    DE,
    "\u200d",
    "\ufe0f",
    "\u0301",
    "\r\n",
    " ",
    "\n",
    "你",
]
TEXT = st.lists(st.one_of(st.characters(), st.sampled_from(SPECIAL), st.text(max_size=3))).map("".join)


@given(text=TEXT, count=st.integers(min_value=1, max_value=64))
def test_split_pieces_property(text: str, count: int) -> None:
    pieces = split_pieces(text, count)
    assert "".join(pieces) == text
    assert all(pieces)
    assert len(pieces) <= count
    boundaries = cluster_boundaries(text)
    offset = 0
    for piece in pieces:
        offset += len(piece)
        assert offset in boundaries, (text, pieces)


# --- dividing the piece count between fields --------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "count", "expected"),
    [
        ([30, 10], 4, [3, 1]),
        ([10, 30], 4, [1, 3]),
        ([1, 100], 4, [1, 3]),
        ([100, 1], 2, [1, 1]),
        ([5, 5], 3, [2, 1]),
        ([2, 3], 5, [2, 3]),
        ([7], 3, [3]),
        ([3, 1, 3], 3, [1, 1, 1]),
    ],
)
def test_apportion_by_length_at_least_one_each(lengths: list[int], count: int, expected: list[int]) -> None:
    assert _apportion(lengths, count) == expected


# --- the window estimate ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_window", "posts", "gaps", "windows"),
    [
        pytest.param(2.0, [0.0], [None], [MIN_WINDOW_SECONDS], id="no-gap-yet"),
        pytest.param(
            2.0, [0.0, 1.0, 3.0, 3.5], [None, 1.0, 2.0, 0.5], [0.05, 1.0, 1.5, 1.0], id="ema-half-weight"
        ),
        pytest.param(2.0, [0.0, 0.01, 0.02], [None, 0.01, 0.01], [0.05, 0.05, 0.05], id="clamped-at-minimum"),
        pytest.param(2.0, [0.0, 10.0, 10.0], [None, 10.0, 0.0], [0.05, 2.0, 1.0], id="clamped-at-max-window"),
        pytest.param(
            2.0, [0.0, 1.0, 0.5, 1.5], [None, 1.0, None, 0.5], [0.05, 1.0, 1.0, 0.75], id="older-post-ignored"
        ),
        pytest.param(0.02, [0.0, 1.0], [None, 1.0], [0.02, 0.02], id="max-window-below-minimum"),
        pytest.param(0.0, [0.0, 1.0], [None, 1.0], [0.0, 0.0], id="max-window-zero"),
    ],
)
def test_window_estimate(
    max_window: float, posts: list[float], gaps: list[float | None], windows: list[float]
) -> None:
    pacer = Pacer(max_window, 20)
    for post, gap, window in zip(posts, gaps, windows, strict=True):
        assert pacer.observe_post(post) == pytest.approx(gap)
        assert pacer.window == pytest.approx(window)


@pytest.mark.parametrize(
    ("max_window", "rate"), [(-1.0, 10), (float("nan"), 10), (1.0, -1), (float("inf"), 10)]
)
def test_pacer_refuses_bad_settings(max_window: float, rate: float) -> None:
    with pytest.raises(ValueError):
        Pacer(max_window, rate)


# --- scheduling -------------------------------------------------------------------------------


def exposed(max_window: float = 2.0, rate: float = 4.0) -> Pacer:
    """A pacer whose first delta (post time 0.0) was already sent whole; the next add is paced."""
    pacer = Pacer(max_window, rate)
    pacer.add("", "first", post_time=0.0, now=0.0)
    pacer.flush()
    return pacer


def test_first_delta_is_sent_whole() -> None:
    pacer = Pacer(2.0, 4)
    scheduled = pacer.add("let me think about it", "Hello there, world", post_time=100.0, now=5.0)
    assert scheduled == Scheduled(gap=None, window=0.0, pieces=2)
    assert pacer.next_due() == 5.0
    assert pacer.due(5.0) == [Piece(R, "let me think about it", 5.0), Piece(C, "Hello there, world", 5.0)]
    assert pacer.next_due() is None


def test_posts_without_text_feed_the_estimate_but_do_not_expose() -> None:
    pacer = Pacer(2.0, 4)
    assert pacer.observe_post(0.0) is None  # discarded reasoning
    assert pacer.add("", "", post_time=0.5, now=1.0) == Scheduled(gap=0.5, window=0.0, pieces=0)
    assert pacer.next_due() is None
    assert pacer.add("", "first text", post_time=1.0, now=2.0) == Scheduled(gap=0.5, window=0.0, pieces=1)
    assert pacer.due(2.0) == [Piece(C, "first text", 2.0)]
    scheduled = pacer.add("", "aaaa bbbb", post_time=1.5, now=3.0)
    assert scheduled.window == pytest.approx(0.5)
    assert scheduled.pieces == 2


def test_later_delta_spread_evenly_over_the_window() -> None:
    pacer = exposed()
    scheduled = pacer.add("", "aaaa bbbb cccc dddd eeee", post_time=1.0, now=10.0)
    assert scheduled == Scheduled(gap=1.0, window=1.0, pieces=4)
    assert pacer.next_due() == 10.0
    # even offsets 6, 12, 18 (half a piece: 3); the nearest spaces are at 4, 14 and 19
    assert pacer.due(10.0) == [Piece(C, "aaaa", 10.0)]
    assert pacer.next_due() == 10.25
    assert pacer.due(10.6) == [Piece(C, " bbbb cccc", 10.25), Piece(C, " dddd", 10.5)]
    assert pacer.due(10.7) == []
    assert pacer.due(11.0) == [Piece(C, " eeee", 10.75)]
    assert pacer.next_due() is None


@pytest.mark.parametrize(
    ("rate", "gap", "text", "pieces"),
    [
        pytest.param(4, 1.0, "a" * 40, 4, id="capped-by-rate-times-window"),
        pytest.param(10, 0.5, "a" * 40, 5, id="rate-times-shorter-window"),
        pytest.param(0.7, 10.0, "a" * 40, 7, id="float-product"),
        pytest.param(100, 1.0, "abc", 3, id="capped-by-characters"),
        pytest.param(100, 1.0, FAMILY, 1, id="one-cluster-one-piece"),
        pytest.param(1, 0.5, "a" * 40, 1, id="at-least-one-piece"),
        pytest.param(0, 1.0, "a" * 40, 1, id="rate-zero"),
    ],
)
def test_piece_count(rate: float, gap: float, text: str, pieces: int) -> None:
    pacer = exposed(max_window=10.0, rate=rate)
    scheduled = pacer.add("", text, post_time=gap, now=1.0)
    assert scheduled.pieces == pieces
    sent = pacer.flush()
    assert len(sent) == pieces
    assert "".join(piece.text for piece in sent) == text


@pytest.mark.parametrize(
    ("reasoning", "content", "rate", "fields"),
    [
        pytest.param("r" * 30, "c" * 10, 4, [R, R, R, C], id="by-length"),
        pytest.param("r", "c" * 40, 4, [R, C, C, C], id="short-reasoning-keeps-one"),
        pytest.param("r" * 40, "c", 4, [R, R, R, C], id="short-content-keeps-one"),
        pytest.param("r" * 40, "c" * 40, 1, [R, C], id="one-each-beats-the-rate"),
        pytest.param("r" * 8, "", 4, [R, R, R, R], id="reasoning-only"),
    ],
)
def test_reasoning_and_content_divided_by_length(
    reasoning: str, content: str, rate: float, fields: list[str]
) -> None:
    pacer = exposed(rate=rate)
    pacer.add(reasoning, content, post_time=1.0, now=1.0)
    sent = pacer.flush()
    assert [piece.field for piece in sent] == fields
    assert "".join(piece.text for piece in sent if piece.field == R) == reasoning
    assert "".join(piece.text for piece in sent if piece.field == C) == content


def test_delta_arriving_while_pending_is_merged_over_a_new_window() -> None:
    pacer = exposed()
    pacer.add("", "aaaa bbbb cccc dddd", post_time=1.0, now=10.0)
    assert [piece.text for piece in pacer.due(10.3)] == ["aaaa", " bbbb"]
    assert pacer.next_due() == 10.5
    # gap 2: window 0.5 * 2 + 0.5 * 1 = 1.5 s, so 4 pieces/s allow 6 pieces, 0.25 s apart from arrival
    scheduled = pacer.add("", " eeee ffff", post_time=3.0, now=10.4)
    assert scheduled == Scheduled(gap=2.0, window=1.5, pieces=6)
    sent = pacer.flush()
    assert "".join(piece.text for piece in sent) == " cccc dddd eeee ffff"
    assert [piece.send_at for piece in sent] == pytest.approx([10.4, 10.65, 10.9, 11.15, 11.4, 11.65])
    assert {piece.field for piece in sent} == {C}


def test_merge_keeps_stream_order_and_joins_same_field_neighbours() -> None:
    pacer = exposed(rate=100)
    pacer.add("thinking", "Answer one", post_time=1.0, now=10.0)
    pacer.due(10.0)
    pacer.add("more thought", " and more", post_time=2.0, now=10.2)
    sent = pacer.flush()
    fields = [piece.field for piece in sent]
    runs = [field for i, field in enumerate(fields) if i == 0 or fields[i - 1] != field]
    assert runs == [R, C, R, C]
    text = "".join(piece.text for piece in sent)
    assert text.endswith("Answer onemore thought and more")
    assert [piece.send_at for piece in sent] == sorted(piece.send_at for piece in sent)
    assert sent[0].send_at == 10.2
    assert sent[-1].send_at < 10.2 + 1.0


def test_flush_returns_reasoning_before_content_in_order() -> None:
    pacer = exposed()
    pacer.add("step one step two", "the answer is 42", post_time=1.0, now=10.0)
    assert pacer.next_due() == 10.0
    sent = pacer.flush()
    assert [piece.field for piece in sent] == [R, R, C, C]
    assert "".join(piece.text for piece in sent) == "step one step twothe answer is 42"
    assert pacer.flush() == []
    assert pacer.due(100.0) == []
    assert pacer.next_due() is None


def test_drop_discards_pending_and_later_deltas_stay_paced() -> None:
    pacer = exposed()
    pacer.add("", "aaaa bbbb cccc dddd", post_time=1.0, now=10.0)
    pacer.drop()
    assert pacer.next_due() is None
    assert pacer.due(100.0) == []
    assert pacer.add("", "eeee ffff", post_time=2.0, now=11.0) == Scheduled(gap=1.0, window=1.0, pieces=4)
    assert "".join(piece.text for piece in pacer.flush()) == "eeee ffff"


def test_max_window_zero_sends_each_delta_whole() -> None:
    pacer = Pacer(0.0, 20)
    assert pacer.add("r1", "first", post_time=0.0, now=1.0) == Scheduled(gap=None, window=0.0, pieces=2)
    assert pacer.add("", "second delta text", post_time=1.0, now=2.0) == Scheduled(
        gap=1.0, window=0.0, pieces=1
    )
    assert pacer.window == 0.0
    assert pacer.due(2.0) == [
        Piece(R, "r1", 1.0),
        Piece(C, "first", 1.0),
        Piece(C, "second delta text", 2.0),
    ]


DELTA = st.tuples(
    st.text(max_size=12), TEXT, st.floats(min_value=0, max_value=3), st.floats(min_value=0, max_value=3)
)


@given(
    deltas=st.lists(DELTA, max_size=8),
    max_window=st.sampled_from([0.0, 0.3, 2.0]),
    rate=st.sampled_from([0, 3, 20]),
)
def test_pacing_delivers_every_character_in_order(
    deltas: list[tuple[str, str, float, float]], max_window: float, rate: float
) -> None:
    pacer = Pacer(max_window, rate)
    sent: list[Piece] = []
    post = now = 0.0
    for reasoning, content, post_step, wait in deltas:
        post += post_step
        now += wait
        sent += pacer.due(now)
        pacer.add(reasoning, content, post_time=post, now=now)
        next_due = pacer.next_due()
        assert next_due is None or next_due >= now
    sent += pacer.flush()
    assert all(piece.text for piece in sent)
    assert "".join(p.text for p in sent if p.field == R) == "".join(d[0] for d in deltas)
    assert "".join(p.text for p in sent if p.field == C) == "".join(d[1] for d in deltas)


# Regional indicators are segmented through a linear stand-in (pacing._grapheme_boundaries); it must cut
# exactly where \X cuts the original text, marks, joiners, prepend characters and CR LF included.
_MIXED_ALPHABET = st.sampled_from(
    [
        "\U0001f1eb",
        "\U0001f1f7",
        "\U0001f1e9",
        "a",
        " ",
        "\u0301",
        "\u200d",
        "\U0001f468",
        "\ufe0f",
        "\U0001f3fd",
        "\r",
        "\n",
        "\u0915",
        "\u093f",
        "\u0600",
    ]
)


@given(st.lists(_MIXED_ALPHABET, max_size=24).map("".join))
def test_regional_indicator_stand_in_cuts_where_grapheme_clusters_end(text: str) -> None:
    from horde_oai.pacing import _grapheme_boundaries

    expected = [match.end() for match in regex.finditer(r"\X", text)][:-1]
    assert _grapheme_boundaries(text) == expected


def test_a_long_run_of_flag_letters_is_cut_between_pairs() -> None:
    run = "\U0001f1fa" * 4801  # 2400 pairs and a lone indicator
    pieces = split_pieces(run, 80)
    assert "".join(pieces) == run and len(pieces) == 80
    assert all(len(piece) % 2 == 0 for piece in pieces[:-1])
