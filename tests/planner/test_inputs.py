"""Reading a model: a checkpoint directory, or the Hub (a fake one on loopback)."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.errors import DefinitionError, ForbiddenError, NotFoundError, UnavailableError
from llmgw.planner.inputs import resolve_model
from llmgw.testing.fake_hub import FakeHub, FakeRepo
from llmgw.weights.hub import HfHub
from tests.planner.fixtures import load_config

QWEN = load_config("qwen2.5-14b-instruct")


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose header declares ``tensors`` (data left empty)."""
    header = {name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
              for name, (dtype, shape) in tensors.items()}
    header["__metadata__"] = {"format": "pt"}  # type: ignore[assignment]
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[FakeHub, HfHub]]:
    with FakeHub({
        "Qwen/Qwen2.5-14B-Instruct": FakeRepo(files={"config.json": json.dumps(QWEN).encode()},
                                              branches=("main", "v1"),
                                              safetensors={"BF16": 14_770_033_664}),
        "meta-llama/Llama-3.3-70B-Instruct": FakeRepo(files={"config.json": b"{}"},
                                                      gated=True),
        "acme/private-model": FakeRepo(files={"config.json": b"{}"}, private=True),
        "bartowski/only-gguf": FakeRepo(files={"model.gguf": b"GGUF"}),
    }) as fake:
        yield fake, HfHub(endpoint=fake.url, cache_dir=str(tmp_path / "hf"))


def test_hub_config_and_parameter_count(hub: tuple[FakeHub, HfHub]) -> None:
    """A Hub repo yields its config.json and the safetensors parameter total."""
    fake, client = hub
    found = resolve_model("Qwen/Qwen2.5-14B-Instruct", hub=client)
    assert found.config["num_key_value_heads"] == 8
    assert found.parameters is not None
    assert (found.parameters.total, found.parameters.source) == (14_770_033_664, "hub")
    assert any("/api/models/Qwen/Qwen2.5-14B-Instruct" in p for p in fake.paths())
    assert any("/resolve/main/config.json" in p for p in fake.paths())


def test_hub_revision_and_params_override(hub: tuple[FakeHub, HfHub]) -> None:
    """@revision is passed to the Hub; --params replaces the Hub's count."""
    fake, client = hub
    found = resolve_model("hf://Qwen/Qwen2.5-14B-Instruct@v1", hub=client, params=14_000_000_000)
    assert found.name == "Qwen/Qwen2.5-14B-Instruct@v1"
    assert found.parameters is not None
    assert found.parameters.source == "--params"
    assert any("/resolve/v1/config.json" in p for p in fake.paths())


def test_gated_repo_says_how_to_get_access(hub: tuple[FakeHub, HfHub]) -> None:
    """A gated repo (GatedRepo on its files) is a ForbiddenError saying to request access
    and naming HF_TOKEN."""
    _, client = hub
    with pytest.raises(ForbiddenError, match="gated.*HF_TOKEN"):
        resolve_model("meta-llama/Llama-3.3-70B-Instruct", hub=client)


@pytest.mark.parametrize("repo", ["acme/no-such-model", "acme/private-model"])
def test_missing_or_private_repo_is_not_found(hub: tuple[FakeHub, HfHub], repo: str) -> None:
    """404 and unauthenticated 401 are both 'not found', with the hint about HF_TOKEN."""
    _, client = hub
    with pytest.raises(NotFoundError, match=f"{repo} was not found on http"):
        resolve_model(repo, hub=client)


def test_repo_without_config_json(hub: tuple[FakeHub, HfHub]) -> None:
    """A repository without config.json (a GGUF-only one) is a definition error saying so."""
    _, client = hub
    with pytest.raises(DefinitionError, match="has no config.json"):
        resolve_model("bartowski/only-gguf", hub=client)


def test_unreachable_hub_is_unavailable(tmp_path: Path) -> None:
    """A Hub that refuses connections is UnavailableError naming HF_ENDPOINT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = HfHub(endpoint=f"http://127.0.0.1:{port}", cache_dir=str(tmp_path))
    with pytest.raises(UnavailableError, match="HF_ENDPOINT"):
        resolve_model("Qwen/Qwen2.5-14B-Instruct", hub=client)


def test_local_dir_counts_parameters_from_safetensors_headers(tmp_path: Path) -> None:
    """Shards' headers give the exact count by dtype."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors",
                      {"a": ("BF16", [1000, 1000]), "b": ("F32", [10])})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": ("BF16", [5, 4])})
    found = resolve_model(str(tmp_path))
    assert found.parameters is not None
    assert found.parameters.by_dtype == {"BF16": 1_000_020, "F32": 10}
    assert found.parameters.source == "safetensors"


def test_local_dir_index_total_size(tmp_path: Path) -> None:
    """With only the index, the byte total over the dtype width is the count."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 29_540_067_328}, "weight_map": {}}))
    found = resolve_model(str(tmp_path))
    assert found.parameters is not None
    assert (found.parameters.total, found.parameters.source) == (14_770_033_664, "index")


def test_local_dir_without_count_asks_for_params(tmp_path: Path) -> None:
    """No index and no shards: an error saying to pass --params; --params makes it work."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    with pytest.raises(DefinitionError, match="no parameter count.*--params"):
        resolve_model(str(tmp_path))
    assert resolve_model(str(tmp_path), params=14_770_033_664).parameters is not None


def test_local_dir_without_config_json(tmp_path: Path) -> None:
    """A directory without config.json is an error naming config.json."""
    with pytest.raises(DefinitionError, match="no config.json") as err:
        resolve_model(str(tmp_path), params=1000)
    assert err.value.field == "config.json"


def test_local_config_not_json(tmp_path: Path) -> None:
    """An unreadable config.json names the file."""
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DefinitionError, match="config.json: not valid JSON"):
        resolve_model(str(tmp_path), params=1000)


@pytest.mark.parametrize("source", ["./no-such-dir", "just-a-name", "a/b/c"])
def test_neither_dir_nor_repo(source: str) -> None:
    """A source that is neither an existing directory nor org/name is refused."""
    with pytest.raises(DefinitionError, match="neither a directory nor a Hub repository"):
        resolve_model(source, params=1000)
