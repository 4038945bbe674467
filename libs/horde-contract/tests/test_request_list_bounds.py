"""The size bounds of a chat request's lists: horde.only/ignore hold at most
MAX_CHAT_WORKER_IDS ids of at most MAX_WORKER_ID_LENGTH characters, a model name at most MAX_MODEL_NAME_LENGTH
characters; each refused with 400 BadRequest at its path."""

from __future__ import annotations

import uuid
from typing import Any

import horde_contract as hc
import pytest
from horde_contract.limits import MAX_CHAT_WORKER_IDS, MAX_MODEL_NAME_LENGTH, MAX_WORKER_ID_LENGTH


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def ids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


def test_bounds() -> None:
    assert (MAX_CHAT_WORKER_IDS, MAX_WORKER_ID_LENGTH, MAX_MODEL_NAME_LENGTH) == (5, 64, 255)


@pytest.mark.parametrize("key", ["only", "ignore"])
def test_worker_id_lists_are_bounded(key: str, refusal: Any) -> None:
    chat = hc.parse_chat_request(body(horde={key: ids(MAX_CHAT_WORKER_IDS)}))
    assert getattr(chat.horde, key) is not None
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(body(horde={key: ids(10_000)}))
    refusal(
        info.value,
        400,
        "BadRequest",
        f"horde.{key}",
        f"'horde.{key}': lists 10000 worker ids; at most 5 are allowed.",
    )
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(body(horde={key: ["x" * (MAX_WORKER_ID_LENGTH + 1)]}))
    refusal(
        info.value, 400, "BadRequest", f"horde.{key}", f"'horde.{key}': has to be an array of worker ids."
    )


def test_model_names_are_bounded(refusal: Any) -> None:
    name = "m" * MAX_MODEL_NAME_LENGTH
    assert hc.parse_chat_request(body(model=name)).models == [name]
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(body(model=name + "m"))
    refusal(info.value, 400, "BadRequest", "model", "'model': a model name has at most 255 characters.")
    request = body(models=["a", name + "m"])
    del request["model"]
    with pytest.raises(hc.HordeError) as info:
        hc.parse_chat_request(request)
    refusal(
        info.value, 400, "BadRequest", "models[1]", "'models[1]': a model name has at most 255 characters."
    )
