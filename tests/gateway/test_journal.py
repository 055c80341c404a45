"""The ledger's journal: records on disk before the store has them, shipped once, bounded."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from llmgw.config import GatewayConfig, ServerConfig
from llmgw.errors import ConfigError
from llmgw.gateway import Gateway
from llmgw.gateway import journal as journal_module
from llmgw.gateway.journal import PREFIX, SEGMENT, Journal, journal_location
from llmgw.gateway.ledger import Ledger
from llmgw.store.base import state_home
from llmgw.store.sqlite import SqliteStore
from tests.gateway.doubles import CatalogHolder, FakeBackend
from tests.gateway.test_ledger import _FlakyStore, rec, rows


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> SqliteStore:
    store = SqliteStore(f"sqlite:///{tmp_path / 'l.db'}")
    await store.open()
    yield store  # type: ignore[misc]
    await store.close()


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{PREFIX}*{SEGMENT}"))


def journaled_lines(directory: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in segments(directory))


async def test_a_record_is_on_disk_as_soon_as_it_is_made(
        sqlite_store: SqliteStore, tmp_path: Path) -> None:
    """The record is written to the journal by ``record`` itself, with no loop turn."""
    ledger = Ledger(sqlite_store, interval=3600, capacity=100, retention=86400,
                    journal_dir=str(tmp_path / "j"))
    ledger.record(rec("a"))
    assert journaled_lines(tmp_path / "j") == 1
    await ledger.tick()
    assert [r[0] for r in await rows(sqlite_store)] == ["a"]
    assert ledger.waiting == 0
    await ledger.close()
    # Everything in the store: a clean stop leaves no file.
    assert list((tmp_path / "j").iterdir()) == []


async def test_a_written_segment_is_emptied_once_it_is_large(
        sqlite_store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The current file is emptied in place when the store holds all it had and it
    reached EMPTY_AT; below it, it keeps written records (a restart ships them again)."""
    monkeypatch.setattr(journal_module, "EMPTY_AT", 400)
    ledger = Ledger(sqlite_store, interval=3600, capacity=100, retention=86400,
                    journal_dir=str(tmp_path / "j"))
    ledger.record(rec("a"))
    await ledger.tick()
    assert journaled_lines(tmp_path / "j") == 1         # small: kept
    for i in range(5):
        ledger.record(rec(f"b{i}"))
    await ledger.tick()
    assert journaled_lines(tmp_path / "j") == 0
    assert ledger.journal is not None
    assert ledger.journal.bytes == 0
    assert len(await rows(sqlite_store)) == 6
    await ledger.close()


def test_a_sync_commits_the_directory_only_when_a_file_came_or_went(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records written: the segment is synced, not the directory (its names did not
    change, and each directory fsync is a journal commit of the filesystem's); a
    segment made or deleted: the directory too, once; nothing written: nothing."""
    synced: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        synced.append("file")
        real_fdatasync(fd)

    monkeypatch.setattr(journal_module.os, "fsync", fsync)
    monkeypatch.setattr(journal_module.os, "fdatasync", fdatasync)
    journal = Journal(tmp_path / "j", max_bytes=1 << 20, ident="t", segment_records=2)
    journal.sync()
    assert synced == ["file", "dir"]        # the first segment was made
    synced.clear()
    journal.sync()
    assert synced == []
    assert journal.append(rec("a"))
    journal.kept()
    journal.sync()
    assert synced == ["file"]
    synced.clear()
    journal.spill()                         # a new, disk-only segment
    assert journal.append(rec("b"))
    journal.sync()
    assert synced == ["file", "file", "dir"]    # the old segment, closed; the new; names
    synced.clear()
    journal.written(1)                      # the first segment's record is stored: deleted
    journal.sync()
    assert synced == ["dir"]
    journal.close()


async def test_an_outage_past_the_memory_buffer_spills_to_disk_and_loses_nothing(
        sqlite_store: SqliteStore, tmp_path: Path) -> None:
    """Past ``ledger_buffer`` records the rest wait on disk only, and all are written once,
    in order, when the store is back."""
    flaky = _FlakyStore(sqlite_store)
    dropped: list[int] = []
    ledger = Ledger(flaky, interval=1, capacity=5, retention=86400,  # type: ignore[arg-type]
                    on_drop=dropped.append, journal_dir=str(tmp_path / "j"))
    flaky.down = True
    for i in range(23):
        ledger.record(rec(f"r{i:02}"))
        await ledger.tick()
    assert len(ledger) == 5             # memory holds what it may
    assert ledger.waiting == 23
    assert ledger.spilled == 18
    assert ledger.pending_teams == {"ml": 230}
    assert journaled_lines(tmp_path / "j") == 23
    assert dropped == []
    flaky.down = False
    flaky.lose_ack = True               # the first batch is written twice
    await ledger.tick()
    await ledger.tick()
    assert [r[0] for r in await rows(sqlite_store)] == [f"r{i:02}" for i in range(23)]
    assert ledger.waiting == 0
    assert ledger.pending_teams == {}
    assert journaled_lines(tmp_path / "j") == 0
    await ledger.close()
    assert segments(tmp_path / "j") == []


async def test_at_the_disk_bound_records_are_counted_not_kept_on_disk(
        sqlite_store: SqliteStore, tmp_path: Path) -> None:
    """``journal_max`` bounds the files: past it a record is kept in memory while it has
    room, else dropped, and both are counted."""
    flaky = _FlakyStore(sqlite_store)
    unjournaled: list[int] = []
    dropped: list[int] = []
    one = len(rec("r00").id) + 120      # about one encoded record
    ledger = Ledger(flaky, interval=1, capacity=3, retention=86400,  # type: ignore[arg-type]
                    journal_dir=str(tmp_path / "j"), journal_max=4 * one,
                    on_unjournaled=unjournaled.append, on_drop=dropped.append)
    flaky.down = True
    for i in range(10):
        ledger.record(rec(f"r{i:02}"))
    assert ledger.journal is not None
    assert ledger.journal.bytes <= 4 * one
    journaled = journaled_lines(tmp_path / "j")
    assert sum(unjournaled) == 10 - journaled
    assert sum(dropped) == ledger.dropped == 10 - ledger.waiting
    flaky.down = False
    await ledger.tick()
    assert len(await rows(sqlite_store)) == ledger.written == 10 - ledger.dropped
    await ledger.close()


_KILLED = textwrap.dedent("""
    import sys, time
    from llmgw.gateway.ledger import Ledger
    from llmgw.store.base import UsageRecord

    class Down:
        is_open = False

    ledger = Ledger(Down(), interval=3600, capacity=int(sys.argv[2]), retention=86400,
                    journal_dir=sys.argv[1])
    for i in range(int(sys.argv[3])):
        ledger.record(UsageRecord(id=f"k{i}", at=time.time(), key="k", team="ml", model="m",
                                  replica="r", gpu_class="", prompt_tokens=1, cached_tokens=0,
                                  completion_tokens=1, status=200, latency=0.1, ttft=None))
    print("recorded", flush=True)
    time.sleep(600)
""")


async def killed_with_records(directory: Path, capacity: int, count: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED, str(directory), str(capacity), str(count),
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            assert await proc.stdout.readline() == b"recorded\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


@pytest.mark.parametrize("capacity", [1000, 7], ids=["in-memory", "spilled"])
async def test_the_records_of_a_killed_process_are_shipped_by_the_next_one(
        sqlite_store: SqliteStore, tmp_path: Path, capacity: int) -> None:
    """A process SIGKILLed with records unwritten leaves them in its files; the next
    process with that directory ships each once and removes the files."""
    journal = tmp_path / "j"
    await killed_with_records(journal, capacity, 40)
    assert journaled_lines(journal) == 40
    ledger = Ledger(sqlite_store, interval=3600, capacity=10, retention=86400,
                    journal_dir=str(journal))
    ledger.adopt()
    ledger.adopt()                      # a second search takes nothing twice
    ledger.record(rec("mine"))
    await ledger.tick()
    assert sorted(r[0] for r in await rows(sqlite_store)) == sorted(
        [f"k{i}" for i in range(40)] + ["mine"])
    assert ledger.journal is not None
    assert ledger.journal.replayed == 40
    assert ledger.pending_teams == {}
    await ledger.close()
    assert list(journal.iterdir()) == []


async def test_a_live_process_files_are_not_taken(
        sqlite_store: SqliteStore, tmp_path: Path) -> None:
    """Two processes share a directory: neither ships the other's records."""
    journal = str(tmp_path / "j")
    flaky = _FlakyStore(sqlite_store)
    flaky.down = True
    first = Ledger(flaky, interval=3600, capacity=10, retention=86400,  # type: ignore[arg-type]
                   journal_dir=journal)
    first.record(rec("first"))
    await first.tick()
    second = Ledger(sqlite_store, interval=3600, capacity=10, retention=86400,
                    journal_dir=journal)
    second.adopt()
    await second.tick()
    assert await rows(sqlite_store) == []
    await second.close()
    flaky.down = False
    await first.close()
    assert [r[0] for r in await rows(sqlite_store)] == ["first"]


def test_a_journal_directory_that_cannot_be_written_stops_the_start_naming_it(
        tmp_path: Path, sqlite_store: SqliteStore) -> None:
    """The gateway refuses to start, before it serves, with the directory in the message."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cases = [blocker / "journal"]
    if os.geteuid() != 0:               # root writes a read-only directory all the same
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases.append(locked)
    for where in cases:
        config = ServerConfig(listen="127.0.0.1:0",
                              gateway=GatewayConfig(journal_dir=str(where)))
        with pytest.raises(ConfigError) as caught:
            Gateway(config, CatalogHolder([]), FakeBackend(), sqlite_store)
        assert str(where) in caught.value.message
        assert caught.value.field == "gateway.journal_dir"


def test_the_journal_is_on_by_default_in_the_stores_own_directory(
        tmp_path: Path, sqlite_store: SqliteStore) -> None:
    """Unset, the journal goes beside a SQLite file; off, there is none; a directory given
    is used as it is."""
    gateway = GatewayConfig()
    assert journal_location(gateway, sqlite_store) == sqlite_store.path.with_name(
        sqlite_store.path.name + ".d") / "journal"
    assert journal_location(GatewayConfig(journal=False), sqlite_store) is None
    assert journal_location(GatewayConfig(journal_dir=str(tmp_path / "j")),
                            sqlite_store) == tmp_path / "j"
    server = Gateway(ServerConfig(listen="127.0.0.1:0"), CatalogHolder([]), FakeBackend(),
                     sqlite_store)
    assert server.ledger is not None
    assert server.ledger.journal is not None
    assert server.ledger.journal.dir == journal_location(gateway, sqlite_store)


def test_a_database_servers_journal_is_under_the_state_home_by_its_url(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One directory per database (a schema of its own counts as one), the same whatever
    the password, under $XDG_STATE_HOME — or ~/.local/state where that is unset or not
    absolute, as the XDG rule says."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    base = "postgresql://llmgw:{}@db.internal:5432/llmgw"
    first = state_home(base.format("old-secret"))
    assert first.parent == tmp_path / "llmgw"
    assert "secret" not in str(first)
    assert state_home(base.format("new-secret")) == first
    assert state_home(base.format("x") + "?options=-csearch_path%3Dother") != first
    assert state_home("postgresql://llmgw@db.internal:5432/billing") != first
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    assert state_home(base.format("x")).parent == Path.home() / ".local" / "state" / "llmgw"
