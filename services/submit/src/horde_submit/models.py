"""The text model reference as pricing reads it: a model's size in billions of parameters, or None.

Text path §10: ``get_text_model_multiplier`` drops a ``::user#id`` suffix, matches exactly, then retries without
a quantization suffix. The reference data is loaded from ``horde_contract`` when the library ships one; a model
the reference does not know is priced as unknown (text path §4).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import horde_contract as hc

QUANT_SUFFIX = re.compile(r"[.,-][a-zA-Z0-9]+?-?Q(-[Ii]nt)?[2-9]{1,2}([_.-][0-9a-zA-Z]+)*")


class ModelReference:
    """Model sizes by name; ``parameters_billion(name)`` follows the reference's lookup rules."""

    def __init__(self, parameters: Mapping[str, float] | None = None) -> None:
        if parameters is None:
            parameters = getattr(hc, "TEXT_MODEL_PARAMETERS", None) or {}
        self._parameters = dict(parameters)

    def parameters_billion(self, name: str | None) -> float | None:
        """The model's parameters / 1e9, or None when the reference does not list it."""
        if not name:
            return None
        lookup = getattr(hc, "text_model_parameters_billion", None)
        if callable(lookup):
            found = lookup(name)
            return float(found) if found else None
        base = name.split("::", 1)[0]
        for candidate in (base, QUANT_SUFFIX.sub("", base)):
            value = self._parameters.get(candidate)
            if value:
                return float(value) / 1e9 if value > 1e6 else float(value)
        return None
