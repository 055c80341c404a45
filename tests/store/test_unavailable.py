"""A database that cannot be reached or used raises StoreUnavailableError, and only then."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from llmgw.errors import StoreUnavailableError
from llmgw.redact import redact_url
from llmgw.store.postgres import PostgresStore
from llmgw.store.sqlite import SqliteStore

from .conftest import Database, FreezingProxy, StoreFactory, with_params
from .test_store import stored


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def unopenable_sqlite(tmp_path: Path, case: str) -> Path:
    if case == "parent is a file":
        (tmp_path / "plain-file").write_text("not a directory\n")
        return tmp_path / "plain-file" / "llmgw.db"
    if case == "path is a directory":
        (tmp_path / "llmgw.db").mkdir()
        return tmp_path / "llmgw.db"
    (tmp_path / "llmgw.db").write_bytes(b"this is a spreadsheet, not a database" * 200)
    return tmp_path / "llmgw.db"


@pytest.mark.parametrize("case", ["parent is a file", "path is a directory", "not a database"])
async def test_sqlite_at_an_unusable_path_is_unavailable(tmp_path: Path, case: str) -> None:
    """open() on a path SQLite cannot use raises StoreUnavailableError naming the file."""
    path = unopenable_sqlite(tmp_path, case)
    store = SqliteStore(f"sqlite:///{path}")
    with pytest.raises(StoreUnavailableError) as caught:
        await store.open()
    assert str(path) in str(caught.value)
    assert "check" in str(caught.value) or "point database:" in str(caught.value)
    await store.close()


async def test_postgres_on_a_closed_port_is_unavailable_without_leaking_the_password() -> None:
    """open() on a closed port raises at once, naming the server but not the password."""
    port = closed_port()
    store = PostgresStore(f"postgresql://llmgw:s3cr3t-pw@127.0.0.1:{port}/llmgw")
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        await store.open()
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "s3cr3t-pw" not in message
    assert "check that the server is running" in message
    assert time.monotonic() - started < 20
    await store.close()


def test_redact_hides_passwords_in_userinfo_and_query() -> None:
    """redact_url() masks a password given either way and keeps the rest of the URL readable."""
    url = "postgresql://llmgw:pw1@db.internal:5432/llmgw?password=pw2&sslmode=require"
    shown = redact_url(url)
    assert "pw1" not in shown
    assert "pw2" not in shown
    assert shown.startswith("postgresql://llmgw:***@db.internal:5432/llmgw?")
    assert "sslmode=require" in shown


async def test_store_used_before_open_is_a_programming_error(tmp_path: Path) -> None:
    """Calling a store that was never opened raises RuntimeError, not an outage."""
    with pytest.raises(RuntimeError, match="not open"):
        await SqliteStore(f"sqlite:///{tmp_path}/llmgw.db").models()
    with pytest.raises(RuntimeError, match="not open"):
        await PostgresStore("postgresql://postgres@127.0.0.1:1/test").models()


async def test_missing_table_is_raised_as_a_bug_not_an_outage(
        store: SqliteStore | PostgresStore, database: Database) -> None:
    """A schema that lost a table raises the driver's error, not StoreUnavailableError."""
    await database.execute("DROP TABLE activity")
    with pytest.raises((sqlite3.OperationalError, psycopg.errors.UndefinedTable)):
        await store.last_activity("llama-3-8b")


async def test_catalog_lock_held_past_the_timeout_is_unavailable(make_store: StoreFactory) -> None:
    """A change that cannot get the catalog lock within lock_timeout raises and writes nothing."""
    holder = await make_store()
    impatient = await make_store(lock_timeout=0.5)
    async with holder.change() as change:
        await change.put_model(stored("held"))
        with pytest.raises(StoreUnavailableError, match="held the catalog lock|busy timeout"):
            async with impatient.change() as other:
                await other.put_model(stored("never-written"))
    assert [m.name for m in await impatient.models()] == ["held"]
    async with impatient.change() as other:
        await other.put_model(stored("after"))
    assert await holder.catalog_version() == 2


async def wait_until_usable(store: PostgresStore) -> int:
    deadline = time.monotonic() + 30
    while True:
        try:
            return await store.catalog_version()
        except StoreUnavailableError:
            assert time.monotonic() < deadline, "the store did not reconnect within 30 s"
            await asyncio.sleep(0.05)


@pytest.mark.postgres
async def test_killed_postgres_connection_is_unavailable_then_recovers(
        postgres_database: Database) -> None:
    """A pooled connection the server killed raises StoreUnavailableError, then recovers."""
    app = f"llmgw-test-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(with_params(postgres_database.url, application_name=app))
    await store.open()
    try:
        assert await store.catalog_version() == 0
        await postgres_database.terminate(app)
        with pytest.raises(StoreUnavailableError) as caught:
            await store.catalog_version()
        assert "read the catalog version" in str(caught.value)
        assert await wait_until_usable(store) == 0
        await store.mark_activity("llama-3-8b")
    finally:
        await store.close()


@pytest.mark.postgres
async def test_connection_killed_inside_a_change_writes_nothing(
        postgres_database: Database) -> None:
    """A change whose connection dies mid-block raises StoreUnavailableError and commits nothing."""
    app = f"llmgw-test-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(with_params(postgres_database.url, application_name=app))
    await store.open()

    async def change_cut_short() -> None:
        async with store.change() as change:
            await change.put_model(stored("half-done"))
            await postgres_database.terminate(app)
            await change.put_model(stored("after-the-kill"))

    try:
        with pytest.raises(StoreUnavailableError):
            await change_cut_short()
        assert await wait_until_usable(store) == 0
        assert await store.models() == []
        async with store.change() as change:
            await change.put_model(stored("retried"))
        assert await store.catalog_version() == 1
    finally:
        await store.close()


@pytest.mark.postgres
async def test_server_that_stops_answering_mid_change_is_unavailable_not_a_hang(
        postgres_database: Database) -> None:
    """A statement left unanswered raises StoreUnavailableError after query_timeout; no write."""
    parts = urlsplit(postgres_database.url)
    proxy = FreezingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    proxied = parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}")
    store = PostgresStore(urlunsplit(proxied), query_timeout=1.0)
    await store.open()

    async def change_that_hangs() -> None:
        async with store.change() as change:
            await change.put_model(stored("before-the-freeze"))
            proxy.freeze()
            await change.put_model(stored("unanswered"))

    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="no answer within 1 s"):
            await asyncio.wait_for(change_that_hangs(), 60)
        # 1 s of waiting, then psycopg's own (bounded) attempt to cancel the query.
        assert time.monotonic() - started < 30
        proxy.thaw()
        assert await wait_until_usable(store) == 0
        assert await store.models() == []
    finally:
        await store.close()
        await proxy.close()


async def test_readiness_says_the_store_is_silent_long_before_the_query_timeout(
        postgres_database: Database) -> None:
    """Packets dropped: the catalog poll goes unanswered, and within a few seconds (not
    the minute its query may wait) the store is reported unreachable; then it recovers."""
    from llmgw.modelsvc import ModelService

    parts = urlsplit(postgres_database.url)
    proxy = FreezingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    proxied = parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}")
    store = PostgresStore(urlunsplit(proxied), query_timeout=60.0)
    await store.open()
    svc = ModelService([], {}, store)
    await svc.load()
    poll: asyncio.Task[bool] | None = None
    try:
        assert svc.store_problem() is None
        proxy.freeze()
        poll = asyncio.create_task(svc.refresh())
        deadline = time.monotonic() + 30
        while (problem := svc.store_problem()) is None:
            assert time.monotonic() < deadline, "the silence was never reported"
            await asyncio.sleep(0.05)
        assert "has not answered" in problem
        proxy.thaw()
        await asyncio.wait_for(poll, 60)
        assert svc.store_problem() is None
    finally:
        proxy.thaw()
        if poll is not None and not poll.done():
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
        await store.close()
        await proxy.close()


def test_postgres_connections_have_keepalives_and_a_tcp_user_timeout() -> None:
    """Defaults the URL may override: the kernel notices a silent peer."""
    store = PostgresStore("postgresql://u@127.0.0.1:5432/llmgw", query_timeout=7.0)
    assert store._kwargs["keepalives"] == 1
    assert store._kwargs["tcp_user_timeout"] == 7000
    assert PostgresStore("postgresql://u@h/db?keepalives_idle=60")._kwargs.get(
        "keepalives_idle") is None
