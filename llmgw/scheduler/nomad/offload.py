"""Running python-nomad's blocking calls off the event loop.

python-nomad is synchronous (requests underneath), and the server is async,
so every Nomad call runs on a thread. Not ``asyncio.to_thread``: its default
executor is shared with everything else in the process (the SQLite store
among them) and is only ``cpu_count + 4`` threads wide, so a few 30-second
blocking queries would starve unrelated work. Not a private
``ThreadPoolExecutor`` either: its threads are joined at interpreter exit,
and one parked in a blocking query holds shutdown for up to its wait.

So each call gets a daemon thread, at most ``limit`` at a time, and its
result is handed back to the loop. A call whose awaiting task was cancelled
finishes on its thread and its result is dropped; its slot is freed only when
the thread ends, not when the caller gives up, so callers that time out on
every request (the API's replica list does) cannot pile threads past the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Offloader:
    def __init__(self, limit: int = 8, name: str = "llmgw-nomad") -> None:
        self._limit = limit
        self._name = name
        self._sem: asyncio.Semaphore | None = None
        self._busy = 0

    @property
    def busy(self) -> int:
        """Threads running now that count against the limit."""
        return self._busy

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._limit)
        sem = self._sem
        await sem.acquire()
        self._busy += 1

        def release() -> None:
            self._busy -= 1
            sem.release()

        try:
            fut = self._spawn(release, lambda: fn(*args, **kwargs))
        except BaseException:
            release()   # the thread never started
            raise
        return await fut

    async def unbounded(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """For long polls, which would otherwise hold a slot for their whole wait."""
        return await self._spawn(None, lambda: fn(*args, **kwargs))

    def _spawn(self, finished: Callable[[], None] | None,
               call: Callable[[], T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: object) -> None:
            if finished is not None:
                finished()   # on the loop, whether or not anyone still waits
            if fut.done():
                return
            if ok:
                fut.set_result(value)  # type: ignore[arg-type]
            else:
                fut.set_exception(value)  # type: ignore[arg-type]

        def target() -> None:
            try:
                result: object = call()
                ok = True
            except BaseException as exc:  # handed to the awaiting task, never lost
                result, ok = exc, False
            # RuntimeError: the loop closed while the call ran; nobody is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, ok, result)

        threading.Thread(target=target, name=self._name, daemon=True).start()
        return fut
