"""The admin console's pages at fleet scale: weight and server time per page.

Targets (the console's issue): every page under 150 KB and under 50 ms of server
time with 2,000 models and 1,000 keys. Measured in-process (Litestar's test
client, so no network; the figure includes the client's own few hundred
microseconds), over a real SQLite store holding the teams, keys, usage records
and request logs ``bench/console_pages.py`` fills it with, and its scheduler double
reporting every replica running (from a cache, as a real scheduler adapter keeps its allocations).
Each page is timed ``ROUNDS`` times after a warm-up and reported as the median,
beside the same page with 1 model and 1 key measured in the same run (the
ratio says what the fleet's size costs).

    .venv/bin/python bench/admin_pages.py
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from litestar.testing import AsyncTestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# bench/ is on sys.path when a script here runs.
from console_pages import CachedFleet, fill, models

from llmgw.config import AdminToken, ServerConfig
from tests.admin.conftest import ADMIN_TOKEN, GPU_CLASSES, make_app, sign_in

ROUNDS = 15
PAGES = ["/admin/models", "/admin/fragments/models", "/admin/models/model-0007",
         "/admin/fleet", "/admin/usage", "/admin/teams", "/admin/add"]
MAX_BYTES = 150_000
MAX_MS = 50.0


async def measure(n_models: int, teams: int, keys: int) -> dict[str, tuple[float, int]]:
    with tempfile.TemporaryDirectory() as d:
        config = ServerConfig(admin_tokens=[AdminToken(name="bench", token=ADMIN_TOKEN)],
                              gpu_classes=GPU_CLASSES, models=models(n_models))
        app, ctx = make_app(Path(d) / "bench.db", CachedFleet(), config)
        out: dict[str, tuple[float, int]] = {}
        async with AsyncTestClient(app) as client:
            await fill(ctx, time.time(), teams, keys)
            await sign_in(client)
            for path in PAGES:
                r = await client.get(path)
                assert r.status_code == 200, (path, r.status_code)
                samples = []
                for _ in range(ROUNDS):
                    start = time.perf_counter()
                    r = await client.get(path)
                    samples.append((time.perf_counter() - start) * 1000)
                out[path] = (statistics.median(samples), len(r.content))
        return out


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("llmgw").setLevel(logging.WARNING)
    small = asyncio.run(measure(8, 1, 1))
    large = asyncio.run(measure(2000, 10, 1000))
    print(f"admin pages, median of {ROUNDS} in-process GETs; baseline 8 models / 1 key, "
          "fleet 2,000 models / 1,000 keys / 20,000 usage records")
    print(f"{'page':32} {'baseline':>14} {'fleet':>16} {'ratio':>6}  target")
    for path in PAGES:
        (b_ms, b_size), (f_ms, f_size) = small[path], large[path]
        ok = f_size < MAX_BYTES and f_ms < MAX_MS
        print(f"{path:32} {b_ms:6.1f} ms {b_size / 1000:5.0f} KB "
              f"{f_ms:7.1f} ms {f_size / 1000:6.0f} KB {f_ms / b_ms:6.1f}  "
              f"{'met' if ok else 'MISSED'} (< {MAX_MS:.0f} ms, < {MAX_BYTES // 1000} KB)")


if __name__ == "__main__":
    main()
