"""Small checks and measures of parsed JSON values, shared by the contract's parsers."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .errors import unsupported


def is_int(value: Any) -> bool:
    """Whether ``value`` is a JSON integer (``True`` and ``False`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def utf8_len(text: str) -> int:
    """The UTF-8 size of ``text`` in bytes (a lone surrogate counts as its three bytes)."""
    # ASCII is the common case and needs no encoding.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def compact_json(value: Any) -> str:
    """``value`` as compact JSON text, non-ASCII kept as it is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def choices(values: Any) -> str:
    """``'a', 'b', and 'c'`` (``'a'`` for one value), as the refusals list the accepted values."""
    names = [f"'{v}'" for v in values]
    return ", ".join(names[:-1]) + f", and {names[-1]}" if len(names) > 1 else names[0]


def refuse_unknown_keys(raw: Iterable[str], allowed: frozenset[str], path: str) -> None:
    """400 UnsupportedChatParameter at ``<path>.<key>`` for the first key of ``raw`` not in ``allowed``."""
    for key in raw:
        if key not in allowed:
            raise unsupported(f"{path}.{key}")
