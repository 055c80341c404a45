"""Fixtures that run every store test against both adapters, for real.

SQLite gets a fresh file under ``tmp_path``. Postgres (when LLMGW_TEST_POSTGRES
is set) gets a fresh schema per test, created here and dropped afterwards, and
the store reaches it through libpq's ``options=-csearch_path=…`` — the same way
an operator would put llmgw in its own schema. The session time zone is set to
one far from UTC (+12:45) so a timestamp that skipped its conversion to UTC
shows up as a failure rather than passing on a UTC server.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

from llmgw.store.base import Store
from llmgw.store.postgres import PostgresStore
from llmgw.store.sqlite import SqliteStore, sqlite_path
from llmgw.testing.tcpproxy import TcpProxy

SESSION_TIME_ZONE = "Pacific/Chatham"

AnyStore = SqliteStore | PostgresStore


def with_params(url: str, **params: str) -> str:
    """``url`` with query parameters added or replaced."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def make_adapter(url: str, **kwargs: Any) -> AnyStore:
    if url.startswith("sqlite:"):
        return SqliteStore(url, **kwargs)
    return PostgresStore(url, **kwargs)


@dataclass
class Database:
    """Direct access to the database under test, past the store, for checking it."""

    kind: str
    url: str

    async def fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            def run() -> list[tuple[Any, ...]]:
                db = sqlite3.connect(sqlite_path(self.url), timeout=30)
                try:
                    return db.execute(sql, params).fetchall()
                finally:
                    db.close()

            return await asyncio.to_thread(run)
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            return await (await conn.execute(sql.replace("?", "%s"), params)).fetchall()

    async def execute(self, sql: str) -> None:
        if self.kind == "sqlite":
            def run() -> None:
                db = sqlite3.connect(sqlite_path(self.url), timeout=30)
                try:
                    db.execute(sql)
                    db.commit()
                finally:
                    db.close()

            await asyncio.to_thread(run)
            return
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(sql)

    async def terminate(self, application_name: str) -> None:
        """Kill every Postgres session of ``application_name`` and wait until they are gone."""
        assert self.kind == "postgres"
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (application_name,),
            )
            deadline = time.monotonic() + 30
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (application_name,),
                )
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    return
                assert time.monotonic() < deadline, "terminated sessions did not go away in 30 s"
                await asyncio.sleep(0.05)


class FreezingProxy(TcpProxy):
    """A loopback TCP proxy to Postgres that can stop passing bytes without closing anything.

    That is what a paused server or a network dropping packets looks like to
    a client: the connection stays open and no answer comes. While frozen it
    refuses new connections, so psycopg's cancel request fails fast too.
    """

    def freeze(self, *, refuse_new: bool = True) -> None:
        super().freeze(refuse_new=refuse_new)

    def thaw(self) -> None:
        self.resume()


@asynccontextmanager
async def fresh_schema(base: str) -> AsyncIterator[str]:
    """A URL for a new, empty Postgres schema on ``base``'s database, dropped afterwards."""
    schema = f"llmgw_test_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(base, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_params(base, options=f"-csearch_path={schema} -cTimeZone={SESSION_TIME_ZONE}")
    finally:
        async with await psycopg.AsyncConnection.connect(base, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """The database under test: each adapter in turn."""
    if request.param == "sqlite":
        yield Database("sqlite", f"sqlite:///{tmp_path}/state/llmgw.db")
        return
    async with fresh_schema(request.getfixturevalue("postgres_url")) as url:
        yield Database("postgres", url)


@pytest.fixture
async def postgres_database(postgres_url: str) -> AsyncIterator[Database]:
    """A Postgres database under test, for behaviour only Postgres has."""
    async with fresh_schema(postgres_url) as url:
        yield Database("postgres", url)


StoreFactory = Callable[..., Awaitable[AnyStore]]


@pytest.fixture
async def make_store(database: Database) -> AsyncIterator[StoreFactory]:
    """Open further stores on the test's database (as other llmgw instances would)."""
    opened: list[Store] = []

    async def make(url: str | None = None, *, open: bool = True, **kwargs: Any) -> AnyStore:
        store = make_adapter(url or database.url, **kwargs)
        opened.append(store)
        if open:
            await store.open()
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory) -> AnyStore:
    return await make_store()
