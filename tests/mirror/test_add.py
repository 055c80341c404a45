"""``llmgw mirror add``: whole versions appear at once, checked, and are never replaced."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.catalog.source import HfSource, parse_source
from llmgw.cli import main
from llmgw.errors import LlmgwError
from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.mirror.add import add

from .conftest import wait_for
from .servers import FileServer, ThreadedMirror, running, sha

WEIGHTS = os.urandom(400_000)
COMMIT = "9a8b7c6d5e4f30211223344556677889900aabbc"
REPO = FakeRepo(
    files={"config.json": b'{"num_hidden_layers": 24}', "model.safetensors": WEIGHTS,
           "tokenizer/tokenizer.json": b'{"version": "1.0"}', ".gitattributes": b"*.bin lfs\n"},
    commit=COMMIT, lfs={"model.safetensors"},
)
BAD_LFS = FakeRepo(files={"model.safetensors": WEIGHTS}, lfs={"model.safetensors"},
                   wrong_lfs_sha={"model.safetensors"})


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    server = FakeHub({"Qwen/Qwen2.5-0.5B-Instruct": REPO, "org/bad-lfs": BAD_LFS})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "mirror"
    path.mkdir()
    return path


def hidden_entries(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob(".*")]


HUB_DIR = "qwen--qwen2.5-0.5b-instruct"


def test_a_hub_snapshot_lands_as_one_checked_version(hub: FakeHub, root: Path) -> None:
    """hf://org/repo is downloaded pinned to one commit into <org>--<repo>/main/ (where
    the Nomad job fetches it), each file with a .sha256 beside it; repository dot-files
    and download bookkeeping are not left on the mirror."""
    result = CliRunner().invoke(main, ["mirror", "add", "hf://Qwen/Qwen2.5-0.5B-Instruct",
                                       "--dir", str(root), "--mirror-url", "http://m:8070"])
    assert result.exit_code == 0, result.output
    version = root / HUB_DIR / "main"
    assert sorted(str(p.relative_to(version)) for p in version.rglob("*") if p.is_file()) == [
        "config.json", "config.json.sha256", "model.safetensors", "model.safetensors.sha256",
        "tokenizer/tokenizer.json", "tokenizer/tokenizer.json.sha256"]
    assert (version / "model.safetensors").read_bytes() == WEIGHTS
    assert (version / "model.safetensors.sha256").read_text() == \
        f"{sha(WEIGHTS)}  model.safetensors\n"
    assert f"{sha(WEIGHTS)}  {HUB_DIR}/main/model.safetensors" in result.output
    assert f"added {HUB_DIR}/main/ (commit {COMMIT})" in result.output
    assert "source for the catalog: hf://Qwen/Qwen2.5-0.5B-Instruct" in result.output
    assert hidden_entries(root) == []
    resolved = [s.path for s in hub.seen if "/resolve/" in s.path]
    assert resolved
    assert all(f"/resolve/{COMMIT}/" in p for p in resolved)


def test_one_hub_file_lands_under_its_revision(hub: FakeHub, root: Path) -> None:
    """hf://org/repo@rev/file adds just that file under <org>--<repo>/<rev>/."""
    result = add(f"hf://Qwen/Qwen2.5-0.5B-Instruct@{COMMIT}/model.safetensors", root)
    assert [f.path for f in result.files] == [f"{HUB_DIR}/{COMMIT}/model.safetensors"]
    assert sorted(p.name for p in (root / HUB_DIR / COMMIT).iterdir()) == [
        "model.safetensors", "model.safetensors.sha256"]


def test_another_file_of_a_hub_revision_joins_its_version(hub: FakeHub, root: Path) -> None:
    """A second file of a revision already on the mirror is linked into that version,
    beside the first, and the same file again is refused untouched."""
    add(f"hf://Qwen/Qwen2.5-0.5B-Instruct@{COMMIT}/model.safetensors", root)
    add(f"hf://Qwen/Qwen2.5-0.5B-Instruct@{COMMIT}/config.json", root)
    version = root / HUB_DIR / COMMIT
    assert sorted(p.name for p in version.iterdir()) == [
        "config.json", "config.json.sha256", "model.safetensors", "model.safetensors.sha256"]
    assert (version / "model.safetensors").read_bytes() == WEIGHTS
    with pytest.raises(LlmgwError, match="never replaced"):
        add(f"hf://Qwen/Qwen2.5-0.5B-Instruct@{COMMIT}/config.json", root)
    assert hidden_entries(root) == []


@pytest.mark.parametrize("option", [{"name": "qwen-small"}, {"version": "2025-01"}])
def test_a_hub_source_cannot_be_put_where_jobs_would_not_look(
        hub: FakeHub, root: Path, option: dict[str, str]) -> None:
    """--name and --version are refused for hf://, naming the path jobs fetch."""
    with pytest.raises(LlmgwError, match=f"{HUB_DIR}/main/"):
        add("hf://Qwen/Qwen2.5-0.5B-Instruct", root, **option)
    assert list(root.iterdir()) == []


def test_a_sum_differing_from_the_hubs_adds_nothing(hub: FakeHub, root: Path) -> None:
    """A file whose sha256 is not the Hub's LFS sum is refused with both sums, and the
    half-built version is removed."""
    result = CliRunner().invoke(main, ["mirror", "add", "hf://org/bad-lfs", "--dir", str(root)])
    assert result.exit_code == 1
    assert sha(WEIGHTS) in result.output
    assert "0" * 64 in result.output
    assert "nothing was added" in result.output
    assert list(root.iterdir()) == []


def test_an_existing_version_is_never_replaced(hub: FakeHub, root: Path) -> None:
    """Adding a version that exists is refused before anything is downloaded, and the
    version on the mirror is untouched."""
    version = root / HUB_DIR / "main"
    version.mkdir(parents=True)
    (version / "model.safetensors").write_bytes(b"what the nodes already have")
    result = CliRunner().invoke(main, ["mirror", "add", "hf://Qwen/Qwen2.5-0.5B-Instruct",
                                       "--dir", str(root)])
    assert result.exit_code == 1
    assert "never replaced" in result.output
    assert "hf://ORG/REPO@REVISION" in result.output
    assert (version / "model.safetensors").read_bytes() == b"what the nodes already have"
    assert not [s for s in hub.seen if "/resolve/" in s.path]
    assert hidden_entries(root) == []


def test_an_http_download_is_invisible_until_renamed_into_place(root: Path) -> None:
    """While an http(s) download runs, the version exists only under a hidden name the
    mirror server neither lists nor serves; when done it is renamed into place."""
    content = os.urandom(1_000_000)
    mirror = ThreadedMirror(root)
    with running(lambda: FileServer(content, name="weights.gguf", hold_at=300_000)) as srv:
        outcome: list[object] = []
        worker = threading.Thread(target=lambda: outcome.append(
            add(srv.url, root, name="llama", version="v1")))
        worker.start()
        try:
            assert srv.holding.wait(60)
            final = root / "llama" / "v1"
            assert not final.exists()
            part = root / "llama" / ".v1.download" / "weights.gguf.part"
            wait_for(lambda: part.stat().st_size == 300_000, 30, "the first 300 kB on disk")
            with urllib.request.urlopen(f"{mirror.url}/llama/") as r:
                assert json.loads(r.read())["entries"] == []
        finally:
            srv.release.set()
            worker.join(60)
            mirror.stop()
    assert final.is_dir()
    assert (final / "weights.gguf").read_bytes() == content
    assert (final / "weights.gguf.sha256").read_text() == f"{sha(content)}  weights.gguf\n"
    assert sorted(p.name for p in final.iterdir()) == ["weights.gguf", "weights.gguf.sha256"]
    assert hidden_entries(root) == []


def test_an_add_that_gives_up_keeps_the_part_it_names_and_the_next_run_resumes_it(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure names a partial file that exists; running the add again asks only for
    the rest, and publishes the whole, verified file."""
    import functools

    from llmgw.weights.mirror import add as add_module

    monkeypatch.setattr(add_module, "fetch_file",
                        functools.partial(add_module.fetch_file, retries=0, backoff=0))
    content = os.urandom(1_000_000)
    with running(lambda: FileServer(content, name="w.gguf", cut_after=[300_000, 0])) as srv:
        with pytest.raises(LlmgwError, match="resumes on the next run") as err:
            add(srv.url, root, name="w", version="v1")
        named = re.search(r"kept in (\S+) and resumes", err.value.message)
        assert named is not None
        assert Path(named.group(1)).stat().st_size == 300_000
        assert hidden_entries(root) != []
        add(srv.url, root, name="w", version="v1")
        assert srv.body_gets()[-1].headers["Range"] == "bytes=300000-"
    assert (root / "w" / "v1" / "w.gguf").read_bytes() == content
    assert sorted(p.name for p in (root / "w").iterdir()) == ["v1"]


def test_an_http_source_needs_a_version(root: Path) -> None:
    """A URL carries no version, so --version is required and the error says so."""
    result = CliRunner().invoke(main, ["mirror", "add", "http://127.0.0.1:9/x/model.gguf",
                                       "--dir", str(root)])
    assert result.exit_code == 1
    assert "give --version" in result.output


def test_a_length_short_of_the_promise_adds_nothing(root: Path) -> None:
    """A download whose length differs from what the server promised is refused and
    leaves nothing on the mirror."""
    with running(lambda: FileServer(WEIGHTS, name="w.gguf", head_extra=1000)) as srv:
        with pytest.raises(LlmgwError, match=f"received {len(WEIGHTS)} bytes but the server "
                                             f"promised {len(WEIGHTS) + 1000}"):
            add(srv.url, root, name="w", version="v1")
    assert list(root.iterdir()) == []


def test_a_wrong_sum_given_for_an_http_source_adds_nothing(root: Path) -> None:
    """--sha256 that does not match the download is refused, naming both sums."""
    with running(lambda: FileServer(WEIGHTS, name="w.gguf")) as srv:
        result = CliRunner().invoke(main, ["mirror", "add", srv.url, "--dir", str(root),
                                           "--version", "v1", "--sha256", "1" * 64])
    assert result.exit_code == 1
    assert "1" * 64 in result.output
    assert sha(WEIGHTS) in result.output
    assert list(root.iterdir()) == []


def test_copying_from_another_mirror_verifies_its_sums(threaded_mirror: ThreadedMirror,
                                                       tmp_path: Path) -> None:
    """Adding from another llmgw mirror checks the file against that mirror's .sha256."""
    target = tmp_path / "second"
    target.mkdir()
    result = CliRunner().invoke(main, ["mirror", "add",
                                       f"{threaded_mirror.url}/qwen/2024-11/model.gguf",
                                       "--dir", str(target), "--name", "qwen",
                                       "--version", "2024-11"])
    assert result.exit_code == 0, result.output
    first = (tmp_path / "mirror" / "qwen/2024-11/model.gguf").read_bytes()
    assert (target / "qwen/2024-11/model.gguf").read_bytes() == first
    assert "\r" not in result.output  # no progress bar off a terminal
    assert (target / "qwen/2024-11/model.gguf.sha256").read_text() == \
        (tmp_path / "mirror" / "qwen/2024-11/model.gguf.sha256").read_text()


@pytest.mark.parametrize(("source", "version"), [
    ("hf://Qwen/Qwen2.5-0.5B-Instruct", "main"),
    (f"hf://Qwen/Qwen2.5-0.5B-Instruct@{COMMIT}/model.safetensors", COMMIT),
    (" hf://Qwen/Qwen2.5-0.5B-Instruct@main/config.json ", "main"),
])
def test_the_cli_takes_every_hub_form_the_catalog_reads(hub: FakeHub, root: Path, source: str,
                                                        version: str) -> None:
    """A Hub source the catalog reads (with a revision, a file, spaces around it) is added
    under that revision, and the source it prints for the catalog reads back the same."""
    assert isinstance(parse_source(source), HfSource)
    result = CliRunner().invoke(main, ["mirror", "add", source, "--dir", str(root),
                                       "-o", "json"])
    assert result.exit_code == 0, result.output
    added = json.loads(result.stdout)
    assert added["directory"] == f"{HUB_DIR}/{version}/"
    assert added["source"] == source.strip()
    assert parse_source(added["source"]) == parse_source(source.strip())


@pytest.mark.parametrize("source", [
    "hf://Qwen", "hf://Qwen/", "hf://Qwen/Qwen2.5-0.5B-Instruct@",
    "hf://Qwen/Qwen2.5-0.5B-Instruct/../config.json", "hf://Qwen/Qwen2.5-0.5B-Instruct@..%2Fmain",
    "hf://Qw en/Qwen2.5-0.5B-Instruct", "hf+x://Qwen/Qwen2.5-0.5B-Instruct",
])
def test_the_cli_refuses_every_source_the_catalog_refuses(hub: FakeHub, root: Path,
                                                          source: str) -> None:
    """A source the catalog refuses is refused with the catalog's own sentence, before the
    Hub is asked anything."""
    with pytest.raises(ValueError, match=".") as refused:
        parse_source(source)
    result = CliRunner().invoke(main, ["mirror", "add", source, "--dir", str(root)])
    assert result.exit_code == 1
    assert str(refused.value) in result.output
    assert hub.seen == []
