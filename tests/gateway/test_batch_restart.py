"""A gateway killed while it runs a batch: the restarted one resumes it at once."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from llmgw.gateway.batchjournal import BatchJournal
from llmgw.gateway.batchworker import LEASE
from llmgw.gateway.holders import holder_name, is_gone
from llmgw.store.base import BatchResult, BatchRow
from llmgw.store.sqlite import SqliteStore
from tests.gateway.engine import FakeEngine
from tests.gateway.test_files_batches import CHAT, finished, line, seen_lines, upload
from tests.gateway.test_ledger_loss import Child


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    e = FakeEngine()
    await e.start()
    yield e
    await e.stop()


def lease_expiry(path: Path) -> float:
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT expires_at FROM leases WHERE name = ?", (LEASE,)).fetchone()
    finally:
        db.close()
    assert row is not None, "the killed worker held no lease"
    return float(row[0])


async def test_a_killed_workers_batch_resumes_before_its_lease_would_expire(
        tmp_path: Path, engine: FakeEngine) -> None:
    """SIGKILLed mid-batch, the gateway restarted on the same machine takes over the dead
    process's lease instead of waiting out its ttl, and no line whose answer was stored
    before the kill is sent again."""
    engine.response_delay = 0.1
    store_path = tmp_path / "store.db"
    store = SqliteStore(f"sqlite:///{store_path}")
    await store.open()
    try:
        first = Child(tmp_path, engine, f"sqlite:///{store_path}", {})
        second = Child(tmp_path, engine, f"sqlite:///{store_path}", {})
        try:
            async with openai.AsyncOpenAI(base_url=f"{await first.start()}/v1",
                                          api_key="x") as client:
                file_id = await upload(client, b"".join(line(i, model="m") for i in range(60)))
                batch = await client.batches.create(input_file_id=file_id, endpoint=CHAT,
                                                    completion_window="24h")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(await store.batch_result_lines(batch.id, 0)) < 12:
                assert loop.time() < deadline, "the batch did not start"
                await asyncio.sleep(0.02)
            await first.kill()
            expiry = lease_expiry(store_path)
            stored = await store.batch_result_lines(batch.id, 0)
            async with openai.AsyncOpenAI(base_url=f"{await second.start()}/v1",
                                          api_key="x") as client:
                done = await finished(client, batch.id, timeout=120)
            assert time.time() < expiry, "the restarted worker waited out the old lease"
            assert done.status == "completed"
            assert done.request_counts.completed == 60
            seen = seen_lines(engine)
            assert all(seen[f"line {n - 1}"] == 1 for n in stored)
            assert set(seen) == {f"line {i}" for i in range(60)}
        finally:
            await first.kill()
            await second.kill()
    finally:
        await store.close()


def test_only_a_holder_of_this_machine_whose_process_is_gone_is_gone() -> None:
    """A dead pid of this boot and pid namespace is gone; this process, a live one, another
    host or machine, or a name of another shape never are."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(proc.stdout)
    mine = holder_name("t")
    machine = mine.rpartition("@")[2]
    assert is_gone(f"{socket.gethostname()}:{dead}:t@{machine}")
    assert not is_gone(mine)
    assert not is_gone(f"{socket.gethostname()}:{os.getppid()}:t@{machine}")
    assert not is_gone(f"elsewhere:{dead}:t@{machine}")
    assert not is_gone(f"{socket.gethostname()}:{dead}:t@0000.1")
    assert not is_gone(f"{socket.gethostname()}:{dead}:t")


_KILLED = """
import sys, time
from llmgw.gateway.batchjournal import BatchJournal
j = BatchJournal(sys.argv[1])
j.keep("running", 3, True, b'{"id": "line 3"}')
j.keep("running", 4, False, b'{"id": "line 4"}')
j.stored("running", 4)
j.keep("running", 5, True, b'{"id": "line 5"}')
j.keep("finished", 1, True, b'{"id": "late"}')
print("kept", flush=True)
time.sleep(600)
"""


class _Batches:
    """Just the batch calls the journal makes, over two batches."""

    def __init__(self) -> None:
        self.put: dict[str, list[BatchResult]] = {}

    async def get_batch(self, id: str, owner: object) -> BatchRow:
        return BatchRow(id=id, owner="o", status="in_progress" if id == "running" else
                        "completed", created_at=0, record=b"")

    async def put_batch_results(self, batch_id: str, results: list[BatchResult]) -> None:
        self.put.setdefault(batch_id, []).extend(results)


async def test_results_left_by_a_killed_process_are_stored_by_the_next(tmp_path: Path) -> None:
    """A SIGKILLed process's journaled results reach the store through the next process
    on the directory, only for batches still running, and the file goes."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED, str(tmp_path), stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"kept\n"
        store = _Batches()
        journal = BatchJournal(tmp_path)
        assert await journal.flush(store) == 0      # its process lives: not taken
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    await journal.flush(store)  # type: ignore[arg-type]
    # Line 4 was stored before the kill; the file kept it (only emptied with none waiting).
    assert sorted(r.line for r in store.put["running"]) == [3, 4, 5]
    assert "finished" not in store.put
    journal.close()
    assert list(tmp_path.iterdir()) == []
