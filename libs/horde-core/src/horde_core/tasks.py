"""Background tasks of a process: stopping one the same way everywhere."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None is a no-op) and wait for it to end. Its cancellation and any error it ends with
    are swallowed: a stopping process has no one left to report a reader's failure to, and one failing task must
    not keep the others from stopping."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
