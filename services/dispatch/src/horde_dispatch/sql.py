"""A small builder for statements whose clauses depend on the pop: it numbers only the parameters a
statement really uses, so one statement text per clause combination is prepared (asyncpg caches it)."""

from __future__ import annotations

from typing import Any


class Params:
    """Collects positional parameters; :meth:`add` returns the ``$n::type`` placeholder for a value."""

    __slots__ = ("_by_key", "values")

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._by_key: dict[str, str] = {}

    def add(self, value: Any, sql_type: str, key: str | None = None) -> str:
        """Append ``value`` and return ``$n::sql_type``; with ``key``, the same placeholder is reused."""
        if key is not None and key in self._by_key:
            return self._by_key[key]
        self.values.append(value)
        placeholder = f"${len(self.values)}::{sql_type}"
        if key is not None:
            self._by_key[key] = placeholder
        return placeholder
