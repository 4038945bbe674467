"""The native refusals of the operator controls as the front answers them (docs/openai-front.md#errors)."""

from __future__ import annotations

from horde_contract.operator_controls import (
    MAINTENANCE_MODE_MESSAGE,
    maintenance_mode_error,
    timeout_ip_error,
)
from horde_oai.native_errors import map_native_error


def test_maintenance_is_a_503_the_sdks_do_not_retry() -> None:
    native = maintenance_mode_error()
    error = map_native_error(native.status, native.to_body(), headers=native.headers)
    assert (error.status, error.code, error.type, error.message) == (
        503,
        "MaintenanceMode",
        "api_error",
        MAINTENANCE_MODE_MESSAGE,
    )
    assert error.headers == {"Retry-After": "300", "x-should-retry": "false"}
    assert not error.should_retry
    # Another Retry-After from the horde is passed on; without one the front's default applies.
    error = map_native_error(400, native.to_body(), headers={"retry-after": "60"})
    assert error.headers["Retry-After"] == "60"
    error = map_native_error(400, {"rc": "MaintenanceMode"}, headers=None)
    assert (error.status, error.message, error.headers["Retry-After"]) == (
        503,
        MAINTENANCE_MODE_MESSAGE,
        "300",
    )


def test_timeout_ip_stays_a_403_without_retry() -> None:
    native = timeout_ip_error(120)
    error = map_native_error(native.status, native.to_body(), headers=native.headers)
    assert (error.status, error.code, error.type) == (403, "TimeoutIP", "permission_error")
    assert error.message == native.message
    assert error.headers["x-should-retry"] == "false"


def test_corrupt_prompt_stays_a_400() -> None:
    error = map_native_error(400, {"message": "nothing left", "rc": "CorruptPrompt"})
    assert (error.status, error.code, error.type) == (400, "CorruptPrompt", "invalid_request_error")
    assert not error.should_retry
