"""A failed plan becomes one readable sentence, classified never-fits or not-now."""

from __future__ import annotations

import msgspec

from llmgw.catalog.units import Size
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.fleet import build_fleet
from llmgw.scheduler.nomad.placement import classify, latest_failure
from llmgw.scheduler.nomad.render import Need

from .shapes import GPU_CLASSES, H100, alloc, gpu_ids, node_8x_h100_80g, node_cpu_64c

GIB = 1024**3


def _need(gpus: int = 2, fabric: str | None = "ib-a", cores: int = 16, memory: int = 64 * GIB,
          device: str = H100) -> Need:
    return Need(model="m", profile="p", gpus=gpus, gpu_class="h100-80g" if gpus else None,
                gpu_device=device if gpus else None, gpu_memory=81559 * 1024**2 if gpus else None,
                fabric=fabric, cores=cores, memory=Size.parse(memory))


def _metric(**kw: object) -> wire.AllocationMetric:
    return msgspec.convert({"NodesEvaluated": 3, **kw}, wire.AllocationMetric)


def _nodes(nodes, allocs=()):
    return build_fleet(nodes, list(allocs), GPU_CLASSES, "llmgw_fabric").nodes


def test_no_failed_allocation_means_it_fits():
    """A plan without FailedTGAllocs for the group fits now."""
    assert classify(_need(), None, []).kind == "fits"


def test_busy_gpus_are_not_now_with_the_best_node_named():
    """Two GPUs wanted where the best node of the fabric has one free: wait, and say so."""
    n7 = node_8x_h100_80g("gpu-07", "ib-a")
    n8 = node_8x_h100_80g("gpu-08", "ib-a")
    allocs = [alloc(n7, gpus=gpu_ids("gpu-07", 8)[:7], memory_mb=1024),
              alloc(n8, gpus=gpu_ids("gpu-08", 8), memory_mb=1024)]
    metric = _metric(NodesExhausted=2, DimensionExhausted={"devices: no devices available": 2})
    v = classify(_need(), metric, _nodes([n7, n8], allocs))
    assert v.kind == "not_now"
    assert v.reason == \
        "no node with 2 free NVIDIA H100 80GB HBM3 on fabric ib-a; best: gpu-07 has 1"


def test_more_gpus_than_any_node_has_never_fits():
    """Sixteen GPUs on eight-GPU nodes is refused: a replica never spans nodes."""
    metric = _metric(NodesFiltered=3, ConstraintFiltered={"missing devices": 3})
    nodes = _nodes([node_8x_h100_80g("gpu-01", "ib-a"), node_8x_h100_80g("gpu-02", "ib-a")])
    v = classify(_need(gpus=16), metric, nodes)
    assert v.kind == "never"
    assert "no node has 16 NVIDIA H100 80GB HBM3 on fabric ib-a" in v.reason
    assert "the most on one node is 8" in v.reason


def test_a_fabric_no_node_carries_never_fits():
    """An unknown fabric is refused, naming the fabrics that exist."""
    nodes = _nodes([node_8x_h100_80g("gpu-01", "ib-a"), node_8x_h100_80g("gpu-02", "ib-b")])
    metric = _metric(NodesFiltered=2, ConstraintFiltered={"${meta.llmgw_fabric} = ib-c": 2})
    v = classify(_need(fabric="ib-c"), metric, nodes)
    assert v.kind == "never"
    assert v.reason == ("no node with NVIDIA H100 80GB HBM3 is on fabric ib-c "
                        "(nodes with it are on ib-a, ib-b)")


def test_a_gpu_model_no_node_has_never_fits():
    """A class whose device string no node reports is refused, listing what the fleet has."""
    nodes = _nodes([node_8x_h100_80g("gpu-01", "ib-a"), node_cpu_64c("cpu-01")])
    metric = _metric(NodesFiltered=2, ConstraintFiltered={"missing devices": 2})
    v = classify(_need(device="NVIDIA B200", fabric=None), metric, nodes)
    assert v.kind == "never"
    assert v.reason == "no node has a NVIDIA B200 GPU (the fleet has NVIDIA H100 80GB HBM3)"


def test_more_cores_than_any_node_has_never_fits_though_nomad_says_exhausted():
    """128 cores on 64-core nodes shows in Nomad as exhausted, yet can never fit."""
    nodes = _nodes([node_cpu_64c("cpu-01")])
    metric = _metric(NodesExhausted=1, DimensionExhausted={"cores": 1})
    v = classify(_need(gpus=0, fabric=None, cores=128, memory=4 * GIB), metric, nodes)
    assert v.kind == "never"
    assert v.reason == "no node has 128 cores; the most is 62 (cpu-01)"


def test_busy_cpu_nodes_are_not_now_with_free_cores_and_memory_named():
    """A CPU profile blocked by taken cores waits, naming the best node's free cores."""
    n = node_cpu_64c("cpu-01")
    metric = _metric(NodesExhausted=1, DimensionExhausted={"cores": 1})
    nodes = _nodes([n], [alloc(n, cores=list(range(2, 60)), memory_mb=1024)])
    v = classify(_need(gpus=0, fabric=None, cores=8, memory=4 * GIB), metric, nodes)
    assert v.kind == "not_now"
    assert v.reason.startswith("no node with 8 free cores and 4.0GiB free memory; "
                               "best: cpu-01 has 4 free cores and ")


def test_nodes_filtered_for_a_reason_llmgw_does_not_model_never_fit():
    """When fitting nodes are filtered anyway (no docker driver), waiting would not help."""
    nodes = _nodes([node_8x_h100_80g("gpu-01", "ib-a")])
    metric = _metric(NodesFiltered=1, ConstraintFiltered={"missing drivers": 1})
    v = classify(_need(), metric, nodes)
    assert v.kind == "never"
    assert "1 node filtered by 'missing drivers'" in v.reason


def test_when_the_only_fitting_node_is_draining_it_is_not_now():
    """Capacity that is draining comes back: wait, and name the node's state."""
    nodes = _nodes([node_8x_h100_80g("gpu-01", "ib-a", drain=True)])
    metric = _metric(NodesEvaluated=0)
    v = classify(_need(), metric, nodes)
    assert v.kind == "not_now"
    assert "gpu-01 is draining" in v.reason


def test_the_latest_evaluation_with_a_failure_is_the_one_reported():
    """The waiting reason comes from the newest evaluation carrying FailedTGAllocs."""
    evals = msgspec.convert([
        {"ID": "a", "CreateIndex": 5, "FailedTGAllocs": {"serve": {"NodesExhausted": 1}}},
        {"ID": "b", "CreateIndex": 9, "FailedTGAllocs": {"serve": {"NodesExhausted": 2}}},
        {"ID": "c", "CreateIndex": 12, "Status": "blocked"},
    ], list[wire.Evaluation])
    metric = latest_failure(evals, "serve")
    assert metric is not None
    assert metric.NodesExhausted == 2
