"""The README's first command, end to end: ``llmgw serve --config examples/local.yaml``.

llmgw runs as a separate process, exactly as a newcomer starts it (with a
temporary SQLite database and a free port from the environment), and is
talked to only over HTTP: the gateway under /v1 and the control API under
/api/v1. Engine processes are found by process id as children of llmgw, so
"nothing left behind" is checked against the kernel, not against llmgw's word.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import alive

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "local.yaml"
TOKEN = "e2e-admin-token"
ALWAYS_ON, ON_DEMAND = "gemma-3-270m", "gemma-3-270m-ondemand"
DEADLINE = 180.0
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], object], what: str, deadline: float = DEADLINE) -> object:
    end = time.monotonic() + deadline
    while True:
        try:
            result = check()
        except (httpx.HTTPError, OSError):
            result = None
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:.0f}s waiting for {what}")
        time.sleep(0.25)


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (the engines llmgw started)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Served:
    """A running ``llmgw serve`` and what it printed."""

    def __init__(self, tmp_path: Path, config: Path = EXAMPLE) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LLMGW_DATABASE_URL": f"sqlite:///{tmp_path / 'llmgw.db'}",
               "LLMGW_LISTEN": f"127.0.0.1:{self.port}", "LLMGW_ADMIN_TOKENS": f"ops={TOKEN}"}
        exe = Path(sys.executable).with_name("llmgw")
        self.proc = subprocess.Popen(
            [str(exe), "serve", "--config", str(config)], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.api = httpx.Client(base_url=self.url, timeout=120,
                                headers={"Authorization": f"Bearer {TOKEN}"})

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())

    def printed(self, text: str) -> bool:
        return any(text in line for line in self.output)

    def printed_ready(self, model: str) -> bool:
        return any(model in line and "ready" in line.lower() for line in self.output)

    def replicas(self, model: str) -> list[dict[str, object]]:
        answer = self.api.get("/api/v1/replicas", params={"model": model})
        answer.raise_for_status()
        rows = answer.json()
        assert isinstance(rows, list)
        return rows

    def engines(self, model: str) -> list[int]:
        """Engine pids of ``model``'s replicas, matched by the port in their command line."""
        ports = {str(r["address"]).rsplit(":", 1)[1] for r in self.replicas(model)
                 if r.get("address")}
        return [pid for pid in children(self.proc.pid)
                if any(f"--port {p} " in cmdline(pid) + " " for p in ports)]

    def chat(self, model: str, **extra: object) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", timeout=DEADLINE, json={
            "model": model, "messages": QUESTION, "max_tokens": 24, "temperature": 0, **extra})

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(60)
        finally:
            self.api.close()

    def close(self) -> None:
        """Close the output pipe once llmgw is gone and the reader has seen its end."""
        self.reader.join(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def diagnose(self) -> str:
        return "\n".join(self.output[-60:])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    try:
        wait_for(lambda: s.printed("listening") or s.proc.poll() is not None, "llmgw to listen")
        assert s.proc.poll() is None, f"llmgw serve exited:\n{s.diagnose()}"
        yield s
    finally:
        engines = children(s.proc.pid) if s.proc.poll() is None else []
        s.stop(signal.SIGKILL)
        for pid in engines:   # do not leave engines behind even when a test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        s.close()


def content(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    text = answer.json()["choices"][0]["message"]["content"]
    assert isinstance(text, str)
    return text


def test_serve_answers_restarts_a_killed_engine_and_leaves_nothing_behind(
        served: Served) -> None:
    """Chat and streaming chat get real text; a killed engine comes back; stopping cleans up."""
    wait_for(lambda: len(served.engines(ALWAYS_ON)) == 1
             and served.replicas(ALWAYS_ON)[0]["healthy"], "the always-on model to be ready")
    # `llmgw serve` says when each model is ready (issue 5, item 5).
    wait_for(lambda: served.printed_ready(ALWAYS_ON), "serve to print that the model is ready", 30)

    answer = served.chat(ALWAYS_ON)
    assert content(answer).strip(), "an empty message: wrong chat format?"
    assert answer.headers["x-llmgw-model"] == ALWAYS_ON

    with httpx.stream("POST", f"{served.url}/v1/chat/completions", timeout=DEADLINE, json={
            "model": ALWAYS_ON, "messages": QUESTION, "max_tokens": 24, "temperature": 0,
            "stream": True}) as stream:
        assert stream.status_code == 200
        pieces = [json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                  for line in stream.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert len([p for p in pieces if p]) > 3
    assert "".join(pieces).strip()

    [engine] = served.engines(ALWAYS_ON)
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: not alive(engine), "the killed engine to be reaped", 30)
    wait_for(lambda: (rows := served.replicas(ALWAYS_ON)) and rows[0]["restarts"] == 1
             and rows[0]["healthy"], "the engine to be restarted and healthy")
    [restarted] = served.engines(ALWAYS_ON)
    assert restarted != engine
    assert content(served.chat(ALWAYS_ON)).strip()

    # The on-demand model loads on its first request, which waits for it.
    assert served.replicas(ON_DEMAND) == []
    assert content(served.chat(ON_DEMAND)).strip()
    [lazy] = served.engines(ON_DEMAND)

    everything = children(served.proc.pid)
    assert {restarted, lazy} <= set(everything)
    # uvicorn shuts down on SIGTERM and then re-raises it, so -SIGTERM is a clean stop.
    assert served.stop(signal.SIGTERM) in (0, -signal.SIGTERM), served.diagnose()
    for pid in everything:
        assert not alive(pid), f"process {pid} ({cmdline(pid)}) outlived llmgw"


def test_a_sigkilled_llmgw_takes_its_engines_with_it(served: Served) -> None:
    """Even without a chance to clean up, no engine outlives llmgw (PR_SET_PDEATHSIG)."""
    wait_for(lambda: served.engines(ALWAYS_ON), "the always-on engine to start")
    engines = children(served.proc.pid)
    assert engines
    served.stop(signal.SIGKILL)
    for pid in engines:
        wait_for(lambda pid=pid: not alive(pid), f"engine {pid} to die with llmgw", 30)
