"""The request path's deadline keeps ``asyncio.timeout``'s contract."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.gateway.deadline import Deadline


async def _wait_forever(delay: float | None, then: float) -> None:
    """Wait under ``Deadline(delay)`` rescheduled to ``then`` seconds from now."""
    async with Deadline(delay) as deadline:
        deadline.reschedule(asyncio.get_running_loop().time() + then)
        await asyncio.Event().wait()


async def test_an_expired_deadline_raises_timeout_and_leaves_the_task_usable() -> None:
    """The block's wait ends in TimeoutError, and the task awaits normally afterwards."""
    with pytest.raises(TimeoutError):
        async with Deadline(0.01) as deadline:
            await asyncio.Event().wait()
    assert deadline.expired()
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(0)        # no cancel left pending on the task


async def test_a_block_that_finishes_in_time_is_untouched() -> None:
    """A wait shorter than the deadline returns its value; the timer is gone after."""
    async with Deadline(60) as deadline:
        await asyncio.sleep(0)
    assert not deadline.expired()
    deadline.reschedule(0)        # outside the block: nothing to cancel any more
    await asyncio.sleep(0.01)
    assert not deadline.expired()


async def test_none_and_reschedule_none_never_expire() -> None:
    """Disarmed (at creation or later), the block waits as long as it needs."""
    async with Deadline(None) as deadline:
        assert deadline.when() is None
        await asyncio.sleep(0.02)
    async with Deadline(0.01) as deadline:
        deadline.reschedule(None)
        await asyncio.sleep(0.05)
    assert not deadline.expired()
    with pytest.raises(TimeoutError):
        await _wait_forever(None, then=0.01)              # armed later


async def test_reschedule_moves_the_deadline_later_and_earlier() -> None:
    """Pushed back, a wait past the first deadline completes; brought forward, it expires."""
    loop = asyncio.get_running_loop()
    async with Deadline(0.02) as deadline:
        deadline.reschedule(loop.time() + 60)
        await asyncio.sleep(0.06)
    assert not deadline.expired()
    with pytest.raises(TimeoutError):
        await _wait_forever(60, then=-1)                  # in the past: expires at once


async def test_another_cancel_is_not_turned_into_a_timeout() -> None:
    """A cancel from elsewhere passes through as CancelledError, even when the deadline
    expired in the same loop turn."""
    started = asyncio.Event()

    async def waits() -> None:
        async with Deadline(60):
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(waits())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def both() -> None:
        async with Deadline(0):                # expires on the next loop turn
            current = asyncio.current_task()
            assert current is not None
            current.cancel()                   # and someone else cancels too
            await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(both())


async def test_nested_deadlines_each_raise_for_their_own() -> None:
    """An inner deadline's expiry is the inner block's TimeoutError; the outer one runs on."""
    async with Deadline(60) as outer:
        with pytest.raises(TimeoutError):
            async with Deadline(0.01):
                await asyncio.Event().wait()
        await asyncio.sleep(0)
    assert not outer.expired()
