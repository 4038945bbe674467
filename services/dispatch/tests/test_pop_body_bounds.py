"""Pop body values that reached PostgreSQL out of its range or crashed the id parse (500s found by the no-5xx
fuzz), each now refused with 400 before anything is stored, or ignored where upstream ignores
it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from horde_contract import HordeError
from horde_dispatch.pop_body import MAX_STORED_LENGTH, parse_pop_body

CHAT_POP: dict[str, Any] = {
    "name": "w",
    "models": ["model-a"],
    "chat_jobs": True,
    "model_id": "model-a",
    "chat_limits": {"max_context_length": 4096, "max_length": 512},
}


@pytest.mark.parametrize("field", ["max_length", "max_context_length"])
def test_a_text_length_past_the_stored_integer_is_400(field: str) -> None:
    assert (
        parse_pop_body({**CHAT_POP, field: MAX_STORED_LENGTH}).text.model_dump()[field] == MAX_STORED_LENGTH
    )
    with pytest.raises(RequestValidationError) as caught:
        parse_pop_body({**CHAT_POP, field: 10**20})
    (error,) = caught.value.errors()
    assert error["loc"] == (field,)
    assert error["type"] == "less_than_equal"


@pytest.mark.parametrize("field", ["max_length", "max_context_length"])
def test_a_chat_limit_past_the_stored_integer_is_chat_declaration_invalid(field: str) -> None:
    limits = {"max_context_length": 4096, "max_length": 512, field: MAX_STORED_LENGTH + 1}
    with pytest.raises(HordeError) as caught:
        parse_pop_body({**CHAT_POP, "chat_limits": limits})
    assert (caught.value.status, caught.value.rc) == (400, "ChatDeclarationInvalid")
    assert caught.value.param == f"chat_limits.{field}"
    assert caught.value.message == f"'chat_limits.{field}': has to be at most 2147483647."


def test_a_priority_id_past_every_user_id_names_nobody() -> None:
    pop = parse_pop_body(
        {**CHAT_POP, "priority_usernames": ["a#7", "b#" + "9" * 30, "c#9223372036854775807"]}
    )
    assert pop.priority_user_ids == [7, 9223372036854775807]


@pytest.mark.parametrize("entry", ["a#\u00b2", "a#\u0663", "a#1\u00b9"])
def test_a_priority_id_of_non_ascii_digits_is_invalid_priority_username(entry: str) -> None:
    # "²".isdigit() is true and int("²") raises: this was a 500.
    with pytest.raises(HordeError) as caught:
        parse_pop_body({**CHAT_POP, "priority_usernames": [entry]})
    assert (caught.value.status, caught.value.rc) == (400, "InvalidPriorityUsername")
    assert caught.value.message == f"Priority usernames need to be in the form alias#id. '{entry}' is not."


def test_at_most_max_pop_priority_usernames_of_at_most_100_characters() -> None:
    from horde_contract.limits import MAX_POP_PRIORITY_USERNAMES

    many = [f"u#{i}" for i in range(MAX_POP_PRIORITY_USERNAMES)]
    assert len(parse_pop_body({**CHAT_POP, "priority_usernames": many}).priority_user_ids) == 100
    with pytest.raises(RequestValidationError) as caught:
        parse_pop_body({**CHAT_POP, "priority_usernames": [*many, "u#100"]})
    (error,) = caught.value.errors()
    assert error["loc"] == ("priority_usernames",) and error["type"] == "too_long"
    with pytest.raises(RequestValidationError) as caught:
        parse_pop_body({**CHAT_POP, "priority_usernames": ["a" * 96 + "#1234"]})
    (error,) = caught.value.errors()
    assert error["loc"] == ("priority_usernames", 0) and error["type"] == "string_too_long"
