"""Warm-node placement and cold/warm scale-ups of a large model, in the fake Nomad.

    .venv/bin/python bench/coldstart_nomad.py [--fleets N] [--runs N] [--bandwidth GB/s]

**Placement.** ``--fleets`` randomized fleets of 50 8×H100 nodes, each node already
running 0–6 GPUs of other work (so bin-packing pulls placements towards the fullest
node that fits). A 70B model (2 GPUs a replica) runs one replica; llmgw's cache keeper
marks that node warm from its finished fetch, as in production, and 1–5 other nodes
with room are made warm as a prefetch would. The model then scales to 2 replicas: how
often does the new replica land on a warm node? The baseline, on the same fleet and
warm nodes in the same run, is the same job without the affinity — what bin-packing
and the spread alone give. Goal: ≥ 95 % with the affinity.

**Time to a routable replica.** The real ``NomadBackend`` against the fake, an
on-demand 70B model (140 GB of weights) scaled from 0 to 1 by ``set_demand``, on a
fleet where one node with room holds the weights (warm) or none does (cold). The
fake's clients play the allocation: the fetch takes weights ÷ ``--bandwidth`` on a
cold node and nothing on a warm one (the fetcher finds the file with its checksum in
place), the engine load takes weights ÷ 2 GB/s (NVMe into GPU memory); these two are
slept, scaled by ``--time-scale``, and reported at full size. What is measured is
everything else: llmgw choosing and registering the job, Nomad placing it, and llmgw's
discovery seeing the replica healthy — the overhead a warm start adds to the engine's
own load. Goal: warm scale-up ≤ the engine's load + 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import httpx
import msgspec

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import GpuClass, Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import NomadConfig, SchedulerConfig, ServerConfig
from llmgw.scheduler.nomad import credentials, render
from llmgw.scheduler.nomad.backend import NomadBackend
from llmgw.scheduler.nomad.caches import CacheKeeper
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.testing.fake_nomad import FakeNomad, node_8x_h100_80g
from llmgw.weights import cache

MIRROR = "http://mirror.internal:8070"
CLASSES = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3",
                                memory=Size.parse("81559MiB"))}
WEIGHTS = 140 * 10**9          # Llama 3.3 70B in bf16
LOAD_RATE = 2 * 10**9          # NVMe into GPU memory, bytes per second


def model(min_: int = 1, max_: int | None = None) -> Model:
    return Model(name="llama-70b", engine="vllm",
                 source=Source.parse(f"{MIRROR}/llama-3-3-70b/v1/"),
                 profiles=[Profile(name="h100x2", gpu_class="h100-80g", gpus=2, cpu_cores=16,
                                   memory=Size.parse("256GiB"), context=32768)],
                 scaling=Scaling(min=min_, max=max_))


def cfg(address: str) -> NomadConfig:
    return NomadConfig(address=address, datacenters=["dc1"], timeout=10.0)


def hog(i: int, node_id: str, gpus: int) -> dict[str, Any]:
    """Other work pinned to one node: ``gpus`` H100s with their cores and memory."""
    return {"ID": f"other-{i:02d}", "Type": "service", "Datacenters": ["dc1"],
            "TaskGroups": [{
                "Name": "work", "Count": 1,
                "Constraints": [{"LTarget": "${node.unique.id}", "Operand": "=",
                                 "RTarget": node_id}],
                "Tasks": [{"Name": "t", "Driver": "docker", "Config": {"image": "x"},
                           "Resources": {"Cores": 6 * gpus or 1, "MemoryMB": 100_000 * gpus
                                         or 1024, "Devices": [{"Name": "nvidia/gpu",
                                                               "Count": gpus}] if gpus else []}}],
            }]}


def placement_trial(seed: int, affinity: bool) -> tuple[bool, int]:
    """One randomized fleet; whether the scaled-up replica landed on a warm node, and how
    many warm nodes with room there were."""
    rng = random.Random(seed)
    nodes = [node_8x_h100_80g(f"gpu-{i:02d}", "ib-a") for i in range(50)]
    used = [rng.choice([0, 0, 2, 4, 4, 6, 6]) for _ in nodes]
    m = model()
    with FakeNomad(nodes) as fake, httpx.Client(base_url=fake.address, timeout=30) as http:
        for i, (n, g) in enumerate(zip(nodes, used, strict=True)):
            if g:
                http.post("/v1/jobs", json={"Job": hog(i, n.id, g)})
        fake.settle()
        client = NomadClient(cfg(fake.address))
        try:
            job = render.render_job(m, m.profiles[0], client.cfg, CLASSES, 1, MIRROR)
            if not affinity:
                job = msgspec.structs.replace(job, TaskGroups=[
                    msgspec.structs.replace(g, Affinities=[]) for g in job.TaskGroups])
            client.register(job)
            fake.settle()
            [first] = fake.allocations(job.ID)
            fake.set_job_checks(job.ID, "success")   # healthy: its deployment completes
            fake.settle()
            keeper = CacheKeeper(client, client.cfg, CLASSES, MIRROR,
                                 credentials.Keeper(client, client.cfg, MIRROR))
            keeper.observe(build_catalog([m], CLASSES))     # marks the first node warm
            room = [n for n, g in zip(nodes, used, strict=True)
                    if g <= 6 and n.name != first.node_name]
            warm = rng.sample(room, rng.randint(1, 5))
            tag = cache.tag(render.weights_entry(m, MIRROR) or "")
            for n in warm:
                fake.apply_node_meta(n.name, {render.cache_key(m.name): tag})
            client.scale(job.ID, render.GROUP, 2, "bench: scale up")
            fake.settle()
            [second] = [a for a in fake.allocations(job.ID) if a.id != first.id]
            return second.node_name in {n.name for n in warm}, len(warm)
        finally:
            client.close()


async def scale_up_trial(warm_node: bool, bandwidth: float, time_scale: float,
                         seed: int) -> tuple[float, float, float, bool]:
    """(measured overhead, simulated fetch, simulated load, placed on the warm node)."""
    rng = random.Random(seed)
    nodes = [node_8x_h100_80g(f"gpu-{i:02d}", "ib-a") for i in range(12)]
    m = model(min_=0, max_=1)
    with FakeNomad(nodes, auto_run=False) as fake, \
            httpx.Client(base_url=fake.address, timeout=30) as http:
        for i, n in enumerate(nodes):
            g = rng.choice([0, 2, 4, 6])
            if g:
                http.post("/v1/jobs", json={"Job": hog(i, n.id, g)})
        fake.settle()
        for a in [a for j in range(len(nodes)) for a in fake.allocations(f"other-{j:02d}")]:
            fake.run_alloc(a.id)
        target = rng.choice(nodes)
        if warm_node:
            tag = cache.tag(render.weights_entry(m, MIRROR) or "")
            fake.apply_node_meta(target.name, {render.cache_key(m.name): tag})
        config = ServerConfig(scheduler=SchedulerConfig(kind="nomad", nomad=cfg(fake.address)),
                              gpu_classes=CLASSES, mirror=MIRROR, models=[m])
        backend = NomadBackend(config)
        await backend.start()
        try:
            await backend.apply(build_catalog([m], CLASSES))
            await backend.reconciled()
            began = time.monotonic()
            await backend.set_demand(m.name, 1)
            alloc = None
            while alloc is None:
                await asyncio.sleep(0.005)
                found = fake.allocations(render.job_id(m.name))
                alloc = found[0] if found else None
            on_warm = alloc.node_name == target.name
            hot = warm_node and on_warm
            fetch = 0.0 if hot else WEIGHTS / bandwidth
            load = WEIGHTS / LOAD_RATE
            fake.run_alloc(alloc.id, through_prestart=False)
            await asyncio.sleep(fetch * time_scale)
            fake.finish_prestart(alloc.id)
            await asyncio.sleep(load * time_scale)
            fake.set_check(alloc.id, "success")
            while not backend.endpoints(m.name):
                await asyncio.sleep(0.005)
            elapsed = time.monotonic() - began
            return elapsed - (fetch + load) * time_scale, fetch, load, on_warm
        finally:
            await backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleets", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bandwidth", type=float, default=1.25,
                        help="Simulated fetch rate in GB/s (1.25: a 10 Gbit/s link).")
    parser.add_argument("--time-scale", type=float, default=0.01,
                        help="Simulated durations are slept this much of (reported whole).")
    args = parser.parse_args()

    with_aff, without, warm_counts = [], [], []
    for seed in range(args.fleets):
        hit, k = placement_trial(seed, affinity=True)
        with_aff.append(hit)
        warm_counts.append(k)
        without.append(placement_trial(seed, affinity=False)[0])
    pct = 100 * sum(with_aff) / len(with_aff)
    base = 100 * sum(without) / len(without)
    print(f"placement: {args.fleets} randomized fleets of 50 8xH100 nodes, 1-5 warm nodes "
          f"with room (median {statistics.median(warm_counts):.0f}) besides the serving one")
    print(f"  scaled-up replica on a warm node: {pct:.1f} % with the affinity (goal >= 95 %), "
          f"{base:.1f} % without it (bin-packing and the spread alone)")

    bandwidth = args.bandwidth * 10**9
    results: dict[bool, list[tuple[float, float, float, bool]]] = {True: [], False: []}
    for i in range(args.runs):
        for warm in (True, False) if i % 2 == 0 else (False, True):
            results[warm].append(asyncio.run(
                scale_up_trial(warm, bandwidth, args.time_scale, seed=100 + i)))
    load = WEIGHTS / LOAD_RATE
    print(f"scale-up 0 -> 1 of a 70B model ({WEIGHTS / 1e9:.0f} GB), fetch at "
          f"{args.bandwidth:g} GB/s, engine load {load:.0f} s; medians of {args.runs}")
    for warm in (True, False):
        rows = results[warm]
        overhead = statistics.median(r[0] for r in rows)
        fetch = statistics.median(r[1] for r in rows)
        placed = sum(r[3] for r in rows)
        total = overhead + fetch + load
        where = (f"placed on the warm node {placed}/{len(rows)}" if warm
                 else "no node warm")
        print(f"  {'warm' if warm else 'cold'}: scale-up -> routable replica {total:7.1f} s = "
              f"fetch {fetch:6.1f} s + engine load {load:.1f} s + measured overhead "
              f"{overhead:.2f} s ({where})")
    warm_total = statistics.median(r[0] for r in results[True]) + load
    cold_total = statistics.median(r[0] for r in results[False]) + WEIGHTS / bandwidth + load
    print(f"  warm over the engine's own load: +{warm_total - load:.2f} s (goal <= +2 s); "
          f"cold/warm: {cold_total / warm_total:.2f}x")


if __name__ == "__main__":
    main()
