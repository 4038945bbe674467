"""The refusals of the operator controls every generate route applies: horde-wide maintenance mode and IP
timeouts (docs/native-api.md#operator-controls, docs/operator-guide.md#operator-controls).

Each message is written here once: admission raises them, the OpenAI front maps them
(docs/openai-front.md#requests), and the tests of both read them from here.
"""

from __future__ import annotations

from .errors import RC, HordeError

#: The Retry-After (seconds) of a maintenance refusal: a hint of when to look again, not a promise. An
#: operator's maintenance takes minutes, so a client retrying within seconds (the OpenAI SDKs' backoff) only
#: meets the same refusal; every maintenance refusal therefore also says ``x-should-retry: false``.
MAINTENANCE_RETRY_AFTER_SECONDS = 300

MAINTENANCE_MODE_MESSAGE = "The Horde is in maintenance mode and accepts no new requests. Try again later."


def maintenance_mode_error() -> HordeError:
    """400 MaintenanceMode (upstream's status; its route documents 503), with ``Retry-After``
    (:data:`MAINTENANCE_RETRY_AFTER_SECONDS`) and ``x-should-retry: false``: maintenance outlasts any
    automatic retry. The OpenAI front answers it as 503 (docs/openai-front.md#requests)."""
    return HordeError(
        400,
        RC.MaintenanceMode,
        MAINTENANCE_MODE_MESSAGE,
        headers={"Retry-After": str(MAINTENANCE_RETRY_AFTER_SECONDS), "x-should-retry": "false"},
    )


def timeout_ip_error(seconds: int) -> HordeError:
    """403 TimeoutIP: an operator timed out the client's address for another ``seconds`` (≥ 1), which the
    message and ``Retry-After`` give; ``x-should-retry: false`` (retrying earlier meets the same refusal)."""
    seconds = max(int(seconds), 1)
    return HordeError(
        403,
        RC.TimeoutIP,
        f"Requests from your address are suspended by the Horde's operators for another {seconds} seconds.",
        headers={"Retry-After": str(seconds), "x-should-retry": "false"},
    )
