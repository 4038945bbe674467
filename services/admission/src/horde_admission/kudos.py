"""Kudos at admission: the quote, the free output allowance and whether a hold is needed.

See docs/native-api.md#free-output-allowance, #pricing (quote from the first listed model, upfront
checks at the highest multiplier), #request-body (horde.max_kudos); docs/native-api.md#submit (quote formula), #kudos (hold
amount, KudosUpfront). Multipliers come from the text model reference (``HORDE_TEXT_MODEL_REFERENCE``,
docs/native-api.md#model-reference): ``parameters / 1e9`` for a listed model, 1 otherwise.
"""

from __future__ import annotations

import functools
import math

from horde_contract import TextModelReference
from horde_contract.errors import RC, HordeError
from horde_core.metrics import counter, histogram

from horde_admission.settings import AdmissionSettings

FREE_ALLOWANCE_DECISIONS = counter(
    "horde.text.free_allowance.decisions",
    "Request creations by free output allowance outcome",
    ["horde.requester", "horde.outcome", "horde.requested_bucket", "horde.allowance_bucket", "horde.chat"],
)
FREE_ALLOWANCE_WAIT = histogram(
    "horde.text.free_allowance.estimated_wait_seconds",
    "The queue wait the free output allowance was sized by",
    ["horde.chat", "horde.requester"],
)


def context_multiplier(max_context_length: int) -> float:
    """``clamp(1.2 + 2.2^log2(ctx/1024), 0.1, 30)`` (docs/native-api.md#submit, the quote's context factor)."""
    value = 1.2 + float(2.2 ** math.log2(max(max_context_length, 1) / 1024))
    return min(max(value, 0.1), 30.0)


def _generation_at(p: float, max_length: int, max_context_length: int) -> float:
    """``round(max_length * bonus * P * ctx / 100, 2)`` with ``bonus = (max(P, 13) / 13) ** 0.2``."""
    ctx = context_multiplier(max_context_length)
    bonus = float((max(p, 13) / 13) ** 0.2)
    return round(max_length * bonus * p * ctx / 100, 2)


def quote_generation(
    models: list[str], max_length: int, max_context_length: int, *, reference: TextModelReference
) -> float:
    """TextWaitingPrompt.calculate_kudos: the kudos of one generation at the full max_length.

    Priced at the first listed model (the default multiplier when it is unknown, never a 500).
    """
    if not models:
        ctx = context_multiplier(max_context_length)
        return round(max_length * 13 * ctx / 100, 2)
    return _generation_at(reference.multiplier(models[0]), max_length, max_context_length)


def quote_request(
    models: list[str],
    max_length: int,
    max_context_length: int,
    n: int = 1,
    tax: float = 1.0,
    *,
    reference: TextModelReference,
    highest: bool = False,
) -> int:
    """The request's kudos estimate, as a dry run returns it: ``round((gen + 1) * n + tax)``, ``gen`` priced
    at the first listed model (:func:`quote_generation`). With ``highest``, ``gen`` is priced at the highest
    multiplier across the list instead: what a shared key has to cover (:data:`shared_key_amount`)."""
    if highest and models:
        gen = _generation_at(reference.highest_multiplier(models), max_length, max_context_length)
    else:
        gen = quote_generation(models, max_length, max_context_length, reference=reference)
    return round((gen + 1) * n + tax)


#: What a shared key has to cover: the estimate priced at the highest multiplier across the list, so a cheap
#: model listed first does not lower it (docs/native-api.md#pricing). Equals the estimate for a single model or none.
shared_key_amount = functools.partial(quote_request, highest=True)


def hold_amount(models: list[str], max_length: int, n: int = 1, *, reference: TextModelReference) -> float:
    """The upfront hold: ``round(max_length * maxP / 21, 2) * n`` (20 per job without models), maxP the
    highest multiplier across the list."""
    if not models:
        return 20.0 * n
    return round(max_length * reference.highest_multiplier(models) / 21, 2) * n


def estimated_wait_seconds(
    competing_tokens: float, competing_jobs: int, eligible_threads: int, tokens_per_second: float
) -> float | None:
    """``competing_tokens / (tps * min(jobs, threads) / threads)``; None without eligible threads."""
    if eligible_threads <= 0 or tokens_per_second <= 0:
        return None
    if competing_jobs <= 0 or competing_tokens <= 0:
        return 0.0
    busy = min(competing_jobs, eligible_threads) / eligible_threads
    return competing_tokens / (tokens_per_second * busy)


def free_output_allowance(settings: AdmissionSettings, wait: float | None) -> int:
    """The free output allowance for a request whose estimated wait is ``wait`` (None: no eligible worker)."""
    ceiling, floor = settings.text_free_output_ceiling, settings.text_free_output_floor
    full, floor_wait = (
        settings.text_free_output_wait_full_seconds,
        settings.text_free_output_wait_floor_seconds,
    )
    if wait is None or wait >= floor_wait:
        return floor
    if wait <= full:
        return ceiling
    return round(ceiling - (ceiling - floor) * (wait - full) / (floor_wait - full))


def kudos_upfront_error(allowance: int, amount: float) -> HordeError:
    """403 KudosUpfront; the message states the allowance (docs/native-api.md#kudos wording)."""
    return HordeError(
        403,
        RC.KudosUpfront,
        f"Due to heavy demand, for requests over {allowance} tokens, the client needs to already have the "
        f"required kudos. This request requires {amount:g} kudos to fulfil.",
    )


def shared_key_insufficient_error(available: float, amount: float) -> HordeError:
    """403 SharedKeyInsufficientKudos: the shared key's kudos left (less its requests' holds) and what the
    request needs (docs/native-api.md#kudos)."""
    return HordeError(
        403,
        RC.SharedKeyInsufficientKudos,
        f"This shared key has {max(available, 0.0):g} kudos left; the request needs {amount:g}.",
    )
