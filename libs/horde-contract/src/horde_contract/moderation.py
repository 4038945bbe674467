"""The moderation replacement filter (docs/native-api.md#moderation): what a flagged user's prompt, or a prompt
for a model the text model reference marks ``nsfw``, goes through before it is queued.

A filter is an ordered list of rules ``(pattern, replacement)``. Each pattern is an RE2 regular expression
(linear time whatever the prompt, so an operator's pattern cannot stall a request; no backreferences or
lookarounds), matched case-insensitively. The rules run as one combined pass over the prompt: at the leftmost
place any rule matches, the first rule (in list order) that matches there wins, its match is replaced by its
replacement as literal text, and the scan goes on after the match (a replacement is not scanned again).
:data:`DEFAULT_REPLACEMENT_RULES` is this project's own list (not upstream's): it keeps sexual content away
from minors by removing terms that only name sexualised minors and rewriting words and ages that make a
character a minor into adult ones. Operators replace it with ``HORDE_MODERATION_REPLACEMENTS``
(docs/operator-guide.md#operator-controls).

The rules do not see the prompt as sent but its *matching view* (:func:`matching_view`): each character
NFKC-normalised (fullwidth ``ｌｏｌｉ`` and ``１２`` are ``loli`` and ``12``), a Latin letter with marks
reduced to its ASCII letter (``KİD`` is ``KID``), combining marks and Unicode format characters (category
Cf: soft hyphen, zero-width space and joiners) dropped, and ``_`` read as a space, so ``\\b`` treats
``loli_chan`` as two words (``-`` already separates words). A match is replaced in the prompt as sent,
covering the characters its view came from; the rest of the prompt is kept as it is. Homoglyphs from other
scripts (Cyrillic ``і``, Greek ``ο``) are not folded: NFKC keeps them, and no maintained library folds them
cheaply enough.

On a chat request the filter rewrites the text of each message (a string content and every text part)
and the prompt is flattened again from the result (:func:`filter_messages`); image parts, tool call
arguments, tool definitions and the response format are JSON documents or data and are not rewritten. A
prompt the filter leaves blank (nothing but whitespace) is refused with :func:`corrupt_prompt_error`.

The filter's CPU is bounded: a pass costs one RE2 search per match (a couple of microseconds), and
:meth:`ReplacementFilter.apply` raises :class:`FilterBudgetExceeded` once the calling thread has spent
``cpu_seconds`` (:data:`DEFAULT_FILTER_CPU_SECONDS`) on a request's texts (admission answers 400 CorruptPrompt,
:func:`filter_budget_error`).
"""

from __future__ import annotations

import functools
import re
import time
import unicodedata
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

import re2
from re2 import _re2

from .errors import RC, HordeError

#: The default rules, in order. Word boundaries are ASCII (RE2's ``\b``) over the matching view, where ``_``
#: is a space.
DEFAULT_REPLACEMENT_RULES: tuple[tuple[str, str], ...] = (
    # Terms that only ever name sexualised minors: removed (a prompt of nothing else ends up blank).
    (
        r"\b(?:loli(?:con)?s?|shota(?:con)?s?|jail\s*bait|under[\s-]?age[ds]?"
        r"|pre[\s-]?teens?|pre[\s-]?pubescent)\b",
        "",
    ),
    # An age below 18 ("12 years old", "15-year-old", "9yo", "16 y/o", "12 y.o.", "12yrs") becomes an adult
    # one.
    (r"\b(?:1[0-7]|[1-9])[\s-]?(?:years?|yrs?)[\s-]?old\b", "adult"),
    (r"\b(?:1[0-7]|[1-9])\s?(?:(?:yo|y/o)\b|y\.\s?o\b\.?)", "adult"),
    (r"\b(?:1[0-7]|[1-9])(?:yrs?|years?)\b", "adult"),
    # Words that make a character a minor become adults.
    (r"\b(?:little|young|small)[\s-]+girls\b|\bschool[\s-]?girls\b", "women"),
    (r"\b(?:little|young|small)[\s-]+girl\b|\bschool[\s-]?girl\b", "woman"),
    (r"\b(?:little|young|small)[\s-]+boys\b|\bschool[\s-]?boys\b", "men"),
    (r"\b(?:little|young|small)[\s-]+boy\b|\bschool[\s-]?boy\b", "man"),
    (r"\b(?:children|kids|toddlers|infants|teenagers|teens|minors)\b", "adults"),
    (r"\b(?:child|kid|toddler|infant|teenager|teen|minor)\b", "adult"),
)

#: The upper bound on rules a filter takes (they are compiled into one pattern).
MAX_REPLACEMENT_RULES = 200

#: The CPU seconds the filter may spend on one request's texts before it gives up: a match costs a couple of
#: microseconds (some 5 MiB of prompt that is nothing but matches), ordinary text a few milliseconds per MiB
#: (a tenth of a second per MiB of non-ASCII text).
DEFAULT_FILTER_CPU_SECONDS = 2.0

#: RE2's memory for the combined program (its default, 8 MiB, is tight for 200 rules).
_MAX_MEM = 64 << 20
_UNANCHORED = _re2.RE2.Anchor.UNANCHORED
#: Matches between two CPU-time checks.
_CHECK_EVERY = 1024


class FilterBudgetExceeded(Exception):
    """The filter spent its CPU budget on one prompt (:func:`filter_budget_error`)."""


def _options() -> Any:
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False
    options.max_mem = _MAX_MEM
    return options


@functools.lru_cache(maxsize=65536)
def _fold(char: str) -> str:
    """One character of the matching view: "" for a format character (Cf) or a combining mark (``k\\u0301id``
    is ``kid``); the ASCII letters a Latin letter with marks decomposes to (``é`` → ``e``, ``İ`` → ``I``);
    else its NFKC form (ASCII is itself)."""
    if unicodedata.category(char) == "Cf" or unicodedata.combining(char):
        return ""
    decomposed = unicodedata.normalize("NFKD", char)
    stripped = "".join(c for c in decomposed if not unicodedata.combining(c))
    if stripped and stripped.isascii():
        return stripped
    return unicodedata.normalize("NFKC", char)


#: ``(view start, view end, text start, text end)`` of each character whose view is not one character long
#: (a dropped character, or one NFKC expands: ``ﬁ`` → ``fi``), in order.
_Segment = tuple[int, int, int, int]
#: A character whose view is one character long (most), in the lengths :func:`matching_view` scans.
_NOT_ONE = re.compile(rb"[^\x01]")


def matching_view(text: str) -> tuple[str, list[_Segment]]:
    """``text`` as the rules see it (see the module docstring), and the characters whose view is not one
    character long (elsewhere a view offset is a text offset shifted by those before it). ASCII text is its
    own view (``_`` aside, which keeps lengths). Linear, C loops but for the characters in the segments."""
    if text.isascii():
        return text.replace("_", " "), []
    folds = list(map(_fold, text))
    view = "".join(folds)
    segments: list[_Segment] = []
    # One byte per character, its view's length (NFKC expands a character to 18 at most).
    lengths = bytes(map(len, folds))
    shift = 0  # view offset minus text offset, after the characters seen so far
    for found in _NOT_ONE.finditer(lengths):
        offset = found.start()
        size = lengths[offset]
        segments.append((offset + shift, offset + shift + size, offset, offset + 1))
        shift += size - 1
    return view.replace("_", " "), segments


def _to_text(segments: list[_Segment], starts: list[int], position: int, *, end: bool) -> int:
    """The text offset of view offset ``position`` (a match's start, or its ``end``): a position inside a
    changed character's view covers the whole character."""
    index = bisect_right(starts, position) - 1
    if index < 0:
        return position
    view_start, view_end, text_start, text_end = segments[index]
    if position < view_end or (position == view_start and not end):
        # Inside the character's view, or a start at it (a dropped character before a match goes with it).
        return text_end if end and position > view_start else text_start
    return position - view_end + text_end


class ReplacementFilter:
    """A compiled rule list (see the module docstring).

    ``rules``: ``(pattern, replacement)`` pairs. Raises ValueError naming the rule for a pattern RE2 does not
    take, a rule that is not a pair of strings, or more than :data:`MAX_REPLACEMENT_RULES` rules.
    """

    def __init__(self, rules: Sequence[Sequence[str]] = DEFAULT_REPLACEMENT_RULES) -> None:
        if len(rules) > MAX_REPLACEMENT_RULES:
            raise ValueError(f"{len(rules)} replacement rules; at most {MAX_REPLACEMENT_RULES} are allowed")
        options = _options()
        rule_of: dict[int, int] = {}  # the rule of each group of the combined pattern that is a whole rule
        replacements: list[str] = []
        alternatives: list[str] = []
        group = 1
        for index, rule in enumerate(rules):
            if len(rule) != 2 or not all(isinstance(part, str) for part in rule):
                raise ValueError(f"replacement rule {index} is not a [pattern, replacement] pair of strings")
            pattern, replacement = rule
            try:
                compiled = re2.compile(pattern, options)
            except re2.error as exc:
                raise ValueError(
                    f"replacement rule {index}: {pattern!r} is not a pattern RE2 takes ({exc})"
                ) from None
            rule_of[group] = index
            group += 1 + compiled.groups
            replacements.append(replacement)
            alternatives.append(pattern)
        self._rule_of = rule_of
        self._replacements = replacements
        self._find: Any = None  # the rules as one pattern without groups: where the next match is
        self._which: Any = None  # the rules as one pattern, a group each: which rule a match is
        if alternatives:
            found = _re2.RE2("|".join(f"(?:{a})" for a in alternatives).encode(), options)
            which = _re2.RE2("|".join(f"({a})" for a in alternatives).encode(), options)
            # A pattern that only compiles alone (``\Q`` quoting to its end) would change the others.
            if not (found.ok() and which.ok() and which.NumberOfCapturingGroups() == group - 1):
                raise ValueError("the replacement rules together are not a pattern RE2 takes")
            self._find, self._which = found, which

    def __len__(self) -> int:
        return len(self._replacements)

    def apply(
        self,
        text: str,
        *,
        cpu_seconds: float = DEFAULT_FILTER_CPU_SECONDS,
        deadline: float | None = None,
    ) -> str:
        """``text`` after the rules (the module docstring); ``text`` itself when no rule matches. Raises
        :class:`FilterBudgetExceeded` once this thread has spent ``cpu_seconds`` of CPU on it, or past
        ``deadline`` (a :func:`time.thread_time` of this thread) when given."""
        if self._find is None or not text:
            return text
        if deadline is None:
            deadline = time.thread_time() + cpu_seconds
        view, segments = matching_view(text)
        data = view.encode()
        find = self._find.Match
        # The rule of a match depends only on its bytes and the byte either side (RE2's assertions look no
        # further: \b, ^, $ and their multi-line forms), so it is looked up once per such triple.
        rules: dict[tuple[bytes, bytes, bytes], int] = {}
        # (start, stop, rule) of each match, in bytes of the view.
        hits: list[tuple[int, int, int]] = []
        pos, end = 0, len(data)
        countdown = 1  # check the budget at once (the view is built), then every _CHECK_EVERY matches
        while True:
            countdown -= 1
            if not countdown:
                countdown = _CHECK_EVERY
                if time.thread_time() > deadline:
                    raise FilterBudgetExceeded("the moderation filter spent its CPU budget on one prompt")
            start, stop = find(_UNANCHORED, data, pos, end)[0]
            if start < 0:
                break
            key = (data[start - 1 : start] if start else b"", data[start:stop], data[stop : stop + 1])
            rule = rules.get(key)
            if rule is None:
                rule = rules[key] = self._rule_at(key)
            hits.append((start, stop, rule))
            if stop > start:
                pos = stop
            elif stop >= end:
                break
            else:
                pos = stop + _re2.CharLenToBytes(data, stop, 1)
        if not hits:
            return text
        return self._rewrite(text, data, len(data) == len(view), segments, hits)

    def _rule_at(self, key: tuple[bytes, bytes, bytes]) -> int:
        """The rule of a match ``key`` = (the byte before it, its bytes, the byte after it): the first rule
        that matches exactly those bytes there (any earlier one would have won the match)."""
        before, match, after = key
        spans = self._which.Match(
            _re2.RE2.Anchor.ANCHOR_BOTH, before + match + after, len(before), len(before) + len(match)
        )
        # The winning rule's group spans the whole match; every other rule's group did not take part.
        return self._rule_of[spans.index(spans[0], 1)]

    def _rewrite(
        self,
        text: str,
        data: bytes,
        ascii_view: bool,
        segments: list[_Segment],
        hits: list[tuple[int, int, int]],
    ) -> str:
        starts = [segment[0] for segment in segments]
        out: list[str] = []
        last = 0  # the text copied so far
        last_byte = last_char = 0  # for byte → view character offsets, which only grow
        replacements = self._replacements
        if ascii_view and not segments:
            for start, stop, rule in hits:
                out.append(text[last:start])
                out.append(replacements[rule])
                last = stop
            out.append(text[last:])
            return "".join(out)
        for byte_start, byte_stop, rule in hits:
            if ascii_view:
                view_start, view_stop = byte_start, byte_stop
            else:
                view_start = last_char + _re2.BytesToCharLen(data, last_byte, byte_start)
                view_stop = view_start + _re2.BytesToCharLen(data, byte_start, byte_stop)
                last_byte, last_char = byte_stop, view_stop
            if segments:
                text_start = _to_text(segments, starts, view_start, end=False)
                text_stop = _to_text(segments, starts, view_stop, end=True)
            else:
                text_start, text_stop = view_start, view_stop
            text_start = max(text_start, last)
            out.append(text[last:text_start])
            out.append(replacements[rule])
            last = max(last, text_stop)
        out.append(text[last:])
        return "".join(out)

    def filter_messages(
        self, messages: Sequence[Mapping[str, Any]], *, cpu_seconds: float = DEFAULT_FILTER_CPU_SECONDS
    ) -> list[dict[str, Any]]:
        """A copy of ``messages`` with each message's text filtered (:func:`filter_messages`)."""
        return filter_messages(messages, self, cpu_seconds=cpu_seconds)


def filter_messages(
    messages: Sequence[Mapping[str, Any]],
    flt: ReplacementFilter,
    *,
    cpu_seconds: float = DEFAULT_FILTER_CPU_SECONDS,
) -> list[dict[str, Any]]:
    """A copy of the stored chat ``messages`` with the text of each filtered: a string ``content`` and the
    ``text`` of every text part (a text the filter empties becomes ``""``). Other parts and keys (image parts,
    ``tool_calls``, ``name``, ``tool_call_id``) are kept as they are; the input is not changed. The texts
    share one CPU budget of ``cpu_seconds`` (:class:`FilterBudgetExceeded`)."""
    deadline = time.thread_time() + cpu_seconds
    out: list[dict[str, Any]] = []
    for message in messages:
        copy = dict(message)
        content = message.get("content")
        if isinstance(content, str):
            copy["content"] = flt.apply(content, deadline=deadline)
        elif isinstance(content, list):
            copy["content"] = [_filter_part(part, flt, deadline) for part in content]
        out.append(copy)
    return out


def _filter_part(part: Any, flt: ReplacementFilter, deadline: float) -> Any:
    if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return {**part, "text": flt.apply(part["text"], deadline=deadline)}
    return part


def message_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every text of ``messages`` the filter reads: string contents and text parts, in order."""
    texts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                part["text"]
                for part in content
                if isinstance(part, Mapping)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            )
    return texts


def is_blank(texts: str | Sequence[str]) -> bool:
    """Whether ``texts`` (one text or several) hold nothing but whitespace."""
    if isinstance(texts, str):
        return not texts.strip()
    return all(not text.strip() for text in texts)


def emptied(before: str | Sequence[str], after: str | Sequence[str]) -> bool:
    """Whether the filter emptied a prompt: it had text before (``before``) and has none after (``after``).
    A prompt that had no text to begin with (a chat request of images only) was not emptied."""
    return not is_blank(before) and is_blank(after)


CORRUPT_PROMPT_MESSAGE = (
    "This prompt cannot be accepted: nothing of it is left after the Horde's moderation filter, which applies "
    "to {whom}. Rephrase the request."
)


FILTER_BUDGET_MESSAGE = (
    "This prompt cannot be accepted: it is too long for the Horde's moderation filter, which applies to {whom}. "
    "Send a shorter prompt."
)


def filter_budget_error(*, nsfw_model: bool) -> HordeError:
    """400 CorruptPrompt: the filter spent its CPU budget (:class:`FilterBudgetExceeded`) on the prompt."""
    return HordeError(400, RC.CorruptPrompt, FILTER_BUDGET_MESSAGE.format(whom=_whom(nsfw_model)))


def _whom(nsfw_model: bool) -> str:
    return "prompts for the requested NSFW models" if nsfw_model else "requests from this account"


def corrupt_prompt_error(*, nsfw_model: bool) -> HordeError:
    """400 CorruptPrompt: the filter emptied the prompt. ``nsfw_model`` says whether a requested model is
    marked nsfw (the message then names the models; otherwise the requester's account)."""
    return HordeError(400, RC.CorruptPrompt, CORRUPT_PROMPT_MESSAGE.format(whom=_whom(nsfw_model)))
