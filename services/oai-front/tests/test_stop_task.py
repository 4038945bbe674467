"""Stopping a wait whose task swallows a cancel (Python 3.11's asyncio.wait_for does when the cancel lands in the
loop turn its inner call finishes in; redis-py wraps every command in one)."""

from __future__ import annotations

import asyncio

from horde_oai.completions import stop_task


async def test_a_swallowed_cancel_is_repeated_until_the_task_ends():
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed >= 3:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_task(task), 5)
    assert task.cancelled() and swallowed == 3


async def test_a_failed_task_is_stopped_without_an_unretrieved_error():
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await stop_task(task)
    assert task.done() and isinstance(task.exception(), RuntimeError)
