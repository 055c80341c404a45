"""Allocations as holdings: which cards and cores each replica held, and from when to when.

Pure: the allocations in, ``Holding``s out.

**When an allocation holds its resources.** From its ``CreateTime`` (the plan
that placed it reserved them) until its client reports a terminal status
(``complete``, ``failed`` or ``lost``). That is the span Nomad's own
scheduler counts as used: ``AllocsFit`` (``nomad/structs/funcs.go``) skips
only allocations whose ``ClientTerminalStatus()`` is true
(``nomad/structs/alloc.go``), so an allocation told to stop still holds its
cards until its tasks have exited. The end is the last task's ``FinishedAt``;
an allocation that never ran a task (lost with its node, or failed at
setup) ends at its ``ModifyTime``, when the status changed.

**What it holds.** The GPUs are the device instances Nomad assigned it
(``AllocatedResources.Tasks[*].Devices`` of type ``gpu``), named by the gpu
class whose ``device`` is the card's name; the cores are its reserved cores
(``Cores``), as ``alloc_usage`` combines its tasks. Only the model jobs
(``llmgw-<model>``) count: prefetch and cache-sweep jobs hold no cards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from llmgw.catalog.model import GpuClass
from llmgw.scheduler.base import Holding
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.fleet import alloc_usage
from llmgw.scheduler.nomad.render import model_of_job

TERMINAL = frozenset({"complete", "failed", "lost"})


def holdings_of(allocs: Sequence[wire.Allocation],
                gpu_classes: Mapping[str, GpuClass]) -> list[Holding]:
    by_device = {(gc.vendor, gc.device): name for name, gc in gpu_classes.items()}
    out = []
    for a in allocs:
        model = model_of_job(a.JobID)
        if model is None or not a.CreateTime:
            continue
        gpus: set[str] = set()
        names: list[str] = []
        res = a.AllocatedResources
        for task in ((res.Tasks or {}).values() if res else ()):
            for d in task.Devices or ():
                if d.Type == "gpu" and d.DeviceIDs:
                    gpus.update(d.DeviceIDs)
                    names.append(by_device.get((d.Vendor, d.Name), d.Name))
        end = None
        if a.ClientStatus in TERMINAL:
            finished = [_seconds(t.FinishedAt) for t in (a.TaskStates or {}).values()]
            end = max((f for f in finished if f is not None), default=a.ModifyTime / 1e9)
        out.append(Holding(
            id=a.ID, model=model, gpu_class=names[0] if names else "", gpus=len(gpus),
            cores=len(alloc_usage(a).cores), start=a.CreateTime / 1e9, end=end))
    return out


def _seconds(rfc3339: str) -> float | None:
    """Unix seconds of a task time; None for Go's zero time (the task never got there)."""
    if not rfc3339 or rfc3339.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(rfc3339).timestamp()
    except ValueError:
        return None
