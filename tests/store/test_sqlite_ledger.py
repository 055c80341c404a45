"""The SQLite store's ledger writer process: restarted after it dies, gone when the
store closes, and never counting a batch twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from llmgw.errors import StoreUnavailableError
from llmgw.store.base import UsageRecord
from llmgw.store.sqlite import SqliteStore

HOUR = 1_773_500_400


def record(id_: str, at: float = HOUR + 10) -> UsageRecord:
    return UsageRecord(id=id_, at=at, key="k1", team="ml", model="m", replica="r",
                       gpu_class="", prompt_tokens=10, cached_tokens=0, completion_tokens=5,
                       status=200, latency=0.25, ttft=None)


async def requests(store: SqliteStore) -> int:
    rows = await store.usage("team", HOUR, HOUR + 3600, day=False)
    return sum(r.requests for r in rows)


async def test_a_writer_that_dies_is_started_again_and_counts_nothing_twice(
        tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await store.open()
    try:
        assert await store.record_usage([record("a"), record("b")]) == 2
        writer = store._ledger
        assert writer is not None
        assert writer._proc is not None
        first = writer._proc
        first.kill()
        first.wait()
        # The batch is written again, with one record already stored, by a new child.
        assert await store.record_usage([record("b"), record("c")]) == 1
        assert writer._proc is not None
        assert writer._proc.pid != first.pid
        assert await requests(store) == 3
    finally:
        await store.close()


async def test_a_writer_that_stops_answering_is_unavailable_then_replaced(
        tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await store.open()
    try:
        assert await store.record_usage([record("a")]) == 1
        writer = store._ledger
        assert writer is not None
        assert writer._proc is not None
        writer.timeout = 1.0
        os.kill(writer._proc.pid, signal.SIGSTOP)
        with pytest.raises(StoreUnavailableError, match="did not answer in time"):
            await store.record_usage([record("b")])
        assert await store.record_usage([record("b")]) == 1
        assert await requests(store) == 2
    finally:
        await store.close()


async def test_closing_the_store_ends_its_writer(tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await store.open()
    assert await store.record_usage([record("a")]) == 1
    writer = store._ledger
    assert writer is not None
    assert writer._proc is not None
    proc = writer._proc
    await store.close()
    assert proc.returncode == 0


async def test_the_signals_that_stop_the_gateway_leave_the_writer_for_its_last_batch(
        tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await store.open()
    try:
        assert await store.record_usage([record("a")]) == 1
        writer = store._ledger
        assert writer is not None
        assert writer._proc is not None
        child = writer._proc.pid
        # What Ctrl-C or a service stop sends the whole group, the gateway included.
        os.kill(child, signal.SIGINT)
        os.kill(child, signal.SIGTERM)
        assert await store.record_usage([record("b")]) == 1
        assert writer._proc is not None
        assert writer._proc.pid == child
    finally:
        await store.close()
