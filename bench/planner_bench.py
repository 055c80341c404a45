"""Planning one model against a fleet of 1,000 nodes (target: under 200 ms).

Builds a Fleet the way the scheduler reports one (nodes, and pools grouped by
gpu class and fabric), then times what POST /api/v1/plan does with it:
``pools_from_fleet`` and ``plan_model``. Two fleets: a realistic one (1,000
nodes in 21 pools) and a worst case where every node sits on a fabric of its
own (1,000 pools). The baseline, measured in the same run, is the same model
planned against a single pool.

Run: .venv/bin/python bench/planner_bench.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from llmgw.planner.candidates import PoolSpec, pools_from_fleet
from llmgw.planner.plan import ParameterCount, PlanRequest, plan_model
from llmgw.scheduler.base import Fleet, NodeView, Pool

GiB = 1024**3
MiB = 1024**2
CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "planner" / "fixtures" / "configs"

# (gpu class, GPUs per node, card memory, fabrics, nodes)
SHAPES = [("h100-80g", 8, 81559 * MiB, 10, 600), ("l40s-48g", 4, 46068 * MiB, 5, 250),
          ("a100-40g", 8, 40960 * MiB, 5, 100), (None, 0, None, 1, 50)]


def fleet(one_fabric_per_node: bool) -> Fleet:
    nodes: list[NodeView] = []
    members: dict[tuple[str | None, str], list[NodeView]] = defaultdict(list)
    i = 0
    for cls, gpus, card, fabrics, count in SHAPES:
        for k in range(count):
            fabric = f"fab-{i}" if one_fabric_per_node else f"{cls or 'cpu'}-{k % fabrics}"
            node = NodeView(name=f"node-{i:04d}", id=f"id-{i}", status="ready", schedulable=True,
                            gpu_class=cls, gpu_device=cls, fabric=fabric, gpus_total=gpus,
                            gpus_free=gpus - (i % (gpus + 1) if gpus else 0), gpu_memory=card,
                            cores_total=96, cores_free=64, memory_total=1024 * GiB,
                            memory_free=512 * GiB)
            nodes.append(node)
            members[(cls, fabric)].append(node)
            i += 1
    pools = [Pool(name=f"{cls or 'cpu'}/{fabric}", gpu_class=cls, fabric=fabric,
                  gpu_memory=ns[0].gpu_memory, nodes=[n.name for n in ns],
                  gpus_total=sum(n.gpus_total for n in ns),
                  gpus_free=sum(n.gpus_free for n in ns),
                  largest_free_gpus_on_a_node=max(n.gpus_free for n in ns))
             for (cls, fabric), ns in members.items()]
    return Fleet(nodes=nodes, pools=pools)


def median_ms(fn: Callable[[], object], runs: int = 15) -> float:
    fn()  # warm
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    models = {
        "Llama-3.3-70B": ("llama-3.3-70b-instruct", 70_553_706_496),
        "DeepSeek-V3": ("deepseek-v3", 684_531_386_000),
        "gpt-oss-120b": ("gpt-oss-120b", None),
    }
    fleets = {"1,000 nodes / 21 pools": fleet(False),
              "1,000 nodes / 1,000 pools": fleet(True)}
    print(f"{'model':<14} {'fleet':<26} {'candidates':>10} {'median ms':>10} "
          f"{'1-pool ms':>10} {'ratio':>7}")
    for label, (name, params) in models.items():
        config = json.loads((CONFIGS / f"{name}.json").read_text())
        count = ParameterCount(total=params, source="hub") if params else None
        request = PlanRequest(model=label, config=config, parameters=count)
        one = [PoolSpec(name="h100", gpus_per_node=8, gpu_memory=81559 * MiB)]
        base = median_ms(lambda r=request, p=one: plan_model(r, p))  # type: ignore[misc]
        for flabel, f in fleets.items():
            def run(r: PlanRequest = request, fl: Fleet = f) -> int:
                pools, notes = pools_from_fleet(fl)
                return len(plan_model(r, pools, notes=notes).candidates)
            n = run()
            ms = median_ms(run)
            print(f"{label:<14} {flabel:<26} {n:>10,} {ms:>10.1f} {base:>10.1f} "
                  f"{ms / base:>6.1f}x")


if __name__ == "__main__":
    main()
