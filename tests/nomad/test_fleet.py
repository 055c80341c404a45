"""The fleet view computes free capacity as Nomad's scheduler does (docs/nomad-api.md §3.3)."""

from __future__ import annotations

from llmgw.scheduler.nomad.fleet import build_fleet

from .shapes import (
    GPU_CLASSES,
    H100,
    alloc,
    gpu_ids,
    node_4x_l40s_48g,
    node_8x_h100_80g,
    node_cpu_64c,
)

GIB = 1024**3
MIB = 1024**2


def _view(nodes, allocs):
    return build_fleet(nodes, allocs, GPU_CLASSES, "llmgw_fabric")


def test_an_allocation_takes_its_gpus_cores_and_memory_from_its_node():
    """Free GPUs, cores and memory are totals minus node reservations minus live allocations."""
    n = node_8x_h100_80g("gpu-h100-01", "ib-a")
    a = alloc(n, cores=list(range(2, 18)), memory_mb=196_608, gpus=gpu_ids("gpu-h100-01", 8)[:2])
    v = _view([n], [a]).nodes[0]
    assert (v.gpus_total, v.gpus_free) == (8, 6)
    assert (v.cores_total, v.cores_free) == (62, 46)          # cores 0 and 1 reserved
    assert v.memory_total == (1_031_526 - 8192) * MIB
    assert v.memory_free == (1_031_526 - 8192 - 196_608) * MIB
    assert v.gpu_class == "h100-80g"
    assert v.gpu_device == H100
    assert v.fabric == "ib-a"
    assert v.gpu_memory == 81559 * MIB


def test_a_stopping_allocation_still_holds_its_gpus_and_finished_ones_do_not():
    """Only client-terminal allocations (complete, failed, lost) release capacity."""
    n = node_8x_h100_80g("gpu-h100-01", "ib-a")
    ids = gpu_ids("gpu-h100-01", 8)
    allocs = [
        alloc(n, gpus=ids[0:2], memory_mb=1024, desired="stop"),           # still running
        alloc(n, gpus=ids[2:4], memory_mb=1024, client_status="complete"),
        alloc(n, gpus=ids[4:6], memory_mb=1024, client_status="failed"),
        alloc(n, gpus=ids[6:8], memory_mb=1024, client_status="lost"),
    ]
    assert _view([n], allocs).nodes[0].gpus_free == 6


def test_free_cores_are_limited_by_the_cpu_bandwidth_left():
    """Whole cores need their MHz too: CPU-share tasks that drain the budget leave no cores."""
    n = node_cpu_64c("cpu-01")
    # 62 usable cores at 3100 MHz; a task asking CPU=180000 MHz holds no core IDs
    # but leaves bandwidth for only 4 more cores.
    a = alloc(n, mhz=180_000, memory_mb=1024)
    v = _view([n], [a]).nodes[0]
    assert v.cores_total == 62
    assert v.cores_free == (62 * 3100 - 180_000) // 3100


def test_an_ephemeral_prestart_task_is_combined_by_max_not_sum():
    """The fetcher's reservation costs nothing beside a larger engine (Comparable's max)."""
    n = node_cpu_64c("cpu-01")
    a = alloc(n, cores=list(range(2, 10)), memory_mb=4096, prestart=(500, 512))
    v = _view([n], [a]).nodes[0]
    assert v.memory_free == (386_000 - 8192 - 4096) * MIB
    assert v.cores_free == 62 - 8


def test_unhealthy_gpus_are_not_counted():
    """A GPU instance the plugin reports unhealthy is neither total nor free."""
    n = node_8x_h100_80g("gpu-h100-01", "ib-a", unhealthy=3)
    v = _view([n], []).nodes[0]
    assert (v.gpus_total, v.gpus_free) == (5, 5)


def test_down_draining_and_ineligible_nodes_have_nothing_free():
    """Unschedulable nodes are listed with their state and count zero free capacity."""
    nodes = [
        node_8x_h100_80g("gpu-h100-01", "ib-a", status="down"),
        node_8x_h100_80g("gpu-h100-02", "ib-a", drain=True),
        node_8x_h100_80g("gpu-h100-03", "ib-a", eligibility="ineligible"),
        node_8x_h100_80g("gpu-h100-04", "ib-a"),
    ]
    views = {v.name: v for v in _view(nodes, []).nodes}
    assert [views[f"gpu-h100-0{i}"].status for i in range(1, 5)] == \
        ["down", "draining", "ineligible", "ready"]
    for name in ("gpu-h100-01", "gpu-h100-02", "gpu-h100-03"):
        v = views[name]
        assert not v.schedulable
        assert (v.gpus_free, v.cores_free, v.memory_free) == (0, 0, 0)
        assert v.gpus_total == 8
    assert views["gpu-h100-04"].gpus_free == 8
    pool = _view(nodes, []).pools[0]
    assert (pool.gpus_total, pool.gpus_free) == (32, 8)


def test_pools_group_nodes_by_gpu_class_and_fabric():
    """Eight free cards on two fabrics are two pools, each with its own largest free node."""
    a1 = node_8x_h100_80g("gpu-h100-01", "ib-a")
    a2 = node_8x_h100_80g("gpu-h100-02", "ib-a")
    b1 = node_8x_h100_80g("gpu-h100-03", "ib-b")
    nodes = [a1, a2, b1, node_4x_l40s_48g("gpu-l40s-01"), node_cpu_64c("cpu-01")]
    taken = alloc(a1, gpus=gpu_ids("gpu-h100-01", 8)[:5], memory_mb=1024)
    fleet = _view(nodes, [taken])
    pools = {p.name: p for p in fleet.pools}
    assert sorted(pools) == ["cpu", "h100-80g@ib-a", "h100-80g@ib-b", "l40s-48g"]
    ib_a = pools["h100-80g@ib-a"]
    assert ib_a.nodes == ["gpu-h100-01", "gpu-h100-02"]
    assert (ib_a.gpus_total, ib_a.gpus_free, ib_a.largest_free_gpus_on_a_node) == (16, 11, 8)
    assert ib_a.gpu_memory == 81559 * MIB
    assert pools["cpu"].gpus_total == 0
    assert pools["cpu"].gpu_class is None


def test_the_gpu_class_comes_from_the_device_the_node_reports():
    """A node whose meta names no class still joins the class whose device string it reports."""
    n = node_4x_l40s_48g("gpu-l40s-01")
    n = type(n)(**{**{f: getattr(n, f) for f in n.__struct_fields__}, "Meta": {}})
    v = _view([n], []).nodes[0]
    assert v.gpu_class == "l40s-48g"
    assert v.gpu_memory == 46068 * MIB
