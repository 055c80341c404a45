"""API keys: the keys file, the `llmgw keys` commands, lookup, rate limits and reloads."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli import main
from llmgw.errors import ConfigError
from llmgw.gateway.keys import (
    KEY_PREFIX,
    KeyRing,
    KeysFileWatcher,
    add_key,
    hash_key,
    read_keys_file,
    revoke_key,
)
from llmgw.tenancy import key_id


def test_add_prints_the_key_once_and_stores_only_its_hash(tmp_path: Path) -> None:
    """`keys add` prints a 256-bit key; the file holds its SHA-256, never the key."""
    path = tmp_path / "keys.json"
    result = CliRunner().invoke(main, ["keys", "add", "alice", "--models", "m1,m2", "--rpm",
                                       "60", "--keys-file", str(path)])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip()
    assert key.startswith(KEY_PREFIX)
    assert len(key) >= len(KEY_PREFIX) + 43
    text = path.read_text()
    assert key not in text
    entry = json.loads(text)["keys"][0]
    assert entry["sha256"] == hash_key(key)
    assert entry["models"] == ["m1", "m2"]
    assert entry["rpm"] == 60
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_list_never_shows_keys(tmp_path: Path) -> None:
    """`keys list` shows names, models and limits, and neither keys nor hashes."""
    path = tmp_path / "keys.json"
    key = add_key(path, "alice", ["m1"], 30)
    add_key(path, "bob")
    runner = CliRunner()
    table = runner.invoke(main, ["keys", "list", "--keys-file", str(path)])
    as_json = runner.invoke(main, ["keys", "list", "--keys-file", str(path), "-o", "json"])
    assert table.exit_code == 0
    assert as_json.exit_code == 0
    for out in (table.output, as_json.output):
        assert key not in out
        assert hash_key(key) not in out
    assert "alice" in table.output
    assert "unlimited" in table.output
    rows = json.loads(as_json.output)
    assert [(r["name"], r["models"], r["rpm"]) for r in rows] == [("alice", ["m1"], 30),
                                                                   ("bob", [], None)]
    # The id that owns each key's objects, the same in the table.
    assert rows[0]["id"] == key_id(hash_key(key))
    assert rows[0]["id"] in table.output


def test_revoke_removes_the_key_and_unknown_names_fail(tmp_path: Path) -> None:
    """`keys revoke` deletes the entry; revoking an unknown name exits 1 naming the keys."""
    path = tmp_path / "keys.json"
    add_key(path, "alice")
    add_key(path, "bob")
    runner = CliRunner()
    ok = runner.invoke(main, ["keys", "revoke", "alice", "--keys-file", str(path)])
    assert ok.exit_code == 0, ok.output
    assert [k.name for k in read_keys_file(path).keys] == ["bob"]
    missing = runner.invoke(main, ["keys", "revoke", "alice", "--keys-file", str(path)])
    assert missing.exit_code == 1
    assert "no key named 'alice'" in missing.output
    assert "bob" in missing.output


def test_duplicate_name_and_bad_input_are_refused(tmp_path: Path) -> None:
    """A second key with a taken name, a bad name or a zero rpm is refused with exit 1."""
    path = tmp_path / "keys.json"
    runner = CliRunner()
    assert runner.invoke(main, ["keys", "add", "alice", "--keys-file", str(path)]).exit_code == 0
    again = runner.invoke(main, ["keys", "add", "alice", "--keys-file", str(path)])
    assert again.exit_code == 1
    assert "already exists" in again.output
    bad = runner.invoke(main, ["keys", "add", "al ice", "--keys-file", str(path)])
    assert bad.exit_code == 1
    assert "key name" in bad.output
    zero = runner.invoke(main, ["keys", "add", "carol", "--rpm", "0", "--keys-file", str(path)])
    assert zero.exit_code == 1
    assert "--rpm" in zero.output
    assert [k.name for k in read_keys_file(path).keys] == ["alice"]


def test_keys_file_comes_from_the_server_config(tmp_path: Path) -> None:
    """With --config, the commands use that file's keys_file; with neither, exit 2."""
    keys_path = tmp_path / "keys.json"
    config = tmp_path / "server.yaml"
    config.write_text(f"keys_file: {keys_path}\n")
    runner = CliRunner()
    result = runner.invoke(main, ["keys", "add", "ci", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert [k.name for k in read_keys_file(keys_path).keys] == ["ci"]
    neither = runner.invoke(main, ["keys", "list"], env={"LLMGW_KEYS_FILE": "",
                                                          "LLMGW_CONFIG": ""})
    assert neither.exit_code == 2
    assert "--keys-file" in neither.output


def test_lookup_finds_keys_by_hash_only() -> None:
    """A presented key is found by its hash; anything else, including the hash itself, is not."""
    key = "sk-llmgw-example-key-with-enough-entropy-for-a-test"
    ring = KeyRing()
    from llmgw.gateway.keys import KeyEntry

    ring.replace([KeyEntry(name="alice", sha256=hash_key(key), models=["m1"])])
    found = ring.lookup(key)
    assert found is not None
    assert found.name == "alice"
    assert found.allows("m1")
    assert not found.allows("m2")
    assert ring.lookup(hash_key(key)) is None
    assert ring.lookup(key + "x") is None


def test_rate_limit_allows_a_minute_then_refills() -> None:
    """A key with rpm N admits N at once, then one every 60/N seconds, saying how long to wait."""
    from llmgw.gateway.keys import ApiKey

    k = ApiKey(name="a", sha256="", models=None, rpm=3)
    assert [k.admit(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = k.admit(100.0)
    assert wait == pytest.approx(20.0)
    assert k.admit(110.0) == pytest.approx(10.0)
    assert k.admit(120.0) == 0.0
    unlimited = ApiKey(name="b", sha256="", models=None, rpm=None)
    assert all(unlimited.admit(0.0) == 0.0 for _ in range(1000))


def test_reload_keeps_buckets_of_unchanged_keys(tmp_path: Path) -> None:
    """Reloading the file does not hand a rate-limited key a fresh minute."""
    path = tmp_path / "keys.json"
    add_key(path, "alice", rpm=1)
    ring = KeyRing()
    watcher = KeysFileWatcher(path, ring)
    watcher.load()
    (alice,) = list(ring._by_hash.values())
    assert alice.admit(50.0) == 0.0
    add_key(path, "bob")
    assert watcher.check()
    alice_again = next(k for k in ring._by_hash.values() if k.name == "alice")
    assert alice_again.admit(50.0) > 0


def test_watcher_reloads_on_change_and_keeps_keys_when_the_file_breaks(tmp_path: Path) -> None:
    """A changed file is reloaded; a broken one leaves the keys in force; a removed one, none."""
    path = tmp_path / "keys.json"
    key = add_key(path, "alice")
    ring = KeyRing()
    watcher = KeysFileWatcher(path, ring)
    watcher.load()
    assert not watcher.check()
    assert ring.lookup(key) is not None
    path.write_text("{ not json")
    assert not watcher.check()
    assert ring.lookup(key) is not None
    path.unlink()
    assert watcher.check()
    assert ring.lookup(key) is None


def test_a_bad_keys_file_at_start_is_a_config_error(tmp_path: Path) -> None:
    """A keys file that cannot be decoded stops start-up with its path in the message."""
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"name": "x"}]}')
    with pytest.raises(ConfigError, match=str(path)):
        KeysFileWatcher(path, KeyRing()).load()


def test_revoke_on_a_missing_file_names_it(tmp_path: Path) -> None:
    """Revoking from a file that does not exist says there is no such key."""
    from llmgw.errors import NotFoundError

    with pytest.raises(NotFoundError, match="keys: none"):
        revoke_key(tmp_path / "absent.json", "alice")
