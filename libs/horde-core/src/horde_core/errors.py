"""The Horde error envelope: every error body is ``{"message", "rc", ...}`` with the spec's status.

Services raise :class:`HordeError` (or a ``horde_contract.ChatContractError``, which the app factory maps the
same way); request-validation failures become 400 ``BadRequest`` with a message naming the field.
"""

from __future__ import annotations

from typing import Any


class HordeError(Exception):
    """An API refusal: HTTP ``status``, return code ``rc``, human ``message``, extra body keys and optional
    response ``headers`` (such as ``Retry-After``)."""

    def __init__(
        self, status: int, rc: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.rc = rc
        self.message = message
        self.headers = headers
        self.extra = extra

    def to_body(self) -> dict[str, Any]:
        """The JSON body: ``{"message": str, "rc": str, **extra}``."""
        return {"message": self.message, "rc": self.rc, **self.extra}


def error_body(message: str, rc: str, **extra: Any) -> dict[str, Any]:
    """Build an error body in the Horde envelope."""
    return {"message": message, "rc": rc, **extra}
