"""Worker bridges and the worker rewards that depend on them: which backends are validated, what an
unvalidated one earns, and the uptime reward (docs/native-api.md#workers, #uptime-kudos, #pricing).

One place for the rule every side applies: dispatch (eligibility for ``validated_backends``, the uptime
reward at check-in) and submit (the generation reward). Pure.

- A bridge's name is ``bridge_agent`` up to its first ``:`` (``unknown`` when empty). It is validated when the
  name is one of :data:`VALIDATED_TEXT_BACKENDS`: upstream's list (``horde/bridge_reference.py``) plus this
  project's reference worker, whose replies the broker verifies like any other.
- An unvalidated bridge earns :data:`UNVALIDATED_BRIDGE_FACTOR` (0.3) of a known model's generation reward and
  of the uptime reward.
- Uptime reward (upstream ``TextWorker.calculate_uptime_reward``), every :data:`UPTIME_REWARD_SECONDS` of
  uptime: ``25 + 15 * min(ctx, 262144) / 1024`` kudos for a worker offering ``ctx`` tokens of context; half of
  that when its first model is unknown to the text model reference; otherwise times 0.3 for an unvalidated
  bridge and times ``max(P / 7, 0.25)`` for a model of ``P`` billion parameters, rounded to 2 decimals.
"""

from __future__ import annotations

from .model_reference import TextModelReference

__all__ = [
    "UNVALIDATED_BRIDGE_FACTOR",
    "UPTIME_REWARD_SECONDS",
    "VALIDATED_TEXT_BACKENDS",
    "bridge_name",
    "is_validated_bridge",
    "uptime_reward",
]

#: Bridge names whose backends are validated (upstream ``LLM_VALIDATED_BACKENDS``) and this project's reference
#: worker.
VALIDATED_TEXT_BACKENDS: frozenset[str] = frozenset(
    {
        "AI Horde Worker",
        "AI Horde Worker~aphrodite~oai",
        "AI Horde Worker~aphrodite~kai",
        "KoboldCppEmbedWorker",
        "TabbyAPI",
        "Horde Chat Worker",
    }
)
#: Multiplier of an unvalidated bridge's reward (a known model's generation, and uptime).
UNVALIDATED_BRIDGE_FACTOR = 0.3
#: Upstream's uptime reward interval (``WorkerTemplate.uptime_reward_threshold``), seconds of uptime.
UPTIME_REWARD_SECONDS = 600
#: The uptime reward's base, and its kudos per 1024 tokens of context up to :data:`UPTIME_CONTEXT_CAP`.
UPTIME_BASE_KUDOS = 25.0
UPTIME_KUDOS_PER_1K_CONTEXT = 15.0
UPTIME_CONTEXT_CAP = 262_144
#: The uptime reward of a worker whose first model the reference does not know: half the base.
UNKNOWN_MODEL_UPTIME_FACTOR = 0.5
#: The model size the uptime reward is measured against (7B earns 1×), and the least multiplier it gives.
UPTIME_BASELINE_BILLION = 7.0
UPTIME_MIN_SIZE_FACTOR = 0.25


def bridge_name(bridge_agent: str | None) -> str:
    """The part of ``bridge_agent`` before the first ``:`` (``unknown`` when empty)."""
    return (bridge_agent or "").split(":", 1)[0] or "unknown"


def is_validated_bridge(bridge_agent: str | None) -> bool:
    """Whether the bridge's name is one of :data:`VALIDATED_TEXT_BACKENDS`."""
    return bridge_name(bridge_agent) in VALIDATED_TEXT_BACKENDS


def uptime_reward(
    models: list[str] | tuple[str, ...],
    max_context_length: int,
    bridge_agent: str | None,
    reference: TextModelReference,
) -> float:
    """The kudos one uptime interval earns a worker offering ``models`` (the first one counts) with
    ``max_context_length`` tokens of context through ``bridge_agent`` (see the module docstring)."""
    context = min(max(max_context_length, 0), UPTIME_CONTEXT_CAP)
    base = UPTIME_BASE_KUDOS + UPTIME_KUDOS_PER_1K_CONTEXT * context / 1024
    size = reference.parameters_billion(models[0]) if models else None
    if size is None:
        return round(base * UNKNOWN_MODEL_UPTIME_FACTOR, 2)
    if not is_validated_bridge(bridge_agent):
        base *= UNVALIDATED_BRIDGE_FACTOR
    return round(base * max(size / UPTIME_BASELINE_BILLION, UPTIME_MIN_SIZE_FACTOR), 2)
