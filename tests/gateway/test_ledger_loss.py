"""No answered request goes missing from the ledger: not through a SIGKILL of the gateway,
not through a store that freezes or cuts its connections.

Each test runs the gateway as a process of its own (``gateway_process``) with a journal
directory, drives it with clients that count the answers they got whole, and then
compares that count with the store's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import msgspec
import psycopg
import pytest

from llmgw.store.sqlite import SqliteStore
from llmgw.testing.tcpproxy import TcpProxy, through
from tests.gateway.conftest import chat_model
from tests.gateway.engine import FakeEngine
from tests.gateway.test_journal import journaled_lines
from tests.store.conftest import fresh_schema

ROOT = Path(__file__).resolve().parents[2]


class Child:
    """``tests.gateway.gateway_process`` with a store and gateway settings."""

    def __init__(self, tmp: Path, engine: FakeEngine, database: str,
                 gateway: dict[str, object]) -> None:
        models = msgspec.json.encode([chat_model("m", upstream=[engine.url])]).decode()
        self.argv = [sys.executable, "-m", "tests.gateway.gateway_process", "--database",
                     database, "--dir", str(tmp), "--models", models,
                     "--gateway", json.dumps(gateway)]
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self) -> str:
        self.proc = await asyncio.create_subprocess_exec(*self.argv, cwd=ROOT,
                                                         stdout=asyncio.subprocess.PIPE)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        self.url = line.decode().strip()
        assert self.url.startswith("http://"), "the gateway process did not start"
        return self.url

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


@dataclass
class Load:
    """Clients sending one request after another, streaming every other one."""

    url: str
    answered: int = 0
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, n: int, pause: float) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as http:
            i = 0
            while not self.stop.is_set():
                i += 1
                stream = (n + i) % 2 == 0
                try:
                    if await self._one(http, stream):
                        self.answered += 1
                    else:
                        self.failed += 1
                except httpx.HTTPError:
                    self.failed += 1
                    await asyncio.sleep(0.05)
                if pause:
                    await asyncio.sleep(pause)

    async def _one(self, http: httpx.AsyncClient, stream: bool) -> bool:
        body = {"model": "m", "stream": stream,
                "messages": [{"role": "user", "content": "count me"}]}
        if not stream:
            r = await http.post("/v1/chat/completions", json=body)
            return r.status_code == 200 and r.json()["object"] == "chat.completion"
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            text = (await r.aread()).decode()
            return r.status_code == 200 and text.rstrip().endswith("data: [DONE]")


@contextlib.asynccontextmanager
async def loaded(url: str, clients: int, pause: float = 0.0) -> AsyncIterator[Load]:
    load = Load(url)
    tasks = [asyncio.create_task(load.client(i, pause)) for i in range(clients)]
    try:
        yield load
    finally:
        load.stop.set()
        await asyncio.gather(*tasks)


async def until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def sqlite_counts(path: Path) -> tuple[int, int]:
    """(records, records of status 200) in the SQLite store at ``path``."""
    def run() -> tuple[int, int]:
        import sqlite3
        db = sqlite3.connect(path)
        try:
            row = db.execute("SELECT COUNT(*), SUM(status = 200) FROM usage").fetchone()
            return int(row[0]), int(row[1] or 0)
        finally:
            db.close()

    return await asyncio.to_thread(run)


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    e = FakeEngine()
    await e.start()
    yield e
    await e.stop()


@pytest.mark.parametrize("interval", ["1h", "20ms"], ids=["all-unwritten", "mid-write"])
async def test_a_sigkilled_gateway_loses_no_answered_request(
        tmp_path: Path, engine: FakeEngine, interval: str) -> None:
    """SIGKILL under load, then a restart on the same journal directory — the default one,
    beside the SQLite file: the store ends with exactly one record per answer a client
    got whole, and the files are gone."""
    store_path = tmp_path / "store.db"
    store = SqliteStore(f"sqlite:///{store_path}")
    await store.open()      # the schema, before the process starts
    await store.close()
    journal = tmp_path / "store.db.d" / "journal"
    settings = {"ledger_interval": interval}
    first = Child(tmp_path, engine, f"sqlite:///{store_path}", settings)
    second = Child(tmp_path, engine, f"sqlite:///{store_path}", settings)
    try:
        url = await first.start()
        async with loaded(url, 8) as load:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while load.answered < 150:
                assert loop.time() < deadline, "the load got too few answers"
                await asyncio.sleep(0.01)
            await first.kill()
        answered = load.answered
        await second.start()

        async def all_recorded() -> bool:
            return (await sqlite_counts(store_path))[1] >= answered

        await until(all_recorded, 60, f"{answered} records")
        total, ok = await sqlite_counts(store_path)
        assert (total, ok) == (answered, answered)

        async def emptied() -> bool:
            return journaled_lines(journal) == 0

        await until(emptied, 60, "the journal to be emptied")
    finally:
        await first.kill()
        await second.kill()


async def pg_counts(url: str) -> tuple[int, int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE status = 200) FROM usage")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def test_a_frozen_then_cut_postgres_loses_no_record_and_blocks_no_request(
        tmp_path: Path, engine: FakeEngine, postgres_url: str) -> None:
    """Postgres behind a proxy that freezes every connection, then cuts them and refuses
    new ones: requests are answered throughout, and afterwards the store holds exactly
    one record per answer."""
    async with fresh_schema(postgres_url) as url:
        parts = urlsplit(url)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        await proxy.start()
        child = Child(tmp_path, engine, through(url, proxy.port),
                      {"journal_dir": str(tmp_path / "journal"), "ledger_interval": "100ms",
                       "ledger_buffer": 50})
        try:
            await child.start()
            async with loaded(child.url, 4, pause=0.02) as load:
                loop = asyncio.get_running_loop()

                async def answers(n: int, what: str) -> None:
                    target = load.answered + n
                    deadline = loop.time() + 120
                    while load.answered < target:
                        assert loop.time() < deadline, f"requests stopped being answered {what}"
                        await asyncio.sleep(0.02)

                await answers(30, "before the outage")
                proxy.freeze()
                # More answers than the memory buffer holds: the rest wait on disk only.
                await answers(120, "while the store was frozen")
                proxy.cut(refuse=True)
                await answers(60, "while the store refused connections")
                proxy.resume()
                await answers(30, "after the outage")
            answered = load.answered

            async def all_recorded() -> bool:
                return (await pg_counts(url))[1] >= answered

            await until(all_recorded, 120, f"{answered} records in Postgres")
            assert await pg_counts(url) == (answered, answered)
        finally:
            await child.kill()
            await proxy.close()
