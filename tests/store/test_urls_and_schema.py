"""Parsing database URLs, and the migration plan, with no database involved."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from llmgw.errors import ConfigError
from llmgw.store import open_store
from llmgw.store.postgres import PostgresStore
from llmgw.store.schema import LATEST, MIGRATIONS, SchemaTooNewError, pending
from llmgw.store.sqlite import SqliteStore, sqlite_path


@pytest.mark.parametrize(("url", "path"), [
    ("sqlite:///llmgw.db", Path("llmgw.db")),
    ("sqlite:///var/llmgw/state.db", Path("var/llmgw/state.db")),
    ("sqlite:////var/lib/llmgw/state.db", Path("/var/lib/llmgw/state.db")),
    ("sqlite:////srv/llm%20gw/state.db", Path("/srv/llm gw/state.db")),
])
def test_sqlite_url_names_a_relative_or_absolute_file(url: str, path: Path) -> None:
    """Three slashes give a path relative to the working directory, four an absolute one."""
    assert sqlite_path(url) == path


@pytest.mark.parametrize("url", [
    "sqlite://", "sqlite:///", "sqlite:///:memory:", "sqlite:/llmgw.db", "sqlite:///x.db?mode=ro",
])
def test_sqlite_url_without_a_usable_file_is_a_config_error(url: str) -> None:
    """A SQLite URL naming no file (or memory, which processes cannot share) is refused."""
    with pytest.raises(ConfigError, match="sqlite:///relative/path") as caught:
        SqliteStore(url)
    assert caught.value.field == "database"


def test_malformed_postgres_url_is_a_config_error_without_the_password() -> None:
    """A Postgres URL libpq cannot parse is refused at construction, password masked."""
    with pytest.raises(ConfigError, match="not a valid PostgreSQL URL") as caught:
        PostgresStore("postgresql://llmgw:hunter2@db/llmgw?sslmod=require")
    assert "hunter2" not in str(caught.value)


def test_open_store_picks_the_adapter_by_scheme(tmp_path: Path) -> None:
    """open_store returns the SQLite or the Postgres adapter, unopened, by URL scheme."""
    assert isinstance(open_store(f"sqlite:///{tmp_path}/x.db"), SqliteStore)
    assert isinstance(open_store("postgresql://postgres@127.0.0.1/test"), PostgresStore)
    assert isinstance(open_store("postgres://postgres@127.0.0.1/test"), PostgresStore)


async def test_relative_sqlite_path_is_created_under_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening sqlite:///a/b/llmgw.db creates a/b under the working directory, in WAL mode."""
    monkeypatch.chdir(tmp_path)
    store = SqliteStore("sqlite:///state/nested/llmgw.db")
    await store.open()
    await store.close()
    db = sqlite3.connect(tmp_path / "state" / "nested" / "llmgw.db")
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_pending_lists_what_is_not_yet_applied_in_order() -> None:
    """A fresh database needs every migration; a migrated one needs none."""
    assert pending([]) == list(MIGRATIONS)
    assert pending([m.number for m in MIGRATIONS]) == []


def test_database_migrated_by_a_newer_llmgw_is_refused() -> None:
    """A recorded migration number this code does not know is refused, naming it."""
    with pytest.raises(SchemaTooNewError, match=rf"\[{LATEST + 1}\]"):
        pending([*(m.number for m in MIGRATIONS), LATEST + 1])


def test_every_migration_has_sql_for_both_dialects() -> None:
    """No migration can create a table on one adapter and not the other."""
    for migration in MIGRATIONS:
        assert migration.sqlite
        assert migration.postgres
        assert len(migration.sqlite) == len(migration.postgres)
