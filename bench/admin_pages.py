"""The admin console's pages at fleet scale: weight and server time per page.

Targets (the console's issue): every page under 150 KB and under 50 ms of server
time with 2,000 models and 1,000 keys. Measured in-process (Litestar's test
client, so no network; the figure includes the client's own few hundred
microseconds), over a real SQLite store holding the teams, keys and a day of
usage records, with the tests' scheduler double reporting every replica running
(its replica list cached, as a real scheduler adapter keeps its allocations).
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

from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import AdminToken, ServerConfig
from llmgw.scheduler.base import Replica
from llmgw.store.base import StoredKey, StoredTeam, UsageRecord
from llmgw.tenancy import Limits, encode_limits
from tests.admin.conftest import (
    ADMIN_TOKEN,
    GPU_CLASSES,
    FleetBackend,
    make_app,
    sign_in,
)

ROUNDS = 15
PAGES = ["/admin/models", "/admin/fragments/models", "/admin/models/model-7",
         "/admin/fleet", "/admin/usage", "/admin/teams", "/admin/add"]
MAX_BYTES = 150_000
MAX_MS = 50.0


class CachedFleet(FleetBackend):
    """The tests' scheduler double, its replica list built once per catalog applied, as a
    real scheduler adapter keeps its allocations: what is timed is the console's work,
    not the double fingerprinting 3,000 replicas on every call."""

    _cache: tuple[object, list[Replica]] | None = None

    async def replicas(self, model: str | None = None) -> list[Replica]:
        if self._cache is None or self._cache[0] is not self.catalog:
            self._cache = (self.catalog, await super().replicas())
        found = self._cache[1]
        return found if model is None else [r for r in found if r.model == model]


def models(n: int) -> list[Model]:
    return [Model(name=f"model-{i}", source=Source.parse(f"hf://org/model-{i}"),
                  engine="llama.cpp", description=f"Model {i} of the fleet",
                  profiles=[Profile(name="cpu", gpus=0, cpu_cores=4,
                                    memory=Size.parse("8GiB"))],
                  scaling=Scaling(min=1 + i % 2, max=4)) for i in range(n)]


async def fill(app_ctx: object, teams: int, keys: int) -> None:
    store = app_ctx.store  # type: ignore[attr-defined]
    for t in range(teams):
        limits = Limits(tokens_per_day=200_000, rpm=600)
        await store.put_team(StoredTeam(name=f"team-{t}", settings=encode_limits(limits),
                                        created_by="bench", created_at=time.time()),
                             create=True)
    for k in range(keys):
        await store.put_key(StoredKey(name=f"key-{k}", team=f"team-{k % teams}",
                                      sha256=f"{k:064x}", settings=b"{}", created_by="bench",
                                      created_at=time.time()))
    now = time.time()
    await store.record_usage([UsageRecord(
        id=f"u{i}", at=now - i * 4, key=f"key-{i % keys}", team=f"team-{i % keys % teams}",
        model=f"model-{i % 50}", replica="", gpu_class="", prompt_tokens=300,
        cached_tokens=0, completion_tokens=80, status=200 if i % 17 else 429, latency=0.3,
        ttft=0.05) for i in range(20_000)])


async def measure(n_models: int, teams: int, keys: int) -> dict[str, tuple[float, int]]:
    with tempfile.TemporaryDirectory() as d:
        config = ServerConfig(admin_tokens=[AdminToken(name="bench", token=ADMIN_TOKEN)],
                              gpu_classes=GPU_CLASSES, models=models(n_models))
        app, ctx = make_app(Path(d) / "bench.db", CachedFleet(), config)
        out: dict[str, tuple[float, int]] = {}
        async with AsyncTestClient(app) as client:
            await fill(ctx, teams, keys)
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
