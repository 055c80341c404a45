"""The Postgres store: for several llmgw instances sharing one catalog.

psycopg 3 in async mode with a small ``AsyncConnectionPool`` (1 to 4
connections by default): the store's traffic is a version poll every half
second, lease renewals and activity marks, and a catalog change now and
then, so a few connections carry it, and a database shared by many
instances should not be handed dozens per instance.

``change()`` is one transaction on one pooled connection. Right after
``BEGIN`` it locks the single ``catalog_version`` row (``SELECT … FOR
UPDATE``); every change in every instance takes that row first, so changes
are serialised from the read of the stored models to the commit that bumps
the version. Plain reads do not take the row lock and never wait for
a change. Within one instance an ``asyncio.Lock`` queues changes before they
take a pool connection: otherwise a burst of changes would hold every
connection while waiting for the row lock, and a read made inside the one
change that holds it could not get a connection at all.

Nothing waits without a bound: TCP keepalives and ``tcp_user_timeout`` (the
query timeout) make the kernel drop a connection whose peer went silent; a
connection attempt gives up after ``connect_timeout``, a wait for a pooled
connection after ``pool_timeout``, a wait for the catalog lock after
``lock_timeout``, and any statement the server leaves unanswered after
``query_timeout``. Each ends in
``StoreUnavailableError``, which the API turns into a 503 while reads keep
serving the catalog in force.

Time is the database's ``now()`` — every statement here runs in its own
transaction, so that is the statement's start — so hosts' clocks do not
matter to leases or idle timeouts.

Connection settings come from the URL, as libpq reads them; ``options=
-csearch_path%3Dname`` puts the tables in a schema (which must exist; the
store creates tables, not schemas). ``application_name`` defaults to
``llmgw`` so an operator can find these sessions in ``pg_stat_activity``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from llmgw.errors import ConfigError, StoreUnavailableError
from llmgw.redact import redact_url
from llmgw.store.base import (
    HOLDINGS_BETWEEN,
    KEY_USAGE_SINCE,
    LEGACY_OWNER,
    OWNED_TABLES,
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
    state_home,
    status_count,
    token_totals_params,
    usage_params,
)
from llmgw.store.schema import (
    POSTGRES_MIGRATIONS_TABLE,
    ROLL_UP_BY,
    SchemaTooNewError,
    pending,
)

logger = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
Cursor = psycopg.AsyncCursor[tuple[Any, ...]]

_SELECT_MODELS = (
    "SELECT name, definition, added_by, added_at, updated_by, updated_at"
    " FROM models ORDER BY name"
)




# A file is there once complete and until it expires (database time, as a response's).
_GET_FILE = (
    "SELECT id, owner, purpose, filename, bytes, created_at, status, expires_at FROM files"
    " WHERE id = %s AND status = 'processed' AND (%s::text IS NULL OR owner = %s)"
    " AND (expires_at IS NULL OR expires_at > EXTRACT(EPOCH FROM now()))"
)
# By (created_at, id), newest first or (True) oldest first, after the cursor file when it
# is the owner's.
_LIST_FILES = {
    False: (
        "SELECT id, owner, purpose, filename, bytes, created_at, status, expires_at FROM files f"
        " WHERE owner = %s AND status = 'processed' AND (%s::text IS NULL OR purpose = %s)"
        " AND (expires_at IS NULL OR expires_at > EXTRACT(EPOCH FROM now()))"
        " AND (%s::text IS NULL OR EXISTS (SELECT 1 FROM files a WHERE a.id = %s"
        " AND a.owner = f.owner AND (f.created_at, f.id) < (a.created_at, a.id)))"
        " ORDER BY created_at DESC, id DESC LIMIT %s"
    ),
    True: (
        "SELECT id, owner, purpose, filename, bytes, created_at, status, expires_at FROM files f"
        " WHERE owner = %s AND status = 'processed' AND (%s::text IS NULL OR purpose = %s)"
        " AND (expires_at IS NULL OR expires_at > EXTRACT(EPOCH FROM now()))"
        " AND (%s::text IS NULL OR EXISTS (SELECT 1 FROM files a WHERE a.id = %s"
        " AND a.owner = f.owner AND (f.created_at, f.id) > (a.created_at, a.id)))"
        " ORDER BY created_at ASC, id ASC LIMIT %s"
    ),
}


def _file(row: tuple[Any, ...]) -> FileRecord:
    id_, owner, purpose, filename, size, created_at, status, expires_at = row
    return FileRecord(id=id_, owner=owner, purpose=purpose, filename=filename, bytes=int(size),
                      created_at=int(created_at), status=status,
                      expires_at=None if expires_at is None else int(expires_at))


def _batch(row: tuple[Any, ...]) -> BatchRow:
    id_, owner, status, created_at, record = row
    return BatchRow(id=id_, owner=owner, status=status, created_at=int(created_at),
                    record=bytes(record))


def _utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"StoredModel.{field} must be timezone-aware, got naive {value!r}")
    return value.astimezone(UTC)


def _model(row: tuple[Any, ...]) -> StoredModel:
    name, definition, added_by, added_at, updated_by, updated_at = row
    # timestamptz comes back in the session's TimeZone; the struct promises UTC.
    return StoredModel(
        name=name,
        definition=bytes(definition),
        added_by=added_by,
        added_at=added_at.astimezone(UTC),
        updated_by=updated_by,
        updated_at=updated_at.astimezone(UTC),
    )


def _is_unavailable(exc: psycopg.Error) -> bool:
    # OperationalError covers a refused or dropped connection, a server
    # shutting down, a lock or pool timeout. The other two are deployment
    # problems, not bugs: a role without privileges, a URL pointing at a
    # read-only standby. Everything else (bad SQL, a missing table) is raised
    # as the bug it is.
    return isinstance(
        exc,
        psycopg.OperationalError
        | pg_errors.InsufficientPrivilege
        | pg_errors.ReadOnlySqlTransaction,
    )


class _PostgresChange:
    """The open transaction of one ``PostgresStore.change()``."""

    def __init__(self, store: PostgresStore, conn: Conn) -> None:
        self._store = store
        self._conn = conn
        self.ended = False

    def _check(self) -> Conn:
        if self.ended:
            raise RuntimeError(
                "this catalog change has ended; make every read and write of a change "
                "inside its `async with store.change()` block"
            )
        return self._conn

    async def models(self) -> list[StoredModel]:
        cur = await self._store._execute(
            self._check(), "read the stored models in a catalog change", _SELECT_MODELS
        )
        return [_model(row) for row in await cur.fetchall()]

    async def put_model(self, model: StoredModel) -> None:
        conn = self._check()
        params = (
            model.name,
            model.definition,
            model.added_by,
            _utc(model.added_at, "added_at"),
            model.updated_by,
            _utc(model.updated_at, "updated_at"),
        )
        await self._store._execute(
            conn,
            f"store model {model.name!r}",
            "INSERT INTO models (name, definition, added_by, added_at, updated_by, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition,"
            " added_by = EXCLUDED.added_by, added_at = EXCLUDED.added_at,"
            " updated_by = EXCLUDED.updated_by, updated_at = EXCLUDED.updated_at",
            params,
        )

    async def delete_model(self, name: str) -> bool:
        cur = await self._store._execute(
            self._check(), f"delete model {name!r}", "DELETE FROM models WHERE name = %s", (name,)
        )
        return cur.rowcount > 0


class PostgresStore:
    """``Store`` on a Postgres database; see the module docstring for the locking."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        pool_timeout: float = 5.0,
        lock_timeout: float = 30.0,
        query_timeout: float = 10.0,
        connect_timeout: int = 5,
    ) -> None:
        self.url = url
        self.where = redact_url(url)
        try:
            given = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(
                f"database: {self.where} is not a valid PostgreSQL URL ({exc})", field="database"
            ) from exc
        # Defaults only: anything the URL sets wins (libpq keyword arguments
        # would override the URL otherwise).
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "application_name" not in given:
            self._kwargs["application_name"] = "llmgw"
        if "connect_timeout" not in given:
            self._kwargs["connect_timeout"] = connect_timeout
        # A peer that vanishes without a word (a partition, packets dropped)
        # is found by the kernel: keepalive probes on an idle connection, and
        # unacknowledged data abandoned after tcp_user_timeout, so a pooled
        # connection to nowhere fails instead of waiting on TCP's retries
        # (about 15 minutes on Linux).
        for key, value in (("keepalives", 1), ("keepalives_idle", 5),
                           ("keepalives_interval", 2), ("keepalives_count", 3),
                           ("tcp_user_timeout", round(query_timeout * 1000))):
            if key not in given:
                self._kwargs[key] = value
        self._password = str(given.get("password") or "")
        self.min_size, self.max_size = min_size, max_size
        self.pool_timeout, self.lock_timeout = pool_timeout, lock_timeout
        self.query_timeout = query_timeout
        # A lock wait past lock_timeout fails on the server with LockNotAvailable.
        self._begin = sql.SQL("BEGIN; SET LOCAL lock_timeout = {}").format(
            sql.Literal(f"{round(lock_timeout * 1000)}ms")
        )
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._change_lock = asyncio.Lock()

    @contextmanager
    def _unavailable(self, doing: str) -> Iterator[None]:
        """Turn a failure to reach or use the database into ``StoreUnavailableError``."""
        try:
            yield
        except psycopg.Error as exc:
            if not _is_unavailable(exc):
                raise
            raise StoreUnavailableError(self._explain(exc, doing)) from exc

    def _explain(self, exc: psycopg.Error, doing: str) -> str:
        reason = re.sub(r"\s+", " ", str(exc)).strip()
        if self._password:
            reason = reason.replace(self._password, "***")
        if isinstance(exc, pg_errors.LockNotAvailable):
            check = (
                f"another llmgw instance held the catalog lock for over {self.lock_timeout:g} s; "
                "look for a stuck session in pg_stat_activity (application_name llmgw)"
            )
        elif isinstance(exc, PoolTimeout):
            check = (
                f"no connection was free or could be made within {self.pool_timeout:g} s; "
                "check that the server is up and reachable, and its max_connections"
            )
        elif isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            check = "the server is read-only; point database: at the primary, not a standby"
        elif isinstance(exc, pg_errors.InsufficientPrivilege):
            check = "grant the role in the URL the privileges named above on llmgw's tables"
        else:
            check = (
                "check that the server is running and reachable from this host, and the URL "
                "in database: (or LLMGW_DATABASE_URL)"
            )
        return f"PostgreSQL database {self.where}: could not {doing} ({reason}); {check}"

    async def open(self) -> None:
        if self._pool is not None:
            raise RuntimeError(f"PostgresStore({self.where}) is already open")
        # One direct connection first: it reports "connection refused" or
        # "password authentication failed" at once, where a pool would retry
        # until its timeout and then say only that it timed out.
        with self._unavailable("connect"):
            conn = await psycopg.AsyncConnection.connect(self.url, **self._kwargs)
        try:
            with self._unavailable("apply schema migrations"):
                await self._migrate(conn)
        finally:
            await conn.close()
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.url,
            kwargs=self._kwargs,
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.pool_timeout,
            name="llmgw-store",
            open=False,
        )
        try:
            with self._unavailable("open its connection pool"):
                await pool.open(wait=True, timeout=self.pool_timeout)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def _migrate(self, conn: Conn) -> None:
        async with conn.transaction():
            row = await (await conn.execute("SELECT current_schema()")).fetchone()
            schema = None if row is None else row[0]
            if schema is None:
                raise StoreUnavailableError(
                    f"PostgreSQL database {self.where}: no schema on the search_path exists; "
                    "create it (CREATE SCHEMA …) or fix options=-csearch_path in the URL"
                )
            # Per schema, so deployments sharing a database in separate schemas
            # do not wait on each other.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"llmgw-migrate:{schema}",)
            )
            # Checked before CREATE … IF NOT EXISTS, which needs CREATE on the
            # schema even when the table is there; a role that may only use
            # existing tables can still open a migrated database.
            row = await (await conn.execute("SELECT to_regclass('schema_migrations')")).fetchone()
            if row is None or row[0] is None:
                await conn.execute(POSTGRES_MIGRATIONS_TABLE)
            cur = await conn.execute("SELECT version FROM schema_migrations")
            applied = [r[0] for r in await cur.fetchall()]
            try:
                todo = pending(applied)
            except SchemaTooNewError as exc:
                raise StoreUnavailableError(f"PostgreSQL database {self.where}: {exc}") from exc
            for migration in todo:
                for statement in migration.postgres:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                    (migration.number, migration.name),
                )
        if todo:
            logger.info(
                "PostgreSQL database %s (schema %s): applied migrations %s",
                self.where, schema, [m.number for m in todo],
            )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @property
    def state_dir(self) -> Path:
        return state_home(self.url)

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    @asynccontextmanager
    async def _connection(self, doing: str) -> AsyncIterator[Conn]:
        if self._pool is None:
            raise RuntimeError(f"PostgresStore({self.where}) is not open; await open() first")
        with self._unavailable(doing):
            async with self._pool.connection() as conn:
                yield conn

    async def _execute(self, conn: Conn, doing: str, query: str | sql.Composed,
                      params: tuple[Any, ...] | None = None, *, lock_wait: bool = False
                      ) -> Cursor:
        """Run one statement, giving up after ``query_timeout`` (plus ``lock_timeout``
        for a statement that may wait for the catalog lock).

        A server that stopped answering — paused, or behind a network that
        drops packets rather than refusing them — would otherwise hold the
        caller forever, and a write must fail with 503, not hang. On the
        timeout psycopg cancels the query and, if the server does not answer
        that either, closes the connection (up to ten more seconds); the pool
        then replaces it.
        """
        limit = self.query_timeout + (self.lock_timeout if lock_wait else 0.0)
        with self._unavailable(doing):
            try:
                async with asyncio.timeout(limit):
                    return await conn.execute(query, params)
            except TimeoutError as exc:
                raise StoreUnavailableError(
                    f"PostgreSQL database {self.where}: could not {doing} (no answer within "
                    f"{limit:g} s); check that the server is not overloaded or paused and "
                    "that the network to it is up"
                ) from exc

    async def _query(self, doing: str, query: str, params: tuple[Any, ...] | None = None
                     ) -> list[tuple[Any, ...]]:
        """One statement on a pooled connection; its rows, if it returns any."""
        async with self._connection(doing) as conn:
            cur = await self._execute(conn, doing, query, params)
            return await cur.fetchall() if cur.description is not None else []

    async def models(self) -> list[StoredModel]:
        return [_model(row) for row in await self._query("read the stored models", _SELECT_MODELS)]

    @asynccontextmanager
    async def change(self) -> AsyncIterator[CatalogChange]:
        # BEGIN and COMMIT are spelled out (the pool's connections are in
        # autocommit) so that they, too, run under the statement timeout; each
        # shares its round trip with its neighbour.
        async with self._change_lock, self._connection("apply a catalog change") as conn:
            await self._execute(conn, "begin a catalog change", self._begin)
            change = _PostgresChange(self, conn)
            try:
                await self._execute(
                    conn, "take the catalog lock",
                    "SELECT version FROM catalog_version WHERE id = 1 FOR UPDATE",
                    lock_wait=True,
                )
                yield change
                change.ended = True
                await self._execute(
                    conn, "commit a catalog change",
                    "UPDATE catalog_version SET version = version + 1 WHERE id = 1; COMMIT",
                )
            except BaseException:
                change.ended = True
                await self._rollback(conn)
                raise

    async def _rollback(self, conn: Conn) -> None:
        # Best effort: a connection that broke has lost its transaction with
        # it (the server rolls back), and the pool discards it on return. The
        # error that got us here is the one to raise, not this one.
        if conn.closed or conn.broken:
            return
        try:
            async with asyncio.timeout(self.query_timeout):
                await conn.execute("ROLLBACK")
        except (psycopg.Error, TimeoutError):
            logger.warning("PostgreSQL database %s: rollback failed", self.where, exc_info=True)

    async def catalog_version(self) -> int:
        [(version,)] = await self._query(
            "read the catalog version", "SELECT version FROM catalog_version WHERE id = 1"
        )
        return int(version)

    async def try_lease(self, name: str, holder: str, ttl: float) -> bool:
        # ON CONFLICT re-checks the WHERE against the newest row version, so two
        # instances racing for a free or expired lease cannot both win.
        rows = await self._query(
            f"take lease {name!r}",
            "INSERT INTO leases (name, holder, expires_at)"
            " VALUES (%s, %s, now() + %s * interval '1 second')"
            " ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder,"
            " expires_at = EXCLUDED.expires_at"
            " WHERE leases.holder = EXCLUDED.holder OR leases.expires_at <= now()"
            " RETURNING holder",
            (name, holder, float(ttl)),
        )
        return bool(rows)

    async def release_lease(self, name: str, holder: str) -> None:
        await self._query(
            f"release lease {name!r}",
            "DELETE FROM leases WHERE name = %s AND holder = %s",
            (name, holder),
        )

    async def lease_holder(self, name: str) -> str | None:
        rows = await self._query(
            f"read lease {name!r}",
            "SELECT holder FROM leases WHERE name = %s AND expires_at > now()",
            (name,),
        )
        return str(rows[0][0]) if rows else None

    async def mark_activity(self, model: str) -> None:
        await self._query(
            f"record activity of {model!r}",
            "INSERT INTO activity (model, at) VALUES (%s, now())"
            " ON CONFLICT (model) DO UPDATE SET at = EXCLUDED.at",
            (model,),
        )

    async def last_activity(self, model: str) -> float | None:
        rows = await self._query(
            f"read activity of {model!r}",
            "SELECT EXTRACT(EPOCH FROM now() - at)::float8 FROM activity WHERE model = %s",
            (model,),
        )
        return max(0.0, float(rows[0][0])) if rows else None

    # --- stored Responses ---------------------------------------------------------

    async def put_response(self, response: StoredResponse, ttl: float) -> None:
        await self._query(
            f"store response {response.id!r}",
            "INSERT INTO responses (id, owner, body, context, expires_at)"
            " VALUES (%s, %s, %s, %s, now() + %s * interval '1 second')"
            " ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, body = EXCLUDED.body,"
            " context = EXCLUDED.context, expires_at = EXCLUDED.expires_at",
            (response.id, response.owner, response.body, response.context, float(ttl)),
        )

    async def get_response(self, id: str, owner: OwnerId) -> StoredResponse | None:
        rows = await self._query(
            f"read response {id!r}",
            "SELECT body, context FROM responses"
            " WHERE id = %s AND owner = %s AND expires_at > now()", (id, owner))
        if not rows:
            return None
        return StoredResponse(id=id, owner=owner, body=bytes(rows[0][0]),
                              context=bytes(rows[0][1]))

    async def delete_response(self, id: str, owner: OwnerId) -> bool:
        rows = await self._query(
            f"delete response {id!r}",
            "DELETE FROM responses WHERE id = %s AND owner = %s AND expires_at > now()"
            " RETURNING id", (id, owner))
        return bool(rows)

    async def purge_responses(self) -> int:
        rows = await self._query("purge expired responses",
                                 "DELETE FROM responses WHERE expires_at <= now() RETURNING id")
        return len(rows)

    # --- files ----------------------------------------------------------------------

    async def create_file(self, file: FileRecord) -> None:
        await self._query(
            f"record file {file.id!r}",
            "INSERT INTO files (id, owner, purpose, filename, bytes, created_at, status,"
            " expires_at) VALUES (%s, %s, %s, %s, %s, %s, 'uploading', %s)",
            (file.id, file.owner, file.purpose, file.filename, file.bytes, file.created_at,
             file.expires_at))

    async def put_file_chunk(self, file_id: str, seq: int, data: bytes) -> None:
        await self._query(
            f"write chunk {seq} of file {file_id!r}",
            "INSERT INTO file_chunks (file_id, seq, data) VALUES (%s, %s, %s)",
            (file_id, seq, data))

    async def finish_file(self, file_id: str, size: int, expires_at: int | None = None) -> None:
        await self._query(
            f"complete file {file_id!r}",
            "UPDATE files SET status = 'processed', bytes = %s,"
            " expires_at = COALESCE(%s, expires_at) WHERE id = %s",
            (size, expires_at, file_id))

    async def get_file(self, id: str, owner: OwnerId | None) -> FileRecord | None:
        rows = await self._query(
            f"read file {id!r}",
            _GET_FILE, (id, owner, owner))
        return _file(rows[0]) if rows else None

    async def list_files(self, owner: OwnerId, *, purpose: str | None, after: str | None,
                         limit: int, ascending: bool) -> list[FileRecord]:
        rows = await self._query(
            f"list the files of {owner!r}", _LIST_FILES[ascending],
            (owner, purpose, purpose, after, after, limit))
        return [_file(r) for r in rows]

    async def read_file_chunks(self, file_id: str, first: int, count: int) -> list[bytes]:
        rows = await self._query(
            f"read file {file_id!r}",
            "SELECT data FROM file_chunks WHERE file_id = %s AND seq >= %s"
            " ORDER BY seq LIMIT %s", (file_id, first, count))
        return [bytes(r[0]) for r in rows]

    async def delete_file(self, id: str, owner: OwnerId | None) -> bool:
        # One statement, so one transaction: the chunks go with the file or not at all.
        rows = await self._query(
            f"delete file {id!r}",
            "WITH f AS (DELETE FROM files WHERE id = %s AND (%s::text IS NULL OR owner = %s)"
            " RETURNING id), c AS (DELETE FROM file_chunks WHERE file_id IN (SELECT id FROM f))"
            " SELECT count(*) FROM f", (id, owner, owner))
        return bool(rows and rows[0][0])

    async def purge_uploads(self, before: int) -> int:
        rows = await self._query(
            "purge abandoned uploads",
            "WITH f AS (DELETE FROM files WHERE status = 'uploading' AND created_at < %s"
            " RETURNING id), c AS (DELETE FROM file_chunks WHERE file_id IN (SELECT id FROM f))"
            " SELECT count(*) FROM f", (before,))
        return int(rows[0][0]) if rows else 0

    async def purge_files(self) -> int:
        rows = await self._query(
            "purge expired files",
            "WITH f AS (DELETE FROM files WHERE expires_at <= EXTRACT(EPOCH FROM now())"
            " RETURNING id), c AS (DELETE FROM file_chunks WHERE file_id IN (SELECT id FROM f))"
            " SELECT count(*) FROM f")
        return int(rows[0][0]) if rows else 0

    # --- batches --------------------------------------------------------------------

    async def create_batch(self, batch: BatchRow) -> None:
        await self._query(
            f"record batch {batch.id!r}",
            "INSERT INTO batches (id, owner, status, created_at, record)"
            " VALUES (%s, %s, %s, %s, %s)",
            (batch.id, batch.owner, batch.status, batch.created_at, batch.record))

    async def get_batch(self, id: str, owner: OwnerId | None) -> BatchRow | None:
        rows = await self._query(
            f"read batch {id!r}",
            "SELECT id, owner, status, created_at, record FROM batches"
            " WHERE id = %s AND (%s::text IS NULL OR owner = %s)", (id, owner, owner))
        return _batch(rows[0]) if rows else None

    async def list_batches(self, owner: OwnerId, after: str | None, limit: int) -> list[BatchRow]:
        if after is None:
            rows = await self._query(
                "list batches",
                "SELECT id, owner, status, created_at, record FROM batches WHERE owner = %s"
                " ORDER BY created_at DESC, id DESC LIMIT %s", (owner, limit))
        else:
            rows = await self._query(
                "list batches",
                "SELECT id, owner, status, created_at, record FROM batches b"
                " WHERE owner = %s AND EXISTS ("
                " SELECT 1 FROM batches a WHERE a.id = %s AND a.owner = b.owner"
                " AND (b.created_at, b.id) < (a.created_at, a.id))"
                " ORDER BY created_at DESC, id DESC LIMIT %s", (owner, after, limit))
        return [_batch(r) for r in rows]

    async def update_batch(self, batch: BatchRow, expect: str) -> bool:
        rows = await self._query(
            f"update batch {batch.id!r}",
            "UPDATE batches SET status = %s, record = %s WHERE id = %s AND status = %s"
            " RETURNING id", (batch.status, batch.record, batch.id, expect))
        return bool(rows)

    async def active_batches(self) -> list[BatchRow]:
        rows = await self._query(
            "list active batches",
            "SELECT id, owner, status, created_at, record FROM batches"
            " WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling')"
            " ORDER BY created_at, id")
        return [_batch(r) for r in rows]

    async def put_batch_results(self, batch_id: str, results: list[BatchResult]) -> None:
        if not results:
            return
        await self._query(
            f"record results of batch {batch_id!r}",
            "INSERT INTO batch_results (batch_id, line, ok, data)"
            " SELECT %s, line, ok, data FROM unnest(%s::integer[], %s::boolean[], %s::bytea[])"
            " AS r(line, ok, data) ON CONFLICT (batch_id, line) DO NOTHING",
            (batch_id, [r.line for r in results], [r.ok for r in results],
             [r.data for r in results]))

    async def batch_results(self, batch_id: str, after: int, limit: int) -> list[BatchResult]:
        rows = await self._query(
            f"read results of batch {batch_id!r}",
            "SELECT line, ok, data FROM batch_results WHERE batch_id = %s AND line > %s"
            " ORDER BY line LIMIT %s", (batch_id, after, limit))
        return [BatchResult(line=int(r[0]), ok=bool(r[1]), data=bytes(r[2])) for r in rows]

    async def batch_result_lines(self, batch_id: str, after: int) -> list[int]:
        rows = await self._query(
            f"read results of batch {batch_id!r}",
            "SELECT line FROM batch_results WHERE batch_id = %s AND line > %s ORDER BY line",
            (batch_id, after))
        return [int(r[0]) for r in rows]

    async def count_batch_results(self, batch_id: str) -> tuple[int, int]:
        rows = await self._query(
            f"count results of batch {batch_id!r}",
            "SELECT count(*) FILTER (WHERE ok), count(*) FILTER (WHERE NOT ok)"
            " FROM batch_results WHERE batch_id = %s", (batch_id,))
        return int(rows[0][0]), int(rows[0][1])

    async def delete_batch_results(self, batch_id: str) -> None:
        await self._query(f"delete results of batch {batch_id!r}",
                          "DELETE FROM batch_results WHERE batch_id = %s", (batch_id,))

    async def put_report(self, kind: str, key: str, payload: bytes) -> None:
        await self._query(
            f"write the {kind} report of {key!r}",
            "WITH dropped AS (DELETE FROM reports WHERE kind = %s"
            " AND at < now() - %s * interval '1 second')"
            " INSERT INTO reports (kind, key, payload, at) VALUES (%s, %s, %s, now())"
            " ON CONFLICT (kind, key) DO UPDATE SET payload = EXCLUDED.payload, at = EXCLUDED.at",
            (kind, REPORT_RETENTION, kind, key, payload),
        )

    async def reports(self, kind: str, within: float) -> list[Report]:
        rows = await self._query(
            f"read the {kind} reports",
            "SELECT key, payload, EXTRACT(EPOCH FROM now() - at)::float8 FROM reports"
            " WHERE kind = %s AND at > now() - %s * interval '1 second' ORDER BY key",
            (kind, float(within)),
        )
        return [Report(key=str(k), payload=bytes(p), age=max(0.0, float(a))) for k, p, a in rows]

    # --- teams and keys created at run time -------------------------------------------
    # Each change is one statement whose CTEs also bump tenants_version when a row
    # changed, so a change and its version are committed together.

    async def tenants_version(self) -> int:
        [(version,)] = await self._query(
            "read the tenants version", "SELECT version FROM tenants_version WHERE id = 1")
        return int(version)

    async def tenants(self) -> tuple[list[StoredTeam], list[StoredKey]]:
        teams = await self._query(
            "read the teams",
            "SELECT name, settings, created_by, created_at FROM teams ORDER BY name")
        keys = await self._query(
            "read the keys",
            "SELECT name, team, sha256, settings, created_by, created_at, expires_at,"
            " previous_sha256, previous_until, owner FROM api_keys ORDER BY name")
        return ([StoredTeam(name=r[0], settings=bytes(r[1]), created_by=r[2],
                            created_at=float(r[3])) for r in teams],
                [StoredKey(name=r[0], team=r[1], sha256=r[2], settings=bytes(r[3]),
                           created_by=r[4], created_at=float(r[5]), expires_at=r[6],
                           previous_sha256=r[7], previous_until=r[8], owner=r[9])
                 for r in keys])

    async def _tenant_change(self, doing: str, changed_cte: str,
                             params: tuple[Any, ...]) -> bool:
        rows = await self._query(
            doing,
            f"WITH changed AS ({changed_cte}),"  # noqa: S608 - a constant of this module
            " bumped AS (UPDATE tenants_version SET version = version + 1"
            " WHERE id = 1 AND EXISTS (SELECT 1 FROM changed) RETURNING 1)"
            " SELECT count(*) FROM changed", params)
        return bool(rows[0][0])

    async def put_team(self, team: StoredTeam, *, create: bool) -> bool:
        if create:
            return await self._tenant_change(
                f"create team {team.name!r}",
                "INSERT INTO teams (name, settings, created_by, created_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING 1",
                (team.name, team.settings, team.created_by, team.created_at))
        return await self._tenant_change(
            f"update team {team.name!r}",
            "UPDATE teams SET settings = %s WHERE name = %s RETURNING 1",
            (team.settings, team.name))

    async def delete_team(self, name: str) -> bool:
        return await self._tenant_change(
            f"delete team {name!r}", "DELETE FROM teams WHERE name = %s RETURNING 1", (name,))

    async def put_key(self, key: StoredKey) -> bool:
        return await self._tenant_change(
            f"create key {key.name!r}",
            "INSERT INTO api_keys (name, team, sha256, settings, created_by, created_at,"
            " expires_at, previous_sha256, previous_until, owner)"
            " SELECT %s, name, %s, %s, %s, %s, %s, %s, %s, %s FROM teams WHERE name = %s"
            " ON CONFLICT DO NOTHING RETURNING 1",
            (key.name, key.sha256, key.settings, key.created_by, key.created_at,
             key.expires_at, key.previous_sha256, key.previous_until, key.owner, key.team))

    async def update_key(self, key: StoredKey) -> bool:
        return await self._tenant_change(
            f"update key {key.name!r}",
            "UPDATE api_keys SET sha256 = %s, settings = %s, expires_at = %s,"
            " previous_sha256 = %s, previous_until = %s, owner = %s WHERE name = %s RETURNING 1",
            (key.sha256, key.settings, key.expires_at, key.previous_sha256, key.previous_until,
             key.owner, key.name))

    async def delete_key(self, name: str) -> bool:
        return await self._tenant_change(
            f"delete key {name!r}", "DELETE FROM api_keys WHERE name = %s RETURNING 1", (name,))

    async def claim_legacy_owners(self, ids: dict[str, str]) -> int:
        names = list(ids)
        rows = await self._query(
            f"give the objects of {len(names)} key name(s) to their key ids", _CLAIM_OWNERS,
            (names, [ids[n] for n in names]))
        return int(rows[0][0])

    # --- the usage ledger ---------------------------------------------------------------

    async def record_usage(self, records: list[UsageRecord]) -> int:
        # One JSON parameter (each record an array, in the columns' order): encoding it
        # costs the event loop a fraction of adapting thirteen Python lists for unnest.
        if not records:
            return 0
        rows = await self._query(
            f"record {len(records)} usage records", _RECORD_USAGE,
            (_encode_records(records).decode(),))
        return int(rows[0][0])

    async def usage(self, by: str, since: float, until: float, day: bool) -> list[UsageRow]:
        query, params = usage_params(by, since, until, day)
        rows = await self._query(f"read usage by {by}", query.replace("?", "%s"), params)
        return [UsageRow(bucket=int(r[0]), group=str(r[1]), requests=int(r[2]),
                         prompt_tokens=int(r[3]), cached_tokens=int(r[4]),
                         completion_tokens=int(r[5])) for r in rows]

    async def token_totals(self, since: float) -> list[TokenTotal]:
        rows = await self._query("read token totals", _KEY_USAGE_SINCE, token_totals_params(since))
        return [TokenTotal(team=r[0], key=r[1], tokens=int(r[2])) for r in rows]

    async def recent_tokens(self, since: float) -> list[TokenTotal]:
        rows = await self._query(
            "read recent tokens",
            "SELECT team, key, SUM(prompt_tokens + completion_tokens)::bigint"
            " FROM usage WHERE at >= %s GROUP BY team, key", (since,))
        return [TokenTotal(team=r[0], key=r[1], tokens=int(r[2])) for r in rows]

    async def status_counts(self, since: float, least: int = 0) -> list[StatusCount]:
        rows = await self._query("read requests by status",
                                 STATUS_COUNTS.replace("?", "%s"), (since, least))
        return [status_count(r) for r in rows]

    async def requests_since(self, since: float) -> int:
        rows = await self._query("count requests", REQUESTS_SINCE.replace("?", "%s"),
                                 (since,))
        return int(rows[0][0])

    async def lease_slice(self, ask: SliceAsk) -> SliceGrant:
        doing = f"lease a slice of budget {ask.scope!r}"
        used_query, used_params = slice_used_params(ask)
        async with self._connection(doing) as conn, conn.transaction():
            # Every holder of the budget takes this lock first, so the sum of the live
            # slices cannot change between reading it and adding this one.
            await self._execute(conn, doing, "SELECT pg_advisory_xact_lock(hashtext(%s))",
                                (f"llmgw-budget:{ask.scope}",))
            await self._execute(conn, doing, "DELETE FROM budget_slices WHERE scope = %s"
                                " AND expires_at <= now()", (ask.scope,))
            used = await self._one(conn, doing, used_query.replace("?", "%s"), used_params)
            others = await self._one(conn, doing, _SLICE_OTHERS, (ask.scope, ask.holder))
            granted = slice_grant(ask, used, others)
            await self._execute(conn, doing, _PUT_SLICE, (
                ask.scope, ask.holder, granted, ask.settled, float(ask.ttl)))
        return SliceGrant(granted=granted, used=used, others=others)

    async def _one(self, conn: Conn, doing: str, query: str, params: tuple[Any, ...]) -> int:
        row = await (await self._execute(conn, doing, query, params)).fetchone()
        return int(row[0]) if row is not None else 0

    async def release_slice(self, scope: str, holder: str) -> None:
        await self._query(f"give back a slice of budget {scope!r}",
                          "DELETE FROM budget_slices WHERE scope = %s AND holder = %s",
                          (scope, holder))

    async def purge_usage(self, before: float) -> int:
        rows = await self._query(
            "purge old usage records",
            "WITH gone AS (DELETE FROM usage WHERE at < %s RETURNING 1)"
            " SELECT count(*) FROM gone", (before,))
        return int(rows[0][0])

    async def team_model_tokens(self, since: float, until: float) -> list[TeamModelTokens]:
        rows = await self._query(
            "read tokens by team and model",
            "SELECT hour, team, model, SUM(prompt_tokens + completion_tokens)::bigint"
            " FROM usage_hourly WHERE hour >= %s AND hour < %s GROUP BY hour, team, model"
            " ORDER BY hour, team, model", (since, until))
        return [TeamModelTokens(hour=int(r[0]), team=r[1], model=r[2], tokens=int(r[3]))
                for r in rows]

    async def put_holdings(self, holdings: list[StoredHolding], seen: float) -> None:
        await self._query(
            f"record {len(holdings)} holding(s) of the scheduler", _PUT_HOLDINGS,
            (seen, [h.id for h in holdings], [h.model for h in holdings],
             [h.gpu_class for h in holdings], [h.gpus for h in holdings],
             [h.cores for h in holdings], [h.started for h in holdings],
             [h.ended for h in holdings], seen))

    async def holdings(self, since: float, until: float) -> list[StoredHolding]:
        rows = await self._query("read holdings", _HOLDINGS_BETWEEN, (until, since))
        return [holding_row(r) for r in rows]

    async def put_request_logs(self, logs: list[RequestLog]) -> None:
        if not logs:
            return
        await self._query(
            f"keep {len(logs)} request logs",
            "INSERT INTO request_logs (id, at, expires_at, team, key, record, request, response)"
            " SELECT * FROM unnest(%s::text[], %s::float8[], %s::float8[], %s::text[],"
            " %s::text[], %s::bytea[], %s::bytea[], %s::bytea[]) ON CONFLICT (id) DO NOTHING",
            ([g.id for g in logs], [g.at for g in logs], [g.expires_at for g in logs],
             [g.team for g in logs], [g.key for g in logs], [g.record for g in logs],
             [g.request for g in logs], [g.response for g in logs]))

    async def request_logs(self, team: str, before: float, limit: int) -> list[RequestLog]:
        rows = await self._query(
            f"read request logs of {team!r}",
            "SELECT id, at, expires_at, team, key, record, request, response FROM request_logs"
            " WHERE team = %s AND at < %s AND expires_at > EXTRACT(EPOCH FROM now())"
            " ORDER BY at DESC LIMIT %s", (team, before, limit))
        return [RequestLog(id=r[0], at=float(r[1]), expires_at=float(r[2]), team=r[3],
                           key=r[4], record=bytes(r[5]),
                           request=None if r[6] is None else bytes(r[6]),
                           response=None if r[7] is None else bytes(r[7])) for r in rows]

    async def purge_request_logs(self, now: float) -> int:
        rows = await self._query(
            "purge expired request logs",
            "WITH gone AS (DELETE FROM request_logs WHERE expires_at <= %s RETURNING 1)"
            " SELECT count(*) FROM gone", (now,))
        return int(rows[0][0])


_encode_records = msgspec.json.Encoder().encode

_SLICE_OTHERS = SLICE_OTHERS.replace("?", "%s")
_PUT_SLICE = (
    "INSERT INTO budget_slices (scope, holder, granted, settled, expires_at)"
    " VALUES (%s, %s, %s, %s, now() + %s * interval '1 second')"
    " ON CONFLICT (scope, holder) DO UPDATE SET granted = excluded.granted,"
    " settled = excluded.settled, expires_at = excluded.expires_at"
)
_KEY_USAGE_SINCE = KEY_USAGE_SINCE.replace("?", "%s")
# One statement: the holdings as reported, and those open but unreported closed. The
# update skips the rows the insert wrote (one statement may not change a row twice).
_PUT_HOLDINGS = (
    "WITH put AS (INSERT INTO holdings (id, model, gpu_class, gpus, cores, started, ended, seen)"
    " SELECT i, m, g, n, c, s, e, %s FROM unnest(%s::text[], %s::text[], %s::text[],"
    " %s::float8[], %s::float8[], %s::float8[], %s::float8[]) AS u(i, m, g, n, c, s, e)"
    " ON CONFLICT (id) DO UPDATE SET gpus = excluded.gpus, cores = excluded.cores,"
    " started = excluded.started, ended = excluded.ended, seen = excluded.seen RETURNING id)"
    " UPDATE holdings SET ended = seen WHERE ended IS NULL AND seen < %s"
    " AND id NOT IN (SELECT id FROM put)"
)
_HOLDINGS_BETWEEN = HOLDINGS_BETWEEN.replace("?", "%s")
# One statement, so one transaction: every ``name:`` owner becomes its key's id, or
# ``revoked:`` when no key of that name is in force. (Table names are constants.)
_CLAIM_TABLE = (
    "{t} AS (UPDATE"  # noqa: S608
    " {t} AS o SET owner = COALESCE("
    " (SELECT m.id FROM m WHERE '" + LEGACY_OWNER + "' || m.name = o.owner),"
    " '" + REVOKED_OWNER + "' || substr(o.owner, " + str(len(LEGACY_OWNER) + 1) + "))"
    " WHERE o.owner LIKE '" + LEGACY_OWNER + "%%'"
    " RETURNING o.owner NOT LIKE '" + REVOKED_OWNER + "%%' AS claimed)")
_CLAIM_OWNERS = (
    "WITH m AS"  # noqa: S608
    " (SELECT * FROM unnest(%s::text[], %s::text[]) AS m (name, id)), "
    + ", ".join(_CLAIM_TABLE.format(t=t) for t in OWNED_TABLES)
    + " SELECT " + " + ".join(f"(SELECT count(*) FROM {t} WHERE claimed)"  # noqa: S608
                               for t in OWNED_TABLES))
# New records only (ON CONFLICT skips an id already stored) feed the roll-ups,
# in the same statement, so a retried batch adds nothing twice. Roll-up rows are
# upserted in key order, so two instances' batches lock them in the same order.
# (ROLL_UP_BY, joined in, is a constant.)
_RECORD_USAGE = (
    "WITH added AS"  # noqa: S608
    " (INSERT INTO usage (id, at, key, team, model, replica, gpu_class,"
    " prompt_tokens, cached_tokens, completion_tokens, status, latency, ttft, key_id)"
    " SELECT r->>0, (r->>1)::float8, r->>2, r->>3, r->>4, r->>5, r->>6, (r->>7)::int8,"
    " (r->>8)::int8, (r->>9)::int8, (r->>10)::int2, (r->>11)::float8, (r->>12)::float8,"
    " r->>13"
    " FROM json_array_elements(%s::json) AS r ON CONFLICT (id) DO NOTHING"
    " RETURNING at, team, key, model, prompt_tokens, cached_tokens, completion_tokens),"
    " hourly AS (SELECT (floor(at / 3600) * 3600)::bigint AS hour, team, key, model,"
    " count(*) AS requests, SUM(prompt_tokens)::bigint AS prompt_tokens,"
    " SUM(cached_tokens)::bigint AS cached_tokens,"
    " SUM(completion_tokens)::bigint AS completion_tokens"
    " FROM added GROUP BY 1, 2, 3, 4),"
    " rolled AS (INSERT INTO usage_hourly (hour, team, key, model, requests, prompt_tokens,"
    " cached_tokens, completion_tokens)"
    " SELECT * FROM hourly ORDER BY hour, team, key, model"
    " ON CONFLICT (hour, team, key, model) DO UPDATE SET"
    " requests = usage_hourly.requests + EXCLUDED.requests,"
    " prompt_tokens = usage_hourly.prompt_tokens + EXCLUDED.prompt_tokens,"
    " cached_tokens = usage_hourly.cached_tokens + EXCLUDED.cached_tokens,"
    " completion_tokens = usage_hourly.completion_tokens + EXCLUDED.completion_tokens),"
    f" by_dim AS ({ROLL_UP_BY % 'hourly'})"
    " SELECT count(*) FROM added"
)
