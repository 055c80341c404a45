"""Start-up times of the embedded mode, and the gateway's share of a real generation.

    .venv/bin/python bench/local_startup.py [--runs N] [--tokens N]

Starts ``llmgw serve --config examples/local.yaml`` as a newcomer would (a
temporary SQLite database and a free port, from the environment) and measures,
with the real Gemma 3 270M on llama.cpp:

1. from spawning ``llmgw serve`` to the first streamed token of the always-on
   model (requests are retried while the gateway answers 503 during the load);
2. the cold start of the on-demand model: from sending its first request to
   its first streamed token (and from spawning ``llmgw serve``);
3. the gateway's share of a real generation: ``--runs`` pairs of the same
   streamed request (temperature 0, so the same tokens every time), sent
   alternately to the engine's own port (the baseline, measured in the same
   run) and through the gateway. On a shared two-core machine the engine's own
   time varies by several percent from one request to the next, far more than
   the gateway adds, so the gateway's cost is also measured where the engine's
   time is small: a one-token request, direct and through the gateway. That
   difference over the generation's median time is the gateway's share.
   Target: ≤ 2 %.
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

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-admin-token"
ALWAYS_ON, ON_DEMAND = "gemma-3-270m", "gemma-3-270m-ondemand"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def first_token(base: str, model: str, serve: subprocess.Popen[bytes],
                deadline: float = 300.0) -> float:
    """Monotonic time at which a streamed chat's first content arrives (retrying 503s)."""
    end = time.monotonic() + deadline
    body = {"model": model, "messages": PROMPT, "max_tokens": 8, "temperature": 0,
            "stream": True}
    while time.monotonic() < end:
        if serve.poll() is not None:
            raise SystemExit(f"llmgw serve exited with status {serve.returncode}")
        try:
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body,
                              timeout=deadline) as answer:
                if answer.status_code != 200:
                    answer.read()
                    time.sleep(0.05)
                    continue
                for line in answer.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        delta = json.loads(line[6:])["choices"][0]["delta"]
                        if delta.get("content"):
                            return time.monotonic()
        except httpx.TransportError:
            time.sleep(0.05)
    raise SystemExit(f"no token from {model} within {deadline:.0f}s")


def generate(client: httpx.Client, base: str, tokens: int) -> tuple[float, int]:
    """Seconds for one streamed generation of up to ``tokens`` tokens, and the chunks seen."""
    body = {"model": ALWAYS_ON, "messages": PROMPT, "max_tokens": tokens, "temperature": 0,
            "stream": True}
    chunks = 0
    began = time.perf_counter()
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            chunks += line.startswith("data: ")
    return time.perf_counter() - began, chunks


def paired(client: httpx.Client, engine: str, gateway: str, runs: int,
           tokens: int) -> tuple[list[float], list[float], int]:
    """``runs`` generations each way, alternating which goes first."""
    direct: list[float] = []
    through: list[float] = []
    chunks = 0
    for i in range(runs):
        order = [(engine, direct), (gateway, through)]
        for url, into in order if i % 2 == 0 else order[::-1]:
            elapsed, chunks = generate(client, url, tokens)
            into.append(elapsed)
    return direct, through, chunks


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LLMGW_DATABASE_URL": f"sqlite:///{tmp}/llmgw.db",
               "LLMGW_LISTEN": f"127.0.0.1:{port}", "LLMGW_ADMIN_TOKENS": f"ops={TOKEN}"}
        exe = Path(sys.executable).with_name("llmgw")
        log = Path(tmp) / "serve.log"
        with log.open("w") as out:
            spawned = time.monotonic()
            serve = subprocess.Popen([str(exe), "serve", "--config",
                                      str(ROOT / "examples" / "local.yaml")],
                                     cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            always_on = first_token(base, ALWAYS_ON, serve) - spawned
            sent = time.monotonic()
            cold = first_token(base, ON_DEMAND, serve) - sent
            cold_since_start = time.monotonic() - spawned

            api = httpx.get(f"{base}/api/v1/replicas", params={"model": ALWAYS_ON},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).json()
            engine = api[0]["address"]
            with httpx.Client(timeout=300) as client:
                paired(client, engine, base, 2, args.tokens)        # warm both paths
                direct, through, chunks = paired(client, engine, base, args.runs, args.tokens)
                one_d, one_g, _ = paired(client, engine, base, args.runs, 1)
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
            if serve.returncode not in (0, -signal.SIGTERM):
                print(log.read_text()[-3000:], file=sys.stderr)

    diffs = [g - d for g, d in zip(through, direct, strict=True)]
    q1, median_diff, q3 = statistics.quantiles(diffs, n=4)
    gen = statistics.median(direct)
    fixed = statistics.median(one_g) - statistics.median(one_d)
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {cores} cores available, load average {os.getloadavg()[0]:.2f}")
    print(f"serve start -> first token, always-on model:   {always_on:6.2f} s")
    print(f"cold on-demand request -> first token:         {cold:6.2f} s "
          f"({cold_since_start:.2f} s after serve start)")
    print(f"streamed generation ({chunks} chunks), median of {args.runs}: direct {ms(gen)}, "
          f"through the gateway {ms(statistics.median(through))}")
    print(f"  paired difference gateway - direct: median {ms(median_diff)} "
          f"(interquartile {ms(q1)} .. {ms(q3)}): the engine's own variation dominates")
    print(f"one-token request, median of {args.runs}: direct {ms(statistics.median(one_d))}, "
          f"through the gateway {ms(statistics.median(one_g))}")
    print(f"gateway's share of a real generation: {ms(fixed)} per request = "
          f"{fixed / gen * 100:.2f} % of {ms(gen)} (target <= 2 %); "
          f"paired medians: {median_diff / gen * 100:+.2f} %")


if __name__ == "__main__":
    main()
