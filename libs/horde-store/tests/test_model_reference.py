"""load_text_model_reference: the local db.json copy named by HORDE_TEXT_MODEL_REFERENCE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from horde_core.settings import HordeSettings
from horde_store.model_reference import TextModelReferenceError, load_text_model_reference


def test_unset_or_empty_is_the_empty_reference() -> None:
    assert len(load_text_model_reference(None)) == 0
    assert len(load_text_model_reference("")) == 0


def test_loads_the_db_json_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.json"
    path.write_text(
        json.dumps({"org/model-13b": {"name": "org/model-13b", "baseline": "opt", "parameters": 13000000000}})
    )
    monkeypatch.setenv("HORDE_TEXT_MODEL_REFERENCE", str(path))
    settings = HordeSettings()
    assert settings.text_model_reference == str(path)
    reference = load_text_model_reference(settings.text_model_reference)
    assert reference.multiplier("koboldcpp/model-13b") == 13.0
    assert reference.is_known("aphrodite/org/model-13b") and not reference.is_known("model-13b")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "cannot read the text model reference"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "is not a JSON object of model entries"),
        ('{"org/m": {"parameters": "x"}}', "text model reference entry 'org/m' has no numeric 'parameters'"),
    ],
)
def test_bad_files_are_a_clear_error(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "db.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TextModelReferenceError) as info:
        load_text_model_reference(str(path))
    message = str(info.value)
    assert message.startswith("HORDE_TEXT_MODEL_REFERENCE: ") and str(path) in message and fragment in message
