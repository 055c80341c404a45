"""How fast a change made through one llmgw process is visible through another.

Two real `llmgw serve` processes share one database (SQLite file by default;
Postgres with LLMGW_BENCH_DATABASE=postgresql://...); a model added through
the first is polled for on the second. The promise is within one second.

    .venv/bin/python bench/catalog_follow.py
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "bench-follow-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
ROUNDS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        database = os.environ.get("LLMGW_BENCH_DATABASE", f"sqlite:///{d}/follow.db")
        config = Path(d) / "server.yaml"
        config.write_text("scheduler: {kind: local}\n")
        urls, procs = [], []
        for i in range(2):
            port = free_port()
            env = {**os.environ, "LLMGW_DATABASE_URL": database,
                   "LLMGW_ADMIN_TOKENS": f"bench{i}={TOKEN}"}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "llmgw.cli", "serve", "--config", str(config),
                 "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
                env=env, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        try:
            for url in urls:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{url} did not become ready")
                    time.sleep(0.1)
            a, b = urls
            delays = []
            for i in range(ROUNDS):
                name = f"follow-{i}"
                httpx.post(f"{a}/api/v1/models?skip_source_check=true", headers=HEADERS,
                           json={"name": name, "upstream": ["http://127.0.0.1:9"]},
                           timeout=30).raise_for_status()
                start = time.monotonic()
                while True:
                    names = {m["name"] for m in httpx.get(f"{b}/api/v1/models",
                                                          headers=HEADERS, timeout=30).json()}
                    if name in names:
                        break
                    time.sleep(0.01)
                delays.append(time.monotonic() - start)
            kind = database.split(":", 1)[0]
            print(f"change visible on the other process ({kind}, {ROUNDS} changes): "
                  f"median {statistics.median(delays) * 1000:.0f} ms, "
                  f"max {max(delays) * 1000:.0f} ms (promise: within 1,000 ms)")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)


if __name__ == "__main__":
    main()
