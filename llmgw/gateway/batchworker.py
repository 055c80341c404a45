"""The batch worker: runs every batch's lines through the gateway's own routing, at low priority.

**One worker across all gateway instances.** Every instance runs this loop,
but only the holder of the store lease ``batch-worker`` works; it renews the
lease every third of its ttl and stops at once if it ever fails to (another
instance may then take over, and must not find two workers sending the
same lines). Nothing about a batch lives in the worker's memory between
steps: its state is the batch row and its per-line results in the store.

**A batch moves** ``validating → in_progress → finalizing → completed``
(or ``failed`` at validation, ``expired`` past its completion window,
``cancelled``). Validation reads the input file once, as a stream, and fails
the batch with line numbers if a well-formed line names another endpoint, an
unknown model, one the owner's key may not use or one that cannot serve the
endpoint (malformed lines only fail themselves: ``batchfile``). Running
reads the file again and sends each line through ``Core.execute`` — the same
replica choice, retries, fallbacks and on-demand start as a client's
request — marked with the ``batch`` priority class. Finalizing writes the
output and error files from the stored results, in line order, a chunk at a
time.

**Resuming.** Each line's result is written to the store before the line
counts as done, and the batch row records the line through which every
result is stored (``done_through``, saved every second). After a restart,
or on another instance, the worker skips those lines and the few after them
that have results, so no finished line is sent twice; a line that was in
flight when the worker stopped had no result and runs again — unless the
engine had answered it: with ``gateway.journal_dir`` its result is journaled
locally as the answer comes back and stored before the next pass
(``batchjournal``), so its answer is neither lost nor generated twice. A worker killed
without releasing its lease does not make the next one wait out the lease's
ttl when the next one runs on the same machine: the holder's name says which
process held it (``holders``), and a holder of this machine whose process is
gone is released at once, so a restarted instance resumes its batches as soon
as it is up.

**Quota is final.** A line refused 429 ``insufficient_quota`` (its owner's
token or cost budget is spent until the period resets, hours away) fails at
once with that error in the error file, rather than being retried like a
transient 429. The batch continues: each later line is checked against the
budget on its own, so while the budget stays spent the rest fail the same
way within moments, and a line the budget still admits (a budget raised
meanwhile, a new period) runs. Nothing is sent to an engine for a refused line.

**Bounded memory.** The input is read a store chunk at a time and split
into lines (``LineSplitter``); at most ``gateway.batch_concurrency`` lines
are in flight; finished results go straight to the store. A 10,000-line
batch holds the same few lines in memory as a 10-line one
(``bench/batch_bench.py`` measures it).

**Priority.** Until an admission queue orders requests by class, the
worker's own concurrency limit is what keeps interactive traffic on the
same model unharmed: with the default of 4 a batch can never occupy more
than 4 of an engine's sequence slots. Transient failures (429 for a rate limit
or a full queue, 502, 503, 504) are retried with back-off rather than
written off, since a batch has hours, not seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

import msgspec

from llmgw.catalog.build import Catalog
from llmgw.errors import StoreUnavailableError
from llmgw.gateway.batchfile import (
    MAX_ERRORS,
    BatchError,
    BatchRecord,
    LineSplitter,
    Malformed,
    Request,
    TooLong,
    encode_record,
    error_line,
    output_line,
    parse_line,
    record_of,
)
from llmgw.gateway.batchjournal import BatchJournal
from llmgw.gateway.capabilities import describe, serves
from llmgw.gateway.exchange import Core
from llmgw.gateway.files import FileWriter, new_file_id
from llmgw.gateway.holders import is_gone
from llmgw.gateway.journal import journal_location
from llmgw.gateway.keys import ApiKey
from llmgw.gateway.responses_api import PATH as RESPONSES
from llmgw.gateway.responses_api import batch_response
from llmgw.store.base import BatchResult, BatchRow, FileRecord, OwnerId

log = logging.getLogger("llmgw.gateway.batches")

LEASE = "batch-worker"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_TRIES = 5
# Uploads still unfinished this long after they began died with their client.
ABANDONED_UPLOAD = 3600
HOUSEKEEPING_EVERY = 60.0
_RESULTS_PAGE = 200


class _ErrorDetail(msgspec.Struct):
    code: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail | None = None


_decode_error = msgspec.json.Decoder(_ErrorBody).decode


def is_final(status: int, body: bytes) -> bool:
    """Whether an answer in RETRY_STATUSES is final all the same: a 429 for quota (the
    budget is spent until its period resets), not for a rate limit or a full queue."""
    if status != 429:
        return False
    try:
        error = _decode_error(body).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return error is not None and error.code == "insufficient_quota"


def _row(record: BatchRecord) -> BatchRow:
    return BatchRow(id=record.id, owner=record.owner, status=record.status,
                    created_at=record.created_at, record=encode_record(record))


class _Cancelled(Exception):  # noqa: N818 - a signal inside the worker, not an error
    """The batch was moved to ``cancelling`` while it ran."""


class BatchWorker:
    def __init__(self, core: Core, holder: str, *, key_by_id: Callable[[str], ApiKey | None],
                 keys_ready: Callable[[], bool] = lambda: True,
                 poll: float = 1.0, lease_ttl: float = 30.0, save_every: float = 1.0,
                 retry_base: float = 1.0) -> None:
        self.core = core
        self.holder = holder
        self.key_by_id = key_by_id
        self.keys_ready = keys_ready
        self.poll = poll
        self.lease_ttl = lease_ttl
        self.save_every = save_every
        self.retry_base = retry_base
        self.concurrency = core.config.gateway.batch_concurrency
        self._slots = asyncio.Semaphore(self.concurrency)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._housekept = -math.inf
        self.lines_sent = 0            # every line sent to a replica (tests, the benchmark)
        journal_dir = journal_location(core.config.gateway, core.store)
        self.results = BatchJournal(journal_dir) if journal_dir is not None else None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="llmgw-batch-worker")

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.core.state.release_lease(LEASE, self.holder)
        if self.results is not None:
            self.results.close()

    async def _run(self) -> None:
        outage: str | None = None       # logged once, not on every poll
        while True:
            try:
                # Not before the store's keys are in force: a batch of a runtime key would
                # otherwise be failed as revoked, its owner not known yet.
                # Results journaled here (or left by a process that is gone) first: a line
                # whose answer was kept must be found done, by whichever worker runs next.
                if self.results is not None:
                    await self.results.flush(self.core.state)
                if self.keys_ready() and await self._take_lease():
                    await self._hold_and_work()
                outage = None
            except StoreUnavailableError as exc:
                if exc.message != outage:
                    log.warning("batch worker: the store is unavailable; batches wait until it "
                                "is back: %s", exc.message)
                outage = exc.message
            except Exception:
                log.exception("batch worker failed; retrying on the next poll")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await self._wake.wait()
            self._wake.clear()

    async def _take_lease(self) -> bool:
        """Take the lease; one held by a process of this machine that is gone is released
        first rather than waited out (``holders``)."""
        store = self.core.state
        if await store.try_lease(LEASE, self.holder, self.lease_ttl):
            return True
        holder = await store.lease_holder(LEASE)
        if holder is None or holder == self.holder or not is_gone(holder):
            return False
        log.info("batch worker: the lease's holder %s is a process of this machine that is "
                 "gone; taking over its batches", holder)
        await store.release_lease(LEASE, holder)
        return await store.try_lease(LEASE, self.holder, self.lease_ttl)

    async def _hold_and_work(self) -> None:
        """Work while renewing the lease; stop the work the moment the lease is lost."""
        work = asyncio.create_task(self._work())
        try:
            while True:
                done, _ = await asyncio.wait({work}, timeout=self.lease_ttl / 3)
                if done:
                    break
                try:
                    kept = await self.core.state.try_lease(LEASE, self.holder, self.lease_ttl)
                except StoreUnavailableError:
                    kept = False
                if not kept:
                    log.warning("batch worker lost its lease; stopping, another instance "
                                "resumes from the stored results")
                    work.cancel()
                    break
        finally:
            if not work.done():
                work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        if not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]

    async def _work(self) -> None:
        store = self.core.state
        now = time.monotonic()
        if now - self._housekept >= HOUSEKEEPING_EVERY:
            self._housekept = now
            purged = await store.purge_responses()
            dead = await store.purge_uploads(int(time.time()) - ABANDONED_UPLOAD)
            expired = await store.purge_files()
            if purged or dead or expired:
                log.info("purged %d expired responses, %d abandoned uploads and %d expired "
                         "files", purged, dead, expired)
        for row in await store.active_batches():
            await self._drive(record_of(row))

    # ------------------------------------------------------------ one batch

    async def _save(self, record: BatchRecord, expect: str) -> bool:
        return await self.core.state.update_batch(_row(record), expect)

    async def _current(self, id: str) -> BatchRecord | None:
        row = await self.core.state.get_batch(id, None)
        return None if row is None else record_of(row)

    async def _drive(self, record: BatchRecord) -> None:
        if record.status == "validating":
            if time.time() >= record.expires_at:
                # Never ran: every line is reported batch_expired, as if the window closed
                # before its first line (which _execute does on seeing the time).
                record.status = "in_progress"
                record.in_progress_at = int(time.time())
                if not await self._save(record, "validating"):
                    return
            elif not await self._validate(record):
                return
        if record.status == "in_progress":
            await self._execute(record)
        if record.status in ("finalizing", "cancelling"):
            await self._finalize(record)

    async def _lines(self, file_id: str) -> AsyncIterator[tuple[int, bytes | TooLong]]:
        splitter = LineSplitter(int(self.core.config.gateway.max_body_size))
        seq = 0
        while True:
            chunks = await self.core.state.read_file_chunks(file_id, seq, 1)
            if not chunks:
                break
            seq += 1
            for item in splitter.feed(chunks[0]):
                yield item
        for item in splitter.finish():
            yield item

    async def _fail(self, record: BatchRecord, expect: str, errors: list[BatchError]) -> bool:
        record.status = "failed"
        record.failed_at = int(time.time())
        record.errors = errors
        return await self._save(record, expect)

    async def _validate(self, record: BatchRecord) -> bool:
        """Check every line; True when the batch moved on to ``in_progress``."""
        key = self.key_by_id(record.owner)
        if key is None:
            await self._fail(record, "validating", [BatchError(
                code="key_revoked", message="the API key that created this batch was revoked "
                "(or its team deleted)")])
            return False
        file = await self.core.state.get_file(record.input_file_id, None)
        if file is None:
            await self._fail(record, "validating", [BatchError(
                code="file_not_found", message=f"input file {record.input_file_id!r} was "
                "deleted before the batch ran")])
            return False
        catalog = self.core.catalog
        errors: list[BatchError] = []
        total = 0
        async for number, data in self._lines(file.id):
            parsed = parse_line(number, data)
            if parsed is None:
                continue
            total += 1
            if isinstance(parsed, Request) and len(errors) < MAX_ERRORS:
                problem = _problem(parsed, number, record.endpoint, key, catalog)
                if problem is not None:
                    errors.append(problem)
        if total == 0:
            errors.append(BatchError(code="empty_file",
                                     message="the input file has no requests"))
        record.total = total
        if errors:
            if not await self._fail(record, "validating", errors):
                return False   # cancelled meanwhile: the next pass finalizes it
            log.info("batch %s failed validation: %s", record.id, errors[0].message)
            return False
        record.status = "in_progress"
        record.in_progress_at = int(time.time())
        return await self._save(record, "validating")

    async def _execute(self, record: BatchRecord) -> None:
        store = self.core.state
        file = await store.get_file(record.input_file_id, None)
        if file is None:
            record.outcome = "failed"
            record.errors = [BatchError(code="file_not_found", message=(
                f"input file {record.input_file_id!r} was deleted while the batch ran"))]
            await self._to_finalizing(record)
            return
        progress = _Progress(record.done_through,
                             set(await store.batch_result_lines(record.id, record.done_through)))
        record.completed, record.failed = await store.count_batch_results(record.id)
        saver = asyncio.create_task(self._keep_saving(record, progress))
        in_flight: set[asyncio.Task[None]] = set()
        failed: list[BaseException] = []
        stopped: str | None = None
        try:
            async for number, data in self._lines(file.id):
                if number <= progress.through or number in progress.done:
                    continue
                if stopped is None:
                    stopped = progress.stopped or ("expired" if time.time() >= record.expires_at
                                                   else None)
                if stopped == "cancelled":
                    break
                parsed = parse_line(number, data)
                if parsed is None:
                    progress.finish(number)
                elif stopped == "expired":
                    await self._record(record, progress, number, False, error_line(
                        parsed.custom_id, "batch_expired", "the batch expired before this "
                        "request ran"))
                elif isinstance(parsed, Malformed):
                    await self._record(record, progress, number, False, error_line(
                        parsed.custom_id, "invalid_request", parsed.message))
                else:
                    await self._slots.acquire()
                    if failed:
                        self._slots.release()
                        break
                    task = asyncio.create_task(self._one(record, progress, number, parsed))
                    in_flight.add(task)
                    # Released here, not in _one: a task cancelled before it first runs
                    # never executes its finally, and the slot would be lost for good.
                    task.add_done_callback(self._done(in_flight, failed))
            await asyncio.gather(*in_flight, return_exceptions=True)
            if failed:
                # The lines whose results could not be stored run again on the next pass.
                raise failed[0]
        finally:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            saver.cancel()
            await asyncio.gather(saver, return_exceptions=True)
        stopped = stopped or progress.stopped
        record.outcome = stopped or "completed"
        await self._to_finalizing(record, progress)

    def _done(self, in_flight: set[asyncio.Task[None]], failed: list[BaseException]
              ) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            self._slots.release()
            if not task.cancelled() and (exc := task.exception()) is not None:
                failed.append(exc)

        return done

    async def _to_finalizing(self, record: BatchRecord, progress: _Progress | None = None) -> None:
        if progress is not None:
            record.done_through = progress.through
        record.status = "finalizing"
        record.finalizing_at = int(time.time())
        if await self._save(record, "in_progress"):
            return
        current = await self._current(record.id)
        if current is not None and current.status == "cancelling":
            record.status = "cancelling"
            record.cancelling_at = current.cancelling_at
            record.outcome = "cancelled"
            await self._save(record, "cancelling")

    async def _keep_saving(self, record: BatchRecord, progress: _Progress) -> None:
        """Save counts and ``done_through`` every second; notice a cancel."""
        while True:
            await asyncio.sleep(self.save_every)
            record.done_through = progress.through
            try:
                if await self._save(record, "in_progress"):
                    continue
                current = await self._current(record.id)
            except StoreUnavailableError as exc:
                log.warning("batch %s: cannot save progress: %s", record.id, exc.message)
                continue
            if current is None or current.status == "cancelling":
                progress.stopped = "cancelled"
                if current is not None:
                    record.cancelling_at = current.cancelling_at
                return

    async def _record(self, record: BatchRecord, progress: _Progress, number: int, ok: bool,
                      line: bytes) -> None:
        await self.core.state.put_batch_results(record.id, [BatchResult(line=number, ok=ok,
                                                                        data=line)])
        if ok:
            record.completed += 1
        else:
            record.failed += 1
        progress.finish(number)

    async def _one(self, record: BatchRecord, progress: _Progress, number: int,
                   request: Request) -> None:
        status, body = 0, b""
        for attempt in range(MAX_TRIES):
            self.lines_sent += 1
            if record.endpoint == RESPONSES:
                status, body = await batch_response(self.core, request.body,
                                                    OwnerId(record.owner))
            else:
                status, body, _ = await self.core.execute(record.endpoint, request.body,
                                                          request.model, priority="batch",
                                                          owner=OwnerId(record.owner))
            if status not in RETRY_STATUSES or attempt == MAX_TRIES - 1 \
                    or is_final(status, body):
                break
            left = record.expires_at - time.time()
            if left <= 0:
                break
            await asyncio.sleep(min(self.retry_base * 2 ** attempt, left))
        ok = 200 <= status < 300
        self.core.metrics.batch_lines.labels(request.model,
                                             "succeeded" if ok else "failed").inc()
        result = output_line(request.custom_id, status, body)
        # Kept before any await: the answer's usage record was journaled as it came back,
        # and the two must survive a kill together.
        if self.results is not None:
            self.results.keep(record.id, number, ok, result)
        await self._record(record, progress, number, ok, result)
        if self.results is not None:
            self.results.stored(record.id, number)

    async def _finalize(self, record: BatchRecord) -> None:
        """Write the output and error files from the results, then the final state."""
        store = self.core.state
        expect = record.status
        outcome = "cancelled" if expect == "cancelling" else (record.outcome or "completed")
        now = int(time.time())
        keep = record.output_expires_after
        files = {ok: FileWriter(store, FileRecord(
            id=new_file_id(), owner=record.owner, purpose="batch_output",
            filename=f"{record.id}_{'output' if ok else 'error'}.jsonl", bytes=0,
            created_at=now, expires_at=None if keep is None else now + keep))
            for ok in (True, False)}
        wrote = {True: False, False: False}
        after = 0
        try:
            while page := await store.batch_results(record.id, after, _RESULTS_PAGE):
                for result in page:
                    await files[result.ok].write(result.data)
                    wrote[result.ok] = True
                after = page[-1].line
            record.completed, record.failed = await store.count_batch_results(record.id)
            record.total = max(record.total, record.completed + record.failed)
            for ok in (True, False):
                if wrote[ok]:
                    done = await files[ok].finish()
                    if ok:
                        record.output_file_id = done.id
                    else:
                        record.error_file_id = done.id
        except BaseException:
            for writer in files.values():
                await writer.abort()
            raise
        record.status = outcome
        setattr(record, f"{outcome}_at", int(time.time()))
        if not await self._save(record, expect):
            for writer in files.values():
                await writer.abort()
            return
        await store.delete_batch_results(record.id)
        log.info("batch %s %s: %d succeeded, %d failed", record.id, outcome, record.completed,
                 record.failed)


class _Progress:
    """Which lines are done: all through ``through``, and ``done`` beyond it."""

    __slots__ = ("done", "stopped", "through")

    def __init__(self, through: int, done: set[int]) -> None:
        self.through = through
        self.done = done
        self.stopped: str | None = None
        self._advance()

    def finish(self, line: int) -> None:
        self.done.add(line)
        self._advance()

    def _advance(self) -> None:
        while self.through + 1 in self.done:
            self.through += 1
            self.done.discard(self.through)


def _problem(request: Request, number: int, endpoint: str, key: ApiKey,
             catalog: Catalog) -> BatchError | None:
    """Why a well-formed line cannot run in this batch, or None."""
    if request.method != "POST":
        return BatchError(code="invalid_method", line=number, param="method",
                          message=f"line {number}: method {request.method!r}; batch requests "
                                  "are POST")
    if request.url != endpoint:
        return BatchError(code="invalid_url", line=number, param="url",
                          message=f"line {number}: url {request.url!r} is not this batch's "
                                  f"endpoint {endpoint}")
    found = catalog.served(request.model)      # a model, or an adapter on its base
    if found is None:
        return BatchError(code="model_not_found", line=number, param="body.model",
                          message=f"line {number}: model {request.model!r} does not exist")
    model = found[0]
    if not key.allows(request.model):
        return BatchError(code="model_not_allowed", line=number, param="body.model",
                          message=f"line {number}: key {key.name!r} may not use model "
                                  f"{request.model!r}")
    if not serves(model, endpoint):
        return BatchError(code="unsupported_endpoint", line=number, param="body.model",
                          message=f"line {number}: model {model.name!r} does not serve "
                                  f"{endpoint}; it serves {describe(model)}")
    return None
