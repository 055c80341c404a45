"""A mirror directory with the cases the server must tell apart, and servers over it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from llmgw.weights.mirror.server import MirrorServer

from .servers import ThreadedMirror, sha

SECRET = b"the secret outside the mirror\n"
LLMGW = str(Path(sys.executable).with_name("llmgw"))


@pytest.fixture
def mirror_root(tmp_path: Path) -> Path:
    """qwen/2024-11/{model.gguf, model.gguf.sha256, config.json}, an empty directory,
    a hidden version being added, links inside and outside, and a FIFO."""
    root = tmp_path / "mirror"
    version = root / "qwen" / "2024-11"
    version.mkdir(parents=True)
    model = os.urandom(300_000)
    (version / "model.gguf").write_bytes(model)
    (version / "model.gguf.sha256").write_text(f"{sha(model)}  model.gguf\n")
    (version / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}\n')
    (root / "empty").mkdir()
    staging = root / "qwen" / ".2025-01.adding-1-abcd"
    staging.mkdir()
    (staging / "model.gguf").write_bytes(b"half a model")
    (tmp_path / "secret.txt").write_bytes(SECRET)
    (tmp_path / "secretdir").mkdir()
    (tmp_path / "secretdir" / "x").write_bytes(SECRET)
    (root / "outside-link").symlink_to(tmp_path / "secret.txt")
    (root / "dirlink").symlink_to(tmp_path / "secretdir")
    (root / "inside-link").symlink_to(version / "config.json")
    os.mkfifo(root / "pipe")
    return root


@pytest.fixture
async def mirror_server(mirror_root: Path) -> AsyncIterator[MirrorServer]:
    """The real server, in-process on the test's event loop, on a free loopback port."""
    server = MirrorServer(mirror_root)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
def threaded_mirror(mirror_root: Path) -> Iterator[ThreadedMirror]:
    """The real server on its own thread, for blocking callers."""
    server = ThreadedMirror(mirror_root)
    try:
        yield server
    finally:
        server.stop()


# Run the CLI as a terminal's foreground job would: with SIGINT at its default. A
# shell that starts a command in the background without job control (a CI runner's
# ``bash .ci/run &``, a script's ``cmd &``) makes the command ignore SIGINT, its
# children inherit that, and Python then leaves SIGINT ignored, rightly: a Ctrl-C
# test of such a child would wait for a signal that is never delivered.
_AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                       "os.execv(sys.argv[1], sys.argv[1:])")


class CliMirror:
    """``llmgw mirror serve DIR --listen 127.0.0.1:0`` as a child process."""

    def __init__(self, root: Path) -> None:
        # stderr goes to a file: a pipe nobody reads fills at 64 KiB, and a server
        # blocked writing its log can neither serve nor stop.
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _AS_FROM_A_TERMINAL, LLMGW, "mirror", "serve", str(root),
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the server has bound its port
        if " on http://" not in line:
            self.proc.kill()
            with self.proc:
                pass
            raise AssertionError(f"mirror serve did not start: {line!r} {self.output()}")
        self.url = line.rsplit(" on ", 1)[1].strip()
        self.pid = self.proc.pid

    def output(self) -> str:
        """What the server wrote to stderr so far."""
        self.log.seek(0)
        return self.log.read()

    def rss(self, field: str = "VmRSS") -> int:
        """A memory figure of the server process from /proc, in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in /proc/{self.pid}/status")

    def stop(self, sig: signal.Signals = signal.SIGINT) -> int:
        """Send ``sig`` (by default what Ctrl-C sends), reap the server, close its pipes."""
        try:
            with self.proc:
                if self.proc.returncode is None:
                    self.proc.send_signal(sig)
                try:
                    return self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(60)
                    raise AssertionError(f"mirror serve did not stop on {sig.name} within "
                                         f"60 s: {self.output()}") from None
        finally:
            self.log.close()


@pytest.fixture
def cli_mirror(mirror_root: Path) -> Iterator[CliMirror]:
    server = CliMirror(mirror_root)
    try:
        yield server
    finally:
        server.stop()


def tree_state(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry below ``root`` with size, mtime and content hash (links not followed)."""
    state: dict[str, tuple[int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            digest = sha(p.read_bytes()) if p.is_file() and not p.is_symlink() else ""
            state[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, digest)
    return state


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0,
             what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
