"""The backend interface every generator implements."""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator

from horde_worker.declaration import Capabilities
from horde_worker.jobs import ChatDelta, ChatJob, ChatOutput, TextJob


class Backend(abc.ABC):
    """A generator the worker drives.

    Lifecycle: :meth:`start` once (discovery; returns the capabilities the declaration is computed from),
    then any number of concurrent :meth:`generate_chat`/:meth:`stream_chat`/:meth:`generate_text` calls (one
    per pop loop), then :meth:`close`. Generation methods raise :class:`horde_worker.jobs.BackendFault` with a
    fault reason when they cannot reply; any other exception is faulted ``generation_error`` by the worker.
    """

    kind: str = "backend"

    @abc.abstractmethod
    async def start(self) -> Capabilities:
        """Connect or load, discover limits and model name; return the capabilities."""

    @abc.abstractmethod
    async def generate_chat(self, job: ChatJob) -> ChatOutput:
        """Generate a reply to a chat job (``max_length`` tokens at most)."""

    async def stream_chat(self, job: ChatJob) -> AsyncGenerator[ChatDelta | ChatOutput, None]:
        """Generate a reply to a chat job piece by piece: yield :class:`ChatDelta` pieces as they are
        generated, then the whole :class:`ChatOutput` (the one the worker submits) as the last item.

        The deltas' ``reasoning`` and ``content`` concatenated are the output's reasoning and content (content
        may still hold ``<think>`` tags; the worker splits both the same way). Closing the generator (or
        cancelling the task iterating it) must stop the generation at once. This default does not stream: it
        yields :meth:`generate_chat`'s output alone.
        """
        yield await self.generate_chat(job)

    @abc.abstractmethod
    async def generate_text(self, job: TextJob, max_length: int) -> str:
        """Complete a legacy text job's prompt; return the generated text only (``max_length`` tokens at most)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or the model."""
