"""5xx found by the no-5xx fuzz in the front's screening, each now a 400.

A role or content part type that is not a string (a list, an object) was looked up in a dict while unknown
nested keys were dropped (``drop_unknown_nested_keys``): TypeError, answered 500.
"""

from __future__ import annotations

from typing import Any

import pytest
from horde_contract import HordeError, parse_chat_request
from horde_oai.errors import OpenAIError
from horde_oai.schema import validate_request


@pytest.mark.parametrize("role", [["user"], {"user": 1}])
def test_a_role_of_the_wrong_type_is_400(role: Any) -> None:
    with pytest.raises(OpenAIError) as caught:
        validate_request({"model": "m", "messages": [{"role": role, "content": "hi"}]})
    assert caught.value.status == 400
    assert caught.value.param == "messages[0].role"


@pytest.mark.parametrize("kind", [["text"], {}, None])
def test_a_part_type_of_the_wrong_type_is_left_for_the_contract_to_refuse(kind: Any) -> None:
    part = {"type": kind, "text": "hi"}
    _, screened = validate_request({"model": "m", "messages": [{"role": "user", "content": [part]}]})
    assert screened["messages"][0]["content"] == [part]
    with pytest.raises(HordeError) as caught:
        parse_chat_request(screened)  # what admission answers the front with
    assert (caught.value.status, caught.value.rc) == (400, "BadRequest")
    assert caught.value.param == "messages[0].content[0].type"
