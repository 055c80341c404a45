"""Batch benchmark: a 10,000-line batch beside interactive traffic on the same model.

    .venv/bin/python bench/batch_bench.py [--lines 10000] [--rate 20] [--window 20]
                                          [--concurrency 4,32] [--slots 8]

Everything runs on loopback: the simulated engine (``slot_engine.py``, its
own process: 8 sequence slots, FIFO beyond them, a small cost per extra
running sequence) and, for each batch concurrency given, a fresh gateway
process (``batch_serve.py``: uvicorn, one worker, SQLite store) with the
simulated engine as the only replica of model ``sim``.

For each gateway the benchmark measures, against the same engine:

1. **baseline**: interactive chat completions alone — Poisson arrivals at
   ``--rate`` per second for ``--window`` seconds — latency p50 and p95;
2. **with the batch**: the same interactive load while an ``--lines``-line
   batch (uploaded with ``/v1/files``, run with ``/v1/batches``) is
   ``in_progress``; latency p50 and p95 and their ratio to the baseline;
   how long the batch took; the gateway's resident memory before the upload
   and at its peak while the batch ran.

The default concurrencies compare the setting's default (4, half the
engine's slots) with what a gateway without the limit would do (32, more
than the engine has slots), in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from gateway_bench import free_port, rss_bytes, running

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
INTERACTIVE = {"model": "sim", "max_tokens": 8,
               "messages": [{"role": "user", "content": "interactive question"}]}


@contextlib.contextmanager
def engine(args: argparse.Namespace) -> Iterator[str]:
    proc = subprocess.Popen(
        [PYTHON, str(BENCH / "slot_engine.py"), "--slots", str(args.slots), "--prefill-ms",
         str(args.prefill_ms), "--token-ms", str(args.token_ms), "--seq-cost",
         str(args.seq_cost)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().decode().strip()
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def gateway(upstream: str, concurrency: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    state = tempfile.mkdtemp(prefix="llmgw-batchbench-")
    args = [str(Path(PYTHON).parent / "uvicorn"), "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--no-access-log", "--log-level", "warning", "--app-dir",
            str(BENCH), "batch_serve:app"]
    env = {"LLMGW_BENCH_UPSTREAM": upstream, "LLMGW_BENCH_STATE": state,
           "LLMGW_BENCH_BATCH_CONCURRENCY": str(concurrency)}
    with running(args, port, env=env) as proc:
        yield f"http://127.0.0.1:{port}", proc.pid


def batch_file(lines: int) -> bytes:
    out = [json.dumps({"custom_id": f"line-{i}", "method": "POST",
                       "url": "/v1/chat/completions",
                       "body": {"model": "sim", "max_tokens": 8, "messages": [
                           {"role": "user", "content": f"batch question {i}"}]}})
           for i in range(lines)]
    return ("\n".join(out) + "\n").encode()


class Load:
    """Interactive chat completions with Poisson arrivals, each timed and tagged with the
    phase it started in."""

    def __init__(self, session: aiohttp.ClientSession, url: str, rate: float) -> None:
        self.session, self.url, self.rate = session, url, rate
        self.phase = "warmup"
        self.samples: dict[str, list[float]] = {}
        self.errors = 0
        self._stop = False

    async def _one(self) -> None:
        phase = self.phase
        started = time.perf_counter()
        async with self.session.post(f"{self.url}/v1/chat/completions", json=INTERACTIVE) as r:
            await r.read()
            ok = r.status == 200
        if not ok:
            self.errors += 1
            return
        self.samples.setdefault(phase, []).append((time.perf_counter() - started) * 1000)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        rng = random.Random(7)
        next_at = loop.time()
        while not self._stop:
            next_at += rng.expovariate(self.rate)
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            task = asyncio.create_task(self._one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)

    def stop(self) -> None:
        self._stop = True


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[94]


async def measure(url: str, pid: int, args: argparse.Namespace, data: bytes) -> dict[str, float]:
    """Interactive load throughout: ``window`` s alone, the batch, ``window`` s alone again."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        load = Load(session, url, args.rate)
        runner = asyncio.create_task(load.run())
        await asyncio.sleep(2.0)
        load.phase = "alone"
        await asyncio.sleep(args.window)
        rss_idle = rss_bytes(pid)
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename="batch.jsonl", content_type="application/jsonl")
        load.phase = "upload"
        async with session.post(f"{url}/v1/files", data=form) as r:
            file_id = (await r.json())["id"]
        rss_uploaded = rss_bytes(pid)
        async with session.post(f"{url}/v1/batches", json={
                "input_file_id": file_id, "endpoint": "/v1/chat/completions",
                "completion_window": "24h"}) as r:
            batch_id = (await r.json())["id"]
        started = time.perf_counter()
        peak = 0
        final: dict[str, object] = {}
        while True:
            peak = max(peak, rss_bytes(pid))
            async with session.get(f"{url}/v1/batches/{batch_id}") as r:
                final = await r.json()
            status = final["status"]
            if status == "in_progress":
                load.phase = "batch"
            if status in ("completed", "failed", "expired", "cancelled"):
                break
            await asyncio.sleep(0.1)
        took = time.perf_counter() - started
        load.phase = "alone"
        await asyncio.sleep(args.window)
        load.stop()
        await runner
    if load.errors:
        print(f"    !! {load.errors} interactive requests failed")
    counts = final["request_counts"]
    assert isinstance(counts, dict)
    print(f"    batch {final['status']}: {counts['completed']:,} completed, {counts['failed']} "
          f"failed in {took:.1f} s ({args.lines / took:,.0f} lines/s)")
    if counts["completed"] + counts["failed"] != args.lines:
        print(f"    !! {args.lines - counts['completed'] - counts['failed']} lines unaccounted for")
    alone, during = load.samples["alone"], load.samples["batch"]
    return {"base_p50": statistics.median(alone), "base_p95": p95(alone),
            "p50": statistics.median(during), "p95": p95(during),
            "n_base": len(alone), "n": len(during), "rss_idle": rss_idle,
            "rss_uploaded": rss_uploaded, "rss_peak": peak, "took": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10000)
    parser.add_argument("--rate", type=float, default=20.0, help="interactive requests/s")
    parser.add_argument("--window", type=float, default=20.0,
                        help="seconds of interactive-only load before and after each batch")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each concurrency is measured, alternating")
    parser.add_argument("--concurrency", default="4,32",
                        help="batch_concurrency values to compare, comma-separated")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--prefill-ms", type=float, default=5.0)
    parser.add_argument("--token-ms", type=float, default=2.0)
    parser.add_argument("--seq-cost", type=float, default=0.01)
    args = parser.parse_args()
    data = batch_file(args.lines)
    print(f"engine: {args.slots} slots, prefill {args.prefill_ms:g} ms, {args.token_ms:g} ms per "
          f"token (+{args.seq_cost:.0%} per extra running sequence), 8 tokens per request")
    print(f"interactive: Poisson {args.rate:g} req/s; batch: {args.lines:,} lines "
          f"({len(data) / 2**20:.1f} MiB file)")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    results: dict[int, list[dict[str, float]]] = {c: [] for c in concurrencies}
    with engine(args) as upstream:
        for round_ in range(args.rounds):
            for concurrency in concurrencies:
                print(f"\nround {round_ + 1}, batch_concurrency {concurrency}")
                with gateway(upstream, concurrency) as (url, pid):
                    r = asyncio.run(measure(url, pid, args, data))
                results[concurrency].append(r)
                print(f"    interactive alone ({r['n_base']:.0f} requests): p50 "
                      f"{r['base_p50']:.1f} ms, p95 {r['base_p95']:.1f} ms")
                print(f"    interactive beside the batch ({r['n']:.0f} requests): p50 "
                      f"{r['p50']:.1f} ms, p95 {r['p95']:.1f} ms; p95 ratio "
                      f"{r['p95'] / r['base_p95']:.3f}")
                print(f"    gateway RSS: idle {r['rss_idle'] / 2**20:.0f} MiB, after upload "
                      f"{r['rss_uploaded'] / 2**20:.0f} MiB, peak during the batch "
                      f"{r['rss_peak'] / 2**20:.0f} MiB")
    print("\nsummary (median over rounds)")
    for concurrency, rs in results.items():
        ratio = statistics.median(r["p95"] / r["base_p95"] for r in rs)
        print(f"  batch_concurrency {concurrency}: interactive p95 alone "
              f"{statistics.median(r['base_p95'] for r in rs):.1f} ms, beside the batch "
              f"{statistics.median(r['p95'] for r in rs):.1f} ms, ratio {ratio:.3f} "
              f"(target <= 1.10); batch {statistics.median(r['took'] for r in rs):.0f} s; "
              f"peak RSS {max(r['rss_peak'] for r in rs) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
