"""Which server and which upstream client the gateway uses, chosen by these numbers.

    .venv/bin/python bench/gateway_compare.py [--duration 5]

For each candidate: median latency at concurrency 1 and throughput at
concurrency 32 for a small non-streaming chat completion, against the same
nginx (or Python) upstream, one worker process, measured in one run:

* the gateway under granian (asyncio loop, and uvloop when installed) and
  under uvicorn (asyncio + h11, and uvloop + httptools when installed);
* a bare pass-through with aiohttp and with httpx as the upstream client
  (``gateway_minimal.py``), which isolates the client's own cost.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_bench import (
    BENCH,
    PYTHON,
    free_port,
    load,
    nginx_upstream,
    python_upstream,
    running,
)


@contextlib.contextmanager
def served(kind: str, module: str, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    bindir = Path(PYTHON).parent
    server, _, loop = kind.partition("+")
    if server == "granian":
        args = [str(bindir / "granian"), "--interface", "asgi", "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1", "--loop", loop, "--log-level",
                "warning", "--working-dir", str(BENCH), f"{module}:app"]
    else:
        http = "httptools" if loop == "uvloop" else "h11"
        args = [str(bindir / "uvicorn"), "--host", "127.0.0.1", "--port", str(port),
                "--loop", loop, "--http", http, "--no-access-log", "--log-level", "warning",
                "--app-dir", str(BENCH), f"{module}:app"]
    with running(args, port, env=env):
        yield f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-gwcmp-"))
    uvloop = importlib.util.find_spec("uvloop") is not None
    candidates = [("gateway", "granian+asyncio"), ("gateway", "uvicorn+asyncio")]
    if uvloop:
        candidates += [("gateway", "granian+uvloop"), ("gateway", "uvicorn+uvloop")]
    best = "uvicorn+uvloop" if uvloop else "uvicorn+asyncio"
    candidates += [("aiohttp", best), ("httpx", best)]
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(nginx_upstream(tmp) if shutil.which("nginx")
                                       else python_upstream(100, 0.1))
        _, direct1, _ = load(upstream, 1, args.duration, tmp)
        direct32, _, _ = load(upstream, 32, args.duration, tmp)
        print(f"direct to the upstream: median {direct1:.3f} ms at c=1, "
              f"{direct32:,.0f} req/s at c=32")
        print(f"{'what':<34}{'added ms (c=1)':>16}{'req/s (c=32)':>14}{'ratio':>8}")
        for what, kind in candidates:
            if what == "gateway":
                module, env = "gateway_serve", {"LLMGW_BENCH_MODELS": f"bench={upstream}"}
            else:
                module, env = "gateway_minimal", {"LLMGW_BENCH_UPSTREAM": upstream,
                                                  "LLMGW_BENCH_CLIENT": what}
            with served(kind, module, env) as url:
                _, med1, _ = load(url, 1, args.duration, tmp)
                rps, _, bad = load(url, 32, args.duration, tmp)
            label = f"{what if what != 'gateway' else 'llmgw gateway'} on {kind}"
            note = f"  ({bad} failed)" if bad else ""
            print(f"{label:<34}{med1 - direct1:>16.3f}{rps:>14,.0f}{rps / direct32:>8.3f}{note}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
