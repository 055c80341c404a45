"""``llmgw mirror unused`` and ``remove``: what the catalog uses, and each refusal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmgw.cli import main
from llmgw.weights.mirror.uses import source_path

from .servers import JsonServer, closed_port_url


def view(name: str, source: str | None, stale: int = 0) -> dict[str, Any]:
    """A model as GET /api/v1/models shows it (the fields these commands read)."""
    definition: dict[str, Any] = {"name": name}
    if source is None:
        definition["upstream"] = ["http://10.0.0.9:8000/v1"]
    else:
        definition.update(source=source, engine="vllm")
    return {"name": name, "origin": "runtime", "external": source is None,
            "stale_replicas": stale, "definition": definition}


CATALOG = [
    # A directory, spelled with another scheme case, host, no trailing slash, '//'.
    view("qwen-coder", "HTTP://MIRROR.Internal:8070//qwen/2024-11"),
    # A file, reached through an address instead of the name, with a trailing slash.
    view("llama", "https://10.0.0.5/llama/v1/model.gguf/"),
    # Percent-encoded.
    view("nomic", "http://mirror.internal:8070/nomic/q8%5F0/nomic.gguf"),
    view("hub-model", "hf://Qwen/Qwen2.5-14B-Instruct"),
    view("external", None),
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "mirror"
    for rel in ("qwen/2024-11/model.gguf", "qwen/2024-11/config.json", "llama/v1/model.gguf",
                "llama/v0/model.gguf", "nomic/q8_0/nomic.gguf", "old/x.bin",
                "qwen/.2025-01.adding-1-ab/model.gguf",
                "qwen--qwen2.5-14b-instruct/main/model.safetensors"):
        p = r / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"w" * 1000)
        if rel.endswith(".gguf"):
            p.with_name(p.name + ".sha256").write_text(f"{'0' * 64}  {p.name}\n")
    return r


@pytest.fixture
def api() -> Iterator[JsonServer]:
    server = JsonServer({"/api/v1/models": CATALOG})
    try:
        yield server
    finally:
        server.stop()


def run(*args: str) -> Any:
    return CliRunner().invoke(main, ["mirror", *args])


def test_unused_lists_only_files_no_entry_uses(root: Path, api: JsonServer) -> None:
    """Files under a used directory, or named by a source spelled with another scheme,
    host, case, slashes or percent-encoding, are in use; the rest is listed, sidecars
    with their file and hidden staging not at all. The admin token is sent."""
    result = run("unused", "--dir", str(root), "--url", api.url, "--token", "t0k", "-o", "json")
    assert result.exit_code == 0, result.output
    assert [f["path"] for f in json.loads(result.stdout)] == ["llama/v0/model.gguf",
                                                             "old/x.bin"]
    assert api.seen[0].headers["Authorization"] == "Bearer t0k"


def test_a_base_url_path_prefix_is_stripped(root: Path) -> None:
    """With --mirror-url naming a path prefix (a mirror behind a proxy), sources under
    that prefix name the files below it."""
    server = JsonServer({"/api/v1/models": [view("old", "https://proxy/models/old/x.bin")]})
    try:
        result = run("unused", "--dir", str(root), "--url", server.url, "--mirror-url",
                     "http://proxy/models/", "-o", "json")
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    assert "old/x.bin" not in [f["path"] for f in json.loads(result.stdout)]


def test_unused_refuses_when_the_api_is_unreachable(root: Path) -> None:
    """An unreachable catalog is not an empty one: unused refuses, lists nothing, and
    says why."""
    result = run("unused", "--dir", str(root), "--url", closed_port_url())
    assert result.exit_code == 1
    assert "cannot read the catalog" in result.output
    assert "Refusing to list unused files" in result.output
    assert "old/x.bin" not in result.output


def test_unused_refuses_without_a_valid_token(root: Path) -> None:
    """A 401 from the API is a refusal too, pointing at the token."""
    server = JsonServer({"/api/v1/models": {"error": {"message": "admin token required"}}},
                        status=401)
    try:
        result = run("unused", "--dir", str(root), "--url", server.url)
    finally:
        server.stop()
    assert result.exit_code == 1
    assert "Refusing to list unused files" in result.output
    assert "--token" in result.output


def test_unused_refuses_an_answer_that_is_not_a_model_list(root: Path) -> None:
    """Something other than a list of models (a proxy's page, another service) is refused."""
    server = JsonServer({"/api/v1/models": {"models": []}})
    try:
        result = run("unused", "--dir", str(root), "--url", server.url)
    finally:
        server.stop()
    assert result.exit_code == 1
    assert "refusing to list unused files" in result.output


def test_an_empty_catalog_that_answers_lists_everything(root: Path) -> None:
    """A reachable, empty catalog really does leave every file unused."""
    server = JsonServer({"/api/v1/models": []})
    try:
        result = run("unused", "--dir", str(root), "--url", server.url, "-o", "json")
    finally:
        server.stop()
    assert result.exit_code == 0
    assert len(json.loads(result.stdout)) == 7


def test_stale_replicas_are_warned_about(root: Path) -> None:
    """A model with replicas from an older definition is named: its old source may
    still be fetched."""
    server = JsonServer({"/api/v1/models": [view("llama", "http://m/llama/v1/", stale=1)]})
    try:
        result = run("unused", "--dir", str(root), "--url", server.url)
    finally:
        server.stop()
    assert result.exit_code == 0
    assert "warning: llama has replicas started from an older definition" in result.output


def test_remove_refuses_a_file_in_use(root: Path, api: JsonServer) -> None:
    """A file an entry uses (through its directory) is refused, naming the entry and
    saying to retire it first; the file stays."""
    result = run("remove", "qwen/2024-11/model.gguf", "--dir", str(root), "--url", api.url)
    assert result.exit_code == 1
    assert "qwen-coder" in result.output
    assert "Retire the entry first" in result.output
    assert (root / "qwen/2024-11/model.gguf").exists()


def test_remove_refuses_a_directory_holding_a_file_in_use(root: Path, api: JsonServer) -> None:
    """Removing a directory is refused when any file inside it is used."""
    result = run("remove", "llama", "--dir", str(root), "--url", api.url)
    assert result.exit_code == 1
    assert "llama" in result.output
    assert (root / "llama/v1/model.gguf").exists()
    assert (root / "llama/v0/model.gguf").exists()


def test_remove_deletes_an_unused_file_with_its_sum(root: Path, api: JsonServer) -> None:
    """An unused file goes with its .sha256, and directories left empty go too."""
    result = run("remove", str(root / "llama/v0/model.gguf"), "--dir", str(root),
                 "--url", api.url)
    assert result.exit_code == 0, result.output
    assert "removed llama/v0/model.gguf" in result.output
    assert not (root / "llama/v0").exists()
    assert (root / "llama/v1/model.gguf").exists()


def test_remove_deletes_an_unused_directory(root: Path, api: JsonServer) -> None:
    """An unused directory is removed whole."""
    result = run("remove", "old/", "--dir", str(root), "--url", api.url)
    assert result.exit_code == 0, result.output
    assert not (root / "old").exists()


def test_remove_refuses_when_the_catalog_cannot_be_read(root: Path) -> None:
    """Without the catalog remove cannot know what is used, so it refuses."""
    result = run("remove", "old/x.bin", "--dir", str(root), "--url", closed_port_url())
    assert result.exit_code == 1
    assert "Refusing to remove old/x.bin" in result.output
    assert (root / "old/x.bin").exists()


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "qwen/.2025-01.adding-1-ab",
                                  "."])
def test_remove_refuses_paths_outside_the_mirror(root: Path, api: JsonServer, path: str) -> None:
    """Paths outside the mirror, hidden staging and the mirror itself are refused."""
    result = run("remove", path, "--dir", str(root), "--url", api.url)
    assert result.exit_code == 1
    assert (root / "qwen/.2025-01.adding-1-ab/model.gguf").exists()


@pytest.mark.parametrize(("source", "want"), [
    ("http://m:8070/a/b/", "a/b"),
    ("HTTPS://M/a//b", "a/b"),
    ("http://10.0.0.5/a/./c/../b/", "a/b"),
    ("http://m/a%2Fb", "a/b"),
    ("http://m/", ""),
    ("hf://org/repo", "org--repo/main"),
    ("pkg:something", None),
    ("relative/path.gguf", None),
])
def test_source_path_normalises_spelling(tmp_path: Path, source: str, want: str | None) -> None:
    """Scheme, host, case of the scheme, slashes, dot segments and percent-encoding are
    normalised away; non-mirror forms name nothing."""
    assert source_path(source, tmp_path) == want


def test_source_path_maps_local_paths_inside_the_mirror(tmp_path: Path) -> None:
    """A local path (or file:// URL) inside the mirror directory names that file."""
    (tmp_path / "a").mkdir()
    assert source_path(str(tmp_path / "a" / "m.gguf"), tmp_path) == "a/m.gguf"
    assert source_path(f"file://{tmp_path}/a/m.gguf", tmp_path) == "a/m.gguf"
    assert source_path("/elsewhere/m.gguf", tmp_path) is None


def test_remove_refuses_the_directory_a_hub_model_is_fetched_from(
        root: Path, api: JsonServer) -> None:
    """An hf:// entry uses the directory its Nomad job fetches, so removing it is refused
    and unused does not list it."""
    result = run("remove", "qwen--qwen2.5-14b-instruct", "--dir", str(root), "--url", api.url)
    assert result.exit_code == 1
    assert "hub-model" in result.output
    assert (root / "qwen--qwen2.5-14b-instruct/main/model.safetensors").exists()
    listed = run("unused", "--dir", str(root), "--url", api.url)
    assert "qwen--qwen2.5-14b-instruct" not in listed.output


def test_remove_refuses_the_sum_beside_a_file_in_use(root: Path, api: JsonServer) -> None:
    """The ``.sha256`` of a file an entry uses is refused like the file itself."""
    result = run("remove", "llama/v1/model.gguf.sha256", "--dir", str(root), "--url", api.url)
    assert result.exit_code == 1
    assert "llama" in result.output
    assert (root / "llama/v1/model.gguf.sha256").exists()
