"""Owned objects move from key names to key ids: migration 10 and the one claim after it."""

from __future__ import annotations

from pathlib import Path

from llmgw.store.base import BatchRow, FileRecord, OwnerId, StoredResponse
from llmgw.store.schema import (
    MIGRATIONS,
    POSTGRES_MIGRATIONS_TABLE,
    SQLITE_MIGRATIONS_TABLE,
)
from llmgw.store.sqlite import sqlite_path
from tests.store.conftest import Database, StoreFactory


async def _at_migration(database: Database, number: int) -> None:
    """Build the schema as an llmgw that knew migrations 1..``number`` left it."""
    if database.kind == "sqlite":
        Path(sqlite_path(database.url)).parent.mkdir(parents=True, exist_ok=True)
        await database.execute(SQLITE_MIGRATIONS_TABLE)
    else:
        await database.execute(POSTGRES_MIGRATIONS_TABLE)
    for m in MIGRATIONS[:number]:
        for statement in (m.sqlite if database.kind == "sqlite" else m.postgres):
            await database.execute(statement)
        await database.execute(
            f"INSERT INTO schema_migrations (version, name) VALUES ({m.number}, 'x')")


async def test_name_owned_rows_go_to_the_ids_in_force_and_revoked_names_to_nobody(
        make_store: StoreFactory, database: Database) -> None:
    """After the upgrade, alice's rows are her current key's; gone's rows are nobody's and
    stay so, even when a key named gone is created and the claim runs again."""
    await _at_migration(database, 8)
    for owner, n in (("alice", 1), ("gone", 2)):
        await database.execute(
            f"INSERT INTO files (id, owner, purpose, filename, bytes, created_at, status)"
            f" VALUES ('file-{n}', '{owner}', 'batch', 'in.jsonl', 0, 0, 'processed')")
        await database.execute(
            f"INSERT INTO batches (id, owner, status, created_at, record)"
            f" VALUES ('batch_{n}', '{owner}', 'completed', {n}, {_blob(database, b'{}')})")
        await database.execute(
            f"INSERT INTO responses (id, owner, body, context, expires_at)"
            f" VALUES ('resp_{n}', '{owner}', {_blob(database, b'{}')},"
            f" {_blob(database, b'[]')}, {_future(database)})")
    store = await make_store()
    alice, gone = OwnerId("key-alice"), OwnerId("key-new-gone")
    assert await store.get_file("file-1", OwnerId("alice")) is None   # a name owns nothing
    assert await store.claim_legacy_owners({"alice": alice}) == 3
    assert await store.get_file("file-1", alice) is not None
    assert await store.get_batch("batch_1", alice) is not None
    assert await store.get_response("resp_1", alice) is not None
    assert [b.id for b in await store.list_batches(alice, None, 10)] == ["batch_1"]
    assert await store.claim_legacy_owners({"gone": gone}) == 0
    assert await store.get_file("file-2", gone) is None
    assert await store.get_batch("batch_2", gone) is None
    assert await store.get_response("resp_2", gone) is None
    [row] = await database.fetch("SELECT owner FROM files WHERE id = 'file-2'")
    assert row[0] == "revoked:gone"


async def test_new_rows_and_usage_records_carry_key_ids(make_store: StoreFactory) -> None:
    """A row written with an owner id is read back by that id only, and the claim leaves
    it alone."""
    store = await make_store()
    owner = OwnerId("key-0123")
    await store.create_file(FileRecord(id="file-x", owner=owner, purpose="batch",
                                       filename="a", bytes=0, created_at=0))
    await store.finish_file("file-x", 0)
    await store.create_batch(BatchRow(id="batch_x", owner=owner, status="validating",
                                      created_at=0, record=b"{}"))
    await store.put_response(StoredResponse(id="resp_x", owner=owner, body=b"{}",
                                            context=b"[]"), 60)
    assert await store.claim_legacy_owners({"someone": "key-9999"}) == 0
    assert await store.get_file("file-x", owner) is not None
    assert await store.get_batch("batch_x", owner) is not None
    assert await store.get_response("resp_x", owner) is not None


def _blob(database: Database, data: bytes) -> str:
    return f"X'{data.hex()}'" if database.kind == "sqlite" else f"'\\x{data.hex()}'::bytea"


def _future(database: Database) -> str:
    return "4102444800.0" if database.kind == "sqlite" else "'2100-01-01T00:00:00Z'"
