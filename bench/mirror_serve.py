"""Benchmark: `llmgw mirror serve` streaming a 2 GiB file over loopback.

Measures, against the same file in the same run:

1. One download at a time: throughput (median of --runs), for `llmgw mirror
   serve` and for the standard library's `python -m http.server` as the
   baseline (it copies through Python buffers rather than sendfile).
2. --clients concurrent downloads of the file: aggregate throughput and the
   server's RSS sampled every 100 ms (idle before, median and max during, and
   the kernel's peak VmHWM), for both servers.

Clients run in a separate process (a raw socket per download, one thread
each, receiving with MSG_TRUNC so the kernel discards the bytes: the client
costs little and the figure is the server's). Concurrent downloads stop after --duration seconds
if not finished (memory flatness is a steady-state property; a full 100 x
2 GiB run moves 200 GiB). Use --full to let every download finish.

    .venv/bin/python bench/mirror_serve.py [--size-gib 2] [--clients 100]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LLMGW = str(Path(sys.executable).with_name("llmgw"))

CLIENT = r"""
import json, socket, sys, threading, time
port, path, n, deadline = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
got = [0] * n
def one(i):
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    got[i] = len(data.partition(b"\r\n\r\n")[2])
    buf = bytearray(1 << 20)
    while time.monotonic() < deadline:
        # MSG_TRUNC: the kernel counts and discards, so the client costs little
        # and the figure is the server's.
        k = s.recv_into(buf, len(buf), socket.MSG_TRUNC)
        if not k:
            break
        got[i] += k
    s.close()
start = time.monotonic()
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"bytes": sum(got), "seconds": time.monotonic() - start,
                  "per_client": got}))
"""

def rss(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def make_file(directory: Path, size: int) -> Path:
    path = directory / "model.bin"
    block = os.urandom(64 << 20)
    with path.open("wb") as f:
        left = size
        while left:
            f.write(block[: min(left, len(block))])
            left -= min(left, len(block))
    # Read it once so both servers start from a warm page cache.
    with path.open("rb") as f:
        while f.read(64 << 20):
            pass
    return path


class Server:
    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        if kind == "llmgw":
            cmd = [LLMGW, "mirror", "serve", str(root), "--listen", "127.0.0.1:0"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            self.port = int(line.rsplit(":", 1)[1])
        else:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            cmd = [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1",
                   "--directory", str(root)]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", self.port), 1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def download(port: int, clients: int, deadline_s: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, str(port), "/model.bin", str(clients),
         str(time.monotonic() + deadline_s)],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def single(server: Server, runs: int, size: int) -> list[float]:
    rates = []
    for _ in range(runs):
        r = download(server.port, 1, 3600)
        assert r["bytes"] == size, r
        rates.append(r["bytes"] / r["seconds"])
    return rates


def concurrent(server: Server, clients: int, duration: float) -> dict[str, float]:
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(rss(server.proc.pid))
            stop.wait(0.1)

    idle = rss(server.proc.pid)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = download(server.port, clients, duration)
    finally:
        stop.set()
        sampler.join()
    return {"idle": idle, "median": statistics.median(samples), "max": max(samples),
            "hwm": rss(server.proc.pid, "VmHWM"), "rate": r["bytes"] / r["seconds"],
            "bytes": r["bytes"], "seconds": r["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args()
    size = int(args.size_gib * (1 << 30))
    duration = 3600.0 if args.full else args.duration
    mib, gb = 1 << 20, 1e9

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_file(root, size)
        print(f"file: {size / (1 << 30):.2f} GiB, loopback, {os.cpu_count()} CPUs, "
              f"Python {sys.version.split()[0]}")
        results: dict[str, dict[str, object]] = {}
        for kind in ("llmgw", "stdlib"):
            server = Server(kind, root)
            try:
                rates = single(server, args.runs, size)
                conc = concurrent(server, args.clients, duration)
            finally:
                server.stop()
            results[kind] = {"single": statistics.median(rates), "rates": rates, **conc}
            print(f"\n[{kind}] one download: median {statistics.median(rates) / gb:.2f} GB/s "
                  f"(runs: {', '.join(f'{r / gb:.2f}' for r in rates)})")
            print(f"[{kind}] {args.clients} concurrent: {conc['rate'] / gb:.2f} GB/s aggregate, "
                  f"{conc['bytes'] / (1 << 30):.1f} GiB in {conc['seconds']:.1f} s")
            print(f"[{kind}] RSS idle {conc['idle'] / mib:.0f} MiB, during median "
                  f"{conc['median'] / mib:.0f} MiB, max {conc['max'] / mib:.0f} MiB, "
                  f"peak (VmHWM) {conc['hwm'] / mib:.0f} MiB")
        a, b = results["llmgw"], results["stdlib"]
        print(f"\nratio llmgw/stdlib: one download {float(a['single']) / float(b['single']):.2f}x,"
              f" {args.clients} concurrent {float(a['rate']) / float(b['rate']):.2f}x; "
              f"RSS growth under load llmgw +{(float(a['max']) - float(a['idle'])) / mib:.0f} MiB"
              f" vs stdlib +{(float(b['max']) - float(b['idle'])) / mib:.0f} MiB")


if __name__ == "__main__":
    main()
