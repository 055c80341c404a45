"""``llmgw fetch``: resume after a cut, checksums, lying servers, one download per node."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli import main
from llmgw.errors import LlmgwError, NotFoundError, UnavailableError
from llmgw.weights.fetch import fetch, fetch_file, head_length, read_range

from .conftest import LLMGW, wait_for
from .servers import FileServer, ThreadedMirror, closed_port_url, running, sha

CONTENT = os.urandom(2_000_000)


def test_a_cut_transfer_resumes_with_range(tmp_path: Path) -> None:
    """A connection closed half-way is resumed from the bytes already on disk with
    Range and If-Range, and the result is the whole, verified file."""
    dest = tmp_path / "cache" / "model.bin"
    with running(lambda: FileServer(CONTENT, cut_after=[700_000],
                                    sidecar=f"{sha(CONTENT)}  model.bin\n")) as srv:
        [result] = fetch(srv.url, dest, backoff=0)
        gets = srv.body_gets()
    assert dest.read_bytes() == CONTENT
    assert not list(dest.parent.glob("*.lock"))
    assert len(gets) == 2
    assert "Range" not in gets[0].headers
    assert gets[1].headers["Range"] == "bytes=700000-"
    assert gets[1].headers["If-Range"] == '"v1"'
    assert result.verified
    assert result.sha256 == sha(CONTENT)
    assert not dest.with_name("model.bin.part").exists()
    assert dest.with_name("model.bin.sha256").read_text() == f"{sha(CONTENT)}  model.bin\n"


def test_a_fetch_killed_mid_transfer_resumes_in_the_next_run(tmp_path: Path) -> None:
    """When the task gives up (or dies) the part file stays; the next run asks only
    for the rest and the two halves verify as one file."""
    dest = tmp_path / "cache" / "model.bin"
    part = dest.with_name("model.bin.part")
    with running(lambda: FileServer(CONTENT, cut_after=[1_200_000, 0])) as srv:
        with pytest.raises(UnavailableError, match="resumes on the next run"):
            fetch_file(srv.url, dest, sha256=sha(CONTENT), retries=0, backoff=0)
        assert part.stat().st_size == 1_200_000
        assert not dest.exists()
        result = fetch_file(srv.url, dest, sha256=sha(CONTENT), backoff=0)
        assert srv.body_gets()[2].headers["Range"] == "bytes=1200000-"
    assert dest.read_bytes() == CONTENT
    assert result.transferred == len(CONTENT)
    assert not part.exists()


def test_a_changed_file_restarts_instead_of_splicing(tmp_path: Path) -> None:
    """If-Range with an old ETag gets the whole new file (200): the part starts over."""
    dest = tmp_path / "model.bin"
    new = os.urandom(1_500_000)
    with running(lambda: FileServer(CONTENT, cut_after=[500_000, 0], etag='"old"')) as srv:
        with pytest.raises(UnavailableError):
            fetch_file(srv.url, dest, retries=0, backoff=0)
        srv.content, srv.etag = new, '"new"'
        fetch_file(srv.url, dest, sha256=sha(new), backoff=0)
        third = srv.body_gets()[2]
    assert third.headers["Range"] == "bytes=500000-"
    assert third.headers["If-Range"] == '"old"'
    assert dest.read_bytes() == new


def test_checksum_mismatch_removes_the_part_and_names_both_sums(tmp_path: Path) -> None:
    """A wrong --sha256 fails naming the expected and the actual sum; nothing is left
    under the final name and the partial file is gone."""
    dest = tmp_path / "model.bin"
    wrong = "0" * 64
    with running(lambda: FileServer(CONTENT)) as srv:
        result = CliRunner().invoke(main, ["fetch", srv.url, str(dest), "--sha256", wrong])
    assert result.exit_code == 1
    assert wrong in result.output
    assert sha(CONTENT) in result.output
    assert "partial file was removed" in result.output
    assert not dest.exists()
    assert not dest.with_name("model.bin.part").exists()


def test_the_mirrors_sidecar_is_used_when_no_sum_is_given(tmp_path: Path) -> None:
    """Without --sha256 the mirror's <url>.sha256 is fetched and enforced."""
    dest = tmp_path / "model.bin"
    bad = "ab" * 32
    with running(lambda: FileServer(CONTENT, sidecar=f"{bad}  model.bin\n")) as srv:
        with pytest.raises(LlmgwError, match=f"expected {bad} \\(from .*model.bin.sha256\\)"):
            fetch_file(srv.url, dest, backoff=0)
        assert [s.path for s in srv.seen if s.method == "GET"] == ["/model.bin.sha256",
                                                                  "/model.bin"]
    assert not dest.exists()


def test_a_server_lying_about_content_length_is_reported(tmp_path: Path) -> None:
    """A server that keeps promising more bytes than it sends is detected and named,
    not retried forever."""
    dest = tmp_path / "model.bin"
    with running(lambda: FileServer(CONTENT, lie_extra=4096)) as srv:
        with pytest.raises(UnavailableError) as info:
            fetch_file(srv.url, dest, retries=2, backoff=0)
    message = str(info.value)
    assert f"promised {len(CONTENT) + 4096} bytes" in message or "disagree" in message
    assert "giving up after 3 attempts" in message
    assert not dest.exists()


def test_a_missing_file_is_not_found_and_not_retried(tmp_path: Path) -> None:
    """HTTP 404 fails at once with a NotFoundError naming the URL."""
    with running(lambda: FileServer(CONTENT)) as srv:
        with pytest.raises(NotFoundError, match="missing.bin"):
            fetch_file(srv.url.replace("model.bin", "missing.bin"), tmp_path / "x",
                       backoff=0)
        assert len([s for s in srv.seen if s.path == "/missing.bin"]) == 1


def sockets_to(port: int) -> int:
    """How many TCP sockets this process holds open towards ``port`` (as the client)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target.removeprefix("socket:[").removesuffix("]"))
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for row in rows if int(row[2].rsplit(":", 1)[1], 16) == port and row[9] in mine)


@pytest.mark.parametrize("call", [
    lambda url, dest: fetch(url, dest, retries=0, backoff=0),
    lambda url, dest: head_length(url),
    lambda url, dest: read_range(url, 0, 64),
], ids=["fetch", "head_length", "read_range"])
def test_an_error_answer_closes_the_connection_before_the_error_is_raised(
        call: Callable[[str, Path], object], tmp_path: Path) -> None:
    """The socket of a request answered 404 is closed while the caller still holds the
    error, not later, when the garbage collector reaches the traceback."""
    with running(lambda: FileServer(CONTENT)) as srv:
        port = int(srv.url.split(":")[2].split("/")[0])
        with pytest.raises(NotFoundError) as missing:
            call(srv.url + ".nothing", tmp_path / "other.bin")
        assert sockets_to(port) == 0, missing.value


def test_an_unreachable_mirror_gives_up_with_the_reason(tmp_path: Path) -> None:
    """A closed port is retried up to --retries, then reported as unavailable."""
    with pytest.raises(UnavailableError, match="cannot reach the server"):
        fetch_file(closed_port_url() + "/m.bin", tmp_path / "m.bin", retries=1, backoff=0)


def test_two_fetches_of_one_file_on_one_node_download_once(tmp_path: Path) -> None:
    """Two `llmgw fetch` processes for the same destination: the second waits on the
    lock while the first downloads, then finds the file in place. One body GET."""
    dest = tmp_path / "cache" / "model.bin"
    with running(lambda: FileServer(CONTENT, hold_at=1_000_000,
                                    sidecar=f"{sha(CONTENT)}  model.bin\n")) as srv:
        err_a, err_b = tmp_path / "a.err", tmp_path / "b.err"
        with err_a.open("w") as ea, err_b.open("w") as eb:
            a = subprocess.Popen([LLMGW, "fetch", srv.url, str(dest), "-q"], stderr=ea,
                                 stdout=subprocess.PIPE, text=True)
            assert srv.holding.wait(60), "the first fetch never started its transfer"
            b = subprocess.Popen([LLMGW, "fetch", srv.url, str(dest), "-q"], stderr=eb,
                                 stdout=subprocess.PIPE, text=True)
            wait_for(lambda: "waiting for another fetch" in err_b.read_text(), 60,
                     "the second fetch to wait on the lock")
            srv.release.set()
            out_a, _ = a.communicate(timeout=120)
            out_b, _ = b.communicate(timeout=120)
        assert a.returncode == 0, err_a.read_text()
        assert b.returncode == 0, err_b.read_text()
        assert len(srv.body_gets()) == 1
    assert dest.read_bytes() == CONTENT
    assert "already in place" in out_b
    assert sha(CONTENT) in out_a
    assert not list(dest.parent.glob("*.lock"))


def test_an_existing_file_with_another_sum_is_fetched_again(tmp_path: Path) -> None:
    """A cached file whose sum differs from the one asked for is replaced, not trusted."""
    dest = tmp_path / "model.bin"
    dest.write_bytes(b"stale weights")
    with running(lambda: FileServer(CONTENT)) as srv:
        result = fetch_file(srv.url, dest, sha256=sha(CONTENT), backoff=0)
    assert result.transferred == len(CONTENT)
    assert dest.read_bytes() == CONTENT


def test_a_mirror_directory_is_fetched_file_by_file(threaded_mirror: ThreadedMirror,
                                                    mirror_root: Path, tmp_path: Path) -> None:
    """A URL ending in '/' fetches every file of the directory from the real mirror,
    each verified against its .sha256 where the mirror has one."""
    dest = tmp_path / "cache"
    results = fetch(f"{threaded_mirror.url}/qwen/2024-11/", dest, backoff=0)
    by_name = {Path(r.path).name: r for r in results}
    assert sorted(by_name) == ["config.json", "model.gguf"]
    assert by_name["model.gguf"].verified
    assert not by_name["config.json"].verified
    for name in by_name:
        assert (dest / name).read_bytes() == (mirror_root / "qwen/2024-11" / name).read_bytes()


def test_a_directory_url_without_its_slash_is_refused(threaded_mirror: ThreadedMirror,
                                                      tmp_path: Path) -> None:
    """Fetching a directory as if it were a file says to end the URL with '/'."""
    with pytest.raises(LlmgwError, match="is a directory on the mirror"):
        fetch_file(f"{threaded_mirror.url}/qwen/2024-11", tmp_path / "x", backoff=0)
    assert not (tmp_path / "x").exists()


def test_a_changed_file_is_not_spliced_when_the_server_ignores_if_range(tmp_path: Path
                                                                        ) -> None:
    """A 206 whose ETag differs from the part's is not appended: the part starts over."""
    dest = tmp_path / "model.bin"
    new = os.urandom(len(CONTENT))
    with running(lambda: FileServer(CONTENT, cut_after=[500_000, 0], etag='"old"',
                                    ignore_if_range=True)) as srv:
        with pytest.raises(UnavailableError):
            fetch_file(srv.url, dest, retries=0, backoff=0)
        srv.content, srv.etag = new, '"new"'
        result = fetch_file(srv.url, dest, backoff=0)
    assert dest.read_bytes() == new
    assert result.sha256 == sha(new)


def _with_userinfo(url: str, userinfo: str) -> str:
    return url.replace("http://", f"http://{userinfo}@", 1)


def test_userinfo_in_the_url_is_sent_as_basic_auth(tmp_path: Path) -> None:
    """``user:pass@`` in the URL (percent-encoded) becomes an Authorization: Basic header
    on every request, the checksum's included."""
    dest = tmp_path / "model.bin"
    with running(lambda: FileServer(CONTENT, sidecar=f"{sha(CONTENT)}  model.bin\n")) as srv:
        [result] = fetch(_with_userinfo(srv.url, "reader:p%40ss%3Aword"), dest, backoff=0)
        seen = [s for s in srv.seen if s.method == "GET"]
    expected = "Basic " + base64.b64encode(b"reader:p@ss:word").decode()
    assert result.verified
    assert {s.path for s in seen} == {"/model.bin", "/model.bin.sha256"}
    assert all(s.headers.get("Authorization") == expected for s in seen)


def test_the_password_in_the_url_is_never_shown(tmp_path: Path) -> None:
    """Errors, retry notices and the part's metadata show the password as ***."""
    notes: list[str] = []
    dest = tmp_path / "model.bin"
    with running(lambda: FileServer(CONTENT, cut_after=[700_000, 0, 0])) as srv:
        url = _with_userinfo(srv.url, "reader:hunter2")
        with pytest.raises(UnavailableError) as cut:
            fetch(url, dest, retries=1, backoff=0, notify=notes.append)
        with pytest.raises(NotFoundError) as missing:
            fetch(url + ".nothing", tmp_path / "other.bin", retries=0, backoff=0)
    with pytest.raises(UnavailableError) as unreachable:
        fetch(_with_userinfo(closed_port_url(), "reader:hunter2") + "/m.bin",
              tmp_path / "m.bin", retries=1, backoff=0, notify=notes.append)
    shown = [str(cut.value), str(missing.value), str(unreachable.value), *notes,
             dest.with_name("model.bin.part.json").read_text()]
    assert notes
    for text in shown:
        assert "hunter2" not in text, text
        assert "reader:***@" in text, text


def test_reading_a_range_of_a_file_on_the_mirror(threaded_mirror: ThreadedMirror,
                                                 mirror_root: Path) -> None:
    """read_range gets the bytes asked for from the real mirror, and none past the end."""
    url = f"{threaded_mirror.url}/qwen/2024-11/model.gguf"
    data = (mirror_root / "qwen/2024-11/model.gguf").read_bytes()
    assert read_range(url, 2, 5) == data[2:7]
    assert read_range(url, len(data) - 3, 64) == data[-3:]
    assert read_range(url, len(data), 64) == b""
    with pytest.raises(NotFoundError, match="not found on the mirror"):
        read_range(f"{threaded_mirror.url}/qwen/2024-11/none.gguf", 0, 8)
    with pytest.raises(UnavailableError, match="cannot reach"):
        read_range(f"{closed_port_url()}/m.gguf", 0, 8)


def test_a_range_from_a_server_that_ignores_ranges_is_read_from_the_start_only() -> None:
    """Without Range support the head is still read, but only as far as asked; a range past
    the start is refused rather than downloading everything before it."""
    with running(lambda: FileServer(CONTENT, ignore_range=True)) as srv:
        assert read_range(srv.url, 0, 100) == CONTENT[:100]
        with pytest.raises(LlmgwError, match="ignores Range requests"):
            read_range(srv.url, 100, 100)


def test_the_words_for_an_unwritable_cache_name_path_owner_and_uid() -> None:
    """The message builder names the path, the owning uid, gid and mode of the directory
    that decides it, the uid the fetch runs as, and the chown to run on the node."""
    from llmgw.weights.fetch import not_writable

    said = not_writable("/llmgw-cache/m/x.gguf", "Permission denied", owner=0, group=0,
                        mode=0o40755, where="/llmgw-cache", uid=10001)
    assert said.startswith("cannot write /llmgw-cache/m/x.gguf: Permission denied; "
                           "/llmgw-cache is owned by uid 0 (gid 0, mode 0755) and this fetch "
                           "runs as uid 10001.")
    assert "`sudo chown -R 10001 DIR`" in said
    assert "scheduler.nomad.fetch_user" in said


def _as_uid(uid: int | None, fn: Callable[[], tuple[int, str]]) -> tuple[int, str]:
    """``fn()`` in a forked child that runs as ``uid`` (None: as this one): the test
    process's own interpreter and modules, so nothing has to be readable by that uid."""
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 1
        try:
            os.close(read)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            out = fn()
            os.write(write, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    code, said = json.loads(data)
    return int(code), str(said)


def test_a_cache_the_fetch_uid_cannot_write_fails_first_naming_owner_and_uid() -> None:
    """`llmgw fetch` into a directory it cannot write stops before any download, saying
    which path, who owns it and which uid it runs as. As root (which may write anywhere)
    the fetch runs in a forked child that dropped to uid 65534, as a Nomad task runs as
    its user; as anyone else, the directory is made read-only for its owner."""
    import shutil
    import tempfile

    import llmgw.weights.cache
    import llmgw.weights.fetchlog
    import llmgw.weights.mirror.add  # noqa: F401 (the command's lazy imports, before the fork)

    base = Path(tempfile.mkdtemp(prefix="llmgw-fetch-owner-"))   # not pytest's 0700 tree
    os.chmod(base, 0o755)                 # the dropped uid may pass through, not write
    cache = base / "cache"
    cache.mkdir(mode=0o755)
    dest = cache / "org" / "model.gguf"
    if os.geteuid() == 0:
        uid: int | None = 65534
        runs_as = 65534
    else:
        uid, runs_as = None, os.geteuid()
        os.chmod(cache, 0o555)
    try:
        def fetch_there() -> tuple[int, str]:
            r = CliRunner().invoke(main, ["fetch", "http://127.0.0.1:9/model.gguf", str(dest),
                                          "--retries", "0"])
            return r.exit_code, r.output
        code, said = _as_uid(uid, fetch_there)
    finally:
        os.chmod(cache, 0o755)
        owner = cache.stat().st_uid
        shutil.rmtree(base, ignore_errors=True)
    assert code == 1, said
    assert f"cannot write {dest}" in said
    assert f"{cache} is owned by uid {owner}" in said
    assert f"this fetch runs as uid {runs_as}" in said
    assert "cannot reach" not in said            # it never tried the network
    assert "Traceback" not in said
