"""Batch line results on local disk from the moment the engine answers until the store has them.

A batch line's answer reaches the store in its own write after the engine
answered, and its usage record is journaled as that answer comes back
(``journal``). A worker killed between the two, or a store that failed the
write, used to leave the line without a result: it ran again, and the
engine's work was done — and billed — twice. With ``gateway.journal_dir``
set, the worker appends the result here first, in the same step of the event
loop as its usage record (one ``write(2)``, no await between), so either
both survive a SIGKILL or neither exists; and before each pass over the
batches, and before a restarted process first takes the worker's lease, the
results waiting here (its own, and those of processes of the directory that
are gone) are written to the store, where a line's result is kept once. A
line whose answer was recorded is then found done and not sent again.

What is left: a line whose process died while the engine was still
answering had no answer to keep, and runs again; and another instance that
takes the lease before this machine's process is back (the lease's ttl after
the kill, since ``holders`` lets a process of the same machine take over at
once) does not see this directory and reruns the lines whose results wait
here — their results are then kept once, the first stored.

One file per process, ``batch-<id>.jnl``, held with ``flock`` while the
process lives; one JSON object per line. It is emptied whenever every result
in it is stored, so it holds the few results in flight, or those of a store
outage (bounded by ``batch_concurrency`` lines per pass, since a pass that
cannot store a result stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from pathlib import Path

import msgspec

from llmgw.errors import ConfigError
from llmgw.store.base import BatchResult, Store

log = logging.getLogger("llmgw.gateway.batches")

PREFIX = "batch-"
SUFFIX = ".jnl"


class _Entry(msgspec.Struct, array_like=True):
    batch: str
    line: int
    ok: bool
    data: bytes


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Entry).decode


class BatchJournal:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.path = self.dir / f"{PREFIX}{os.urandom(8).hex()}{SUFFIX}"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path,
                               os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"gateway.journal_dir: {self.dir} cannot be written ({exc.strerror}); batch "
                "line results are journaled there, so make it a directory this user may "
                "write (gateway.journal_dir), or turn gateway.journal off",
                field="gateway.journal_dir") from None
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        # Results journaled and not yet stored, by (batch, line).
        self._waiting: dict[tuple[str, int], _Entry] = {}

    def keep(self, batch: str, line: int, ok: bool, data: bytes) -> None:
        """Journal a line's result (never raises: a failed write leaves it in memory)."""
        entry = _Entry(batch, line, ok, data)
        self._waiting[(batch, line)] = entry
        try:
            os.write(self._fd, _encode(entry) + b"\n")
        except OSError as exc:
            log.warning("batch %s line %d: its result cannot be journaled in %s: %s",
                        batch, line, self.dir, exc.strerror)

    def stored(self, batch: str, line: int) -> None:
        """The store has that result; with none waiting the file starts afresh."""
        self._waiting.pop((batch, line), None)
        if not self._waiting:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)

    async def flush(self, store: Store) -> int:
        """Store every result waiting here, then those left by processes that are gone;
        the results written. Raises what the store raises."""
        total = 0
        for (batch, line), entry in list(self._waiting.items()):
            await store.put_batch_results(batch, [BatchResult(line=line, ok=entry.ok,
                                                              data=entry.data)])
            self.stored(batch, line)
            total += 1
        for path in sorted(self.dir.glob(f"{PREFIX}*{SUFFIX}")):
            if path != self.path:
                total += await self._adopt(path, store)
        return total

    async def _adopt(self, path: Path, store: Store) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0            # its process lives (or another is adopting it)
            by_batch = await asyncio.to_thread(_read, path)
            for batch, results in by_batch.items():
                row = await store.get_batch(batch, None)
                # A batch past in_progress was finished without these lines (by another
                # instance, or cancelled): its results are gone and must stay so.
                if row is not None and row.status == "in_progress":
                    await store.put_batch_results(batch, list(results.values()))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            found = sum(len(r) for r in by_batch.values())
            if found:
                log.info("stored %d batch line result(s) left in %s by a process that is "
                         "gone", found, path)
            return found
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release the file, removed when it holds nothing to store; again: nothing."""
        if self._fd < 0:
            return
        if self._waiting:
            log.warning("%d batch line result(s) stay in %s for the next start",
                        len(self._waiting), self.path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = -1


def _read(path: Path) -> dict[str, dict[int, BatchResult]]:
    """The results in ``path``, by batch and line."""
    by_batch: dict[str, dict[int, BatchResult]] = {}
    for raw in path.read_bytes().splitlines():
        try:
            e = _decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue    # the tail of a write cut by a crash of the machine
        by_batch.setdefault(e.batch, {})[e.line] = BatchResult(line=e.line, ok=e.ok,
                                                               data=e.data)
    return by_batch
