"""The text model reference as the Horde reads it: which model names are known and their size.

docs/native-api.md#model-reference (``horde/model_reference.py``, the text-model-reference ``convert.py``); see docs/native-api.md
#known-models and #pricing. Pure: the caller reads the upstream ``db.json`` mapping
(``{"org/name": {"name": ..., "parameters": 7000000000, ...}, ...}``) and hands it to
:meth:`TextModelReference.from_mapping`.

- Naming: each ``org/name`` row also answers as ``aphrodite/org/name`` and ``koboldcpp/name`` (org dropped), as
  ``convert.py`` writes them; a row already under one of those prefixes is kept as it is, and a row the file
  lists explicitly wins over a derived name.
- Lookup (``is_known_text_model``, ``get_text_model_multiplier``): a ``::user#id`` suffix is dropped, the name
  is matched exactly, then retried with every quantization suffix (:data:`QUANT_SUFFIX`) removed.
- The multiplier is ``parameters / 1e9`` for a known model and 1 otherwise.
- A row with ``"nsfw": true`` marks the model (and its derived names) nsfw: its prompts go through the
  moderation replacement filter (docs/native-api.md#moderation, :mod:`horde_contract.moderation`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DERIVED_NAME_PREFIXES",
    "QUANT_SUFFIX",
    "TextModelReference",
]

#: A quantization suffix such as ``-Q4_K_M`` or ``.Q8_0`` (upstream ``ModelReference.no_q_regex``).
QUANT_SUFFIX = re.compile(r"[.,-][a-zA-Z0-9]+?-?Q(-[Ii]nt)?[2-9]{1,2}([_.-][0-9a-zA-Z]+)*")
#: The backend prefixes ``convert.py`` derives names under (``aphrodite/org/name``, ``koboldcpp/name``).
DERIVED_NAME_PREFIXES = ("aphrodite/", "koboldcpp/")
#: The default multiplier of a model the reference does not list.
DEFAULT_MULTIPLIER = 1.0


def _parameters(key: str, row: Any) -> int:
    """The row's ``parameters`` as a positive integer (``int(parameters)`` upstream); ValueError otherwise."""
    if not isinstance(row, Mapping):
        raise ValueError(f"text model reference entry {key!r} is not an object")
    value = row.get("parameters")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"text model reference entry {key!r} has no numeric 'parameters'")
    try:
        parameters = int(value)
    except (ValueError, OverflowError):
        raise ValueError(f"text model reference entry {key!r} has no numeric 'parameters'") from None
    if parameters <= 0:
        raise ValueError(f"text model reference entry {key!r} has 'parameters' {value!r}, not positive")
    return parameters


def _derived_names(key: str) -> tuple[str, ...]:
    """The names ``convert.py`` writes for a reference row (none for a row already under a backend prefix)."""
    if key.startswith(DERIVED_NAME_PREFIXES):
        return ()
    short = key.split("/")[1] if "/" in key else key
    return (f"aphrodite/{key}", f"koboldcpp/{short}")


def _base_name(name: str) -> str:
    """``name`` without its ``::user#id`` suffix (only a single ``::`` separates one, as upstream)."""
    parts = name.split("::")
    return parts[0] if len(parts) == 2 else name


@dataclass(frozen=True)
class TextModelReference:
    """Known text models and their parameter counts, by every name the reference answers to."""

    parameters: Mapping[str, int] = field(default_factory=dict)
    #: The names (derived ones included) of the rows marked ``"nsfw": true``.
    nsfw_names: frozenset[str] = frozenset()

    @classmethod
    def from_mapping(cls, db: Mapping[str, Any]) -> TextModelReference:
        """Build the reference from the upstream ``db.json`` mapping, with the naming expansion.

        Raises ValueError for an entry that is not an object or lacks positive numeric ``parameters``.
        """
        explicit: dict[str, int] = {}
        nsfw: dict[str, bool] = {}
        for key, row in db.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"text model reference key {key!r} is not a model name")
            explicit[key] = _parameters(key, row)
            nsfw[key] = row.get("nsfw") is True
        names: dict[str, int] = {}
        marked: dict[str, bool] = {}
        for key, parameters in explicit.items():
            for derived in _derived_names(key):
                names.setdefault(derived, parameters)
                marked.setdefault(derived, nsfw[key])
        names.update(explicit)
        marked.update(nsfw)
        return cls(parameters=names, nsfw_names=frozenset(name for name, on in marked.items() if on))

    def __len__(self) -> int:
        return len(self.parameters)

    def _key(self, name: str | None) -> str | None:
        """The reference name ``name`` resolves to (the lookup rules), or None."""
        if not name:
            return None
        base = _base_name(name)
        if base in self.parameters:
            return base
        stripped = QUANT_SUFFIX.sub("", base)
        return stripped if stripped in self.parameters else None

    def _lookup(self, name: str | None) -> int | None:
        key = self._key(name)
        return None if key is None else self.parameters[key]

    def is_nsfw(self, name: str | None) -> bool:
        """True when ``name`` resolves (the lookup rules) to a row marked ``"nsfw": true``."""
        key = self._key(name)
        return key is not None and key in self.nsfw_names

    def has_nsfw(self, names: list[str]) -> bool:
        """True when any of ``names`` is nsfw (:meth:`is_nsfw`; upstream ``has_nsfw_models``)."""
        return any(self.is_nsfw(name) for name in names)

    def is_known(self, name: str | None) -> bool:
        """``is_known_text_model``: True when the reference lists ``name`` (after the lookup rules)."""
        return self._lookup(name) is not None

    def parameters_billion(self, name: str | None) -> float | None:
        """The model's ``parameters / 1e9``, or None when the reference does not list it."""
        found = self._lookup(name)
        return None if found is None else found / 1e9

    def multiplier(self, name: str | None) -> float:
        """``get_text_model_multiplier``: ``parameters / 1e9`` of a known model, else 1."""
        found = self.parameters_billion(name)
        return DEFAULT_MULTIPLIER if found is None else found

    def highest_multiplier(self, names: list[str]) -> float:
        """The highest multiplier across ``names`` (the upfront hold and shared-key checks); 1 for none."""
        return max((self.multiplier(n) for n in names), default=DEFAULT_MULTIPLIER)
