"""Why a profile cannot be placed, in one sentence, and whether waiting would help.

Pure: it reads the plan's failed-allocation metric for the group and the
fleet view, and returns a ``Verdict``. The two kinds of failure are kept
apart because they call for opposite answers:

* **never** — no node of the fleet could run the profile even if it were
  empty: no node has that GPU model, its cards report less memory than the
  gpu class declares (the device constraint excludes them), none carries the
  fabric, none has that many GPUs, cores or that much memory in total, or
  Nomad filtered every node for a reason llmgw does not model (a missing
  driver, a datacenter with no nodes). Refused at add time (``PlacementError``, HTTP 400):
  waiting would wait forever.
* **not now** — some node could, but its capacity is taken. Accepted; the
  model shows ``waiting_for_capacity`` with this reason until Nomad places
  it, because capacity frees up.

Nomad's own metric does not draw that line by itself: its feasibility pass
ignores usage, so "16 GPUs on 8-GPU nodes" is a ``ConstraintFiltered``
"missing devices" (never) while "128 cores on 64-core nodes" only shows as
``DimensionExhausted`` "cores", which looks like "not now". So the node
totals decide first, and the metric explains what totals cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from llmgw.catalog.units import format_size
from llmgw.scheduler.base import NodeView
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.render import Need

VerdictKind = Literal["fits", "not_now", "never"]
MIB = 1024 * 1024


class Verdict(msgspec.Struct, frozen=True):
    kind: VerdictKind
    reason: str = ""


def _on(need: Need) -> str:
    return f" on fabric {need.fabric}" if need.fabric else ""


def _with(need: Need) -> str:
    return f" with {need.gpu_device}" if need.gpus > 0 else ""


def _what(need: Need, free: bool) -> str:
    """'2 free NVIDIA H100 80GB HBM3 on fabric ib-a' / '8 free cores and 4.0GiB free memory'."""
    f = "free " if free else ""
    if need.gpus > 0:
        return f"{need.gpus} {f}{need.gpu_device}{_on(need)}"
    return f"{need.cores} {f}cores and {format_size(need.memory)} {f}memory{_on(need)}"


def candidates(need: Need, nodes: Sequence[NodeView]) -> list[NodeView]:
    """Nodes of the right GPU model and fabric, whatever their state or load; for a CPU
    replica, nodes without GPUs unless it may use GPU nodes (render ``_placement``)."""
    out = []
    for n in nodes:
        if need.gpus > 0 and (n.gpu_device != need.gpu_device or _too_little_memory(need, n)):
            continue
        if need.gpus == 0 and not need.gpu_nodes and n.gpu_device is not None:
            continue
        if need.fabric and n.fabric != need.fabric:
            continue
        out.append(n)
    return out


def _fits_total(need: Need, n: NodeView) -> bool:
    return (n.gpus_total >= need.gpus and n.cores_total >= need.cores
            and n.memory_total >= need.memory)


def _fits_free(need: Need, n: NodeView) -> bool:
    return (n.schedulable and n.gpus_free >= need.gpus and n.cores_free >= need.cores
            and n.memory_free >= need.memory)


def _too_little_memory(need: Need, n: NodeView) -> bool:
    """The node's cards report less memory than the job's device constraint asks for."""
    return (need.gpus > 0 and need.gpu_memory is not None and n.gpu_memory is not None
            and n.gpu_memory < need.gpu_memory)


def _never_from_totals(need: Need, nodes: Sequence[NodeView]) -> str | None:
    """The reason no node could ever hold one replica, judged by totals; None if one could."""
    if need.gpus > 0:
        with_device = [n for n in nodes if n.gpu_device == need.gpu_device]
        if not with_device:
            seen = sorted({n.gpu_device for n in nodes if n.gpu_device})
            have = (f"the fleet has {', '.join(seen)}" if seen else "no node reports a GPU")
            return f"no node has a {need.gpu_device} GPU ({have})"
        if all(_too_little_memory(need, n) for n in with_device):
            reported = max(n.gpu_memory or 0 for n in with_device) // MIB
            asked = (need.gpu_memory or 0) // MIB
            return (f"the device memory constraint (${{device.attr.memory}} >= {asked} MiB, "
                    f"from gpu class {need.gpu_class}) excludes every node with "
                    f"{need.gpu_device}: their cards report {reported} MiB; set "
                    f"gpu_classes.{need.gpu_class}.memory to {reported}MiB")
        if need.fabric and not any(n.fabric == need.fabric for n in with_device):
            fabrics = sorted({n.fabric for n in with_device if n.fabric})
            where = (f"nodes with it are on {', '.join(fabrics)}" if fabrics
                     else "no node with it has a fabric set")
            return f"no node with {need.gpu_device} is on fabric {need.fabric} ({where})"
    elif need.fabric and not any(n.fabric == need.fabric for n in nodes):
        fabrics = sorted({n.fabric for n in nodes if n.fabric})
        return (f"no node is on fabric {need.fabric}"
                + (f" (fabrics: {', '.join(fabrics)})" if fabrics else ""))
    cands = candidates(need, nodes)
    if not cands and need.gpus == 0 and not need.gpu_nodes and nodes:
        return ("every node has GPUs, and a CPU profile keeps off GPU nodes; add a node "
                "without GPUs, or set gpu_nodes: true on the profile")
    if not cands:
        return "the fleet has no nodes" if not nodes else f"no node has {_what(need, False)}"
    if any(_fits_total(need, n) for n in cands):
        return None
    if need.gpus > 0 and not any(n.gpus_total >= need.gpus for n in cands):
        best = max(cands, key=lambda n: n.gpus_total)
        return (f"no node has {need.gpus} {need.gpu_device}{_on(need)}; "
                f"the most on one node is {best.gpus_total} ({best.name}); a replica "
                "never spans nodes")
    if not any(n.cores_total >= need.cores for n in cands):
        best = max(cands, key=lambda n: n.cores_total)
        return (f"no node{_with(need)}{_on(need)} has {need.cores} cores; "
                f"the most is {best.cores_total} ({best.name})")
    if not any(n.memory_total >= need.memory for n in cands):
        best = max(cands, key=lambda n: n.memory_total)
        return (f"no node{_with(need)}{_on(need)} has {format_size(need.memory)} of memory; "
                f"the most is {format_size(best.memory_total)} ({best.name})")
    return f"no single node has {_what(need, False)} together"


def metric_text(metric: wire.AllocationMetric) -> str:
    """Nomad's own account of why it placed nothing, for failures the fleet view does not
    explain (and for a job pinned to one node, which has no other to offer)."""
    parts = []
    filtered = metric.ConstraintFiltered or {}
    for key, count in sorted(filtered.items()):
        parts.append(f"{count} node{'s' if count != 1 else ''} filtered by {key!r}")
    for key, count in sorted((metric.DimensionExhausted or {}).items()):
        parts.append(f"{count} node{'s' if count != 1 else ''} out of {key}")
    if metric.NodesEvaluated == 0 and not parts:
        avail = metric.NodesAvailable or {}
        dcs = ", ".join(f"{dc}: {n}" for dc, n in sorted(avail.items()))
        return ("Nomad evaluated no nodes: none are ready in the job's datacenters or node pool"
                + (f" ({dcs})" if dcs else ""))
    return "Nomad: " + "; ".join(parts) if parts else "Nomad found no node for it"


def _best_free(need: Need, cands: Sequence[NodeView]) -> str:
    ready = [n for n in cands if n.schedulable]
    if not ready:
        states = ", ".join(f"{n.name} is {n.status}" for n in cands[:3])
        more = f" and {len(cands) - 3} more" if len(cands) > 3 else ""
        return f"no node that could run it is schedulable ({states}{more})"
    if need.gpus > 0:
        best = max(ready, key=lambda n: (n.gpus_free, n.cores_free, n.memory_free))
        if best.gpus_free >= need.gpus and not _fits_free(need, best):
            return (f"best: {best.name} has {best.gpus_free} free GPUs but {best.cores_free} "
                    f"free cores and {format_size(best.memory_free)} free memory (a replica "
                    f"needs {need.cores} cores and {format_size(need.memory)})")
        return f"best: {best.name} has {best.gpus_free}"
    best = max(ready, key=lambda n: (min(n.cores_free / max(need.cores, 1),
                                         n.memory_free / max(need.memory, 1))))
    return (f"best: {best.name} has {best.cores_free} free cores and "
            f"{format_size(best.memory_free)} free memory")


def classify(need: Need, metric: wire.AllocationMetric | None,
             nodes: Sequence[NodeView]) -> Verdict:
    """Fits, not now, or never — with the sentence an operator reads."""
    if metric is None:
        return Verdict("fits")
    never = _never_from_totals(need, nodes) if nodes else metric_text(metric)
    if never is not None:
        return Verdict("never", never)
    cands = [n for n in candidates(need, nodes) if _fits_total(need, n)]
    spread_out = (metric.ConstraintFiltered or {}).get("distinct_hosts", 0)
    if spread_out:
        # Nodes that could run it already run one of its replicas: more nodes (or
        # fewer replicas) is the way out, not a different profile.
        return Verdict("not_now", (
            f"{spread_out} node{'s' if spread_out != 1 else ''} that could run it already "
            f"run{'' if spread_out != 1 else 's'} a replica of {need.model}, and its profile "
            "asks for distinct_hosts; add nodes or lower its replicas"))
    if metric.NodesExhausted == 0 and any(n.schedulable for n in cands):
        # A node that fits by every number we know was filtered anyway: a
        # driver, a datacenter, a constraint we do not model. Waiting will
        # not change that.
        return Verdict("never", f"no node can run {_what(need, False)}: {metric_text(metric)}")
    roomy = [n for n in cands if _fits_free(need, n)]
    if roomy:
        # Capacity freed since Nomad last tried (it retries blocked placements
        # by itself), or Nomad sees something the numbers here do not.
        return Verdict("not_now", (
            f"no node with {_what(need, True)} when Nomad last tried; {roomy[0].name} has "
            f"room now ({metric_text(metric)})"))
    return Verdict("not_now", f"no node with {_what(need, True)}; {_best_free(need, cands)}")


def failed_metric(plan: wire.PlanResponse, group: str) -> wire.AllocationMetric | None:
    return (plan.FailedTGAllocs or {}).get(group)


def latest_failure(evals: Sequence[wire.Evaluation], group: str) -> wire.AllocationMetric | None:
    """The failed-allocation metric of the most recent evaluation that has one."""
    with_failures = [e for e in evals if (e.FailedTGAllocs or {}).get(group) is not None]
    if not with_failures:
        return None
    newest = max(with_failures, key=lambda e: (e.CreateIndex, e.ModifyIndex))
    return (newest.FailedTGAllocs or {})[group]
