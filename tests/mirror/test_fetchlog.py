"""What ``llmgw fetch`` writes to its task log: progress, a summary, and a last line
that says what to do when it fails."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli import main
from llmgw.errors import LlmgwError
from llmgw.weights import fetch as fetch_module
from llmgw.weights.cache import Meter
from llmgw.weights.fetch import FetchResult, fetch_file
from llmgw.weights.fetchlog import FetchLog, clock_text

from .conftest import LLMGW, wait_for
from .servers import FileServer, running, sha

CONTENT = os.urandom(3_000_000)
MIB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_progress_line_gives_bytes_share_recent_rate_and_time_left(tmp_path: Path) -> None:
    """Each line: what is on disk of the total, the rate over the last interval, and the
    time left at the rate since the start."""
    dest = tmp_path / "model.bin"
    part = dest.with_name("model.bin.part")
    part.write_bytes(b"\0" * (10 * MIB))          # from an earlier attempt
    clock = Clock()
    lines: list[str] = []
    log = FetchLog(Meter("http://mirror/m.bin", dest, 110 * MIB, clock=clock), lines.append)
    assert log.begin() == ("fetching http://mirror/m.bin into "
                           f"{dest}: 110.0MiB, 10.0MiB already on disk")
    clock.t += 10
    part.write_bytes(b"\0" * (30 * MIB))
    assert log.line(clock.t) == "fetched 30.0MiB of 110.0MiB (27.3%) at 2.0MiB/s, about 40s left"
    clock.t += 10
    part.write_bytes(b"\0" * (35 * MIB))
    assert log.line(clock.t) == ("fetched 35.0MiB of 110.0MiB (31.8%) at 512.0KiB/s, "
                                 "about 1m00s left")
    clock.t += 10
    assert log.line(clock.t) == "fetched 35.0MiB of 110.0MiB (31.8%) at 0B/s, about 1m30s left"
    assert len(lines) == 4


def test_without_a_known_total_the_line_says_so(tmp_path: Path) -> None:
    """A server that promises no length: bytes and rate, no share and no time left."""
    dest = tmp_path / "m.bin"
    clock = Clock()
    log = FetchLog(Meter("http://m/m.bin", dest, None, clock=clock), lambda _: None)
    dest.with_name("m.bin.part").write_bytes(b"\0" * MIB)
    clock.t += 1
    assert log.line(clock.t) == "fetched 1.0MiB of an unknown size at 1.0MiB/s"


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (45, "45s"), (125, "2m05s"),
                                               (3720, "1h02m"), (90061, "25h01m")])
def test_durations_read_as_people_write_them(seconds: float, text: str) -> None:
    """Seconds, minutes and seconds, hours and minutes."""
    assert clock_text(seconds) == text


def _result(size: int, moved: int, verified: bool) -> FetchResult:
    return FetchResult(path="/c/x", size=size, sha256="s", transferred=moved, verified=verified)


def test_the_summary_says_what_moved_how_fast_and_how_it_was_checked(tmp_path: Path) -> None:
    """Bytes moved, time, mean rate, files and checks; or that nothing needed moving."""
    clock = Clock()
    log = FetchLog(Meter("http://m/d/", tmp_path / "d", 300 * MIB, clock=clock), lambda _: None)
    clock.t += 150
    assert log.summary([_result(200 * MIB, 200 * MIB, True), _result(100 * MIB, 100 * MIB, True)]
                       ) == (f"fetched 300.0MiB in 2m30s (2.0MiB/s) into {tmp_path / 'd'}: "
                             "300.0MiB in 2 files, every sha256 checked")
    assert log.summary([_result(MIB, MIB, False)]).endswith(
        "1.0MiB in 1 file, lengths checked only (the mirror has no .sha256 files)")
    assert log.summary([_result(MIB, MIB, True), _result(MIB, 0, False)]).endswith(
        "1 checked by sha256, 1 by length only")
    assert log.summary([_result(5 * MIB, 0, True)]) == (
        f"already in the cache: {tmp_path / 'd'} (5.0MiB, 1 file); nothing fetched")


def test_the_task_log_starts_with_what_is_fetched_and_ends_with_a_summary(tmp_path: Path
                                                                          ) -> None:
    """Without a terminal: the first line says what and how much, the last one the
    outcome, after the file's own line."""
    dest = tmp_path / "cache" / "model.bin"
    with running(lambda: FileServer(CONTENT, sidecar=f"{sha(CONTENT)}  model.bin\n")) as srv:
        result = CliRunner().invoke(main, ["fetch", srv.url, str(dest)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"fetching {srv.url} into {dest}: 2.9MiB"
    assert lines[-2] == f"{sha(CONTENT)}  {dest}"
    assert lines[-1].startswith("fetched 2.9MiB in ")
    assert lines[-1].endswith(f"into {dest}: 2.9MiB in 1 file, every sha256 checked")


def test_a_stalled_transfer_keeps_logging_at_zero_bytes_a_second(tmp_path: Path) -> None:
    """Lines come from a clock: while the server sends nothing, the log says 0B/s rather
    than falling silent."""
    dest = tmp_path / "cache" / "model.bin"
    out = tmp_path / "fetch.out"
    with running(lambda: FileServer(CONTENT, hold_at=1_000_000)) as srv, out.open("w") as f:
        proc = subprocess.Popen([LLMGW, "fetch", srv.url, str(dest), "--log-interval", "0.2"],
                                stdout=f, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            assert srv.holding.wait(60), "the fetch never started its transfer"
            wait_for(lambda: "fetched 976.6KiB of 2.9MiB (33.3%) at 0B/s" in out.read_text(), 60,
                     "a progress line during the stall")
            srv.release.set()
            assert proc.wait(timeout=120) == 0
        finally:
            proc.kill()
            proc.wait()
    last = out.read_text().splitlines()[-1]
    assert last.startswith("fetched 2.9MiB in "), last


def test_a_failed_fetch_ends_both_logs_with_what_to_do(tmp_path: Path) -> None:
    """A file missing from the mirror: the last line of stdout (which the Nomad UI shows
    first) and of stderr say so, and how to put it there."""
    with running(lambda: FileServer(CONTENT)) as srv:
        result = CliRunner().invoke(main, ["fetch", srv.url + ".nope", str(tmp_path / "m")])
    assert result.exit_code == 1
    said = (f"{srv.url}.nope: not found on the mirror (HTTP 404); check the model's source, "
            "or add the file with `llmgw mirror add`")
    assert result.stdout.splitlines()[-1] == f"failed: {said}"
    assert result.stderr.splitlines()[-1] == f"error: {said}"


def test_a_full_cache_is_reported_as_such_and_not_retried(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A write failing with ENOSPC names the path and how to free room, at once, instead
    of being retried as a network error and blamed on the mirror."""
    def full(*_: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fetch_module.os, "write", full)
    dest = tmp_path / "cache" / "model.bin"
    with running(lambda: FileServer(CONTENT)) as srv:
        with pytest.raises(LlmgwError) as err:
            fetch_file(srv.url, dest, backoff=0)
        assert len(srv.body_gets()) == 1
    message = err.value.message
    assert message.startswith(f"cannot write {dest}.part: No space left on device; ")
    assert "`llmgw cache sweep`" in message
    assert "cannot reach the server" not in message


def test_an_unwritable_cache_says_which_user_must_write_it(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """EACCES on the cache: the directory's owner, the uid the fetch runs as, and the
    chown that fixes it."""
    real_open = os.open

    def refuse(path: object, *args: object, **kw: object) -> int:
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fetch_module.os, "open", refuse)
    with pytest.raises(LlmgwError) as err:
        fetch_file("http://127.0.0.1:9/m.bin", tmp_path / "m.bin", backoff=0)
    assert f"{tmp_path} is owned by uid {tmp_path.stat().st_uid}" in err.value.message
    assert f"this fetch runs as uid {os.getuid()}" in err.value.message
    assert f"`sudo chown -R {os.getuid()} DIR`" in err.value.message
