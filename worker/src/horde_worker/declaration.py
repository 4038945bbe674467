"""The chat declaration a worker sends on every pop (docs/native-api.md#chat-declaration).

A backend reports :class:`Capabilities`; :func:`build_declaration` turns them, with the operator's settings,
into the pop fields. Rule (worker/README.md#what-the-worker-declares): a *feature* is declared when the backend applies the field; a
*guarantee* only when the worker itself checks it before submitting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from horde_contract.vocab import CHAT_FEATURE_VALUES, CHAT_GUARANTEE_VALUES, ChatImageTransport


@dataclass
class Capabilities:
    """What a backend can do, as discovered at start-up.

    ``features`` and ``guarantees`` are ChatFeature/ChatGuarantee values. ``max_context_length`` and
    ``max_length`` are the backend's own limits in tokens (``None`` when it does not say; the operator's
    settings then stand). ``tools_max_temperature`` is the highest temperature applied as sent with tools
    (``None``: every temperature is applied as sent). ``model_name`` is the model the backend reports, used as
    ``model_id`` when the operator sets none. ``image_transports`` is how it receives images (none until the
    image issue).
    """

    features: frozenset[str] = frozenset()
    guarantees: frozenset[str] = frozenset()
    max_context_length: int | None = None
    max_length: int | None = None
    tools_max_temperature: float | None = None
    model_name: str | None = None
    image_transports: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def chat_features(
    caps: Capabilities, only: list[str] | None = None, disabled: list[str] | None = None
) -> list[str]:
    """The sorted ``chat_features`` list: the backend's features and guarantees.

    ``only`` (operator override) replaces the computed set; ``disabled`` removes values from it. Values that
    are neither features nor guarantees are dropped, so a typo never reaches the Horde.
    """
    values = set(only) if only else set(caps.features) | set(caps.guarantees)
    values -= set(disabled or [])
    return sorted(v for v in values if v in CHAT_FEATURE_VALUES or v in CHAT_GUARANTEE_VALUES)


def chat_limits(caps: Capabilities, max_context_length: int, max_length: int) -> dict[str, Any]:
    """``chat_limits``: the operator's limits lowered to the backend's, in tokens (see
    docs/native-api.md#chat-declaration). ``tools_max_temperature`` appears only when the backend clamps temperature with tools."""
    ctx = (
        max_context_length
        if caps.max_context_length is None
        else min(max_context_length, caps.max_context_length)
    )
    length = max_length if caps.max_length is None else min(max_length, caps.max_length)
    limits: dict[str, Any] = {"max_context_length": ctx, "max_length": min(length, ctx)}
    if caps.tools_max_temperature is not None:
        limits["tools_max_temperature"] = caps.tools_max_temperature
    return limits


def build_declaration(
    caps: Capabilities,
    *,
    model_id: str,
    prompt_jobs: bool,
    max_context_length: int,
    max_length: int,
    only_features: list[str] | None = None,
    disabled_features: list[str] | None = None,
    messages_url: bool = False,
) -> dict[str, Any]:
    """The six declaration fields of a pop body.

    Returns ``{chat_jobs: true, prompt_jobs, chat_features, chat_limits, model_id, image_transports}``;
    ``model_id`` must be one of the pop's ``models`` (the caller puts it there). ``messages_url`` adds that
    transport to the backend's: the worker itself fetches offloaded messages (docs/native-api.md#messages-offload),
    whatever the backend.
    """
    transports = list(caps.image_transports)
    if messages_url and ChatImageTransport.messages_url.value not in transports:
        transports.append(ChatImageTransport.messages_url.value)
    return {
        "chat_jobs": True,
        "prompt_jobs": prompt_jobs,
        "chat_features": chat_features(caps, only_features, disabled_features),
        "chat_limits": chat_limits(caps, max_context_length, max_length),
        "model_id": model_id,
        "image_transports": transports,
    }
