"""The Store contract, run unchanged against SQLite and Postgres."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import TypeVar

import pytest

from llmgw.errors import StoreUnavailableError
from llmgw.store.base import StoredModel
from llmgw.store.schema import LATEST, MIGRATIONS

from .conftest import AnyStore, Database, StoreFactory, with_params

T = TypeVar("T")

T0 = datetime(2026, 3, 14, 9, 26, 53, 589793, tzinfo=UTC)


def stored(name: str, definition: bytes = b'{"engine":"vllm"}', *, by: str = "alice",
           at: datetime = T0) -> StoredModel:
    return StoredModel(name=name, definition=definition, added_by=by, added_at=at,
                       updated_by=by, updated_at=at)


async def wait_for(probe: Callable[[], Awaitable[T]], what: str, timeout: float = 30.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        await asyncio.sleep(0.02)


# --- migrations -----------------------------------------------------------------


async def test_reopening_applies_no_migration_twice_and_keeps_data(
        make_store: StoreFactory, database: Database) -> None:
    """Opening an already migrated database applies nothing again and keeps its rows and version."""
    first = await make_store()
    async with first.change() as change:
        await change.put_model(stored("qwen-coder-32b"))
    await first.close()

    second = await make_store()
    assert [m.name for m in await second.models()] == ["qwen-coder-32b"]
    assert await second.catalog_version() == 1
    rows = await database.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in rows] == [m.number for m in MIGRATIONS]


async def test_concurrent_first_opens_migrate_exactly_once(
        make_store: StoreFactory, database: Database) -> None:
    """Four stores opening a fresh database at once all succeed and record each migration once."""
    stores = [await make_store(open=False) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    rows = await database.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in rows] == [m.number for m in MIGRATIONS]
    assert {await s.catalog_version() for s in stores} == {0}


async def test_database_migrated_by_a_newer_version_is_unavailable(
        make_store: StoreFactory, database: Database) -> None:
    """A database recording a migration this llmgw does not know is refused at open, by number."""
    await (await make_store()).close()
    await database.execute(
        f"INSERT INTO schema_migrations (version, name) VALUES ({LATEST + 1}, 'from the future')"
    )
    with pytest.raises(StoreUnavailableError, match=rf"\[{LATEST + 1}\]"):
        await make_store()


# --- models ---------------------------------------------------------------------


async def test_put_get_delete_round_trip(store: AnyStore) -> None:
    """A stored model comes back byte for byte, with its actors and UTC times, and deletes once."""
    definition = b'{"name":"llama-3-8b","bad-utf8":"\xff\xfe"}\x00'
    async with store.change() as change:
        await change.put_model(stored("llama-3-8b", definition, by="bob"))
        await change.put_model(stored("gemma-3-270m"))

    models = await store.models()
    assert [m.name for m in models] == ["gemma-3-270m", "llama-3-8b"]
    llama = models[1]
    assert llama.definition == definition
    assert (llama.added_by, llama.updated_by) == ("bob", "bob")
    assert llama.added_at == T0
    assert llama.updated_at == T0
    assert llama.added_at.utcoffset() == timedelta(0)

    async with store.change() as change:
        assert await change.delete_model("llama-3-8b") is True
        assert await change.delete_model("llama-3-8b") is False
        assert await change.delete_model("never-added") is False
    assert [m.name for m in await store.models()] == ["gemma-3-270m"]


async def test_put_replaces_every_field_with_what_the_caller_gives(store: AnyStore) -> None:
    """Putting an existing name stores exactly the given row: the caller decides what to keep."""
    async with store.change() as change:
        await change.put_model(stored("mixtral", b"v1", by="alice", at=T0))
    later = T0 + timedelta(hours=5)
    updated = StoredModel(name="mixtral", definition=b"v2", added_by="alice", added_at=T0,
                          updated_by="carol", updated_at=later)
    async with store.change() as change:
        await change.put_model(updated)
    assert await store.models() == [updated]


async def test_times_in_other_zones_are_stored_as_the_same_instant_in_utc(store: AnyStore) -> None:
    """An aware time in any zone is kept as the same instant and returned in UTC."""
    ist = timezone(timedelta(hours=5, minutes=30))
    at = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=ist)
    async with store.change() as change:
        await change.put_model(stored("phi-4", at=at))
    [model] = await store.models()
    assert model.added_at == at
    assert model.added_at.tzinfo == UTC


async def test_naive_time_is_refused_as_a_programming_error(store: AnyStore) -> None:
    """A naive datetime raises ValueError and writes nothing."""
    with pytest.raises(ValueError, match="timezone-aware"):
        async with store.change() as change:
            await change.put_model(stored("phi-4", at=datetime(2026, 1, 1)))
    assert await store.models() == []


# --- change transactions --------------------------------------------------------


async def test_change_that_raises_writes_nothing_and_keeps_the_version(store: AnyStore) -> None:
    """An exception inside change() rolls back every write and leaves the version alone."""
    async with store.change() as change:
        await change.put_model(stored("kept"))
    version = await store.catalog_version()

    class Refused(Exception):
        pass

    async def refused_change() -> None:
        async with store.change() as change:
            await change.put_model(stored("added-then-refused"))
            assert await change.delete_model("kept") is True
            assert [m.name for m in await change.models()] == ["added-then-refused"]
            raise Refused

    with pytest.raises(Refused):
        await refused_change()
    assert [m.name for m in await store.models()] == ["kept"]
    assert await store.catalog_version() == version


async def test_each_committed_change_bumps_the_version_seen_by_other_instances(
        make_store: StoreFactory) -> None:
    """Every committed change increases the version by one, as read from another instance."""
    writer, reader = await make_store(), await make_store()
    start = await reader.catalog_version()
    for i in range(3):
        async with writer.change() as change:
            await change.put_model(stored(f"model-{i}"))
        assert await reader.catalog_version() == start + i + 1
    assert [m.name for m in await reader.models()] == ["model-0", "model-1", "model-2"]


async def test_change_object_refuses_use_after_its_block(store: AnyStore) -> None:
    """Using a change after its block ended raises instead of writing outside the lock."""
    async with store.change() as change:
        pass
    with pytest.raises(RuntimeError, match="has ended"):
        await change.put_model(stored("late"))
    assert await store.models() == []


async def test_cancelled_change_rolls_back_and_frees_the_lock(store: AnyStore) -> None:
    """A task cancelled inside change() writes nothing, and the next change proceeds at once."""
    entered = asyncio.Event()

    async def stuck_change() -> None:
        async with store.change() as change:
            await change.put_model(stored("abandoned"))
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(stuck_change())
    await asyncio.wait_for(entered.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(10):
        async with store.change() as change:
            assert await change.models() == []
            await change.put_model(stored("next"))
    assert [m.name for m in await store.models()] == ["next"]
    assert await store.catalog_version() == 1


async def test_reads_do_not_wait_for_an_open_change(make_store: StoreFactory) -> None:
    """models() and catalog_version() answer from the last commit while a change is open."""
    a, b = await make_store(), await make_store()
    async with a.change() as change:
        await change.put_model(stored("pending"))
        assert await asyncio.wait_for(b.models(), 10) == []
        assert await asyncio.wait_for(b.catalog_version(), 10) == 0
    assert [m.name for m in await b.models()] == ["pending"]
    assert await b.catalog_version() == 1


async def test_reads_keep_answering_while_a_write_waits_for_an_open_change(
        make_store: StoreFactory) -> None:
    """While a lease write waits on another instance's change, reads still answer promptly."""
    a, b = await make_store(), await make_store()
    async with a.change() as change:
        await change.put_model(stored("pending"))
        lease = asyncio.create_task(b.try_lease("reconciler", "host-b:202", 60))
        await asyncio.sleep(0)  # let the lease write start (and, on SQLite, wait)
        assert await asyncio.wait_for(b.catalog_version(), 10) == 0
        assert await asyncio.wait_for(b.lease_holder("scale-up:qwen"), 10) is None
    assert await asyncio.wait_for(lease, 30) is True


async def increment(store: AnyStore, name: str = "counter") -> None:
    async with store.change() as change:
        current = {m.name: m for m in await change.models()}
        n = json.loads(current[name].definition)["n"] if name in current else 0
        # Hand the loop to every other task between the read and the write: if
        # changes were not serialised, another increment would read the same n.
        await asyncio.sleep(0)
        await change.put_model(stored(name, json.dumps({"n": n + 1}).encode()))


async def test_concurrent_changes_from_two_instances_serialise(make_store: StoreFactory) -> None:
    """Twenty concurrent read-modify-write changes through two instances lose no update."""
    a, b = await make_store(), await make_store()
    await asyncio.gather(*(increment(a if i % 2 else b) for i in range(20)))
    [counter] = await a.models()
    assert json.loads(counter.definition) == {"n": 20}
    assert await b.catalog_version() == 20


# --- leases ---------------------------------------------------------------------


async def test_lease_is_exclusive_and_renewable_by_its_holder(store: AnyStore) -> None:
    """A live lease is refused to others, renewed by its holder, and named by lease_holder."""
    assert await store.lease_holder("reconciler") is None
    assert await store.try_lease("reconciler", "host-a:101", 60) is True
    assert await store.try_lease("reconciler", "host-b:202", 60) is False
    assert await store.try_lease("reconciler", "host-a:101", 60) is True
    assert await store.lease_holder("reconciler") == "host-a:101"
    assert await store.try_lease("scale-up:llama-3-8b", "host-b:202", 60) is True


async def test_expired_lease_is_taken_by_another_holder(store: AnyStore) -> None:
    """Once a lease's ttl passes by the database clock, another holder takes it."""
    assert await store.try_lease("reconciler", "host-a:101", 0.2) is True

    async def b_took_it() -> bool:
        return bool(await store.try_lease("reconciler", "host-b:202", 60))

    await wait_for(b_took_it, "host-b taking the expired lease")
    assert await store.lease_holder("reconciler") == "host-b:202"
    assert await store.try_lease("reconciler", "host-a:101", 60) is False


async def test_expired_lease_has_no_holder(store: AnyStore) -> None:
    """lease_holder stops naming a holder whose lease has expired."""
    assert await store.try_lease("reconciler", "host-a:101", 0.1) is True

    async def gone() -> bool:
        return await store.lease_holder("reconciler") is None

    await wait_for(gone, "the lease expiring")


async def test_release_frees_the_lease_only_for_its_holder(make_store: StoreFactory) -> None:
    """Only the holder's release frees a lease; another instance can then take it at once."""
    a, b = await make_store(), await make_store()
    assert await a.try_lease("reconciler", "host-a:101", 60) is True
    await b.release_lease("reconciler", "host-b:202")
    assert await b.lease_holder("reconciler") == "host-a:101"
    await a.release_lease("reconciler", "host-a:101")
    assert await b.lease_holder("reconciler") is None
    assert await b.try_lease("reconciler", "host-b:202", 60) is True


async def test_concurrent_lease_attempts_have_one_winner(make_store: StoreFactory) -> None:
    """Of many holders racing for a free lease through two instances, exactly one wins."""
    a, b = await make_store(), await make_store()
    results = await asyncio.gather(
        *((a if i % 2 else b).try_lease("scale-up:qwen", f"holder-{i}", 60) for i in range(10))
    )
    assert sum(results) == 1
    winner = f"holder-{results.index(True)}"
    assert await a.lease_holder("scale-up:qwen") == winner


# --- activity -------------------------------------------------------------------


async def test_activity_is_none_until_marked_then_counts_up(make_store: StoreFactory) -> None:
    """last_activity is None for an unused model, then the database seconds since the last mark."""
    gateway, reconciler = await make_store(), await make_store()
    assert await reconciler.last_activity("llama-3-8b") is None
    await gateway.mark_activity("llama-3-8b")
    first = await reconciler.last_activity("llama-3-8b")
    assert first is not None
    assert 0.0 <= first < 10.0

    async def aged() -> float | None:
        idle = await reconciler.last_activity("llama-3-8b")
        return idle if idle is not None and idle >= first + 0.05 else None

    older = await wait_for(aged, "idle time growing")
    await gateway.mark_activity("llama-3-8b")
    again = await reconciler.last_activity("llama-3-8b")
    assert again is not None
    assert older is not None
    assert again < older
    assert await reconciler.last_activity("gemma-3-270m") is None


# --- reports --------------------------------------------------------------------


async def test_reports_are_overwritten_per_key_and_read_back_with_their_age(
        make_store: StoreFactory) -> None:
    """A report replaces the earlier one of its kind and key; other kinds are not listed."""
    gateway_a, gateway_b, scaler = await make_store(), await make_store(), await make_store()
    await gateway_a.put_report("load", "host-a:1", b'{"n":1}')
    await gateway_a.put_report("load", "host-a:1", b'{"n":2}')
    await gateway_b.put_report("load", "host-b:7", b"\xff\x00 not utf-8")
    await gateway_b.put_report("scaler", "decisions", b"{}")
    found = await scaler.reports("load", 60.0)
    assert [(r.key, r.payload) for r in found] == [
        ("host-a:1", b'{"n":2}'), ("host-b:7", b"\xff\x00 not utf-8")]
    assert all(0.0 <= r.age < 10.0 for r in found)


async def test_reports_older_than_the_window_are_not_read(make_store: StoreFactory) -> None:
    """A report not refreshed within ``within`` seconds is left out (its writer may be gone)."""
    store = await make_store()
    await store.put_report("load", "gone", b"{}")

    async def aged() -> bool:
        return not await store.reports("load", 0.05)

    await wait_for(aged, "the report ageing past the window")
    assert [r.key for r in await store.reports("load", 60.0)] == ["gone"]


def _running_on_catalog_thread(store: AnyStore) -> bool:
    """The SQLite adapter's catalog connection is executing a statement right now."""
    threads = store._catalog._executor._threads  # type: ignore[union-attr]
    frames = sys._current_frames()
    for t in threads:
        frame = frames.get(t.ident) if t.ident is not None else None
        while frame is not None:
            if frame.f_code.co_name == "_call":
                return True
            frame = frame.f_back
    return False


async def test_change_cancelled_while_waiting_for_the_lock_leaves_no_transaction(
        make_store: StoreFactory, database: Database) -> None:
    """Cancelling a change blocked on another instance's lock rolls back its late BEGIN."""
    tag = f"llmgw-wait-{uuid.uuid4().hex[:8]}"
    a = await make_store()
    b = await make_store(database.url if database.kind == "sqlite"
                         else with_params(database.url, application_name=tag))

    async def b_waits() -> bool:
        if database.kind == "sqlite":
            return _running_on_catalog_thread(b)
        rows = await database.fetch(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = ? AND wait_event_type = 'Lock'", (tag,))
        return bool(rows[0][0])

    async def put(store: AnyStore, name: str) -> None:
        async with store.change() as change:
            await change.put_model(stored(name))

    async with a.change() as change:
        await change.put_model(stored("first"))
        waiting = asyncio.create_task(put(b, "cancelled"))
        await wait_for(b_waits, "b's change to wait for a's lock")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 30)
    # b's BEGIN takes the lock once a commits, and must be rolled back at once.
    async with asyncio.timeout(30):
        await put(a, "second")
        await put(b, "third")
        await put(a, "fourth")
    assert [m.name for m in await a.models()] == ["first", "fourth", "second", "third"]
    assert await b.catalog_version() == 4
