"""The SQLite store's usage ledger writes, in a process of their own.

The other SQLite work runs on a thread beside the event loop (``sqlite``'s
docstring), and that is fine for calls made a few times a second. The ledger
writes thousands of rows a second, and a thread cannot do that cheaply beside a
busy loop: sqlite3 lets go of the GIL for each statement, and a thread waiting to
take it back from a loop that holds it nearly all the time only gets it when it
wins a race (CPython's wait counts the loop's own release and re-take as a
switch, so it never asks the loop to yield), while every release the loop makes
costs it a futex wake for the waiting thread. Under load the writes' thread spent
three to six times its CPU in isolation, and the loop slowed with it.

So a child process writes them: ``python -m llmgw.store.sqlite_ledger PATH``,
started on the first write and again after a failure. The store sends each batch
as one msgpack frame on the child's stdin (a 4-byte length, then the records);
the child writes it in one transaction and answers with a frame of its own. The
child exits when its stdin closes, so it never outlives the store, and ignores
SIGINT and SIGTERM, which reach it with the gateway's (a terminal's Ctrl-C, a
service manager's stop) while the store still has a last batch to write.

A batch goes in few statements: rows 512 to a statement (a power of two, so
batches of any size use a handful of cached statements), then the roll-ups from
a temporary table of the batch's sums by hour. A batch partly stored already (a
retry after a lost acknowledgement) is summed by SQLite from the new rowids.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

import msgspec
from msgspec.structs import astuple

from llmgw.errors import StoreUnavailableError
from llmgw.store.base import UsageRecord
from llmgw.store.schema import ROLL_UP_BY

log = logging.getLogger("llmgw.store.sqlite_ledger")

# How long close() waits for the child to finish the batch in hand.
CLOSE_TIMEOUT = 10.0


class _Reply(msgspec.Struct, array_like=True, frozen=True):
    added: int
    error: str | None = None
    unavailable: bool = False    # an operational failure (else a bug)


_ENCODER = msgspec.msgpack.Encoder()
_BATCH_DECODER = msgspec.msgpack.Decoder(list[UsageRecord])
_REPLY_DECODER = msgspec.msgpack.Decoder(_Reply)


class LedgerWriter:
    """The store's side: one child process, one batch at a time.

    The exchange runs on the event loop that calls, waiting on the pipes through it
    (no thread, so nothing else takes the GIL from the loop); like the store's
    connections, it serves whichever loop calls it."""

    def __init__(self, path: Path, *, timeout: float) -> None:
        self.path = path
        self.lock_timeout = timeout
        # A write may wait for SQLite's lock (the busy timeout) before it starts.
        self.timeout = timeout + 30.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    async def write(self, records: list[UsageRecord]) -> int:
        """Write ``records``; how many were new. Raises ``StoreUnavailableError``
        when the child or the database fails (the batch may be written again)."""
        payload = _ENCODER.encode(records)
        async with self._exclusive():
            proc = self._started()
            assert proc.stdin is not None
            assert proc.stdout is not None
            try:
                async with asyncio.timeout(self.timeout):
                    await _send(proc.stdin.fileno(),
                                len(payload).to_bytes(4, "big") + payload)
                    size = int.from_bytes(await _receive(proc.stdout.fileno(), 4), "big")
                    reply = _REPLY_DECODER.decode(await _receive(proc.stdout.fileno(), size))
            except BaseException as exc:
                # Whatever broke off the exchange, the child's answer can no longer be
                # matched to its batch: the next write starts a new child.
                self._stop(kill=True)
                if not isinstance(exc, OSError | EOFError | TimeoutError | msgspec.DecodeError):
                    raise
                why = "did not answer in time" if isinstance(exc, TimeoutError) else \
                    f"exited ({exc.__class__.__name__})"
                raise StoreUnavailableError(
                    f"SQLite database {self.path}: the ledger's writer process {why}; "
                    "the batch is kept and written again") from exc
        if reply.error is None:
            return reply.added
        if reply.unavailable:
            raise StoreUnavailableError(reply.error)
        raise RuntimeError(f"the ledger's writer process failed: {reply.error}")

    async def close(self) -> None:
        async with self._exclusive():
            proc = self._proc
            if proc is not None and proc.stdin is not None:
                proc.stdin.close()     # the child's loop ends at end of input
            await asyncio.to_thread(self._stop, False)

    def _exclusive(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop(kill=True)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "llmgw.store.sqlite_ledger", str(self.path),
                 str(self.lock_timeout)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise StoreUnavailableError(
                f"SQLite database {self.path}: cannot start the ledger's writer process "
                f"({exc})") from exc
        assert proc.stdin is not None
        assert proc.stdout is not None
        os.set_blocking(proc.stdin.fileno(), False)
        os.set_blocking(proc.stdout.fileno(), False)
        self._proc = proc
        return proc

    def _stop(self, kill: bool) -> None:
        """End the child: at once (``kill``), or when it has read what it was sent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        try:
            proc.wait(CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.warning("the ledger's writer process for %s did not exit; killing it",
                        self.path)
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


async def _ready(fd: int, *, write: bool) -> None:
    """Until ``fd`` can be written (or read) without blocking."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await _ready(fd, write=True)


async def _receive(fd: int, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = os.read(fd, size - len(data))
        except BlockingIOError:
            await _ready(fd, write=False)
            continue
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


# --- the child's side ----------------------------------------------------------------


def write_usage(db: sqlite3.Connection, records: list[UsageRecord]) -> int:
    """Insert ``records`` and roll them up, in the transaction open on ``db``; how
    many were new."""
    if not records:
        return 0
    last = db.execute("SELECT coalesce(max(rowid), 0) FROM usage").fetchone()[0]
    values = [value for r in records for value in astuple(r)]
    added = _insert_rows(db, _INSERT_USAGE, _USAGE_COLUMNS, values)
    if not added:
        return 0
    db.execute(_NEW_HOURLY_TABLE)
    if added == len(records):
        _insert_rows(db, _INSERT_NEW_HOURLY, _HOURLY_COLUMNS, _hourly(records))
    else:
        db.execute(_SUM_NEW_HOURLY, (last,))
    db.execute(_ROLL_UP_NEW)
    db.execute(_ROLL_UP_NEW_BY)
    db.execute("DELETE FROM temp.new_hourly")
    return added


def serve(path: Path, lock_timeout: float, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Write each batch read from ``stdin`` and answer on ``stdout``, until end of input."""
    # The store made the file and put it in WAL mode; like the store's other writes,
    # these skip the fsync per commit.
    db = sqlite3.connect(path, timeout=lock_timeout, isolation_level=None)
    db.execute("PRAGMA synchronous=NORMAL")
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        payload = stdin.read(int.from_bytes(head, "big"))
        try:
            records = _BATCH_DECODER.decode(payload)
            db.execute("BEGIN IMMEDIATE")
            try:
                added = write_usage(db, records)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            reply = _Reply(added=added)
        except sqlite3.OperationalError as exc:
            reply = _Reply(added=0, unavailable=True, error=(
                f"SQLite database {path}: writing usage records failed ({exc})"))
        except Exception as exc:   # a bug: said to the store, which logs it
            reply = _Reply(added=0, error=f"{exc.__class__.__name__}: {exc}")
        answer = _ENCODER.encode(reply)
        stdout.write(len(answer).to_bytes(4, "big") + answer)
        stdout.flush()


# The most rows one INSERT carries; at most 6,656 parameters, below SQLite's bound
# (32,766 since 3.32; 999 before, and then fewer rows).
_MOST_ROWS = 512
_USAGE_COLUMNS = len(UsageRecord.__struct_fields__)
_HOURLY_COLUMNS = 8
_INSERT_USAGE = (
    f"INSERT INTO usage ({', '.join(UsageRecord.__struct_fields__)}) VALUES %s"  # noqa: S608
    " ON CONFLICT (id) DO NOTHING")
_INSERT_NEW_HOURLY = "INSERT INTO temp.new_hourly VALUES %s"


@functools.cache
def _rows_statement(template: str, columns: int, rows: int) -> str:
    """``template`` with ``rows`` rows of ``columns`` parameters for its VALUES."""
    return template % ", ".join(["(" + ", ".join("?" * columns) + ")"] * rows)


def _insert_rows(db: sqlite3.Connection, template: str, columns: int,
                 values: list[object]) -> int:
    """Insert the rows ``values`` holds (``columns`` to a row, row after row) through
    ``template``; the rows that were new."""
    most = _MOST_ROWS
    while most * columns > db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER):
        most //= 2
    rows = len(values) // columns
    added = done = 0
    while done < rows:
        while most > rows - done:
            most //= 2
        added += db.execute(_rows_statement(template, columns, most),
                            values[done * columns:(done + most) * columns]).rowcount
        done += most
    return added


def _hourly(records: list[UsageRecord]) -> list[object]:
    """``records`` summed as usage_hourly sums them (by hour, team, key and model), in
    its columns' order, row after row."""
    sums: dict[tuple[int, str, str, str], list[int]] = {}
    for r in records:
        group = (int(r.at // 3600) * 3600, r.team, r.key, r.model)
        s = sums.get(group)
        if s is None:
            sums[group] = [1, r.prompt_tokens, r.cached_tokens, r.completion_tokens]
        else:
            s[0] += 1
            s[1] += r.prompt_tokens
            s[2] += r.cached_tokens
            s[3] += r.completion_tokens
    return [value for group, s in sums.items() for value in (*group, *s)]


# A batch's new rows by hour (the shape ROLL_UP_BY reads), for both roll-ups to add.
_NEW_HOURLY_TABLE = (
    "CREATE TEMP TABLE IF NOT EXISTS new_hourly (hour INTEGER, team TEXT, key TEXT,"
    " model TEXT, requests INTEGER, prompt_tokens INTEGER, cached_tokens INTEGER,"
    " completion_tokens INTEGER)"
)
_SUM_NEW_HOURLY = (
    "INSERT INTO temp.new_hourly SELECT CAST(at / 3600 AS INTEGER) * 3600, team, key, model,"
    " count(*), SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens)"
    " FROM usage WHERE rowid > ? GROUP BY 1, 2, 3, 4"
)
# "WHERE true": SQLite needs it to parse an upsert whose source is a SELECT.
_ROLL_UP_NEW = (
    "INSERT INTO usage_hourly"
    " (hour, team, key, model, requests, prompt_tokens, cached_tokens,"
    " completion_tokens) SELECT * FROM temp.new_hourly WHERE true"
    " ON CONFLICT (hour, team, key, model) DO UPDATE SET"
    " requests = usage_hourly.requests + excluded.requests,"
    " prompt_tokens = usage_hourly.prompt_tokens + excluded.prompt_tokens,"
    " cached_tokens = usage_hourly.cached_tokens + excluded.cached_tokens,"
    " completion_tokens = usage_hourly.completion_tokens + excluded.completion_tokens"
)
_ROLL_UP_NEW_BY = ROLL_UP_BY % "temp.new_hourly"


if __name__ == "__main__":
    # Ctrl-C in a terminal reaches the whole process group, and a service manager's
    # stop may signal every process of the service: the store still has its last
    # batch to write on the way out, and closing stdin is what ends this loop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(BrokenPipeError):
        serve(Path(sys.argv[1]), float(sys.argv[2]), sys.stdin.buffer, sys.stdout.buffer)
