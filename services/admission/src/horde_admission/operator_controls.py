"""The operator controls both generate routes apply (docs/native-api.md#operator-controls): maintenance mode,
IP timeouts and the moderation replacement filter, at the spec's places in the processing order
(maintenance, authentication, the concurrency limit, countermeasures, moderation).

- Maintenance mode (the ``horde_modes`` row, :mod:`horde_store.modes`): 400 MaintenanceMode before
  authentication. The row is read at most once per ``HORDE_MODES_CACHE_SECONDS`` (1 s) per process
  (:class:`ModesCache`): every submission checks it, and a database round trip per submission for a value an
  operator changes a few times a year is not worth it; a second is shorter than any operator's reaction, and a
  request admitted in that second by a process that had not seen the switch is aborted by a repeated
  ``horde-admin modes maintenance on``. 0 reads the row on every submission (the tests).
- IP timeouts (Redis keys with a TTL, :func:`horde_store.modes.ip_timeout_seconds`): 403 TimeoutIP after the
  concurrency limit, for the address the rate limits count (:func:`horde_admission.ratelimit.client_address`).
  A Redis failure or a check slower than ``HORDE_RATE_LIMIT_TIMEOUT_SECONDS`` lets the request through
  (logged), as the rate limits do: a store outage never takes the route down.
- Moderation: a flagged user's prompt, or a prompt for a model the text model reference marks nsfw, goes
  through the replacement filter (:mod:`horde_contract.moderation`, rules ``HORDE_MODERATION_REPLACEMENTS``);
  on the chat route each message text, before context sizing. A request that names no model can be served by
  any worker, an nsfw model's too, so it is filtered whenever the reference marks any model nsfw. A prompt
  the filter empties is 400 CorruptPrompt. Texts of more than :data:`INLINE_FILTER_CHARS` characters are
  filtered in a worker thread (``asyncio.to_thread``), so a large prompt does not hold up the event loop, and
  the filter's CPU per request is bounded (past it, 400 CorruptPrompt).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from horde_contract import TextModelReference
from horde_contract.moderation import (
    DEFAULT_REPLACEMENT_RULES,
    FilterBudgetExceeded,
    ReplacementFilter,
    corrupt_prompt_error,
    emptied,
    filter_budget_error,
    message_texts,
)
from horde_contract.operator_controls import maintenance_mode_error, timeout_ip_error
from horde_store.db import ConnOrPool
from horde_store.modes import ip_timeout_seconds, read_modes
from redis.asyncio import Redis

from horde_admission.auth import Requester
from horde_admission.ratelimit import client_address
from horde_admission.settings import AdmissionSettings

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Texts up to this many characters (all of a request's texts together) are filtered on the event loop: a
#: couple of milliseconds at worst (every word a match), near the cost of a thread hand-off. Longer ones go to
#: a worker thread.
INLINE_FILTER_CHARS = 4096


class ModesCache:
    """The maintenance flag of the ``horde_modes`` row, re-read once it is older than ``seconds``."""

    def __init__(self) -> None:
        self._maintenance = False
        self._read_at: float | None = None

    async def maintenance(self, conn: ConnOrPool, seconds: float) -> bool:
        """Whether maintenance mode is on, from a read at most ``seconds`` old (0: read now)."""
        now = time.monotonic()
        if self._read_at is None or seconds <= 0 or now - self._read_at >= seconds:
            self._maintenance = (await read_modes(conn)).maintenance
            self._read_at = now
        return self._maintenance


@dataclass
class OperatorControls:
    """The per-process state of the controls: the modes cache and the compiled replacement filter."""

    modes: ModesCache = field(default_factory=ModesCache)
    _filter: ReplacementFilter | None = None

    def replacement_filter(self, settings: AdmissionSettings) -> ReplacementFilter:
        """The filter of ``HORDE_MODERATION_REPLACEMENTS`` (the default rules when unset), compiled once."""
        if self._filter is None:
            rules = settings.moderation_replacements
            self._filter = ReplacementFilter(DEFAULT_REPLACEMENT_RULES if rules is None else rules)
        return self._filter


async def check_maintenance(
    controls: OperatorControls, conn: ConnOrPool, settings: AdmissionSettings
) -> None:
    """400 MaintenanceMode while maintenance mode is on (Retry-After, x-should-retry false)."""
    if await controls.modes.maintenance(conn, settings.modes_cache_seconds):
        raise maintenance_mode_error()


async def check_ip_timeout(redis: Redis, request: Request, settings: AdmissionSettings) -> None:
    """403 TimeoutIP (Retry-After: the seconds left) when an operator timed out the request's client address.
    Fails open on a Redis error or timeout (logged)."""
    address = client_address(request, settings)
    try:
        seconds = await asyncio.wait_for(
            ip_timeout_seconds(redis, address), settings.rate_limit_timeout_seconds
        )
    except Exception:
        log.warning("IP timeout check failed; request let through", exc_info=True)
        return
    if seconds > 0:
        raise timeout_ip_error(seconds)


def moderation_applies(
    requester: Requester, models: list[str], reference: TextModelReference
) -> tuple[bool, bool]:
    """``(applies, nsfw_model)``: whether the replacement filter applies (a flagged requester or an nsfw
    model), and whether an nsfw model may serve the request: a requested model is nsfw, or no model is named
    (any worker may serve it) and the reference marks any model nsfw."""
    nsfw_model = reference.has_nsfw(models) if models else bool(reference.nsfw_names)
    return requester.flagged or nsfw_model, nsfw_model


async def _run_filter(work: Callable[[], _T], texts_chars: int, *, nsfw_model: bool) -> _T:
    """``work()`` (a filter call over ``texts_chars`` characters), on the loop for small inputs, else in a
    worker thread; the filter's CPU budget becomes 400 CorruptPrompt."""
    try:
        if texts_chars <= INLINE_FILTER_CHARS:
            return work()
        return await asyncio.to_thread(work)
    except FilterBudgetExceeded:
        log.warning("moderation filter budget spent on a prompt of %d characters", texts_chars)
        raise filter_budget_error(nsfw_model=nsfw_model) from None


async def moderate_prompt(
    controls: OperatorControls,
    settings: AdmissionSettings,
    requester: Requester,
    models: list[str],
    reference: TextModelReference,
    prompt: str,
) -> str:
    """The text request's prompt after the replacement filter when it applies (else as it is); 400
    CorruptPrompt when the filter empties it."""
    applies, nsfw_model = moderation_applies(requester, models, reference)
    if not applies:
        return prompt
    flt = controls.replacement_filter(settings)
    filtered = await _run_filter(lambda: flt.apply(prompt), len(prompt), nsfw_model=nsfw_model)
    if emptied(prompt, filtered):
        raise corrupt_prompt_error(nsfw_model=nsfw_model)
    return filtered


async def moderate_messages(
    controls: OperatorControls,
    settings: AdmissionSettings,
    requester: Requester,
    models: list[str],
    reference: TextModelReference,
    messages: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The chat request's messages with each text filtered when the filter applies (else ``messages``
    itself); 400 CorruptPrompt when the filter empties every text of a request that had some
    (docs/native-api.md#flattened-prompt: the prompt is flattened again from the result)."""
    applies, nsfw_model = moderation_applies(requester, models, reference)
    if not applies:
        return messages
    flt = controls.replacement_filter(settings)
    texts = message_texts(messages)
    chars = sum(map(len, texts))
    filtered = await _run_filter(lambda: flt.filter_messages(messages), chars, nsfw_model=nsfw_model)
    if emptied(texts, message_texts(filtered)):
        raise corrupt_prompt_error(nsfw_model=nsfw_model)
    return filtered
