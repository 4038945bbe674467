"""Context adjustments: max_length lowering to the workers' limit, then context sizing (context_fit).

See docs/native-api.md#context-adjustments. Token counts are the character-based estimate of the
flattened messages (``estimate_chat_prompt_tokens``), which includes CHAT_IMAGE_PROMPT_TOKENS per image.
A request fits when its prompt estimate plus its max_length is at most its max_context_length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import horde_contract as contract
from horde_core.metrics import counter, size_bucket

MAX_LENGTH_LOWERED = counter(
    "horde.chat.max_length_lowered",
    "Chat requests whose max_length was lowered to the largest declared worker max_length",
    ["horde.requested_bucket", "horde.declared_bucket", "horde.dry_run"],
)
CONTEXT_FIT = counter(
    "horde.text.context_fit",
    "Requests whose messages were trimmed to fit the context",
    ["horde.outcome", "horde.mode"],
)


@dataclass
class Sized:
    """The outcome of sizing: what the request is created with."""

    messages: list[dict[str, Any]]
    max_length: int
    max_context_length: int
    prompt_tokens: int
    adjustments: list[dict[str, Any]] = field(default_factory=list)


def lower_max_length(requested: int, declared_max: int, dry_run: bool) -> tuple[int, dict[str, Any] | None]:
    """Lower ``requested`` to the largest declared chat max_length when above it (docs/native-api.md#context-adjustments).

    Returns ``(max_length, adjustment or None)``; ``declared_max`` 0 means no declaration to lower to.
    """
    if declared_max <= 0 or requested <= declared_max:
        return requested, None
    MAX_LENGTH_LOWERED.labels(size_bucket(requested), size_bucket(declared_max), str(dry_run).lower()).inc()
    return declared_max, contract.context_adjustment(requested, declared_max, "worker_max_length")


def size_context(
    messages: list[dict[str, Any]],
    tools: Any,
    max_length: int,
    requested_context: int,
    growth_bound: int,
    context_fit: str,
) -> Sized:
    """Fit the messages into the context under ``context_fit`` (grow, reject, truncate_oldest).

    ``requested_context`` is horde.max_context_length or the text default (2048); ``growth_bound`` the
    largest chat max_context_length among the online chat workers serving the models. Raises 400
    PromptExceedsContext (the contract's refusal) when the messages cannot fit.
    """
    tokens = contract.estimate_chat_prompt_tokens(messages, tools)
    need = tokens + max_length
    sized = Sized(messages, max_length, requested_context, tokens)
    if need <= requested_context:
        return sized
    if context_fit == "reject":
        raise contract.prompt_exceeds_context_error(tokens, requested_context - max_length)
    bound = max(growth_bound, requested_context)
    if need <= bound:
        sized.max_context_length = need
        sized.adjustments.append(contract.context_adjustment(requested_context, need, "grow"))
        return sized
    if context_fit == "grow":
        raise contract.prompt_exceeds_context_error(tokens, bound - max_length)
    # truncate_oldest: run at the bound (grown when above the request), drop oldest turns until it fits.
    if bound > requested_context:
        sized.adjustments.append(contract.context_adjustment(requested_context, bound, "grow"))
    sized.max_context_length = bound
    kept, trimmed = contract.truncate_oldest(messages, tools, bound - max_length)
    sized.messages = kept
    if trimmed is not None:
        sized.prompt_tokens = int(trimmed["to"])
        sized.adjustments.append(trimmed)
    CONTEXT_FIT.labels("truncated", "truncate_oldest").inc()
    return sized
