"""An overload step against a scaled, admission-controlled model of simulated engines.

    .venv/bin/python bench/routing_overload.py [--steady 330] [--load-time 10]

One process serves the gateway (one worker, as ``llmgw serve``) in front of a
scheduler double that runs simulated engines in the same process: it starts
``--initial`` replicas, and on ``set_demand`` starts more (each ready after
``--load-time`` s, as a model load) or stops the newest. The model runs
between 2 and 8 replicas with the default scaler and admission settings.

The load (this process) is single-turn streaming chats, each with its own
~500-token prompt, arriving as a Poisson process: 0.5x the initial fleet's
capacity for 30 s, **3x for 30 s**, then 0.5x again for ``--steady`` seconds
(5.5 minutes by default: the scaler must not scale down within 5 minutes of
its scale-up). Capacity is measured first, closed-loop, on the initial fleet.

The run is made twice: first with admission control and the scaler off (no
saturation limit, one fixed fleet: what a gateway without them does; its
capacity is measured here, closed-loop, so that the measuring does not
itself wake a scaler), for the step only; then with both as configured.

Reported: per phase, requests answered 200 and 429, TTFT p50/p95 of the
admitted ones; when the scaler first asked for more replicas (from the start
of the step) and every change it made after, with its reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp

from llmgw.scheduler.base import SameDisk

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from gateway_bench import free_port  # noqa: E402
from routing_replay import WORDS, pct  # noqa: E402

SPEC = {"max_seqs": 16, "token_budget": 2048, "step_time": 0.015, "decode_per_seq": 0.0004,
        "prefill_per_token": 0.00012, "cache_blocks": 4096, "chunk_tokens": 8}


# ---------------------------------------------------------------- the served side


async def serve(port: int, initial: int, load_time: float, controlled: bool) -> None:
    import uvicorn

    from llmgw.catalog.build import Catalog, build_catalog
    from llmgw.catalog.decode import convert
    from llmgw.catalog.model import Model
    from llmgw.config import GatewayConfig, ServerConfig
    from llmgw.gateway import Gateway
    from llmgw.scheduler.base import BackendHealth, Fleet, ModelStatus, Replica
    from llmgw.store.sqlite import SqliteStore
    from llmgw.testing.simengine import SimEngine, SimSpec

    spec = SimSpec(**SPEC)  # type: ignore[arg-type]

    class SimScheduler(SameDisk):
        """Runs simulated replicas in this process; a replica loads for ``load_time`` s."""

        def __init__(self) -> None:
            self.ready: list[SimEngine] = []
            self.desired = 0
            self.loading = 0
            self._changed = asyncio.Event()

        async def boot(self, n: int) -> None:
            for _ in range(n):
                engine = SimEngine(spec, "sim")
                await engine.start()
                self.ready.append(engine)
            self.desired = n
            self._kick()

        def _kick(self) -> None:
            self._changed.set()
            self._changed = asyncio.Event()

        def endpoints(self, model: str) -> list[str]:
            return [e.url for e in self.ready]

        def profile_of(self, address: str) -> str | None:
            return None

        async def wait_changed(self, timeout: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

        async def set_demand(self, model: str, replicas: int) -> None:
            replicas = max(2, min(8, replicas))
            grow = replicas - self.desired
            self.desired = replicas
            for _ in range(grow):
                asyncio.get_running_loop().create_task(self._load())
            while len(self.ready) + self.loading > replicas and self.ready:
                await self.ready.pop().stop()
                self._kick()

        async def _load(self) -> None:
            self.loading += 1
            await asyncio.sleep(load_time)
            engine = SimEngine(spec, "sim")
            await engine.start()
            self.loading -= 1
            self.ready.append(engine)
            self._kick()

        def status(self, model: str) -> ModelStatus:
            return ModelStatus(desired=self.desired, ready=len(self.ready))

        async def start(self) -> None: ...
        async def close(self) -> None: ...
        async def check_placement(self, model: Model, catalog: Catalog) -> None: ...
        async def apply(self, catalog: Catalog) -> None: ...
        async def rollout(self, model: str) -> None: ...

        async def replicas(self, model: str | None = None) -> list[Replica]:
            return []

        async def fleet(self) -> Fleet:
            return Fleet(nodes=[], pools=[])

        def health(self) -> BackendHealth:
            return BackendHealth(ok=True)

    class Catalogs:
        def __init__(self, catalog: Catalog) -> None:
            self.catalog = catalog

    routing: dict[str, Any] = {"policy": "prefix-affinity"}
    scaling: dict[str, Any] = {"min": 2, "max": 8}
    if not controlled:   # no saturation limit and a fixed fleet: what a plain gateway does
        routing |= {"max_waiting": 1_000_000}
        scaling = {"min": initial, "max": initial}
    model = convert({"name": "sim", "source": "/models/sim.gguf", "engine": "llama.cpp",
                     "profiles": [{"name": "cpu", "cpu_cores": 1, "memory": "1GiB"}],
                     "scaling": scaling, "routing": routing}, Model)
    backend = SimScheduler()
    await backend.boot(initial)
    state = tempfile.mkdtemp(prefix="llmgw-overload-")
    store = SqliteStore(f"sqlite:///{state}/store.db")
    await store.open()
    gateway = Gateway(ServerConfig(listen="127.0.0.1:0", gateway=GatewayConfig()),
                      Catalogs(build_catalog([model])), backend, store)
    await gateway.start()
    server = uvicorn.Server(uvicorn.Config(gateway, host="127.0.0.1", port=port,
                                           lifespan="off", log_level="warning",
                                           access_log=False, backlog=4096,
                                           timeout_keep_alive=120))
    await server.serve()


# ---------------------------------------------------------------- the load


class Phase:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ttft: list[float] = []
        self.codes: dict[str, int] = {}

    def count(self, code: str) -> None:
        self.codes[code] = self.codes.get(code, 0) + 1


async def one(http: aiohttp.ClientSession, url: str, rng: random.Random, phase: Phase) -> None:
    prompt = f"{rng.random():.15f} " + " ".join(rng.choice(WORDS) for _ in range(300))
    body = {"model": "sim", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 64, "stream": True}
    sent = time.monotonic()
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                await r.read()
                phase.count(str(r.status))
                return
            first = None
            async for _ in r.content.iter_any():
                if first is None:
                    first = time.monotonic() - sent
            phase.ttft.append(first if first is not None else time.monotonic() - sent)
            phase.count("200")
    except (aiohttp.ClientError, TimeoutError) as exc:
        phase.count(type(exc).__name__)


async def capacity(url: str, seconds: float = 15.0, clients: int = 96) -> float:
    """Completions per second of the fleet under closed-loop saturation."""
    rng = random.Random(1)
    phase = Phase("calibrate")
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:
        async def loop() -> None:
            while time.monotonic() < stop:
                await one(http, url, rng, phase)

        started = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(clients)))
    return phase.codes.get("200", 0) / (time.monotonic() - started)


async def watch(url: str, t0: float, changes: list[tuple[float, int, str]],
                stop: asyncio.Event) -> None:
    last: int | None = None
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            try:
                async with http.get(f"{url}/metrics") as r:
                    text = await r.text()
            except aiohttp.ClientError:
                text = ""
            m = re.search(r'llmgw_gateway_desired_replicas\{model="sim",reason="(\w+)"\} (\S+)',
                          text)
            if m:
                desired = int(float(m.group(2)))
                if desired != last:
                    changes.append((time.monotonic() - t0, desired, m.group(1)))
                    last = desired
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await stop.wait()


async def run(url: str, plan: Iterable[tuple[str, float, float]], seed: int
              ) -> tuple[list[Phase], list[tuple[float, int, str]], float]:
    rng = random.Random(seed)
    phases: list[Phase] = []
    changes: list[tuple[float, int, str]] = []
    t0 = time.monotonic()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(url, t0, changes, stop))
    tasks: list[asyncio.Task[None]] = []
    step_at = 0.0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=900)) as http:
        for name, rate, seconds in plan:
            phase = Phase(name)
            phases.append(phase)
            if name == "step":
                step_at = time.monotonic() - t0
            end = time.monotonic() + seconds
            while True:
                await asyncio.sleep(rng.expovariate(rate))
                if time.monotonic() >= end:
                    break
                tasks.append(asyncio.create_task(one(http, url, rng, phase)))
        await asyncio.gather(*tasks)
    stop.set()
    await watcher
    return phases, changes, step_at


def show(phases: list[Phase]) -> None:
    for p in phases:
        print(f"    {p.name:<8} answered {sum(p.codes.values()):5d}: {p.codes}   admitted TTFT "
              f"p50 {pct(p.ttft, .5) * 1000:7.0f} ms  p95 {pct(p.ttft, .95) * 1000:7.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--initial", type=int, default=2)
    parser.add_argument("--load-time", type=float, default=10.0)
    parser.add_argument("--steady", type=float, default=330.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--uncontrolled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port, args.initial, args.load_time, not args.uncontrolled))
        return
    print(f"machine: {os.cpu_count()} cores; engines {SPEC}; initial replicas {args.initial}, "
          f"load time {args.load_time:g}s")
    results = {}
    cap = 0.0
    for controlled in (False, True):
        port = free_port()
        cmd = [sys.executable, __file__, "--serve", "--port", str(port), "--initial",
               str(args.initial), "--load-time", str(args.load_time)]
        if not controlled:
            cmd.append("--uncontrolled")
        proc = subprocess.Popen(cmd)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(OSError):
                    import socket

                    socket.create_connection(("127.0.0.1", port), 0.5).close()
                    break
                assert time.monotonic() < deadline
                assert proc.poll() is None
                time.sleep(0.1)
            if not controlled:
                cap = asyncio.run(capacity(url))
            steady = args.steady if controlled else 30.0
            plan = [("warm", 0.5 * cap, 30.0), ("step", 3 * cap, 30.0),
                    ("after", 0.5 * cap, steady)]
            label = ("admission control + scaler (defaults)" if controlled
                     else "no admission control, fixed fleet")
            print(f"\n{label}: capacity of {args.initial} replicas {cap:.1f} req/s; "
                  f"0.5x = {0.5 * cap:.1f}/s, step 3x = {3 * cap:.1f}/s")
            phases, changes, step_at = asyncio.run(run(url, plan, 7))
            show(phases)
            if controlled:
                ups = [c for c in changes if c[1] > args.initial]
                first_up = ups[0][0] - step_at if ups else None
                print(f"    scaler: {[(round(t - step_at, 1), n, k) for t, n, k in changes]} "
                      "(seconds from the step, desired, reason)")
                print("    first scale-up "
                      + (f"{first_up:.1f} s after the step starts" if first_up is not None
                         else "never"))
                if ups:
                    peak_at = max(t for t, n, _ in changes if n == max(x[1] for x in changes))
                    downs = [c for c in changes if c[0] > ups[0][0] and c[1] < max(
                        x[1] for x in changes if x[0] <= c[0])]
                    early = [d for d in downs if d[0] - peak_at < 300]
                    print(f"    scale-downs within 5 min of the last scale-up: {len(early)}"
                          f" (of {len(downs)} in the run)")
            results[controlled] = {"phases": {p.name: {"codes": p.codes,
                                                       "ttft_p95": pct(p.ttft, .95)}
                                              for p in phases}, "changes": changes}
        finally:
            proc.terminate()
            proc.wait(20)
    (BENCH / ".routing_overload.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
