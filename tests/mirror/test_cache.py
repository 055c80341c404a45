"""The node's weight cache: stamps, least-recently-used eviction that spares what replicas
use, and the progress file a fetch keeps."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import msgspec
from click.testing import CliRunner

from llmgw.cli import main
from llmgw.weights import cache

from .servers import ThreadedMirror


def _entry(root: Path, name: str, size: int, used: float) -> str:
    """A directory entry of ``size`` bytes, stamped as used at ``used``."""
    d = root / "mirror_8000" / name / "rev"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w" * size)
    dest = f"{d}/"
    cache.record_use(dest, now=used)
    return dest


def test_a_stamped_entry_is_reported_with_its_size_and_tag(tmp_path: Path) -> None:
    """record_use makes a fetch destination an entry the sweep reports, tagged by its path."""
    dest = _entry(tmp_path, "qwen", 1000, used=50.0)
    (tmp_path / "copied-by-hand").mkdir()
    (tmp_path / "copied-by-hand" / "x.gguf").write_bytes(b"x" * 10)
    [e] = cache.entries(tmp_path)
    assert (e.path, e.size, e.used) == (dest, 1000, 50.0)
    assert e.tag == cache.tag(dest) == cache.tag(dest.rstrip("/"))


def test_the_sweep_evicts_least_recently_used_first_until_within_the_bound(
        tmp_path: Path) -> None:
    """Over the bound, the oldest unkept entry goes first, and only as many as needed."""
    old = _entry(tmp_path, "old", 1000, used=10.0)
    mid = _entry(tmp_path, "mid", 1000, used=20.0)
    new = _entry(tmp_path, "new", 1000, used=30.0)
    report = cache.sweep(tmp_path, 2000)
    assert [e.path for e in report.evicted] == [old]
    assert not Path(old).exists()
    assert Path(mid).exists()
    assert Path(new).exists()
    assert [e.path for e in report.entries] == [mid, new]
    assert report.total == 2000


def test_the_sweep_never_removes_what_a_replica_uses(tmp_path: Path) -> None:
    """A kept entry and one used since the keep list was made stay, even over the bound."""
    kept = _entry(tmp_path, "kept", 1000, used=10.0)
    recent = _entry(tmp_path, "recent", 1000, used=100.0)
    report = cache.sweep(tmp_path, 500, keep=[kept.rstrip("/")], since=90.0)
    assert report.evicted == []
    assert Path(kept).exists()
    assert Path(recent).exists()
    assert report.kept_over_bound == 1500


def test_an_entry_kept_by_its_tag_stays(tmp_path: Path) -> None:
    """--keep takes a tag as well as a path: the entry of that tag is not removed."""
    kept = _entry(tmp_path, "kept", 1000, used=10.0)
    report = cache.sweep(tmp_path, 0, keep=[cache.tag(kept)])
    assert report.evicted == []
    assert Path(kept).exists()


def test_the_sweep_leaves_an_entry_a_fetch_is_using(tmp_path: Path) -> None:
    """An entry whose lock a running fetch holds is not removed under it."""
    busy = _entry(tmp_path, "busy", 1000, used=10.0)
    with cache.using(busy):
        report = cache.sweep(tmp_path, 0)
    assert report.evicted == []
    assert Path(busy).exists()
    assert [e.path for e in cache.sweep(tmp_path, 0).evicted] == [busy]


def test_cache_sweep_writes_its_report(tmp_path: Path) -> None:
    """`llmgw cache sweep` evicts, prints what it did and writes the report as JSON."""
    old = _entry(tmp_path / "c", "old", 2048, used=10.0)
    _entry(tmp_path / "c", "new", 2048, used=20.0)
    report = tmp_path / "alloc" / "llmgw-cache.json"
    result = CliRunner().invoke(main, ["cache", "sweep", str(tmp_path / "c"), "--max-bytes",
                                       "3KiB", "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert f"evicted {old}" in result.output
    got = msgspec.json.decode(report.read_bytes(), type=cache.Report)
    assert [e.path for e in got.evicted] == [old]
    assert len(got.entries) == 1


def test_a_bad_bound_is_refused_with_the_option_named(tmp_path: Path) -> None:
    """A --max-bytes that is not a size is a usage error naming the option."""
    result = CliRunner().invoke(main, ["cache", "sweep", str(tmp_path), "--max-bytes", "lots"])
    assert result.exit_code == 2
    assert "--max-bytes" in result.output


def test_the_progress_file_counts_bytes_on_disk_and_the_rate(tmp_path: Path) -> None:
    """The progress file shows the bytes below the destination, the total and a rate."""
    now = [100.0]
    dest = tmp_path / "cache" / "rev"
    dest.mkdir(parents=True)
    pf = cache.ProgressFile(tmp_path / "p.json", "http://m/rev/", f"{dest}/", 4000,
                            clock=lambda: now[0])
    (dest / "a.part").write_bytes(b"x" * 1000)
    now[0] = 102.0
    pf(1000, 4000)
    got = cache.read_progress((tmp_path / "p.json").read_bytes())
    assert got is not None
    assert (got.done, got.total, got.rate) == (1000, 4000, 500.0)
    assert got.percent == 25.0
    assert got.eta == 6.0
    now[0] = 102.5
    (dest / "a.part").write_bytes(b"x" * 2000)
    pf(2000, 4000)   # within the interval: not written again
    again = cache.read_progress((tmp_path / "p.json").read_bytes())
    assert again is not None
    assert again.done == 1000


def test_fetch_keeps_a_progress_file_and_stamps_the_entry(threaded_mirror: ThreadedMirror,
                                                          tmp_path: Path) -> None:
    """`llmgw fetch --progress-file` ends with a finished progress file of the listed total,
    and the fetched directory becomes a cache entry."""
    dest = tmp_path / "cache" / "qwen" / "2024-11"
    progress = tmp_path / "alloc" / "llmgw-fetch.json"
    result = CliRunner().invoke(main, ["fetch", f"{threaded_mirror.url}/qwen/2024-11/",
                                       f"{dest}/", "--progress-file", str(progress), "-q"])
    assert result.exit_code == 0, result.output
    got = json.loads(progress.read_text())
    assert got["finished"] is True
    assert got["done"] == got["total"] > 300_000
    [e] = cache.entries(tmp_path / "cache")
    assert e.path == f"{dest}/"
    assert e.size == got["total"]


def test_a_fetch_waits_for_a_sweep_deleting_its_entry(tmp_path: Path) -> None:
    """The sweep's exclusive lock keeps a fetch from starting on an entry being removed."""
    dest = _entry(tmp_path, "x", 10, used=1.0)
    order: list[str] = []
    with cache.using(dest, exclusive=True):
        t = threading.Thread(target=lambda: (cache.using(dest).__enter__(),
                                             order.append("fetch")))
        t.start()
        t.join(0.2)
        order.append("sweep done")
    t.join(10)
    assert order == ["sweep done", "fetch"]
