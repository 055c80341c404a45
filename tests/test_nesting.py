"""Nesting depth is bounded wherever JSON or YAML enters: a 400 (or the CLI's
definition error) naming the file or body, never a RecursionError."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.catalog.decode import decode_json, decode_model_file
from llmgw.catalog.model import Model
from llmgw.cli import main
from llmgw.errors import DefinitionError
from llmgw.nesting import MAX_DEPTH, MAX_YAML_DEPTH, json_depth

DEEP_YAML = "name: trial\nsource: " + "[" * 500 + "]" * 500 + "\n"


@pytest.mark.parametrize(("text", "depth"), [
    (b"{}", 1), (b'{"a": [1, {"b": []}]}', 4), (b'"[[[["', 0),
    (b'["\\"[[[[[[", {"x": "]]]]"}]', 2),
])
def test_json_depth_counts_brackets_outside_strings(text: bytes, depth: int) -> None:
    assert json_depth(text, limit=0) == depth


def test_json_depth_is_exact_past_the_limit_even_with_brackets_in_strings() -> None:
    body = b'{"m": "' + b"[" * 5000 + b'", "x": ' + b"[" * 200 + b"]" * 200 + b"}"
    assert json_depth(body) == 201
    assert json_depth(b"[" * 10_000) == 10_000   # unterminated: counted as far as it goes


def test_a_deep_json_body_is_a_definition_error_naming_it() -> None:
    with pytest.raises(DefinitionError, match=rf"request body: nested more than {MAX_DEPTH}"):
        decode_json(b'{"name": ' + b"[" * 2000 + b"]" * 2000 + b"}", Model)


def test_a_deep_yaml_file_is_a_definition_error_naming_the_file_and_line() -> None:
    with pytest.raises(DefinitionError, match=rf"trial.yaml: not valid YAML \(line 2, column "
                                              rf"\d+\): nested more than {MAX_YAML_DEPTH} levels"):
        decode_model_file(DEEP_YAML, source="trial.yaml")


def test_yaml_as_deep_as_the_limit_is_read() -> None:
    ok = "name: trial\nsource: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1)
    with pytest.raises(DefinitionError, match="trial.yaml: source: expected a source"):
        decode_model_file(ok, source="trial.yaml")


def test_ctl_model_add_f_refuses_a_deep_file_without_a_traceback(tmp_path: Path) -> None:
    f = tmp_path / "trial.yaml"
    f.write_text(DEEP_YAML)
    result = CliRunner().invoke(main, ["ctl", "model", "add", "-f", str(f)],
                                env={"LLMGW_URL": "http://127.0.0.1:9", "LLMGW_ADMIN_TOKEN": "x"})
    assert result.exit_code == 1, result.output
    assert f"{f}: not valid YAML" in result.output
    assert "nested more than" in result.output
    assert not isinstance(result.exception, RecursionError)


def test_serve_refuses_a_deep_config_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("gateway: " + "{a: " * 600 + "1" + "}" * 600 + "\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert f"{config}: not valid YAML" in result.output
    assert "nested more than" in result.output
