"""The moderation replacement filter (docs/native-api.md#moderation): what a flagged user's prompt, or a prompt
for a model the text model reference marks ``nsfw``, goes through before it is queued.

A filter is an ordered list of rules ``(pattern, replacement)``. Each pattern is an RE2 regular expression
(linear time whatever the prompt, so an operator's pattern cannot stall a request; no backreferences or
lookarounds), matched case-insensitively; every match is replaced by the replacement as literal text, rule
after rule, each rule seeing the previous rule's output. :data:`DEFAULT_REPLACEMENT_RULES` is this project's
own list (not upstream's): it keeps sexual content away from minors by removing terms that only name
sexualised minors and rewriting words and ages that make a character a minor into adult ones. Operators
replace it with ``HORDE_MODERATION_REPLACEMENTS`` (docs/operator-guide.md#operator-controls).

On a chat request the filter rewrites the text of each message (a string content and every text part)
and the prompt is flattened again from the result (:func:`filter_messages`); image parts, tool call
arguments, tool definitions and the response format are JSON documents or data and are not rewritten. A
prompt the filter leaves blank (nothing but whitespace) is refused with :func:`corrupt_prompt_error`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import re2

from .errors import RC, HordeError

#: The default rules, in order. Word boundaries are ASCII (RE2's ``\b``).
DEFAULT_REPLACEMENT_RULES: tuple[tuple[str, str], ...] = (
    # Terms that only ever name sexualised minors: removed (a prompt of nothing else ends up blank).
    (r"\b(?:loli(?:con)?s?|shota(?:con)?s?|jail ?bait|under-?age[ds]?|pre-?teens?|pre-?pubescent)\b", ""),
    # An age below 18 ("12 years old", "15-year-old", "9yo", "16 y/o") becomes an adult one.
    (r"\b(?:1[0-7]|[1-9])[ -]?(?:years?|yrs?)[ -]?old\b", "adult"),
    (r"\b(?:1[0-7]|[1-9]) ?(?:yo|y/o)\b", "adult"),
    # Words that make a character a minor become adults.
    (r"\b(?:little|young|small) girls\b|\bschool ?girls\b", "women"),
    (r"\b(?:little|young|small) girl\b|\bschool ?girl\b", "woman"),
    (r"\b(?:little|young|small) boys\b|\bschool ?boys\b", "men"),
    (r"\b(?:little|young|small) boy\b|\bschool ?boy\b", "man"),
    (r"\b(?:children|kids|toddlers|infants|teenagers|teens|minors)\b", "adults"),
    (r"\b(?:child|kid|toddler|infant|teenager|teen|minor)\b", "adult"),
)

#: The upper bound on rules a filter takes (each is one pass over the prompt).
MAX_REPLACEMENT_RULES = 200


def _options() -> Any:
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False
    return options


class ReplacementFilter:
    """A compiled rule list (see the module docstring).

    ``rules``: ``(pattern, replacement)`` pairs. Raises ValueError naming the rule for a pattern RE2 does not
    take, a rule that is not a pair of strings, or more than :data:`MAX_REPLACEMENT_RULES` rules.
    """

    def __init__(self, rules: Sequence[Sequence[str]] = DEFAULT_REPLACEMENT_RULES) -> None:
        if len(rules) > MAX_REPLACEMENT_RULES:
            raise ValueError(f"{len(rules)} replacement rules; at most {MAX_REPLACEMENT_RULES} are allowed")
        options = _options()
        compiled: list[tuple[Any, str]] = []
        for index, rule in enumerate(rules):
            if len(rule) != 2 or not all(isinstance(part, str) for part in rule):
                raise ValueError(f"replacement rule {index} is not a [pattern, replacement] pair of strings")
            pattern, replacement = rule
            try:
                compiled.append((re2.compile(pattern, options), replacement))
            except re2.error as exc:
                raise ValueError(
                    f"replacement rule {index}: {pattern!r} is not a pattern RE2 takes ({exc})"
                ) from None
        self._rules = compiled

    def __len__(self) -> int:
        return len(self._rules)

    def apply(self, text: str) -> str:
        """``text`` after every rule, in order (the replacement is literal text)."""
        for regex, replacement in self._rules:
            text = regex.sub(lambda _match, r=replacement: r, text)
        return text

    def filter_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """A copy of ``messages`` with each message's text filtered (:func:`filter_messages`)."""
        return filter_messages(messages, self)


def filter_messages(messages: Sequence[Mapping[str, Any]], flt: ReplacementFilter) -> list[dict[str, Any]]:
    """A copy of the stored chat ``messages`` with the text of each filtered: a string ``content`` and the
    ``text`` of every text part (a text the filter empties becomes ``""``). Other parts and keys (image parts,
    ``tool_calls``, ``name``, ``tool_call_id``) are kept as they are; the input is not changed."""
    out: list[dict[str, Any]] = []
    for message in messages:
        copy = dict(message)
        content = message.get("content")
        if isinstance(content, str):
            copy["content"] = flt.apply(content)
        elif isinstance(content, list):
            copy["content"] = [_filter_part(part, flt) for part in content]
        out.append(copy)
    return out


def _filter_part(part: Any, flt: ReplacementFilter) -> Any:
    if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return {**part, "text": flt.apply(part["text"])}
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


def corrupt_prompt_error(*, nsfw_model: bool) -> HordeError:
    """400 CorruptPrompt: the filter emptied the prompt. ``nsfw_model`` says whether a requested model is
    marked nsfw (the message then names the models; otherwise the requester's account)."""
    whom = "prompts for the requested NSFW models" if nsfw_model else "requests from this account"
    return HordeError(400, RC.CorruptPrompt, CORRUPT_PROMPT_MESSAGE.format(whom=whom))
