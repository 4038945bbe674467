"""Load the text model reference from a local file (``HORDE_TEXT_MODEL_REFERENCE``).

Upstream fetches ``db.json`` from GitHub every hour (docs/native-api.md#model-reference); this deployment reads a local copy in the
same format once, when the process starts. Admission reads it for the known-model check and the quote/hold,
submit for the generation's price. The rules themselves are :class:`horde_contract.TextModelReference`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from horde_contract import TextModelReference


class TextModelReferenceError(RuntimeError):
    """The configured text model reference cannot be read or is not in the db.json format."""


def load_text_model_reference(path: str | None) -> TextModelReference:
    """The reference in ``path`` (a db.json file); an empty reference when ``path`` is None or empty.

    Raises :class:`TextModelReferenceError`, naming the setting and the file, when the file is missing,
    unreadable, not JSON, not an object, or has an entry without positive numeric ``parameters``.
    """
    if not path:
        return TextModelReference()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TextModelReferenceError(
            f"HORDE_TEXT_MODEL_REFERENCE: cannot read the text model reference {path!r}: {exc}"
        ) from exc
    try:
        db = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TextModelReferenceError(
            f"HORDE_TEXT_MODEL_REFERENCE: {path!r} is not valid JSON: {exc}"
        ) from exc
    if not isinstance(db, Mapping):
        raise TextModelReferenceError(
            f"HORDE_TEXT_MODEL_REFERENCE: {path!r} is not a JSON object of model entries (the db.json format)"
        )
    try:
        return TextModelReference.from_mapping(db)
    except ValueError as exc:
        raise TextModelReferenceError(f"HORDE_TEXT_MODEL_REFERENCE: {path!r}: {exc}") from exc
