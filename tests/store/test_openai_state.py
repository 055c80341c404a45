"""Stored Responses, files and batches: the Store contract, run against SQLite and Postgres."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from llmgw.store.base import CHUNK_SIZE, BatchResult, BatchRow, FileRecord, StoredResponse

from .conftest import AnyStore, Database, StoreFactory
from .test_store import wait_for


def response(id: str, owner: str = "alice", body: bytes = b'{"id":"r"}') -> StoredResponse:
    return StoredResponse(id=id, owner=owner, body=body, context=b'[{"role":"user"}]')


def batch(id: str, owner: str = "alice", status: str = "validating", created_at: int = 100,
          record: bytes = b"{}") -> BatchRow:
    return BatchRow(id=id, owner=owner, status=status, created_at=created_at, record=record)


# --- stored Responses ---------------------------------------------------------------


async def test_a_stored_response_is_read_back_only_by_its_owner(store: AnyStore) -> None:
    """get_response returns body and context to the key that stored it, None to another."""
    await store.put_response(response("resp_1"), ttl=60)
    got = await store.get_response("resp_1", "alice")
    assert got == response("resp_1")
    assert await store.get_response("resp_1", "bob") is None
    assert await store.get_response("resp_2", "alice") is None


async def test_an_expired_response_is_gone_and_purged(store: AnyStore) -> None:
    """Past its ttl (database time) a response cannot be read or deleted, and purge removes it."""
    await store.put_response(response("resp_old"), ttl=0.2)
    await store.put_response(response("resp_new"), ttl=600)

    async def expired() -> bool:
        return await store.get_response("resp_old", "alice") is None

    await wait_for(expired, "the response to expire")
    assert not await store.delete_response("resp_old", "alice")
    assert await store.purge_responses() == 1
    assert await store.get_response("resp_new", "alice") is not None


async def test_deleting_a_response_needs_its_owner(store: AnyStore) -> None:
    """delete_response by another key deletes nothing; by the owner, once."""
    await store.put_response(response("resp_1"), ttl=60)
    assert not await store.delete_response("resp_1", "bob")
    assert await store.delete_response("resp_1", "alice")
    assert not await store.delete_response("resp_1", "alice")


# --- files ----------------------------------------------------------------------------


async def write_file(store: AnyStore, id: str, data: bytes, owner: str = "alice") -> None:
    await store.create_file(FileRecord(id=id, owner=owner, purpose="batch", filename="in.jsonl",
                                       bytes=0, created_at=100))
    for seq, start in enumerate(range(0, len(data), CHUNK_SIZE)):
        await store.put_file_chunk(id, seq, data[start:start + CHUNK_SIZE])
    await store.finish_file(id, len(data))


async def test_a_file_is_invisible_until_finished_then_read_back_in_chunks(
        store: AnyStore) -> None:
    """A file being uploaded is not found; once finished its chunks come back in order."""
    data = bytes(range(256)) * (CHUNK_SIZE // 256) * 2 + b"tail"   # three chunks
    await store.create_file(FileRecord(id="file-1", owner="alice", purpose="batch",
                                       filename="in.jsonl", bytes=0, created_at=100))
    await store.put_file_chunk("file-1", 0, data[:CHUNK_SIZE])
    assert await store.get_file("file-1", "alice") is None
    for seq in (1, 2):
        await store.put_file_chunk("file-1", seq, data[seq * CHUNK_SIZE:(seq + 1) * CHUNK_SIZE])
    await store.finish_file("file-1", len(data))
    record = await store.get_file("file-1", "alice")
    assert record is not None
    assert (record.bytes, record.status, record.filename) == (len(data), "processed", "in.jsonl")
    assert await store.get_file("file-1", "bob") is None
    assert await store.get_file("file-1", None) == record
    first_two = await store.read_file_chunks("file-1", 0, 2)
    rest = await store.read_file_chunks("file-1", 2, 2)
    assert b"".join(first_two + rest) == data
    assert len(rest) == 1


async def test_deleting_a_file_takes_its_chunks(store: AnyStore) -> None:
    """delete_file by its owner removes the record and every chunk; by another key, nothing."""
    await write_file(store, "file-1", b"x" * (CHUNK_SIZE + 10))
    assert not await store.delete_file("file-1", "bob")
    assert await store.delete_file("file-1", "alice")
    assert await store.get_file("file-1", None) is None
    assert await store.read_file_chunks("file-1", 0, 10) == []


async def test_abandoned_uploads_are_purged_and_finished_files_kept(store: AnyStore) -> None:
    """purge_uploads removes files still uploading that began before the cutoff, with chunks."""
    await store.create_file(FileRecord(id="file-dead", owner="alice", purpose="batch",
                                       filename="a", bytes=0, created_at=50))
    await store.put_file_chunk("file-dead", 0, b"partial")
    await store.create_file(FileRecord(id="file-young", owner="alice", purpose="batch",
                                       filename="b", bytes=0, created_at=500))
    await write_file(store, "file-done", b"{}\n")
    assert await store.purge_uploads(before=100) == 1
    assert await store.read_file_chunks("file-dead", 0, 1) == []
    assert await store.get_file("file-done", "alice") is not None
    await store.finish_file("file-young", 0)
    assert await store.get_file("file-young", "alice") is not None


async def test_files_are_listed_by_owner_and_purpose_in_either_order(store: AnyStore) -> None:
    """list_files pages one owner's finished files by (created_at, id) after a cursor."""
    for id, created, purpose in (("file-a", 100, "batch"), ("file-b", 300, "batch_output"),
                                 ("file-c", 200, "batch"), ("file-d", 300, "batch")):
        await store.create_file(FileRecord(id=id, owner="alice", purpose=purpose, filename="f",
                                           bytes=0, created_at=created))
        await store.finish_file(id, 0)
    await write_file(store, "file-bob", b"{}", owner="bob")
    await store.create_file(FileRecord(id="file-half", owner="alice", purpose="batch",
                                       filename="f", bytes=0, created_at=400))

    async def ids(**kw: Any) -> list[str]:
        args = {"purpose": None, "after": None, "limit": 10, "ascending": False, **kw}
        return [f.id for f in await store.list_files("alice", **args)]

    assert await ids() == ["file-d", "file-b", "file-c", "file-a"]
    assert await ids(ascending=True) == ["file-a", "file-c", "file-b", "file-d"]
    assert await ids(limit=2) == ["file-d", "file-b"]
    assert await ids(after="file-b") == ["file-c", "file-a"]
    assert await ids(after="file-b", ascending=True) == ["file-d"]
    assert await ids(purpose="batch") == ["file-d", "file-c", "file-a"]
    assert await ids(purpose="batch", after="file-d") == ["file-c", "file-a"]
    assert await ids(after="file-bob") == []      # another owner's file is no cursor


async def test_an_expired_file_is_gone_and_purged_with_its_chunks(store: AnyStore) -> None:
    """A file past its expires_at is neither found nor listed, and purge_files deletes it."""
    await store.create_file(FileRecord(id="file-old", owner="alice", purpose="batch_output",
                                       filename="o", bytes=0, created_at=100, expires_at=3700))
    await store.put_file_chunk("file-old", 0, b"done")
    await store.finish_file("file-old", 4)
    far = int(time.time()) + 86400
    await store.create_file(FileRecord(id="file-new", owner="alice", purpose="batch_output",
                                       filename="n", bytes=0, created_at=100, expires_at=far))
    await store.finish_file("file-new", 0)
    assert await store.get_file("file-old", "alice") is None
    kept = await store.get_file("file-new", None)
    assert kept is not None
    assert kept.expires_at == far
    listed = await store.list_files("alice", purpose=None, after=None, limit=10,
                                    ascending=False)
    assert [f.id for f in listed] == ["file-new"]
    assert await store.purge_files() == 1
    assert await store.read_file_chunks("file-old", 0, 1) == []
    assert await store.get_file("file-new", "alice") is not None


# --- batches --------------------------------------------------------------------------


async def test_a_batch_update_is_refused_when_its_status_moved_on(store: AnyStore) -> None:
    """update_batch is a compare-and-set on status: a cancel in between wins."""
    await store.create_batch(batch("batch_1"))
    assert await store.update_batch(batch("batch_1", status="in_progress", record=b'{"a":1}'),
                                    expect="validating")
    assert await store.update_batch(batch("batch_1", status="cancelling"), expect="in_progress")
    assert not await store.update_batch(batch("batch_1", status="finalizing"),
                                        expect="in_progress")
    got = await store.get_batch("batch_1", "alice")
    assert got is not None
    assert got.status == "cancelling"
    assert await store.get_batch("batch_1", "bob") is None


async def test_batches_are_listed_newest_first_page_by_page(store: AnyStore) -> None:
    """list_batches pages through one owner's batches, newest first, by the last id seen."""
    for i, created in enumerate([100, 300, 200, 300]):
        await store.create_batch(batch(f"batch_{i}", created_at=created))
    await store.create_batch(batch("batch_other", owner="bob", created_at=400))
    first = await store.list_batches("alice", None, 2)
    assert [b.id for b in first] == ["batch_3", "batch_1"]
    second = await store.list_batches("alice", first[-1].id, 2)
    assert [b.id for b in second] == ["batch_2", "batch_0"]
    assert await store.list_batches("alice", "batch_0", 2) == []


async def test_active_batches_are_those_not_finished(store: AnyStore) -> None:
    """active_batches lists validating, in_progress, finalizing and cancelling, oldest first."""
    statuses = ["completed", "in_progress", "validating", "failed", "cancelling", "finalizing",
                "cancelled", "expired"]
    for i, status in enumerate(statuses):
        await store.create_batch(batch(f"batch_{i}", status=status, created_at=100 - i))
    active = await store.active_batches()
    assert [b.status for b in active] == ["finalizing", "cancelling", "validating",
                                          "in_progress"]


async def test_batch_results_keep_the_first_answer_per_line_and_page_in_order(
        store: AnyStore) -> None:
    """Results are read in line order after a line; a line written twice keeps its first result."""
    await store.put_batch_results("batch_1", [
        BatchResult(line=3, ok=True, data=b"c"), BatchResult(line=1, ok=False, data=b"a")])
    await store.put_batch_results("batch_1", [
        BatchResult(line=2, ok=True, data=b"b"), BatchResult(line=3, ok=False, data=b"again")])
    await store.put_batch_results("batch_2", [BatchResult(line=1, ok=True, data=b"other")])
    page = await store.batch_results("batch_1", 0, 2)
    assert [(r.line, r.ok, r.data) for r in page] == [(1, False, b"a"), (2, True, b"b")]
    rest = await store.batch_results("batch_1", 2, 10)
    assert [(r.line, r.ok, r.data) for r in rest] == [(3, True, b"c")]
    assert await store.batch_result_lines("batch_1", 1) == [2, 3]
    assert await store.count_batch_results("batch_1") == (2, 1)
    await store.delete_batch_results("batch_1")
    assert await store.count_batch_results("batch_1") == (0, 0)
    assert await store.count_batch_results("batch_2") == (1, 0)


async def test_two_stores_writing_results_concurrently_lose_nothing(
        make_store: StoreFactory) -> None:
    """Two instances recording results of one batch at once end with every line once."""
    a, b = await make_store(), await make_store()

    async def write(store: AnyStore, lines: range) -> None:
        for line in lines:
            await store.put_batch_results("batch_1", [BatchResult(line=line, ok=True, data=b"x")])

    await asyncio.gather(write(a, range(1, 60)), write(b, range(30, 90)))
    assert await a.batch_result_lines("batch_1", 0) == list(range(1, 90))


async def test_many_identical_writes_at_once_all_land(make_store: StoreFactory,
                                                      database: Database) -> None:
    """A burst of concurrent writes of one statement on one store (the batch worker's pattern)
    records every row: no write fails or is lost."""
    # The burst queues for Postgres's few pooled connections. On a loaded machine the last
    # of 1,500 can wait longer than the default pool_timeout (5 s) for one, which is a
    # StoreUnavailableError by design; what is pinned here is that no write is lost.
    store = await make_store(**({"pool_timeout": 120.0} if database.kind == "postgres" else {}))
    await asyncio.gather(*(store.put_batch_results("batch_1", [BatchResult(line=n, ok=True,
                                                                           data=b"x")])
                           for n in range(1, 1501)))
    assert await store.count_batch_results("batch_1") == (1500, 0)
