"""The completion limit's range at the front: max_tokens (or max_completion_tokens) above 16384 is refused
with 400 before any native call, never lowered; 16384 itself passes to the Horde.

See docs/native-api.md#request-body ("max_length, 16 to 16384 ... not clamped"), docs/openai-front.md
#requests (the rules shared with the native route; a limit of 1 to 15 gets the Horde floor).
The rule is horde_contract's (parse_chat_request), the same one the native route applies.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from horde_testing.launcher import ServiceProcess

MESSAGES = [{"role": "user", "content": "Hello"}]
HEADERS = {"Authorization": "Bearer 0000000000"}


def complete(front: ServiceProcess, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{front.url}/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, **body},
        headers=HEADERS,
        timeout=20,
    )


@pytest.mark.parametrize("value", [16385, 20000])
def test_max_tokens_above_16384_is_400(lone_front: ServiceProcess, value: int) -> None:
    response = complete(lone_front, max_tokens=value)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "Invalid value for 'max_tokens': Input should be less than or equal to 16384",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "BadRequest",
        }
    }
    assert response.headers["x-should-retry"] == "false"


def test_max_completion_tokens_above_16384_names_the_key_sent(lone_front: ServiceProcess) -> None:
    response = complete(lone_front, max_completion_tokens=20000)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("max_completion_tokens", "BadRequest")
    assert (
        error["message"]
        == "Invalid value for 'max_completion_tokens': Input should be less than or equal to 16384"
    )


def test_max_tokens_16384_is_accepted(lone_front: ServiceProcess) -> None:
    # Accepted by the front and forwarded: the horde of this front does not answer, so 502, not a 400.
    response = complete(lone_front, max_tokens=16384)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "HordeUnavailable"
    both = complete(lone_front, max_tokens=16384, max_completion_tokens=16384)
    assert both.status_code == 502
