"""The text kudos formula, applied to chat and text generations alike (docs/native-api.md#pricing; docs/native-api.md#submit, #kudos).

Pure functions: :mod:`horde_submit.generations` writes their results. ``charged_tokens`` (``T(x)``: characters
/ 4 rounded up, at least 20, at most max_length) is the contract's, and so are the validated bridges and their
0.3 factor (:mod:`horde_contract.bridges`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from horde_contract import charged_tokens
from horde_contract.bridges import UNVALIDATED_BRIDGE_FACTOR, is_validated_bridge

__all__ = [
    "PricingInputs",
    "charged_tokens",
    "context_multiplier",
    "escrow_split",
    "generation_kudos",
    "is_validated_bridge",
    "requester_charge",
    "speed_sample",
]

#: The fewest tokens a generation is charged (docs/native-api.md#submit, ``T(x)``).
MIN_CHARGED_TOKENS = 20
#: Per-token rate a trusted owner earns on an unknown model: the 2.7B rate (docs/native-api.md#submit, #kudos).
UNKNOWN_MODEL_TRUSTED_RATE = 0.027
#: The extra burn the requester pays on top of each generation's kudos (docs/native-api.md#kudos).
EXTRA_KUDOS_BURN = 1.0


def context_multiplier(prompt_characters: int, max_context_length: int) -> float:
    """``clamp(1.2 + 2.2 ** log2(prompt_tokens / 1024), 0.1, 30)``.

    ``prompt_tokens`` is the prompt's character estimate (at least 20), bounded by the request's context.
    Upstream bounds it by ``max_length`` (an upstream quirk); this project bounds it by the
    context the prompt is served in, its intended meaning.
    """
    tokens = charged_tokens(prompt_characters, max(max_context_length, MIN_CHARGED_TOKENS))
    value: float = 1.2 + 2.2 ** math.log2(tokens / 1024)
    return min(max(value, 0.1), 30.0)


@dataclass(frozen=True, slots=True)
class PricingInputs:
    """What the formula reads about one generation.

    ``parameters_billion`` is the served model's size from the text model reference, or None for a model the
    reference does not know.
    """

    reply_characters: int
    prompt_characters: int
    max_length: int
    max_context_length: int
    parameters_billion: float | None
    bridge_agent: str | None
    owner_trusted: bool


def generation_kudos(p: PricingInputs) -> float:
    """The kudos one generation earns its worker and costs its requester (before the extra burn).

    docs/native-api.md#submit (``TextProcessingGeneration.get_gen_kudos``): a known model earns
    ``round(T(gen) * bonus * P / 125 * (0.3 if unvalidated) * ctx, 2)`` with ``bonus = (max(P, 13) / 13) ** 0.2``;
    an unknown model earns ``ctx`` for an untrusted owner and ``T(gen) * ctx * 0.027`` for a trusted one.
    """
    tokens = charged_tokens(p.reply_characters, p.max_length)
    ctx = context_multiplier(p.prompt_characters, p.max_context_length)
    if p.parameters_billion is None or p.parameters_billion <= 0:
        if p.owner_trusted:
            return round(tokens * ctx * UNKNOWN_MODEL_TRUSTED_RATE, 2)
        return round(ctx, 2)
    size = p.parameters_billion
    bonus: float = (max(size, 13.0) / 13.0) ** 0.2
    kudos = tokens * bonus * size / 125.0 * ctx
    if not is_validated_bridge(p.bridge_agent):
        kudos *= UNVALIDATED_BRIDGE_FACTOR
    return round(kudos, 2)


def requester_charge(kudos: float, censored: bool = False) -> float:
    """What the requester pays for one generation: its kudos plus the extra burn, or the burn alone when
    censored (docs/native-api.md#kudos, ``calculate_extra_kudos_burn``)."""
    return round((0.0 if censored else kudos) + EXTRA_KUDOS_BURN, 2)


def speed_sample(reply_characters: int, max_length: int, seconds: float) -> float:
    """A worker speed sample in tokens per second: ``round(T(gen) / seconds, 1)``, or 1 at 0 seconds."""
    tokens = charged_tokens(reply_characters, max_length)
    if seconds <= 0:
        return 1.0
    return round(tokens / seconds, 1)


def escrow_split(reward: float, owner_trusted: bool, owner_anonymous: bool) -> tuple[float, float]:
    """``(spendable, escrowed)``: an untrusted, non-anonymous owner gets half of the reward into escrow
    (``evaluating_kudos``), docs/native-api.md#kudos (``User.record_contributions``)."""
    if owner_trusted or owner_anonymous:
        return reward, 0.0
    escrowed = round(reward / 2, 2)
    return round(reward - escrowed, 2), escrowed
