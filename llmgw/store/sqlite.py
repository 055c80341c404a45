"""The SQLite store: one file, the default, good for one host.

sqlite3 blocks, and the server is async, so every call runs on a thread. Each
connection gets its own single-thread executor rather than ``to_thread``'s
shared pool: sqlite3 connections belong to the thread that made them, and one
thread per connection also keeps the calls on a connection in the order they
were made — which a transaction held across awaits depends on.

Three connections per store, each with a job:

* the *catalog* connection runs migrations and ``change()``. A change holds
  ``BEGIN IMMEDIATE`` on it from entry to commit, across the caller's awaits,
  so changes from other processes on the same file wait for it; an
  ``asyncio.Lock`` queues this process's own changes, which share the one
  connection. It commits with ``synchronous=FULL``: a catalog change that was
  acknowledged survives a power cut.
* the *writes* connection takes leases and records activity: short-lived
  facts, rewritten every few seconds, so it commits with
  ``synchronous=NORMAL`` and skips the fsync per write; a power cut can lose
  the last of them, never corrupt the file.
* the *reads* connection answers everything else. In WAL mode a reader never
  waits for a writer, and having its own thread means it never queues behind
  a write that is waiting for the lock either: the half-second version poll
  and the model list keep answering while another process holds a change open.

SQLite has one writer at a time, so a lease or activity write waits while a
change is open (the busy timeout, 30 s by default). Keep ``change()`` blocks
to the database work and the catalog build; do network checks before entering.

The usage ledger's batches are written by a child process of their own
(``sqlite_ledger``): thousands of rows a second cannot share the GIL with a
busy event loop cheaply.

Time is the database's: ``julianday('now')``, which SQLite computes once per
statement, converted to Unix seconds (millisecond resolution).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

from llmgw.errors import ConfigError, StoreUnavailableError
from llmgw.store.base import (
    CLOSE_UNSEEN,
    HOLDINGS_BETWEEN,
    KEY_USAGE_SINCE,
    LEGACY_OWNER,
    OWNED_TABLES,
    PUT_HOLDING,
    REPORT_RETENTION,
    REQUESTS_SINCE,
    REVOKED_OWNER,
    SLICE_OTHERS,
    STATUS_COUNTS,
    BatchResult,
    BatchRow,
    CatalogChange,
    FileRecord,
    OwnerId,
    Report,
    RequestLog,
    SliceAsk,
    SliceGrant,
    StatusCount,
    StoredHolding,
    StoredKey,
    StoredModel,
    StoredResponse,
    StoredTeam,
    TeamModelTokens,
    TokenTotal,
    UsageRecord,
    UsageRow,
    holding_row,
    slice_grant,
    slice_used_params,
    status_count,
    token_totals_params,
    usage_params,
)
from llmgw.store.schema import SQLITE_MIGRATIONS_TABLE, SchemaTooNewError, pending
from llmgw.store.sqlite_ledger import LedgerWriter

logger = logging.getLogger(__name__)

T = TypeVar("T")

# "Now" in Unix seconds by the database's clock, which SQLite evaluates once per
# statement, is spelled out in each statement below as
#     ((julianday('now') - 2440587.5) * 86400.0)
# (2440587.5 is the Julian day of the Unix epoch).
_PUT_SLICE = (
    "INSERT INTO budget_slices (scope, holder, granted, settled, expires_at)"
    " VALUES (?, ?, ?, ?, ((julianday('now') - 2440587.5) * 86400.0) + ?)"
    " ON CONFLICT (scope, holder) DO UPDATE SET granted = excluded.granted,"
    " settled = excluded.settled, expires_at = excluded.expires_at"
)
_DROP_EXPIRED_SLICES = (
    "DELETE FROM budget_slices"
    " WHERE scope = ? AND expires_at <= ((julianday('now') - 2440587.5) * 86400.0)"
)
_TRY_LEASE = (
    "INSERT INTO leases (name, holder, expires_at)"
    " VALUES (?, ?, ((julianday('now') - 2440587.5) * 86400.0) + ?)"
    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
    " expires_at = excluded.expires_at"
    " WHERE leases.holder = excluded.holder"
    " OR leases.expires_at <= ((julianday('now') - 2440587.5) * 86400.0)"
    " RETURNING holder"
)
_LEASE_HOLDER = (
    "SELECT holder FROM leases"
    " WHERE name = ? AND expires_at > ((julianday('now') - 2440587.5) * 86400.0)"
)
_MARK_ACTIVITY = (
    "INSERT INTO activity (model, at) VALUES (?, ((julianday('now') - 2440587.5) * 86400.0))"
    " ON CONFLICT (model) DO UPDATE SET at = excluded.at"
)
_LAST_ACTIVITY = (
    "SELECT ((julianday('now') - 2440587.5) * 86400.0) - at FROM activity WHERE model = ?"
)

_PUT_RESPONSE = (
    "INSERT INTO responses (id, owner, body, context, expires_at)"
    " VALUES (?, ?, ?, ?, ((julianday('now') - 2440587.5) * 86400.0) + ?)"
    " ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, body = excluded.body,"
    " context = excluded.context, expires_at = excluded.expires_at"
)
_GET_RESPONSE = (
    "SELECT CAST(body AS BLOB), CAST(context AS BLOB) FROM responses"
    " WHERE id = ? AND owner = ? AND expires_at > ((julianday('now') - 2440587.5) * 86400.0)"
)
_DELETE_RESPONSE = (
    "DELETE FROM responses"
    " WHERE id = ? AND owner = ? AND expires_at > ((julianday('now') - 2440587.5) * 86400.0)"
)
_PURGE_RESPONSES = (
    "DELETE FROM responses WHERE expires_at <= ((julianday('now') - 2440587.5) * 86400.0)"
)
# Files and batches are read by their owner, or by anyone when the owner given is NULL
# (the batch worker).
# A file is there once complete and until it expires (database time, as a response's).
_GET_FILE = (
    "SELECT id, owner, purpose, filename, bytes, created_at, status, expires_at FROM files"
    " WHERE id = ? AND status = 'processed' AND (? IS NULL OR owner = ?)"
    " AND (expires_at IS NULL OR expires_at > ((julianday('now') - 2440587.5) * 86400.0))"
)
# By (created_at, id), newest first or (True) oldest first, after the cursor file when it
# is the owner's.
_LIST_FILES = {
    False: (
        "SELECT id, owner, purpose, filename, bytes, created_at, status, expires_at FROM files f"
        " WHERE owner = ? AND status = 'processed' AND (? IS NULL OR purpose = ?)"
        " AND (expires_at IS NULL OR expires_at > ((julianday('now') - 2440587.5) * 86400.0))"
        " AND (? IS NULL OR EXISTS (SELECT 1 FROM files a WHERE a.id = ? AND a.owner = f.owner"
        " AND (f.created_at < a.created_at OR (f.created_at = a.created_at AND f.id < a.id))))"
        " ORDER BY created_at DESC, id DESC LIMIT ?"
    ),
    True: (
        "SELECT id, owner, purpose, filename, bytes, created_at, status, expires_at FROM files f"
        " WHERE owner = ? AND status = 'processed' AND (? IS NULL OR purpose = ?)"
        " AND (expires_at IS NULL OR expires_at > ((julianday('now') - 2440587.5) * 86400.0))"
        " AND (? IS NULL OR EXISTS (SELECT 1 FROM files a WHERE a.id = ? AND a.owner = f.owner"
        " AND (f.created_at > a.created_at OR (f.created_at = a.created_at AND f.id > a.id))))"
        " ORDER BY created_at ASC, id ASC LIMIT ?"
    ),
}
_EXPIRED_FILES = (
    "SELECT id FROM files"
    " WHERE expires_at IS NOT NULL AND expires_at <= ((julianday('now') - 2440587.5) * 86400.0)"
)
_GET_BATCH = (
    "SELECT id, owner, status, created_at, CAST(record AS BLOB) FROM batches"
    " WHERE id = ? AND (? IS NULL OR owner = ?)"
)
_LIST_BATCHES = (
    "SELECT id, owner, status, created_at, CAST(record AS BLOB) FROM batches WHERE owner = ?"
    " ORDER BY created_at DESC, id DESC LIMIT ?"
)
_LIST_BATCHES_AFTER = (
    "SELECT id, owner, status, created_at, CAST(record AS BLOB) FROM batches b"
    " WHERE owner = ? AND EXISTS (SELECT 1 FROM batches a WHERE a.id = ? AND a.owner = b.owner"
    " AND (b.created_at < a.created_at OR (b.created_at = a.created_at AND b.id < a.id)))"
    " ORDER BY created_at DESC, id DESC LIMIT ?"
)
_ACTIVE_BATCHES = (
    "SELECT id, owner, status, created_at, CAST(record AS BLOB) FROM batches"
    " WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling')"
    " ORDER BY created_at, id"
)
_PUT_REPORT = (
    "INSERT INTO reports (kind, key, payload, at)"
    " VALUES (?, ?, ?, ((julianday('now') - 2440587.5) * 86400.0))"
    " ON CONFLICT (kind, key) DO UPDATE SET payload = excluded.payload, at = excluded.at"
)
_DROP_REPORTS = (
    "DELETE FROM reports WHERE kind = ? AND at < ((julianday('now') - 2440587.5) * 86400.0) - ?"
)
_REPORTS = (
    "SELECT key, CAST(payload AS BLOB), ((julianday('now') - 2440587.5) * 86400.0) - at"
    " FROM reports WHERE kind = ? AND at > ((julianday('now') - 2440587.5) * 86400.0) - ?"
    " ORDER BY key"
)

_SELECT_MODELS = (
    "SELECT name, CAST(definition AS BLOB), added_by, added_at, updated_by, updated_at"
    " FROM models ORDER BY name"
)

# Primary result codes that mean "the database cannot be used right now", with
# what an operator should check. Every other code (SQLITE_ERROR for bad SQL,
# SQLITE_CONSTRAINT, SQLITE_MISUSE …) is a bug in this code and is raised as is.
_GROUPS: tuple[tuple[tuple[int, ...], str, str], ...] = (
    (
        (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED),
        "stayed locked by another connection for longer than the {timeout:g} s busy timeout",
        "check for a stuck llmgw process, or an sqlite3 shell holding a transaction on it",
    ),
    (
        (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY,
         sqlite3.SQLITE_AUTH),
        "cannot be opened for reading and writing",
        "check that database: (or LLMGW_DATABASE_URL) names a file in a directory "
        "this user can write",
    ),
    (
        (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL),
        "could not be read or written",
        "check free space and errors on the filesystem that holds it",
    ),
    (
        (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB),
        "is not a usable SQLite database",
        "point database: at another file, or restore this one from a backup",
    ),
    (
        (sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_NOLFS),
        "cannot be used",
        "check the host's memory and that the file is on a local filesystem",
    ),
)
_HINTS = {code: (what, check) for codes, what, check in _GROUPS for code in codes}


def sqlite_path(url: str) -> Path:
    """The file named by ``sqlite:///relative/path`` or ``sqlite:////absolute/path``."""
    prefix = "sqlite:///"
    rest = url[len(prefix):] if url.startswith(prefix) else ""
    if not rest or "?" in rest or rest == ":memory:":
        raise ConfigError(
            f"database: {url!r} is not sqlite:///relative/path or sqlite:////absolute/path "
            "(a file: several connections must share it, so :memory: cannot work)",
            field="database",
        )
    return Path(unquote(rest))


def _utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"StoredModel.{field} must be timezone-aware, got naive {value!r}")
    return value.astimezone(UTC)


def _parse_time(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    # A row edited by hand without an offset is read as UTC, like every row we write.
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _model(row: tuple[Any, ...]) -> StoredModel:
    name, definition, added_by, added_at, updated_by, updated_at = row
    return StoredModel(
        name=name,
        definition=bytes(definition),
        added_by=added_by,
        added_at=_parse_time(added_at),
        updated_by=updated_by,
        updated_at=_parse_time(updated_at),
    )


def _create_private(path: Path) -> None:
    """Create the database file readable by its owner only, before SQLite creates it
    with the umask's mode: it holds who changed what, and the catalog. SQLite gives
    the -wal and -shm files the database file's mode."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600))


class _Connection:
    """One sqlite3 connection and the one thread allowed to touch it."""

    def __init__(self, path: Path, *, timeout: float, role: str, synchronous: str = "NORMAL",
                 query_only: bool = False) -> None:
        self.path = path
        self.timeout = timeout
        self._synchronous = synchronous
        self._query_only = query_only
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"llmgw-sqlite-{role}"
        )
        self._db: sqlite3.Connection | None = None

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        # Submitted work runs even if the awaiting task is cancelled, so a
        # rollback queued here cannot be skipped by a second cancellation.
        return await loop.run_in_executor(self._executor, self._call, fn)

    def submit(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        """Queue ``fn`` on the connection's thread without waiting; failures are logged."""
        def report(done: Future[object]) -> None:
            if not done.cancelled() and done.exception() is not None:
                logger.warning("SQLite %s: queued work failed", self.path,
                               exc_info=done.exception())

        self._executor.submit(self._call, fn).add_done_callback(report)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if self._db is None:
                self._db = self._connect()
            result = fn(self._db)
            if isinstance(result, sqlite3.Cursor):
                # A cursor must be finalized on its connection's thread. Handed back
                # to the event loop and freed there, it resets its cached statement
                # while this thread may be running the same statement for the next
                # call: SQLITE_MISUSE ("bad parameter or other API misuse") under a
                # stream of identical writes.
                result.close()
                return None  # type: ignore[return-value]
            return result
        except sqlite3.Error as exc:
            raise self.unavailable(exc) from exc

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit BEGINs; transactions are spelled out.
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            mode = self._enable_wal(db)
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            if self._query_only:
                db.execute("PRAGMA query_only=ON")
        except BaseException:
            db.close()
            raise
        if mode.lower() != "wal":
            db.close()
            raise StoreUnavailableError(
                f"SQLite database {self.path} cannot use write-ahead logging "
                f"(journal mode stayed {mode!r}); put it on a local filesystem"
            )
        return db

    def _enable_wal(self, db: sqlite3.Connection) -> str:
        # Switching a new file to WAL needs an exclusive lock, and SQLite
        # reports SQLITE_BUSY at once there instead of calling the busy
        # handler, so processes opening a new file together retry here. Once
        # the file is in WAL mode (it stays so) the pragma takes no lock.
        deadline = time.monotonic() + self.timeout
        pause = 0.001
        while True:
            try:
                return str(db.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
                if time.monotonic() >= deadline:
                    raise
            time.sleep(pause)  # on this connection's own thread, never the event loop
            pause = min(pause * 2, 0.05)

    def unavailable(self, exc: sqlite3.Error) -> Exception:
        """``StoreUnavailableError`` for an operational failure; ``exc`` itself for a bug."""
        code = getattr(exc, "sqlite_errorcode", None)
        hint = _HINTS.get(code & 0xFF) if isinstance(code, int) else None
        if hint is None:
            return exc
        what, check = hint
        return StoreUnavailableError(
            f"SQLite database {self.path} {what.format(timeout=self.timeout)} ({exc}); {check}"
        )

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def close(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close_db)
        finally:
            self._executor.shutdown(wait=False)


# --- statements, each run on a connection's thread -------------------------------


def _migrate(db: sqlite3.Connection) -> list[int]:
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(SQLITE_MIGRATIONS_TABLE)
        applied = [row[0] for row in db.execute("SELECT version FROM schema_migrations")]
        todo = pending(applied)
        for migration in todo:
            for statement in migration.sqlite:
                db.execute(statement)
            db.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                (migration.number, migration.name),
            )
        db.execute("COMMIT")
    except BaseException:
        _rollback(db)
        raise
    return [m.number for m in todo]


def _rollback(db: sqlite3.Connection) -> None:
    if not db.in_transaction:
        return
    try:
        db.execute("ROLLBACK")
    except sqlite3.Error:
        # SQLite rolls back on its own when a statement fails badly enough
        # (SQLITE_FULL, SQLITE_IOERR); the original error is the one to raise.
        logger.warning("SQLite rollback failed; raising the error that caused it", exc_info=True)


def _bump_and_commit(db: sqlite3.Connection) -> None:
    db.execute("UPDATE catalog_version SET version = version + 1 WHERE id = 1")
    db.execute("COMMIT")


def _put_model(model: StoredModel) -> Callable[[sqlite3.Connection], None]:
    row = (
        model.name,
        model.definition,
        model.added_by,
        _utc(model.added_at, "added_at").isoformat(timespec="microseconds"),
        model.updated_by,
        _utc(model.updated_at, "updated_at").isoformat(timespec="microseconds"),
    )

    def run(db: sqlite3.Connection) -> None:
        db.execute(
            "INSERT INTO models (name, definition, added_by, added_at, updated_by, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET definition = excluded.definition,"
            " added_by = excluded.added_by, added_at = excluded.added_at,"
            " updated_by = excluded.updated_by, updated_at = excluded.updated_at",
            row,
        )

    return run


def _file(row: tuple[Any, ...]) -> FileRecord:
    id_, owner, purpose, filename, size, created_at, status, expires_at = row
    return FileRecord(id=id_, owner=owner, purpose=purpose, filename=filename, bytes=size,
                      created_at=created_at, status=status, expires_at=expires_at)


def _batch(row: tuple[Any, ...]) -> BatchRow:
    id_, owner, status, created_at, record = row
    return BatchRow(id=id_, owner=owner, status=status, created_at=created_at,
                    record=bytes(record))


def _delete_files(db: sqlite3.Connection, ids: list[str]) -> int:
    for file_id in ids:
        db.execute("DELETE FROM file_chunks WHERE file_id = ?", (file_id,))
        db.execute("DELETE FROM files WHERE id = ?", (file_id,))
    return len(ids)


def _in_transaction(db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    db.execute("BEGIN IMMEDIATE")
    try:
        result = fn(db)
        db.execute("COMMIT")
    except BaseException:
        _rollback(db)
        raise
    return result


class _SqliteChange:
    """The open ``BEGIN IMMEDIATE`` transaction of one ``SqliteStore.change()``."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.ended = False

    def _check(self) -> _Connection:
        if self.ended:
            raise RuntimeError(
                "this catalog change has ended; make every read and write of a change "
                "inside its `async with store.change()` block"
            )
        return self._conn

    async def models(self) -> list[StoredModel]:
        rows = await self._check().run(lambda db: db.execute(_SELECT_MODELS).fetchall())
        return [_model(row) for row in rows]

    async def put_model(self, model: StoredModel) -> None:
        await self._check().run(_put_model(model))

    async def delete_model(self, name: str) -> bool:
        count = await self._check().run(
            lambda db: db.execute("DELETE FROM models WHERE name = ?", (name,)).rowcount
        )
        return bool(count > 0)


class SqliteStore:
    """``Store`` on one SQLite file; see the module docstring for the threading."""

    def __init__(self, url: str, *, lock_timeout: float = 30.0) -> None:
        self.path = sqlite_path(url)
        self.lock_timeout = lock_timeout
        self._catalog: _Connection | None = None
        self._writes: _Connection | None = None
        self._reads: _Connection | None = None
        self._ledger: LedgerWriter | None = None
        self._change_lock = asyncio.Lock()

    async def open(self) -> None:
        if self._catalog is not None:
            raise RuntimeError(f"SqliteStore({self.path}) is already open")
        try:
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(_create_private, self.path)
        except OSError as exc:
            raise StoreUnavailableError(
                f"SQLite database {self.path}: cannot create its directory {self.path.parent} "
                f"({exc}); check that database: (or LLMGW_DATABASE_URL) names a path this "
                "user can create"
            ) from exc
        timeout = self.lock_timeout
        catalog = _Connection(self.path, timeout=timeout, role="catalog", synchronous="FULL")
        writes = _Connection(self.path, timeout=timeout, role="writes")
        reads = _Connection(self.path, timeout=timeout, role="reads", query_only=True)
        try:
            try:
                applied = await catalog.run(_migrate)
            except SchemaTooNewError as exc:
                raise StoreUnavailableError(f"SQLite database {self.path}: {exc}") from exc
            # Connect the others now, so a problem shows in open(), not later.
            await writes.run(lambda db: None)
            await reads.run(lambda db: None)
        except BaseException:
            for conn in (catalog, writes, reads):
                await conn.close()
            raise
        if applied:
            logger.info("SQLite database %s: applied migrations %s", self.path, applied)
        self._catalog, self._writes, self._reads = catalog, writes, reads
        self._ledger = LedgerWriter(self.path, timeout=timeout)

    async def close(self) -> None:
        catalog, writes, reads = self._catalog, self._writes, self._reads
        self._catalog = self._writes = self._reads = None
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            await ledger.close()
        if catalog is not None:
            async with self._change_lock:  # let an open change finish first
                await catalog.close()
        for conn in (writes, reads):
            if conn is not None:
                await conn.close()

    @property
    def state_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".d")

    @property
    def is_open(self) -> bool:
        return self._catalog is not None

    def _conn(self, conn: _Connection | None) -> _Connection:
        if conn is None:
            raise RuntimeError(f"SqliteStore({self.path}) is not open; await open() first")
        return conn

    async def models(self) -> list[StoredModel]:
        rows = await self._conn(self._reads).run(
            lambda db: db.execute(_SELECT_MODELS).fetchall()
        )
        return [_model(row) for row in rows]

    @asynccontextmanager
    async def change(self) -> AsyncIterator[CatalogChange]:
        async with self._change_lock:
            conn = self._conn(self._catalog)
            change = _SqliteChange(conn)
            began = False
            try:
                await conn.run(lambda db: db.execute("BEGIN IMMEDIATE"))
                began = True
                yield change
                change.ended = True
                await conn.run(_bump_and_commit)
            except BaseException:
                change.ended = True
                if began:
                    await conn.run(_rollback)
                else:
                    # Cancelled (or failed) while BEGIN waited for another
                    # process's lock: the BEGIN still runs to its end on the
                    # connection's thread, and would leave the connection
                    # inside a write transaction nobody owns. Queue the
                    # rollback behind it without waiting, so the cancellation
                    # is not held up for the lock; the thread runs work in
                    # order, so the next change's BEGIN comes after it.
                    conn.submit(_rollback)
                raise

    async def catalog_version(self) -> int:
        row = await self._conn(self._reads).run(
            lambda db: db.execute("SELECT version FROM catalog_version WHERE id = 1").fetchone()
        )
        return int(row[0])

    async def try_lease(self, name: str, holder: str, ttl: float) -> bool:
        # One statement, so SQLite's write lock makes take-or-renew atomic; the
        # WHERE on the update leaves a live lease of another holder untouched,
        # and RETURNING yields a row only when this holder now has it.
        rows = await self._conn(self._writes).run(
            lambda db: db.execute(_TRY_LEASE, (name, holder, float(ttl))).fetchall()
        )
        return bool(rows)

    async def release_lease(self, name: str, holder: str) -> None:
        await self._conn(self._writes).run(
            lambda db: db.execute(
                "DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder)
            )
        )

    async def lease_holder(self, name: str) -> str | None:
        row = await self._conn(self._reads).run(
            lambda db: db.execute(_LEASE_HOLDER, (name,)).fetchone()
        )
        return None if row is None else str(row[0])

    async def mark_activity(self, model: str) -> None:
        await self._conn(self._writes).run(
            lambda db: db.execute(_MARK_ACTIVITY, (model,))
        )

    async def last_activity(self, model: str) -> float | None:
        row = await self._conn(self._reads).run(
            lambda db: db.execute(_LAST_ACTIVITY, (model,)).fetchone()
        )
        return None if row is None else max(0.0, float(row[0]))

    # --- stored Responses ---------------------------------------------------------

    async def put_response(self, response: StoredResponse, ttl: float) -> None:
        row = (response.id, response.owner, response.body, response.context, float(ttl))
        await self._conn(self._writes).run(lambda db: db.execute(_PUT_RESPONSE, row))

    async def get_response(self, id: str, owner: OwnerId) -> StoredResponse | None:
        row = await self._conn(self._reads).run(
            lambda db: db.execute(_GET_RESPONSE, (id, owner)).fetchone())
        if row is None:
            return None
        return StoredResponse(id=id, owner=owner, body=bytes(row[0]), context=bytes(row[1]))

    async def delete_response(self, id: str, owner: OwnerId) -> bool:
        count = await self._conn(self._writes).run(
            lambda db: db.execute(_DELETE_RESPONSE, (id, owner)).rowcount)
        return bool(count > 0)

    async def purge_responses(self) -> int:
        count = await self._conn(self._writes).run(
            lambda db: db.execute(_PURGE_RESPONSES).rowcount)
        return int(count)

    # --- files ----------------------------------------------------------------------

    async def create_file(self, file: FileRecord) -> None:
        row = (file.id, file.owner, file.purpose, file.filename, file.bytes, file.created_at,
               "uploading", file.expires_at)
        await self._conn(self._writes).run(lambda db: db.execute(
            "INSERT INTO files (id, owner, purpose, filename, bytes, created_at, status,"
            " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row))

    async def put_file_chunk(self, file_id: str, seq: int, data: bytes) -> None:
        await self._conn(self._writes).run(lambda db: db.execute(
            "INSERT INTO file_chunks (file_id, seq, data) VALUES (?, ?, ?)",
            (file_id, seq, data)))

    async def finish_file(self, file_id: str, size: int, expires_at: int | None = None) -> None:
        await self._conn(self._writes).run(lambda db: db.execute(
            "UPDATE files SET status = 'processed', bytes = ?,"
            " expires_at = COALESCE(?, expires_at) WHERE id = ?",
            (size, expires_at, file_id)))

    async def get_file(self, id: str, owner: OwnerId | None) -> FileRecord | None:
        row = await self._conn(self._reads).run(
            lambda db: db.execute(_GET_FILE, (id, owner, owner)).fetchone())
        return None if row is None else _file(row)

    async def list_files(self, owner: OwnerId, *, purpose: str | None, after: str | None,
                         limit: int, ascending: bool) -> list[FileRecord]:
        args = (owner, purpose, purpose, after, after, limit)
        rows = await self._conn(self._reads).run(
            lambda db: db.execute(_LIST_FILES[ascending], args).fetchall())
        return [_file(r) for r in rows]

    async def read_file_chunks(self, file_id: str, first: int, count: int) -> list[bytes]:
        rows = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT CAST(data AS BLOB) FROM file_chunks WHERE file_id = ? AND seq >= ?"
            " ORDER BY seq LIMIT ?", (file_id, first, count)).fetchall())
        return [bytes(r[0]) for r in rows]

    async def delete_file(self, id: str, owner: OwnerId | None) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            if owner is None:
                cur = db.execute("DELETE FROM files WHERE id = ?", (id,))
            else:
                cur = db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (id, owner))
            if cur.rowcount == 0:
                return False
            db.execute("DELETE FROM file_chunks WHERE file_id = ?", (id,))
            return True

        return await self._conn(self._writes).run(lambda db: _in_transaction(db, run))

    async def purge_uploads(self, before: int) -> int:
        def run(db: sqlite3.Connection) -> int:
            ids = [r[0] for r in db.execute(
                "SELECT id FROM files WHERE status = 'uploading' AND created_at < ?", (before,))]
            return _delete_files(db, ids)

        return await self._conn(self._writes).run(lambda db: _in_transaction(db, run))

    async def purge_files(self) -> int:
        def run(db: sqlite3.Connection) -> int:
            return _delete_files(db, [r[0] for r in db.execute(_EXPIRED_FILES)])

        return await self._conn(self._writes).run(lambda db: _in_transaction(db, run))

    # --- batches --------------------------------------------------------------------

    async def create_batch(self, batch: BatchRow) -> None:
        row = (batch.id, batch.owner, batch.status, batch.created_at, batch.record)
        await self._conn(self._writes).run(lambda db: db.execute(
            "INSERT INTO batches (id, owner, status, created_at, record) VALUES (?, ?, ?, ?, ?)",
            row))

    async def get_batch(self, id: str, owner: OwnerId | None) -> BatchRow | None:
        row = await self._conn(self._reads).run(
            lambda db: db.execute(_GET_BATCH, (id, owner, owner)).fetchone())
        return None if row is None else _batch(row)

    async def list_batches(self, owner: OwnerId, after: str | None, limit: int) -> list[BatchRow]:
        def run(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if after is None:
                return db.execute(_LIST_BATCHES, (owner, limit)).fetchall()
            return db.execute(_LIST_BATCHES_AFTER, (owner, after, limit)).fetchall()

        return [_batch(r) for r in await self._conn(self._reads).run(run)]

    async def update_batch(self, batch: BatchRow, expect: str) -> bool:
        count = await self._conn(self._writes).run(lambda db: db.execute(
            "UPDATE batches SET status = ?, record = ? WHERE id = ? AND status = ?",
            (batch.status, batch.record, batch.id, expect)).rowcount)
        return bool(count > 0)

    async def active_batches(self) -> list[BatchRow]:
        rows = await self._conn(self._reads).run(
            lambda db: db.execute(_ACTIVE_BATCHES).fetchall())
        return [_batch(r) for r in rows]

    async def put_batch_results(self, batch_id: str, results: list[BatchResult]) -> None:
        rows = [(batch_id, r.line, int(r.ok), r.data) for r in results]
        await self._conn(self._writes).run(lambda db: _in_transaction(db, lambda d: d.executemany(
            "INSERT INTO batch_results (batch_id, line, ok, data) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (batch_id, line) DO NOTHING", rows)))

    async def batch_results(self, batch_id: str, after: int, limit: int) -> list[BatchResult]:
        rows = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT line, ok, CAST(data AS BLOB) FROM batch_results"
            " WHERE batch_id = ? AND line > ? ORDER BY line LIMIT ?",
            (batch_id, after, limit)).fetchall())
        return [BatchResult(line=r[0], ok=bool(r[1]), data=bytes(r[2])) for r in rows]

    async def batch_result_lines(self, batch_id: str, after: int) -> list[int]:
        rows = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT line FROM batch_results WHERE batch_id = ? AND line > ? ORDER BY line",
            (batch_id, after)).fetchall())
        return [int(r[0]) for r in rows]

    async def count_batch_results(self, batch_id: str) -> tuple[int, int]:
        row = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT COALESCE(SUM(ok), 0), COALESCE(SUM(1 - ok), 0) FROM batch_results"
            " WHERE batch_id = ?", (batch_id,)).fetchone())
        return int(row[0]), int(row[1])

    async def delete_batch_results(self, batch_id: str) -> None:
        await self._conn(self._writes).run(lambda db: db.execute(
            "DELETE FROM batch_results WHERE batch_id = ?", (batch_id,)))

    async def put_report(self, kind: str, key: str, payload: bytes) -> None:
        def run(db: sqlite3.Connection) -> None:
            db.execute(_PUT_REPORT, (kind, key, payload))
            db.execute(_DROP_REPORTS, (kind, REPORT_RETENTION))

        await self._conn(self._writes).run(run)

    async def reports(self, kind: str, within: float) -> list[Report]:
        rows = await self._conn(self._reads).run(
            lambda db: db.execute(_REPORTS, (kind, float(within))).fetchall()
        )
        return [Report(key=str(k), payload=bytes(p), age=max(0.0, float(a))) for k, p, a in rows]

    # --- teams and keys created at run time -------------------------------------------

    async def tenants_version(self) -> int:
        row = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT version FROM tenants_version WHERE id = 1").fetchone())
        return int(row[0])

    async def tenants(self) -> tuple[list[StoredTeam], list[StoredKey]]:
        def run(db: sqlite3.Connection) -> tuple[list[StoredTeam], list[StoredKey]]:
            db.execute("BEGIN")
            try:
                teams = [StoredTeam(name=r[0], settings=bytes(r[1]), created_by=r[2],
                                    created_at=float(r[3])) for r in db.execute(
                    "SELECT name, CAST(settings AS BLOB), created_by, created_at FROM teams"
                    " ORDER BY name")]
                keys = [StoredKey(name=r[0], team=r[1], sha256=r[2], settings=bytes(r[3]),
                                  created_by=r[4], created_at=float(r[5]), expires_at=r[6],
                                  previous_sha256=r[7], previous_until=r[8], owner=r[9])
                        for r in db.execute(
                    "SELECT name, team, sha256, CAST(settings AS BLOB), created_by, created_at,"
                    " expires_at, previous_sha256, previous_until, owner"
                    " FROM api_keys ORDER BY name")]
            finally:
                db.execute("COMMIT")
            return teams, keys

        return await self._conn(self._reads).run(run)

    async def _tenant_change(self, fn: Callable[[sqlite3.Connection], bool]) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            changed = fn(db)
            if changed:
                db.execute("UPDATE tenants_version SET version = version + 1 WHERE id = 1")
            return changed

        return await self._conn(self._writes).run(lambda db: _in_transaction(db, run))

    async def put_team(self, team: StoredTeam, *, create: bool) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            if create:
                return db.execute(
                    "INSERT INTO teams (name, settings, created_by, created_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                    (team.name, team.settings, team.created_by, team.created_at)).rowcount > 0
            return db.execute("UPDATE teams SET settings = ? WHERE name = ?",
                              (team.settings, team.name)).rowcount > 0

        return await self._tenant_change(run)

    async def delete_team(self, name: str) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            db.execute("DELETE FROM api_keys WHERE team = ?", (name,))
            return db.execute("DELETE FROM teams WHERE name = ?", (name,)).rowcount > 0

        return await self._tenant_change(run)

    async def put_key(self, key: StoredKey) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            if db.execute("SELECT 1 FROM teams WHERE name = ?", (key.team,)).fetchone() is None:
                return False
            return db.execute(
                "INSERT INTO api_keys (name, team, sha256, settings, created_by, created_at,"
                " expires_at, previous_sha256, previous_until, owner)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (key.name, key.team, key.sha256, key.settings, key.created_by,
                 key.created_at, key.expires_at, key.previous_sha256, key.previous_until,
                 key.owner)).rowcount > 0

        return await self._tenant_change(run)

    async def update_key(self, key: StoredKey) -> bool:
        return await self._tenant_change(lambda db: db.execute(
            "UPDATE api_keys SET sha256 = ?, settings = ?, expires_at = ?, previous_sha256 = ?,"
            " previous_until = ?, owner = ? WHERE name = ?",
            (key.sha256, key.settings, key.expires_at, key.previous_sha256, key.previous_until,
             key.owner, key.name)).rowcount > 0)

    async def delete_key(self, name: str) -> bool:
        return await self._tenant_change(lambda db: db.execute(
            "DELETE FROM api_keys WHERE name = ?", (name,)).rowcount > 0)

    async def claim_legacy_owners(self, ids: dict[str, str]) -> int:
        pairs = [(id, LEGACY_OWNER + name) for name, id in ids.items()]

        def run(db: sqlite3.Connection) -> int:
            claimed = 0
            for table in OWNED_TABLES:
                before = db.total_changes
                db.executemany(f"UPDATE {table} SET owner = ? WHERE owner = ?",  # noqa: S608
                               pairs)
                claimed += db.total_changes - before
                db.execute(f"UPDATE {table} SET owner = ? || substr(owner, ?)"  # noqa: S608
                           " WHERE owner LIKE ?",
                           (REVOKED_OWNER, len(LEGACY_OWNER) + 1, LEGACY_OWNER + "%"))
            return claimed

        return await self._conn(self._writes).run(lambda db: _in_transaction(db, run))

    # --- the usage ledger ---------------------------------------------------------------

    async def record_usage(self, records: list[UsageRecord]) -> int:
        if self._ledger is None:
            raise RuntimeError(f"SqliteStore({self.path}) is not open; await open() first")
        return await self._ledger.write(records) if records else 0

    async def usage(self, by: str, since: float, until: float, day: bool) -> list[UsageRow]:
        query, params = usage_params(by, since, until, day)
        rows = await self._conn(self._reads).run(
            lambda db: db.execute(query, params).fetchall())
        return [UsageRow(bucket=int(r[0]), group=str(r[1]), requests=int(r[2]),
                         prompt_tokens=int(r[3]), cached_tokens=int(r[4]),
                         completion_tokens=int(r[5])) for r in rows]

    async def token_totals(self, since: float) -> list[TokenTotal]:
        params = token_totals_params(since)
        rows = await self._conn(self._reads).run(
            lambda db: db.execute(KEY_USAGE_SINCE, params).fetchall())
        return [TokenTotal(team=r[0], key=r[1], tokens=int(r[2])) for r in rows]

    async def recent_tokens(self, since: float) -> list[TokenTotal]:
        rows = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT team, key, SUM(prompt_tokens + completion_tokens) FROM usage"
            " WHERE at >= ? GROUP BY team, key", (since,)).fetchall())
        return [TokenTotal(team=r[0], key=r[1], tokens=int(r[2])) for r in rows]

    async def status_counts(self, since: float, least: int = 0) -> list[StatusCount]:
        rows = await self._conn(self._reads).run(
            lambda db: db.execute(STATUS_COUNTS, (since, least)).fetchall())
        return [status_count(r) for r in rows]

    async def requests_since(self, since: float) -> int:
        count = await self._conn(self._reads).run(
            lambda db: db.execute(REQUESTS_SINCE, (since,)).fetchone()[0])
        return int(count)

    async def lease_slice(self, ask: SliceAsk) -> SliceGrant:
        used_query, used_params = slice_used_params(ask)

        def run(db: sqlite3.Connection) -> SliceGrant:
            # Inside BEGIN IMMEDIATE: no other holder writes a slice until the commit.
            db.execute(_DROP_EXPIRED_SLICES, (ask.scope,))
            used = int(db.execute(used_query, used_params).fetchone()[0])
            others = int(db.execute(SLICE_OTHERS, (ask.scope, ask.holder)).fetchone()[0])
            granted = slice_grant(ask, used, others)
            db.execute(_PUT_SLICE, (ask.scope, ask.holder, granted, ask.settled,
                                    float(ask.ttl)))
            return SliceGrant(granted=granted, used=used, others=others)

        return await self._conn(self._writes).run(lambda db: _in_transaction(db, run))

    async def release_slice(self, scope: str, holder: str) -> None:
        await self._conn(self._writes).run(lambda db: db.execute(
            "DELETE FROM budget_slices WHERE scope = ? AND holder = ?", (scope, holder)))

    async def purge_usage(self, before: float) -> int:
        count = await self._conn(self._writes).run(
            lambda db: db.execute("DELETE FROM usage WHERE at < ?", (before,)).rowcount)
        return int(count)

    async def team_model_tokens(self, since: float, until: float) -> list[TeamModelTokens]:
        rows = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT hour, team, model, SUM(prompt_tokens + completion_tokens) FROM usage_hourly"
            " WHERE hour >= ? AND hour < ? GROUP BY hour, team, model ORDER BY hour, team, model",
            (since, until)).fetchall())
        return [TeamModelTokens(hour=int(r[0]), team=r[1], model=r[2], tokens=int(r[3]))
                for r in rows]

    async def put_holdings(self, holdings: list[StoredHolding], seen: float) -> None:
        rows = [(h.id, h.model, h.gpu_class, h.gpus, h.cores, h.started, h.ended, seen)
                for h in holdings]

        def run(db: sqlite3.Connection) -> None:
            db.executemany(PUT_HOLDING, rows)
            db.execute(CLOSE_UNSEEN, (seen,))

        await self._conn(self._writes).run(lambda db: _in_transaction(db, run))

    async def holdings(self, since: float, until: float) -> list[StoredHolding]:
        rows = await self._conn(self._reads).run(lambda db: db.execute(
            HOLDINGS_BETWEEN, (until, since)).fetchall())
        return [holding_row(r) for r in rows]

    async def put_request_logs(self, logs: list[RequestLog]) -> None:
        rows = [(g.id, g.at, g.expires_at, g.team, g.key, g.record, g.request, g.response)
                for g in logs]
        await self._conn(self._writes).run(lambda db: _in_transaction(db, lambda d: d.executemany(
            "INSERT INTO request_logs (id, at, expires_at, team, key, record, request, response)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING", rows)))

    async def request_logs(self, team: str, before: float, limit: int) -> list[RequestLog]:
        rows = await self._conn(self._reads).run(lambda db: db.execute(
            "SELECT id, at, expires_at, team, key, CAST(record AS BLOB), CAST(request AS BLOB),"
            " CAST(response AS BLOB) FROM request_logs WHERE team = ? AND at < ?"
            " AND expires_at > ((julianday('now') - 2440587.5) * 86400.0)"
            " ORDER BY at DESC LIMIT ?", (team, before, limit)).fetchall())
        return [_log(r) for r in rows]

    async def purge_request_logs(self, now: float) -> int:
        count = await self._conn(self._writes).run(lambda db: db.execute(
            "DELETE FROM request_logs WHERE expires_at <= ?", (now,)).rowcount)
        return int(count)


def _log(r: tuple[Any, ...]) -> RequestLog:
    return RequestLog(id=r[0], at=float(r[1]), expires_at=float(r[2]), team=r[3], key=r[4],
                      record=bytes(r[5]), request=None if r[6] is None else bytes(r[6]),
                      response=None if r[7] is None else bytes(r[7]))
