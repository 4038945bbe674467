"""The process-wide handles the front's routes share, built by the app's lifespan."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request

if TYPE_CHECKING:
    from horde_core.signals import SignalHub

    from horde_oai.cancels import CancelManager
    from horde_oai.deltas import DeltaStreamReader, RelayRecords
    from horde_oai.horde_client import HordeClient
    from horde_oai.operations import OperationRecords
    from horde_oai.settings import OaiSettings

#: The chat entries of the models the horde serves, by model id (cached a few seconds).
ChatEntries = Callable[[], Awaitable[Mapping[str, Mapping[str, Any]]]]


@dataclass
class FrontState:
    """``horde`` (the native HTTP client), ``signals`` (the completion signal hub), ``cancels`` (the cancel
    retries), ``deltas`` (the progress stream reader), ``relay_records`` and ``operations`` (the resumable
    stream and call records on the stream database) and ``chat_entries`` (see :data:`ChatEntries`)."""

    settings: OaiSettings
    horde: HordeClient
    signals: SignalHub
    cancels: CancelManager
    deltas: DeltaStreamReader
    relay_records: RelayRecords
    operations: OperationRecords
    chat_entries: ChatEntries


def get_state(request: Request) -> FrontState:
    """The :class:`FrontState` of the app serving ``request``."""
    state: FrontState = request.app.state.front
    return state
