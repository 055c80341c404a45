"""The SQLite store's ledger writer process: restarted after it dies, gone when the
store closes, and never counting a batch twice."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.errors import StoreUnavailableError
from llmgw.store.base import UsageRecord
from llmgw.store.sqlite import SqliteStore
from llmgw.store.sqlite_ledger import LedgerWriter

HOUR = 1_773_500_400


def record(id_: str, at: float = HOUR + 10) -> UsageRecord:
    return UsageRecord(id=id_, at=at, key="k1", team="ml", model="m", replica="r",
                       gpu_class="", prompt_tokens=10, cached_tokens=0, completion_tokens=5,
                       status=200, latency=0.25, ttft=None)


async def requests(store: SqliteStore) -> int:
    rows = await store.usage("team", HOUR, HOUR + 3600, day=False)
    return sum(r.requests for r in rows)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """An open store that has written one record, so its writer is running."""
    store = SqliteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await store.open()
    try:
        assert await store.record_usage([record("a")]) == 1
        yield store
    finally:
        await store.close()


def writer_of(store: SqliteStore) -> tuple[LedgerWriter, subprocess.Popen[bytes]]:
    """The store's ledger writer and its child now."""
    writer = store._ledger
    assert writer is not None
    assert writer._proc is not None
    return writer, writer._proc


async def test_a_writer_that_dies_is_started_again_and_counts_nothing_twice(
        store: SqliteStore) -> None:
    _writer, first = writer_of(store)
    first.kill()
    first.wait()
    # The batch is written again, with one record already stored, by a new child.
    assert await store.record_usage([record("a"), record("b")]) == 1
    assert writer_of(store)[1].pid != first.pid
    assert await requests(store) == 2


async def test_a_writer_that_stops_answering_is_unavailable_then_replaced(
        store: SqliteStore) -> None:
    writer, child = writer_of(store)
    usual, writer.timeout = writer.timeout, 1.0
    os.kill(child.pid, signal.SIGSTOP)
    with pytest.raises(StoreUnavailableError, match="did not answer in time"):
        await store.record_usage([record("b")])
    # The replacement starts a Python process before it answers: on a loaded machine
    # that alone can take longer than the 1 s that caught the stopped one.
    writer.timeout = usual
    assert await store.record_usage([record("b")]) == 1
    assert await requests(store) == 2


async def test_closing_the_store_ends_its_writer(store: SqliteStore) -> None:
    _writer, child = writer_of(store)
    await store.close()
    assert child.returncode == 0


async def test_the_signals_that_stop_the_gateway_leave_the_writer_for_its_last_batch(
        store: SqliteStore) -> None:
    _writer, child = writer_of(store)
    # What Ctrl-C or a service stop sends the whole group, the gateway included.
    os.kill(child.pid, signal.SIGINT)
    os.kill(child.pid, signal.SIGTERM)
    assert await store.record_usage([record("b")]) == 1
    assert writer_of(store)[1].pid == child.pid
