"""Page weight and server time of every admin console page on a large fleet.

    .venv/bin/python bench/console_pages.py [--rounds 7]

The real control app in process (Litestar's test client, no sockets) over a
SQLite store holding 1,000 runtime keys in 50 teams, 20,000 usage records
and 1,000 request logs, with 2,000 declared models whose replicas (one each) the
admin tests' scheduler double reports from a cache, as a real backend does, and gateway metrics with
traffic on every model (the live view's input). Each page is fetched
``--rounds`` times after one warm-up; the figure is the median wall time of
the whole in-process request (routing, session check, the page's reads,
rendering), and its ratio to the sign-in page — the lightest page, a
template and nothing else — measured in the same run. The live view is
timed twice: as it comes (a sampling of the gateway's metrics runs in a
worker thread every few seconds and competes for the interpreter) and
between samplings. Targets: under 150 KB and under 50 ms a page.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from litestar.testing import AsyncTestClient  # noqa: E402

from llmgw.admin.console import live  # noqa: E402
from llmgw.admin.console.reqlogs import Entry  # noqa: E402
from llmgw.catalog.build import Catalog  # noqa: E402
from llmgw.catalog.decode import convert  # noqa: E402
from llmgw.catalog.model import Model  # noqa: E402
from llmgw.config import AdminToken, ServerConfig  # noqa: E402
from llmgw.gateway.metrics import GatewayMetrics  # noqa: E402
from llmgw.scheduler.base import ModelStatus, Replica  # noqa: E402
from llmgw.store.base import RequestLog, StoredKey, StoredTeam, UsageRecord  # noqa: E402
from llmgw.tenancy import Limits, encode_limits, generate_key, hash_key  # noqa: E402
from tests.admin.conftest import (  # noqa: E402
    ADMIN_TOKEN,
    GPU_CLASSES,
    FleetBackend,
    make_app,
    sign_in,
)

MODELS, TEAMS, KEYS, RECORDS, LOGS = 2000, 50, 1000, 20_000, 1000


class CachedFleet(FleetBackend):
    """The admin tests' scheduler double, answering from a cache as real backends do
    (their replica lists and statuses are kept by a watch, not computed per call; the
    double recomputes every fingerprint on each call, which is not what is measured)."""

    def __init__(self) -> None:
        super().__init__()
        self._replicas: list[Replica] | None = None
        self._status: dict[str, ModelStatus] = {}

    async def apply(self, catalog: Catalog) -> None:
        await super().apply(catalog)
        self._replicas = None
        self._status = {}

    async def replicas(self, model: str | None = None) -> list[Replica]:
        if self._replicas is None:
            self._replicas = await super().replicas()
        return [r for r in self._replicas if model in (None, r.model)]

    def status(self, model: str) -> ModelStatus:
        found = self._status.get(model)
        if found is None:
            found = self._status[model] = super().status(model)
        return found
MAX_BYTES, MAX_MS = 150_000, 50.0


def models(n: int = MODELS) -> list[Model]:
    return [convert({
        "name": f"model-{i:04d}", "source": f"/models/model-{i:04d}.gguf",
        "engine": "llama.cpp", "description": f"Model {i} of the benchmark fleet",
        "profiles": [{"name": "cpu", "gpus": 0, "cpu_cores": 4, "memory": "8GiB"}],
        "scaling": {"min": 1, "max": 3}}, Model) for i in range(n)]


def metrics() -> GatewayMetrics:
    m = GatewayMetrics(lambda: [(f"model-{i:04d}", 1, 0) for i in range(MODELS)])
    for i in range(MODELS):
        mm = m.for_model(f"model-{i:04d}")
        for status in (200, 200, 200, 502, 429):
            mm.done(status)
        mm.latency.observe(0.2 + i % 7 / 10)
        mm.ttft.observe(0.05 + i % 5 / 100)
        mm.tokens_prompt.inc(400)
        mm.tokens_cached.inc(100)
        mm.tokens_completion.inc(120)
    return m


async def fill(ctx: object, now: float, teams: int = TEAMS, keys: int = KEYS) -> None:
    """The store's teams, keys, usage records and request logs (``bench/admin_pages.py``
    fills its store with this too)."""
    store = ctx.store  # type: ignore[attr-defined]
    for t in range(teams):
        limits = Limits(tokens_per_day=200_000, log_requests="bodies" if t == 0 else None)
        await store.put_team(StoredTeam(name=f"team-{t:02d}", settings=encode_limits(limits),
                                        created_by="bench", created_at=now), create=True)
    for k in range(keys):
        await store.put_key(StoredKey(
            name=f"key-{k:04d}", team=f"team-{k % teams:02d}", sha256=hash_key(generate_key()),
            settings=encode_limits(Limits(rpm=600) if k % 3 == 0 else Limits()),
            created_by="bench", created_at=now))
    records = [UsageRecord(
        id=f"r{i}", at=now - (i % 3600), key=f"key-{i % keys:04d}",
        team=f"team-{i % keys % teams:02d}", model=f"model-{i % MODELS:04d}",
        replica="10.0.3.17:24117", gpu_class="", prompt_tokens=400, cached_tokens=100,
        completion_tokens=120, status=200 if i % 10 else 429, latency=0.4, ttft=0.05)
        for i in range(RECORDS)]
    await store.record_usage(records)
    encode = msgspec.json.Encoder().encode
    await store.put_request_logs([RequestLog(
        id=f"log{i}", at=now - i, expires_at=now + 86400, team="team-00",
        key=f"key-{(i * teams) % keys:04d}",
        record=encode(Entry(path="/v1/chat/completions", requested="model-0001", stream=False,
                            usage=records[i])),
        request=b'{"model": "model-0001", "messages": [{"role": "user", "content": "hi"}]}',
        response=b'{"choices": [{"message": {"content": "hello"}}]}') for i in range(LOGS)])


PAGES = ["/admin/signin", "/admin/models", "/admin/models/model-0001", "/admin/fleet",
         "/admin/usage", "/admin/teams", "/admin/add", "/admin/replicas",
         "/admin/replica?id=model-0001-0&model=model-0001", "/admin/playground",
         "/admin/spend", "/admin/spend?period=month", "/admin/keys/key-0001", "/admin/logs",
         "/admin/logs/request?team=team-00&id=log5&at={at5}", "/admin/guided",
         "/admin/mirror",
         # Last: their sampling thread would otherwise run on into the pages after them.
         "/admin/live", "/admin/live.json"]


async def run(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig(admin_tokens=[AdminToken(name="alice", token=ADMIN_TOKEN)],
                              gpu_classes=GPU_CLASSES, models=models())
        app, ctx = make_app(Path(tmp) / "llmgw.db", CachedFleet(), config)
        gm = metrics()
        ctx.gateway_samples, ctx.gateway_state = gm.counted_samples, gm.state_samples
        now = time.time()
        async with AsyncTestClient(app) as client:
            await fill(ctx, now)
            await sign_in(client)
            rows = []
            for path in PAGES:
                url = path.format(at5=now - 5)
                saved = dict(client.cookies)
                if path == "/admin/signin":
                    # Signed in, the sign-in page redirects: fetch it as a visitor does.
                    client.cookies.clear()
                fetch = client.get
                r = await fetch(url, follow_redirects=False)
                assert r.status_code == 200, (url, r.status_code, r.text[:300])
                times = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    r = await fetch(url, follow_redirects=False)
                    times.append((time.perf_counter() - start) * 1000)
                rows.append((path.split("?")[0] if "{" in path else path, len(r.content),
                             statistics.median(times)))
                if path == "/admin/signin":
                    client.cookies.update(saved)
            # The live view again, with its sampling of the gateway's metrics at hand:
            # what a refresh costs between two samplings, rather than while a sampling
            # (prometheus_client's collect() of every series, in a worker thread)
            # competes for the interpreter.
            live.SAMPLE_EVERY = float("inf")
            while any(st.taking is not None and not st.taking.done()
                      for st in live._samplings.values()):
                await asyncio.sleep(0.05)
            for path in ("/admin/live", "/admin/live.json"):
                await client.get(path)
                times = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    r = await client.get(path)
                    times.append((time.perf_counter() - start) * 1000)
                rows.append((f"{path} (between samplings)", len(r.content),
                             statistics.median(times)))
    baseline = rows[0][2]
    print(f"{MODELS:,} models, {KEYS:,} keys in {TEAMS} teams, {RECORDS:,} usage records, "
          f"{LOGS:,} request logs; median of {rounds} rounds after a warm-up; "
          f"baseline: the sign-in page ({baseline:.1f} ms)")
    print(f"{'page':44} {'bytes':>9} {'ms':>7} {'× base':>7}  targets")
    for path, size, ms in rows:
        ok = ("ok" if size < MAX_BYTES and ms < MAX_MS else
              "OVER " + ", ".join(x for x, bad in (("150 KB", size >= MAX_BYTES),
                                                  ("50 ms", ms >= MAX_MS)) if bad))
        print(f"{path:44} {size:>9,} {ms:>7.1f} {ms / baseline:>7.1f}  {ok}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(run(args.rounds))


if __name__ == "__main__":
    main()
