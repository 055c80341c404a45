"""Prefetch in embedded mode: the model's file is brought into this machine's cache."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import Scaling
from llmgw.errors import RefusedError
from llmgw.scheduler.local.backend import LocalBackend

from .conftest import cpu_model, until
from .test_sources import fake_pkg


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run


def _assembling_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A model package whose assemble() writes its file into a cache directory."""
    target = tmp_path / "cache" / "model.gguf"
    dist = fake_pkg(tmp_path, monkeypatch, f"""
        from pathlib import Path
        def assemble():
            p = Path({str(target)!r})
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"GGUF" + bytes(60))
            return p
        """)
    return dist, target


async def test_a_prefetch_assembles_the_model_file_before_any_replica(
        backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        runtime_dir: Path) -> None:
    """Prefetching an on-demand model assembles its package's file now; the machine then
    reports it warm, and the status says done."""
    dist, target = _assembling_pkg(tmp_path, monkeypatch)
    m = cpu_model("lazy", f"pkg:{dist}", min_=0)
    await backend.apply(build_catalog([m]))
    assert (await backend.prefetch_status("lazy")).nodes == []
    started = await backend.prefetch("lazy", count=1)
    assert started.model == "lazy"

    async def done() -> bool:
        return (await backend.prefetch_status("lazy")).message == "done"
    await until(done, "the prefetch finished")
    assert target.is_file()
    status = await backend.prefetch_status("lazy")
    assert status.warm == [backend.machine.name]
    assert "lazy" in (await backend.fleet()).nodes[0].warm
    assert await backend.replicas("lazy") == []


async def test_scaling_prefetch_assembles_at_apply(
        backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        runtime_dir: Path) -> None:
    """A model with scaling.prefetch has its file assembled when the catalog is applied."""
    dist, target = _assembling_pkg(tmp_path, monkeypatch)
    m = msgspec.structs.replace(cpu_model("lazy", f"pkg:{dist}", min_=0),
                                scaling=Scaling(min=0, prefetch=1))
    await backend.apply(build_catalog([m]))
    await until(target.is_file, "the file assembled at apply")


async def test_a_remote_source_cannot_be_prefetched_here(backend: LocalBackend) -> None:
    """A model this machine cannot fetch is refused with the reason, naming the way out."""
    m = cpu_model("hub", "hf://Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q8_0.gguf",
                  min_=0)
    await backend.apply(build_catalog([m]))
    with pytest.raises(RefusedError, match="is remote"):
        await backend.prefetch("hub")
