"""`llmgw serve` refuses a bad configuration before it binds a port (STYLE 10)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from llmgw.cli import main


def serve(tmp_path: Path, text: str) -> tuple[int, str]:
    config = tmp_path / "server.yaml"
    config.write_text(text)
    result = CliRunner().invoke(main, ["serve", "--config", str(config)],
                                env={"LLMGW_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"})
    return result.exit_code, result.output


def test_an_unknown_key_exits_2_naming_the_file_and_key(tmp_path: Path) -> None:
    """A misspelt top-level key is a usage error with the key path."""
    code, out = serve(tmp_path, "listne: 127.0.0.1:1\n")
    assert code == 2
    assert "server.yaml: listne: unknown field" in out


def test_a_bad_gateway_setting_exits_2_before_anything_starts(tmp_path: Path) -> None:
    """Gateway settings are validated with the rest, not when the first request comes."""
    code, out = serve(tmp_path, "gateway: {max_body_size: lots}\n")
    assert code == 2, out
    assert "max_body_size" in out


def test_a_malformed_listen_address_exits_2(tmp_path: Path) -> None:
    """listen must be HOST:PORT."""
    code, out = serve(tmp_path, "listen: somewhere\n")
    assert code == 2
    assert "HOST:PORT" in out


def test_a_journal_directory_that_cannot_be_written_exits_2_naming_it(tmp_path: Path) -> None:
    """The usage journal's directory is tried at start: one that cannot be made stops
    serve before it binds, and the message names it."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, out = serve(tmp_path, f"listen: 127.0.0.1:1\ngateway: {{journal_dir: {blocker}/j}}\n")
    assert code == 2, out
    assert f"gateway.journal_dir: {blocker}/j cannot be written" in out
