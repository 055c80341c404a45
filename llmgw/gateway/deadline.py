"""A deadline for one await on the request path: ``asyncio.timeout``'s contract, made cheap.

Every request arms several: the wait for the replica's first byte, the idle
wait between chunks, and each send to the client (``proxy``). With
``asyncio.timeout`` on Python 3.11 each costs about six times a bare timer
(``loop.call_at`` and its cancel) on the loaded 2-core machine, and with three
or more per request they were the largest item of the gateway's own code in a
profile under load (``bench/hotpath.py``). This is the same contract on a
bare timer handle:

* ``async with Deadline(delay)`` cancels the task when ``delay`` seconds pass
  inside the block, and the block raises ``TimeoutError`` instead of the
  ``CancelledError`` that caused (``None``: not armed);
* ``reschedule(when)`` moves it to loop time ``when``, or disarms it (``None``);
* a cancellation that is not the deadline's own (the client went away, the
  server is stopping) passes through as ``CancelledError``, untouched, even
  when the deadline expired in the same loop turn: the task's cancel count
  says whose it is, as ``asyncio.timeout`` decides on Python 3.12.

Rejected: one shared sweeper task that checks every in-flight send once a
second. Cheaper still per send, but a send's deadline would be off by up
to the sweep period and every gateway would run one more loop for it.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Deadline:
    __slots__ = ("_cancelling", "_expired", "_handle", "_loop", "_task", "_when")

    def __init__(self, delay: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._when = None if delay is None else self._loop.time() + delay
        self._handle: asyncio.Handle | None = None
        self._task: asyncio.Task[object] | None = None
        self._expired = False
        self._cancelling = 0

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a Deadline is used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self.reschedule(self._when)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task, self._task = self._task, None
        # An expired deadline's cancel is one of the task's pending cancels: it is taken
        # back (uncancel), and if no other is left the block was cancelled for the
        # deadline alone.
        if self._expired and task is not None and task.uncancel() <= self._cancelling \
                and exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            raise TimeoutError from exc

    def when(self) -> float | None:
        """The loop time the deadline is set for (None: not armed)."""
        return self._when

    def expired(self) -> bool:
        return self._expired

    def reschedule(self, when: float | None) -> None:
        """Expire at loop time ``when`` instead; None: never (until rescheduled)."""
        self._when = when
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if when is None or self._task is None or self._expired:
            return
        if when <= self._loop.time():
            self._handle = self._loop.call_soon(self._expire)
        else:
            self._handle = self._loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._handle = None
        if self._task is not None and not self._task.done():
            self._expired = True
            self._task.cancel()
