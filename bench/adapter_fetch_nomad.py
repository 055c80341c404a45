"""The first request for an adapter on Nomad: fetched onto the node, or already there.

    .venv/bin/python bench/adapter_fetch_nomad.py [--rounds N] [--size MiB]

The stack of ``llmgw.testing.nomad_lora``: the fake Nomad with two CPU nodes and one
replica of a LoRA base on each, a real mirror, real ``llmgw fetch`` tasks, the
simulated vLLM reading the node's disk, the real backend and gateway, and the
``openai`` client. Each round times one chat completion (one token) for an adapter
no replica holds, two ways, in the same run:

* **cold**: no node holds it; the gateway has its fetch job run on the chosen
  replica's node, waits for it, then loads it;
* **warm** (the baseline): one node's disk and metadata hold it; the gateway picks
  that node's replica and loads it at once, with no job.

Reported, medians over the rounds: both latencies, their ratio, the fetch process's
own run time (``llmgw fetch``, started by the fake's client), and what the job path
adds beyond that process and the load: registering the job, Nomad placing it, the
gateway seeing it finish. That last figure is the price of a batch job per fetch
over a fetch already running on the node.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import openai

from llmgw.scheduler.nomad.render import adapter_fetch_of, cache_key
from llmgw.testing.fake_nomad.fixtures import CACHE_VOLUME
from llmgw.testing.nomad_lora import NODES, LoraStack, adapter, lora_on_nomad, publish
from llmgw.weights import cache


async def _first(s: LoraStack, client: openai.AsyncOpenAI, name: str) -> float:
    """Milliseconds for one answer from ``name``, then unloaded again everywhere."""
    started = time.perf_counter()
    await client.chat.completions.create(model=name, max_tokens=1,
                                         messages=[{"role": "user", "content": "hi"}])
    took = (time.perf_counter() - started) * 1000
    async with httpx.AsyncClient() as http:
        for url in s.backend.endpoints("qwen"):
            await http.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name})
    async with asyncio.timeout(60):
        while s.gateway.adapters.loaded_where():
            await asyncio.sleep(0.05)
    return took


async def run(rounds: int, size: int) -> None:
    names = [f"cold-{i}" for i in range(rounds)] + [f"warm-{i}" for i in range(rounds)]

    def published(root: Path) -> None:
        for n in names:
            publish(root, n, size=size)

    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp:
        async with lora_on_nomad(Path(tmp), published) as s:
            adapters = [adapter(n, s.mirror) for n in names]
            warm_node = NODES[1]
            for a in adapters[rounds:]:
                found = adapter_fetch_of(a, s.mirror)
                assert found is not None
                where = s.disks[warm_node] / CACHE_VOLUME / found[1].removeprefix(
                    "/llmgw-cache/")
                where.mkdir(parents=True)
                for f in (Path(tmp) / "mirror" / "adapters" / a.name).iterdir():
                    (where / f.name).write_bytes(f.read_bytes())
                s.nomad.apply_node_meta(warm_node, {cache_key(a.name): cache.tag(found[1])})
            await asyncio.to_thread(s.nomad.advance, 10)   # the client's re-register lands
            await s.add(*adapters)
            async with asyncio.timeout(60):
                while not any(s.backend.adapter_warm(adapters[-1], u)
                              for u in s.backend.endpoints("qwen")):
                    await asyncio.sleep(0.1)
            client = s.openai()
            cold, warm = [], []
            try:
                await _first(s, client, "warm-0")          # warm-up: imports, connections
                for i in range(rounds):
                    cold.append(await _first(s, client, f"cold-{i}"))
                    warm.append(await _first(s, client, f"warm-{i}"))
            finally:
                await client.close()
            fetch = [sec * 1000 for sec in s.fetches.seconds.values()]
            jobs = s.adapter_jobs()
            assert len(jobs) == rounds, jobs        # the warm adapters were never fetched
    c, w, f = statistics.median(cold), statistics.median(warm), statistics.median(fetch)
    print(f"adapter first request on the fake Nomad, {rounds} rounds, "
          f"{size / 2**20:.0f} MiB of weights, medians:")
    print(f"  cold (fetch job, then load)  {c:8.0f} ms")
    print(f"  warm (load only; baseline)   {w:8.0f} ms")
    print(f"  cold / warm                  {c / w:8.1f} x")
    print(f"  llmgw fetch process          {f:8.0f} ms")
    print(f"  job path beyond fetch + load {c - w - f:8.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=16, help="MiB of adapter weights")
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.size * 2**20))


if __name__ == "__main__":
    main()
