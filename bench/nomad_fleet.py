"""How long the fleet view takes for 1,000 nodes and 20,000 allocations (target: < 500 ms).

    .venv/bin/python bench/nomad_fleet.py [--nodes N] [--allocs A] [--rounds R]

Builds Nomad's answers as JSON (600 8×H100 nodes on two fabrics, 200 4×L40S,
200 CPU-only; allocations with reserved cores, memory and GPUs, a tenth of
them terminal), then measures:

* decode: ``/v1/node/:id`` × N and ``/v1/allocations?resources=true`` into
  llmgw's wire structs (what the client does with the bytes);
* build: ``build_fleet`` — free capacity per node and the pools;
* baseline: one plain pass summing every allocation's memory, the least any
  per-allocation accounting costs, to show what the real arithmetic adds.

Prints medians and p95 in milliseconds and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import random
import statistics
from typing import Any

import msgspec
from _timing import timed  # bench/ is on sys.path when a script here runs

from llmgw.catalog.model import GpuClass
from llmgw.catalog.units import Size
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.fleet import build_fleet

CLASSES = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB")),
           "l40s-48g": GpuClass(device="NVIDIA L40S", memory=Size.parse("46068MiB"))}


def node(i: int) -> dict[str, Any]:
    kind = "h100" if i < 600 else "l40s" if i < 800 else "cpu"
    cores, mhz = (64, 2800) if kind == "h100" else (48, 2900) if kind == "l40s" else (64, 3100)
    devices = []
    if kind != "cpu":
        n = 8 if kind == "h100" else 4
        devices.append({
            "Vendor": "nvidia", "Type": "gpu",
            "Name": "NVIDIA H100 80GB HBM3" if kind == "h100" else "NVIDIA L40S",
            "Attributes": {"memory": {"Int": 81559 if kind == "h100" else 46068, "Unit": "MiB"}},
            "Instances": [{"ID": f"GPU-{i}-{g}", "Healthy": True} for g in range(n)],
        })
    return {
        "ID": f"node-{i}", "Name": f"{kind}-{i:04d}", "Status": "ready" if i % 97 else "down",
        "SchedulingEligibility": "eligible", "Drain": i % 89 == 0,
        "Meta": {"llmgw_fabric": "ib-a" if i % 2 else "ib-b"} if kind == "h100" else {},
        "NodeResources": {"Cpu": {"CpuShares": cores * mhz, "TotalCpuCores": cores,
                                  "ReservableCpuCores": list(range(cores))},
                          "Memory": {"MemoryMB": 1_031_526}, "Devices": devices},
        "ReservedResources": {"Cpu": {"CpuShares": 2 * mhz, "ReservedCpuCores": [0, 1]},
                              "Memory": {"MemoryMB": 8192}},
        "ModifyIndex": 7,
    }


def alloc(j: int, nodes: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    n = nodes[rng.randrange(len(nodes))]
    gpus = [i["ID"] for d in n["NodeResources"]["Devices"] for i in d["Instances"]]
    taken = rng.sample(gpus, k=min(len(gpus), rng.choice([0, 1, 2]))) if gpus else []
    first = rng.randrange(2, 60)
    engine: dict[str, Any] = {
        "Cpu": {"CpuShares": 2 * 2800, "ReservedCores": [first, first + 1]},
        "Memory": {"MemoryMB": rng.choice([2048, 4096, 16384])},
    }
    if taken:
        engine["Devices"] = [{"Vendor": "nvidia", "Type": "gpu", "Name": "x", "DeviceIDs": taken}]
    return {
        "ID": f"alloc-{j}", "NodeID": n["ID"], "JobID": f"llmgw-m{j % 400}",
        "ClientStatus": "complete" if j % 10 == 0 else "running", "DesiredStatus": "run",
        "AllocatedResources": {
            "Tasks": {"engine": engine,
                      "fetch": {"Cpu": {"CpuShares": 500}, "Memory": {"MemoryMB": 512}}},
            "TaskLifecycles": {"engine": None, "fetch": {"Hook": "prestart", "Sidecar": False}},
            "Shared": {"DiskMB": 300},
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--allocs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    rng = random.Random(7)
    raw_nodes = [node(i) for i in range(args.nodes)]
    raw_allocs = [alloc(j, raw_nodes, rng) for j in range(args.allocs)]
    node_bytes = [msgspec.json.encode(n) for n in raw_nodes]
    allocs_bytes = msgspec.json.encode(raw_allocs)
    # Only the bytes stay, as in the server: live builder dicts would make every
    # garbage collection during the measurement walk 20,000 extra objects.
    del raw_nodes, raw_allocs
    node_dec = msgspec.json.Decoder(wire.Node)
    allocs_dec = msgspec.json.Decoder(list[wire.Allocation])

    def decode() -> tuple[list[wire.Node], list[wire.Allocation]]:
        return [node_dec.decode(b) for b in node_bytes], allocs_dec.decode(allocs_bytes)

    nodes, allocs = decode()

    def build() -> object:
        return build_fleet(nodes, allocs, CLASSES, "llmgw_fabric")

    def baseline() -> int:
        total = 0
        for a in allocs:
            if a.AllocatedResources and a.AllocatedResources.Tasks:
                for t in a.AllocatedResources.Tasks.values():
                    total += t.Memory.MemoryMB
        return total

    def both() -> object:
        n, a = decode()
        return build_fleet(n, a, CLASSES, "llmgw_fabric")

    base = timed(baseline, args.rounds)
    rows = [("baseline (sum memory)", base), ("decode", timed(decode, args.rounds)),
            ("build_fleet", timed(build, args.rounds)),
            ("decode + build_fleet", timed(both, args.rounds))]
    fleet = build()
    print(f"{args.nodes} nodes, {args.allocs} allocations, {len(fleet.pools)} pools "  # type: ignore[attr-defined]
          f"({args.rounds} rounds); target: fleet view < 500 ms")
    bm = statistics.median(base)
    for name, samples in rows:
        med = statistics.median(samples)
        p95 = sorted(samples)[int(0.95 * (len(samples) - 1))]
        print(f"  {name:<24} median {med:7.1f} ms   p95 {p95:7.1f} ms   "
              f"x{med / bm:6.1f} of baseline")


if __name__ == "__main__":
    main()
