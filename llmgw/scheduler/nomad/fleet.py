"""The fleet as Nomad's scheduler sees it: nodes and allocations → free capacity.

Pure: it takes the decoded ``/v1/node/:id`` and ``/v1/allocations?resources=true``
answers and computes, per node, what ``AllocsFit`` would compute
(docs/nomad-api.md §3.3), so "free" here means "placeable now" and never "looks
idle". The parts that are easy to get plausibly wrong:

* an allocation counts until its *client* status is terminal (complete,
  failed, lost); one told to stop that is still running still holds its
  GPUs, as it does for the scheduler;
* whole cores are free only if their IDs are free *and* the node's CPU
  bandwidth still covers them, because the scheduler charges a reserved
  core's MHz to the same budget that ``CPU`` tasks draw from;
* an ephemeral prestart task (our fetcher) is combined with the main tasks
  by max, not sum, as ``AllocatedResources.Comparable`` does;
* only healthy GPU instances count, and only nodes that are ready, eligible
  and not draining have anything free. The others are listed with their
  state, so an operator sees the capacity that is missing and why.

Pools group nodes by (gpu class, fabric) because a replica never spans two
nodes, and eight free cards split across two fabrics are not eight cards for
a model that needs eight.

One trap is named wherever the fleet is shown: a gpu class whose ``memory``
is more than its cards report. Jobs ask for ``${device.attr.memory} >=`` the
class's memory, so an "80GB" H100 class written as ``80GiB`` (81920 MiB)
matches no H100, which reports 81559 MiB (docs/nomad-api.md §2): the node has
the cards, free, and Nomad filters it as "missing devices". ``memory_warning``
says so with both numbers and the value to write.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.catalog.model import GpuClass
from llmgw.scheduler.base import Fleet, NodeView, Pool
from llmgw.scheduler.nomad import wire

MIB = 1024 * 1024
TERMINAL_CLIENT_STATUS = frozenset({"complete", "failed", "lost"})
GPU_CLASS_META = "llmgw_gpu_class"
_UNIT_BYTES = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
               "kib": 1024, "mib": MIB, "gib": 1024**3, "tib": 1024**4}


@dataclass
class Usage:
    """What one allocation takes from its node."""

    mhz: int = 0
    memory_mb: int = 0
    cores: set[int] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)

    def add(self, other: Usage) -> None:
        self.mhz += other.mhz
        self.memory_mb += other.memory_mb
        self.cores |= other.cores
        self.devices |= other.devices

    def max(self, other: Usage) -> None:
        self.mhz = max(self.mhz, other.mhz)
        self.memory_mb = max(self.memory_mb, other.memory_mb)
        # Core and device IDs are concrete; whichever task holds one holds it.
        self.cores |= other.cores
        self.devices |= other.devices


def _task_usage(r: wire.AllocatedTaskResources) -> Usage:
    devices: set[str] = set()
    for d in r.Devices or ():
        devices.update(d.DeviceIDs or ())
    return Usage(mhz=r.Cpu.CpuShares, memory_mb=r.Memory.MemoryMB,
                 cores=set(r.Cpu.ReservedCores or ()), devices=devices)


def alloc_usage(alloc: wire.Allocation) -> Usage:
    """The allocation's reservation combined as ``AllocatedResources.Comparable`` does."""
    res = alloc.AllocatedResources
    if res is None:
        return Usage()
    tasks = res.Tasks or {}
    lifecycles = res.TaskLifecycles or {}
    if not any(lifecycles.values()):   # no lifecycle hooks: everything runs together
        total = Usage()
        for r in tasks.values():
            total.add(_task_usage(r))
        return total
    main, sidecars, ephemeral, poststop = Usage(), Usage(), Usage(), Usage()
    for name, r in tasks.items():
        u = _task_usage(r)
        lc = lifecycles.get(name)
        hook = lc.Hook if lc else ""
        if hook == "prestart":
            (sidecars if lc and lc.Sidecar else ephemeral).add(u)
        elif hook == "poststop":
            poststop.add(u)
        else:  # main and poststart tasks run together
            main.add(u)
    ephemeral.max(main)
    ephemeral.max(poststop)
    sidecars.add(ephemeral)
    return sidecars


def _attr_bytes(attr: wire.Attribute | None) -> int | None:
    if attr is None:
        return None
    value = attr.Int if attr.Int is not None else attr.Float
    factor = _UNIT_BYTES.get(attr.Unit.lower())
    if value is None or factor is None:
        return None
    return int(value * factor)


def _gpu_group(node: wire.Node, gpu_classes: Mapping[str, GpuClass]
               ) -> tuple[wire.NodeDeviceResource | None, str | None]:
    """The node's GPU device group and its class.

    The class comes from the device string the plugin reports, which is what
    the scheduler matches; the node meta ``llmgw_gpu_class`` only chooses
    between two classes naming the same card.
    """
    groups = [d for d in (node.NodeResources.Devices if node.NodeResources else None) or ()
              if d.Type == "gpu"]
    if not groups:
        return None, None
    hint = (node.Meta or {}).get(GPU_CLASS_META)
    by_name = {g.Name: g for g in groups}
    if hint is not None and hint in gpu_classes and gpu_classes[hint].device in by_name:
        return by_name[gpu_classes[hint].device], hint
    for cname, gc in gpu_classes.items():
        if gc.device in by_name:
            return by_name[gc.device], cname
    biggest = max(groups, key=lambda g: len(g.Instances or ()))
    return biggest, hint


def node_state(node: wire.Node) -> tuple[str, bool]:
    """(status shown, schedulable). Down beats draining beats ineligible."""
    if node.Status in ("down", "disconnected"):
        return node.Status, False
    if node.Drain:
        return "draining", False
    if node.SchedulingEligibility == "ineligible":
        return "ineligible", False
    status = node.Status or "unknown"
    return status, status == "ready"


def memory_warning(gpu_class: str, declared: int, name: str, reported: int) -> str:
    """The device memory trap, for one node (or a list of them) of one class."""
    declared_mib, reported_mib = declared // MIB, reported // MIB
    return (f"gpu class {gpu_class} declares {declared_mib} MiB per card but {name} "
            f"report{'s' if ',' not in name else ''} {reported_mib} MiB: the device memory "
            f"constraint (${{device.attr.memory}} >= {declared_mib} MiB) excludes it; set "
            f"gpu_classes.{gpu_class}.memory to {reported_mib}MiB")


def node_view(node: wire.Node, used: Usage, gpu_classes: Mapping[str, GpuClass],
              fabric_key: str) -> NodeView:
    """One node's totals and free capacity, given everything its live allocations hold."""
    res = node.NodeResources or wire.NodeResources()
    reserved = node.ReservedResources or wire.ReservedResources()
    status, schedulable = node_state(node)

    group, gpu_class = _gpu_group(node, gpu_classes)
    healthy_ids = {i.ID for i in (group.Instances or ()) if i.Healthy} if group else set()
    gpus_free = len(healthy_ids - used.devices)

    reservable = set(res.Cpu.ReservableCpuCores or range(res.Cpu.TotalCpuCores))
    usable = reservable - set(reserved.Cpu.ReservedCpuCores or ())
    free_ids = usable - used.cores
    mhz_free = res.Cpu.CpuShares - reserved.Cpu.CpuShares - used.mhz
    per_core = res.Cpu.CpuShares / len(reservable) if reservable else 0.0
    cores_free = len(free_ids)
    if per_core > 0:
        cores_free = max(0, min(cores_free, math.floor(mhz_free / per_core)))

    memory_total = max(0, res.Memory.MemoryMB - reserved.Memory.MemoryMB) * MIB
    memory_free = max(0, memory_total - used.memory_mb * MIB)
    gpu_memory = _attr_bytes((group.Attributes or {}).get("memory")) if group else None
    warning = None
    gc = gpu_classes.get(gpu_class) if gpu_class is not None else None
    if gpu_class is not None and gc is not None and gpu_memory is not None \
            and gc.memory > gpu_memory:
        warning = memory_warning(gpu_class, gc.memory, node.Name or node.ID, gpu_memory)
    return NodeView(
        name=node.Name or node.ID, id=node.ID, status=status, schedulable=schedulable,
        gpu_class=gpu_class, gpu_device=group.Name if group else None,
        fabric=(node.Meta or {}).get(fabric_key),
        gpus_total=len(healthy_ids), gpus_free=gpus_free if schedulable else 0,
        gpu_memory=gpu_memory,
        cores_total=len(usable), cores_free=cores_free if schedulable else 0,
        memory_total=memory_total, memory_free=memory_free if schedulable else 0,
        warning=warning,
    )


def pool_name(gpu_class: str | None, gpu_device: str | None, fabric: str | None) -> str:
    label = gpu_class or gpu_device or "cpu"
    return f"{label}@{fabric}" if fabric else label


def build_fleet(nodes: Sequence[wire.Node], allocs: Iterable[wire.Allocation],
                gpu_classes: Mapping[str, GpuClass], fabric_key: str) -> Fleet:
    """Nodes with their free capacity, and the pools they form."""
    by_node: dict[str, Usage] = defaultdict(Usage)
    for a in allocs:
        if a.ClientStatus in TERMINAL_CLIENT_STATUS or not a.NodeID:
            continue
        by_node[a.NodeID].add(alloc_usage(a))
    views = sorted((node_view(n, by_node.get(n.ID) or Usage(), gpu_classes, fabric_key)
                    for n in nodes), key=lambda v: (v.name, v.id))
    members: dict[tuple[str | None, str | None, str | None], list[NodeView]] = defaultdict(list)
    for v in views:
        members[(v.gpu_class, v.gpu_device if v.gpu_class is None else None, v.fabric)].append(v)
    pools = []
    for (gclass, device, fabric), vs in members.items():
        mem = next((v.gpu_memory for v in vs if v.gpu_memory), None)
        if gclass is not None and gclass in gpu_classes:
            mem = int(gpu_classes[gclass].memory)
        pools.append(Pool(
            name=pool_name(gclass, device, fabric), gpu_class=gclass, fabric=fabric,
            gpu_memory=mem, nodes=[v.name for v in vs],
            gpus_total=sum(v.gpus_total for v in vs), gpus_free=sum(v.gpus_free for v in vs),
            largest_free_gpus_on_a_node=max((v.gpus_free for v in vs), default=0),
        ))
    pools.sort(key=lambda p: p.name)
    return Fleet(nodes=views, pools=pools, warnings=_warnings(views, gpu_classes))


def _warnings(views: Sequence[NodeView], gpu_classes: Mapping[str, GpuClass]) -> list[str]:
    """One line per gpu class whose declared memory its nodes' cards do not report."""
    short: dict[tuple[str, int], list[str]] = defaultdict(list)
    for v in views:
        if v.warning and v.gpu_class and v.gpu_memory is not None:
            short[(v.gpu_class, v.gpu_memory)].append(v.name)
    out = []
    for (cls, reported), names in sorted(short.items()):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(memory_warning(cls, gpu_classes[cls].memory, shown, reported))
    return out
