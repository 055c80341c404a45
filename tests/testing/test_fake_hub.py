"""The one Hub adapter against the fake Hub: every answer and every refusal, by kind."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.hub import HfHub, HubError

WEIGHTS = b"w" * 1000


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub({
        "org/open": FakeRepo(files={"config.json": b"{}", "model.safetensors": WEIGHTS},
                             lfs={"model.safetensors"}, branches=("main", "v1"),
                             safetensors={"BF16": 7, "F32": 3}),
        "org/private": FakeRepo(files={"config.json": b"{}"}, private=True, tokens={"hf_ok"}),
        "org/gated": FakeRepo(files={"config.json": b"{}"}, gated=True, tokens={"hf_ok"}),
    }) as fake:
        yield fake


def _kind(call: object) -> str:
    with pytest.raises(HubError) as info:
        call()  # type: ignore[operator]
    return info.value.kind


def test_repository_facts_files_and_parameters(hub: FakeHub) -> None:
    """repo_info gives the commit, file sizes with LFS sums, and parameters by dtype."""
    info = HfHub(endpoint=hub.url).repo_info("org/open", "v1", files=True)
    files = {f.path: f for f in info.files}
    assert info.sha == FakeRepo().commit
    assert files["model.safetensors"].size == len(WEIGHTS)
    assert files["model.safetensors"].lfs_sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    counted = HfHub(endpoint=hub.url).repo_info("org/open", None, parameters=True)
    assert counted.parameters == {"BF16": 7, "F32": 3}


def test_reading_and_downloading_files(hub: FakeHub, tmp_path: Path) -> None:
    """read returns a small file's bytes; download writes a file under the directory."""
    client = HfHub(endpoint=hub.url, cache_dir=str(tmp_path / "cache"))
    assert client.read("org/open", "config.json", None) == b"{}"
    assert client.file_size("org/open", "model.safetensors", "main") == len(WEIGHTS)
    path = client.download("org/open", "model.safetensors", "main", tmp_path / "out")
    assert path.read_bytes() == WEIGHTS


def test_reading_a_range_of_a_file(hub: FakeHub) -> None:
    """read_range asks for the bytes it wants and gets them, and nothing past the end."""
    client = HfHub(endpoint=hub.url)
    assert client.read_range("org/open", "model.safetensors", None, 10, 20) == WEIGHTS[10:30]
    assert hub.seen[-1].headers["Range"] == "bytes=10-29"
    assert client.read_range("org/open", "model.safetensors", "v1", 990, 64) == WEIGHTS[990:]
    assert client.read_range("org/open", "model.safetensors", None, 1000, 64) == b""
    assert _kind(lambda: client.read_range("org/open", "nope.gguf", None, 0, 8)) == "file"
    assert _kind(lambda: client.read_range("org/gated", "config.json", None, 0, 8)) == "gated"
    assert _kind(lambda: client.read_range("org/none", "m.gguf", None, 0, 8)) == "repository"


def test_each_refusal_has_its_kind(hub: FakeHub) -> None:
    """Missing repository, revision and file, gated and private are told apart."""
    client = HfHub(endpoint=hub.url, token=None)
    assert _kind(lambda: client.repo_info("org/none", None)) == "repository"
    assert _kind(lambda: client.repo_info("org/open", "v9")) == "revision"
    assert _kind(lambda: client.file_size("org/open", "nope.bin", None)) == "file"
    assert _kind(lambda: client.repo_info("org/private", None)) == "repository"
    assert _kind(lambda: client.file_size("org/gated", "config.json", None)) == "gated"
    wrong = HfHub(endpoint=hub.url, token="hf_other")
    assert _kind(lambda: wrong.file_size("org/gated", "config.json", None)) == "gated"


def test_a_token_with_access_opens_private_and_gated_repositories(hub: FakeHub) -> None:
    """The token is sent, and a repository that lists it answers."""
    client = HfHub(endpoint=hub.url, token="hf_ok")
    assert client.repo_info("org/private", None).repo_id == "org/private"
    assert client.file_size("org/gated", "config.json", None) == 2
    assert all(s.headers.get("authorization") == "Bearer hf_ok" or
               s.headers.get("Authorization") == "Bearer hf_ok" for s in hub.seen)


def test_an_unreachable_hub_says_where_it_looked(tmp_path: Path) -> None:
    """A closed port is 'unreachable', naming the endpoint and HF_ENDPOINT."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = HfHub(endpoint=f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(HubError) as info:
        client.repo_info("org/open", None)
    assert info.value.kind == "unreachable"
    assert f"127.0.0.1:{port}" in info.value.reason
    assert "HF_ENDPOINT" in info.value.reason
