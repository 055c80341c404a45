"""The usage ledger: one record per request, written to the store in batches.

The request path only appends a record to a bounded in-memory buffer (no
database round trip, no await). A loop writes the buffer every
``ledger_interval`` in batches of at most ``BATCH``; the store inserts each
in one transaction (Postgres: one statement with the batch as a JSON
parameter; SQLite: from a writer process of its own, off the event loop's GIL)
and adds the new ones to the roll-ups in the same transaction.

**Nothing is counted twice.** Each record gets a random id when it is made;
a batch whose write failed (the store is down, or its acknowledgement was
lost) stays at the head of the buffer and is written again with the same
ids, and the store skips ids it already holds.

**Nothing is lost, with a journal** (``gateway.journal_dir``, ``journal``):
each record is on local disk before the request's answer ends, and stays
there until the store holds it; a process killed with records unwritten
leaves them to the next process that starts with the same directory. While
the store is unreachable, the first ``ledger_buffer`` records wait in memory
and the rest in the journal only (read back a file at a time), up to
``journal_max`` bytes on disk; what the journal's docstring says happens at
that bound is metered. An outage never blocks a request.

**Without a journal**, records wait in memory up to ``ledger_buffer``; beyond
it the oldest are dropped and counted (``llmgw_gateway_ledger_dropped_records``),
and a process killed before its next write loses up to ``ledger_interval`` of
them. On shutdown the buffer is written once more (``close``), so a clean
restart loses nothing the store could take.

What a record holds is fixed by ``UsageRecord``: names, counts, status and
timings. It never holds the API key (only its name) or any part of the
request or the answer.

The ledger also keeps, per team and per key, the tokens of records not yet
written (``pending``) and of those written since the budgets last re-read the
store (``written``): budget checks add both to the totals they read, so this
instance's own traffic counts at once and never drops out between a write
and the re-read.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from llmgw.errors import LlmgwError
from llmgw.gateway.journal import Journal
from llmgw.store.base import RequestLog, Store, UsageRecord

log = logging.getLogger("llmgw.gateway.ledger")

BATCH = 5000
# Request logs may carry bodies of up to a megabyte or two each.
LOG_BATCH = 100
# How long close() keeps trying to write what is left.
CLOSE_TIMEOUT = 10.0
# How often the journal directory is searched for the files of processes that are gone.
ADOPT_EVERY = 60.0


class Ledger:
    def __init__(self, store: Store, *, interval: float, capacity: int,
                 retention: float, urgent_interval: float | None = None,
                 clock: Callable[[], float] = time.time,
                 on_flush: Callable[[], Awaitable[None]] | None = None,
                 on_drop: Callable[[int], object] | None = None,
                 journal_dir: str | Path | None = None, journal_max: int = 1024**3,
                 on_unjournaled: Callable[[int], object] | None = None,
                 on_cycle: Callable[[], None] | None = None) -> None:
        self.store = store
        self.interval = interval
        # While records of budgeted traffic wait, they are written this often.
        self.urgent_interval = min(interval, urgent_interval or interval)
        self._urgent = False
        self._hurry = False
        # Record ids: a random prefix per ledger and a counter, unique across processes
        # and restarts without a random draw per request.
        self._prefix = os.urandom(8).hex()
        self._count = itertools.count()
        self.capacity = capacity
        self.retention = retention
        self.clock = clock
        self._buffer: deque[UsageRecord] = deque()
        self._logs: deque[RequestLog] = deque()
        # Tokens of buffered records, by team and by (team, key).
        self.pending_teams: dict[str, int] = {}
        self.pending_keys: dict[tuple[str, str], int] = {}
        # Tokens written since the budgets last took them (``take_written``).
        self.written_teams: dict[str, int] = {}
        self.written_keys: dict[tuple[str, str], int] = {}
        self.dropped = 0
        self.written = 0
        self._on_flush = on_flush
        self._on_drop = on_drop
        self._on_cycle = on_cycle
        self._lock = asyncio.Lock()
        self._purged_at = 0.0
        self._synced_at = -math.inf
        # Records in the journal only (memory was full, or an older file waits).
        self.spilled = 0
        self.journal = None if journal_dir is None else Journal(
            journal_dir, max_bytes=journal_max, ident=self._prefix, segment_records=capacity,
            on_unjournaled=on_unjournaled)

    def __len__(self) -> int:
        return len(self._buffer)

    def next_id(self) -> str:
        return f"{self._prefix}{next(self._count):x}"

    def record(self, rec: UsageRecord, *, urgent: bool = False) -> None:
        """Append ``rec`` (never blocks); the oldest record goes if the buffer is full.

        ``urgent``: the record counts against a budget, so the buffer is written
        at ``urgent_interval`` rather than ``interval`` until it is empty.
        """
        if urgent:
            self._urgent = True
        journal = self.journal
        if journal is None:
            if len(self._buffer) >= self.capacity:
                self._forget(self._buffer.popleft())
                self._dropped(1)
        else:
            if not journal.spilling and len(self._buffer) >= self.capacity:
                journal.spill()
            if journal.spilling:
                if not journal.append(rec):
                    self._dropped(1)
                    return
                self.spilled += 1
                self._pending(rec)
                return
            journal.append(rec)
            journal.kept()
        self._buffer.append(rec)
        self._pending(rec)

    def _pending(self, rec: UsageRecord) -> None:
        tokens = rec.prompt_tokens + rec.completion_tokens
        if tokens:
            self.pending_teams[rec.team] = self.pending_teams.get(rec.team, 0) + tokens
            k = (rec.team, rec.key)
            self.pending_keys[k] = self.pending_keys.get(k, 0) + tokens

    def _dropped(self, n: int) -> None:
        self.dropped += n
        if self._on_drop is not None:
            self._on_drop(n)

    @property
    def waiting(self) -> int:
        """Records not yet in the store, in memory or in the journal only."""
        return len(self._buffer) + self.spilled

    def log(self, entry: RequestLog) -> None:
        """Keep ``entry`` for a team that logs requests (bounded like the records)."""
        if len(self._logs) >= self.capacity:
            self._logs.popleft()
            self._dropped(1)
        self._logs.append(entry)

    def _forget(self, rec: UsageRecord) -> None:
        tokens = rec.prompt_tokens + rec.completion_tokens
        if not tokens:
            return
        _subtract(self.pending_teams, rec.team, tokens)
        _subtract(self.pending_keys, (rec.team, rec.key), tokens)

    async def flush(self) -> int:
        """Write what is buffered now; the records written. Raises if the store fails."""
        async with self._lock:
            total = 0
            while True:
                while self._buffer:
                    batch = list(itertools.islice(self._buffer, BATCH))
                    await self.store.record_usage(batch)
                    self._written(batch)
                    if self.journal is not None:
                        self.journal.written(len(batch))
                    total += len(batch)
                    self.written += len(batch)
                if not self._read_back():
                    break
            while self._logs:
                logs = list(itertools.islice(self._logs, LOG_BATCH))
                await self.store.put_request_logs(logs)
                for entry in logs:
                    if self._logs and self._logs[0] is entry:
                        self._logs.popleft()
            return total

    def _read_back(self) -> bool:
        """Memory is written: bring in the journal's next disk-only file, if one waits."""
        journal = self.journal
        if journal is None:
            return False
        loaded = journal.load_next()
        if loaded is None:
            self.spilled = 0
            journal.drained()
            return False
        records, adopted = loaded
        if adopted:
            for rec in records:
                self._pending(rec)
        else:
            self.spilled = max(0, self.spilled - len(records))
        self._buffer.extend(records)
        return True

    def _written(self, batch: list[UsageRecord]) -> None:
        """Drop a written batch from the buffer and move its tokens from pending to written.

        Records appended meanwhile stay. A record the full buffer dropped while the
        batch was being written is no longer at the head (its pending tokens went
        with it), but it was written, so its tokens count as written all the same.
        """
        buffer = self._buffer
        left: dict[tuple[str, str], int] = {}
        done: dict[tuple[str, str], int] = {}
        for rec in batch:
            tokens = rec.prompt_tokens + rec.completion_tokens
            k = (rec.team, rec.key)
            if buffer and buffer[0] is rec:
                buffer.popleft()
                if tokens:
                    left[k] = left.get(k, 0) + tokens
            if tokens:
                done[k] = done.get(k, 0) + tokens
        for (team, key), n in left.items():
            _subtract(self.pending_teams, team, n)
            _subtract(self.pending_keys, (team, key), n)
        wt, wk = self.written_teams, self.written_keys
        for (team, key), n in done.items():
            wt[team] = wt.get(team, 0) + n
            wk[(team, key)] = wk.get((team, key), 0) + n

    def take_written(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """The tokens written since the last call, by team and by (team, key)."""
        out = self.written_teams, self.written_keys
        self.written_teams, self.written_keys = {}, {}
        return out

    @property
    def hurried(self) -> bool:
        """Whether the next cycle comes at the quickened pace."""
        return self._hurry

    def hurry(self) -> None:
        """A budget is nearly spent: the next cycle comes after a quarter of the budget
        pace, so every instance's tokens are shared sooner while it matters."""
        self._hurry = True
        self._urgent = True

    def adopt(self) -> None:
        """Take on the journal files of gateway processes that are gone (none: no journal)."""
        if self.journal is None:
            return
        try:
            found = self.journal.adopt()
        except OSError as exc:
            log.warning("reading the journal directory %s for other processes' records "
                        "failed: %s", self.journal.dir, exc)
            return
        if found:
            self._urgent = True

    async def run(self) -> None:
        waited = 0.0
        adopted_at = self.clock()
        self.adopt()
        while True:
            if self.clock() - adopted_at >= ADOPT_EVERY:
                adopted_at = self.clock()
                self.adopt()
            step = self.urgent_interval / 4 if self._hurry else self.urgent_interval
            self._hurry = False
            await asyncio.sleep(step)
            waited += step
            if waited >= self.interval or self._urgent:
                waited = 0.0
                self._urgent = False
                await self.tick()

    async def tick(self) -> None:
        self._cycled()      # the gauges, also while a write waits on a store that hangs
        # fsync (against a crash of the machine only) every ``interval``, not at the
        # budget pace: each costs the kernel a journal commit.
        if self.journal is not None and self.clock() - self._synced_at >= self.interval:
            self._synced_at = self.clock()
            try:
                await asyncio.to_thread(self.journal.sync)
            except OSError as exc:
                log.warning("syncing the usage journal failed: %s", exc)
        if not self.store.is_open:
            return
        try:
            await self.flush()
        except LlmgwError as exc:
            log.warning("writing %d usage record(s) failed; keeping them to retry: %s",
                        len(self._buffer), exc.message)
        except Exception:
            log.exception("writing usage records failed; keeping them to retry")
        self._cycled()
        if self._on_flush is not None:
            try:
                await self._on_flush()
            except Exception:
                log.exception("refreshing after the ledger's flush failed")
        now = self.clock()
        if now - self._purged_at >= 3600:
            self._purged_at = now
            try:
                purged = await self.store.purge_usage(now - self.retention)
                if purged:
                    log.info("purged %d usage record(s) older than the retention", purged)
                purged = await self.store.purge_request_logs(now)
                if purged:
                    log.info("purged %d request log(s) past their team's retention", purged)
            except LlmgwError as exc:
                log.warning("purging old usage records failed: %s", exc.message)

    def _cycled(self) -> None:
        if self._on_cycle is not None:
            self._on_cycle()

    async def close(self) -> None:
        """Write what is left, for at most ``CLOSE_TIMEOUT``; say what could not be."""
        try:
            await self._close()
        finally:
            if self.journal is not None:
                self.journal.close()

    async def _close(self) -> None:
        waiting = bool(self._buffer or self.spilled or self._logs)
        if waiting and self.store.is_open:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self.flush()
            except (LlmgwError, TimeoutError) as exc:
                self._left(f"writing them failed: {exc}")
        elif self._buffer or self.spilled:
            self._left("the store is not open")

    def _left(self, why: str) -> None:
        if self.journal is not None:
            log.warning("%s: %d usage record(s) stay in the journal in %s for the next start",
                        why, self.waiting, self.journal.dir)
        else:
            log.error("%s: %d usage record(s) are lost", why, len(self._buffer))


K = TypeVar("K")


def _subtract(table: dict[K, int], name: K, n: int) -> None:
    rest = table.get(name, 0) - n
    if rest > 0:
        table[name] = rest
    else:
        table.pop(name, None)
