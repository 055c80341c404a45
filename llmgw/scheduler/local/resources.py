"""This machine's cores, memory and GPUs, and who holds them: placement arithmetic.

Pure: no I/O and no clock (``machine.py`` measures the machine). Each replica
reserves what its profile declares, for as long as its engine runs or is being
restarted, exactly as a Nomad allocation holds its resources across restarts;
so a crashing engine cannot lose its place to a newcomer between two attempts.

Two questions are kept apart, as in Nomad (see ``llmgw.scheduler.base``):

* ``never_fits`` — the profile asks for more than this machine *has* (64 cores
  on a 16-core laptop, a GPU on a machine without one). Waiting cannot help,
  so it is a definition error when the model is added.
* ``why_not_now`` — the machine has it, but other replicas hold it. The replica
  waits, and the model shows the reason in the shape Nomad's placement
  failures have: ``no room for 8 cores on this machine: 2 of 16 free``.

Cores are handed out as concrete CPU ids so the engine can be pinned to them,
which is what Nomad's ``Cores`` (exclusive cores, never ``CPU`` shares) means.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from llmgw.catalog.model import GpuClass, Profile
from llmgw.catalog.units import format_size


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int            # as CUDA_VISIBLE_DEVICES counts them
    device: str           # the NVML name, e.g. "NVIDIA L40S"
    memory: int           # bytes


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    """What this machine offers to replicas."""

    name: str
    cores: tuple[int, ...]          # CPU ids replicas may be given
    memory: int                     # bytes
    gpus: tuple[Gpu, ...] = ()
    # False when the core count was set in configuration rather than measured:
    # the ids are then only counters and must not be used for pinning.
    pinnable: bool = True


class Demand(msgspec.Struct, frozen=True, kw_only=True):
    """What one replica of a profile reserves."""

    profile: str
    cores: int
    memory: int
    gpus: int = 0
    gpu_device: str | None = None


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """What one replica holds: concrete core ids and GPU indexes."""

    cores: tuple[int, ...]
    memory: int
    gpus: tuple[int, ...] = ()


def demand_of(profile: Profile, gpu_classes: Mapping[str, GpuClass]) -> Demand:
    """The reservation a profile makes; undeclared cores or memory reserve nothing."""
    gc = gpu_classes.get(profile.gpu_class or "") if profile.gpus > 0 else None
    return Demand(
        profile=profile.name,
        cores=profile.cpu_cores or 0,
        memory=int(profile.memory) if profile.memory is not None else 0,
        gpus=profile.gpus,
        gpu_device=gc.device if gc else None,
    )


def _cores(n: int) -> str:
    return f"{n} core" if n == 1 else f"{n} cores"


def _gpus(n: int, device: str | None) -> str:
    what = f"{n} GPU" if n == 1 else f"{n} GPUs"
    return f"{what} ({device})" if device else what


class Ledger:
    """Reservations on one machine. Mutable, but only arithmetic: safe to test alone."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self._held: dict[str, Grant] = {}

    @property
    def held(self) -> Mapping[str, Grant]:
        return self._held

    def free_cores(self) -> list[int]:
        taken = {c for g in self._held.values() for c in g.cores}
        return [c for c in self.machine.cores if c not in taken]

    def free_memory(self) -> int:
        return self.machine.memory - sum(g.memory for g in self._held.values())

    def free_gpus(self, device: str | None = None) -> list[Gpu]:
        taken = {i for g in self._held.values() for i in g.gpus}
        return [g for g in self.machine.gpus
                if g.index not in taken and (device is None or g.device == device)]

    def never_fits(self, demand: Demand) -> str | None:
        """Why no replica of this profile could ever run here, or None."""
        m = self.machine
        if demand.gpus > 0:
            matching = [g for g in m.gpus if demand.gpu_device in (None, g.device)]
            if not m.gpus:
                return (f"profile {demand.profile!r} needs {_gpus(demand.gpus, demand.gpu_device)} "
                        "and this machine has no GPU")
            if len(matching) < demand.gpus:
                have = ", ".join(sorted({g.device for g in m.gpus}))
                return (f"profile {demand.profile!r} needs {_gpus(demand.gpus, demand.gpu_device)}"
                        f"; this machine has {len(matching)} of those (its GPUs: {have})")
        if demand.cores > len(m.cores):
            return (f"profile {demand.profile!r} needs {_cores(demand.cores)}; this machine has "
                    f"{len(m.cores)} (lower cpu_cores, or run the model on Nomad)")
        if demand.memory > m.memory:
            return (f"profile {demand.profile!r} needs {format_size(demand.memory)} of memory; "
                    f"this machine has {format_size(m.memory)} (lower memory, or run the model "
                    "on Nomad)")
        return None

    def why_not_now(self, demand: Demand) -> str | None:
        """Why a replica cannot be placed with what is free now, or None if it can."""
        if reason := self.never_fits(demand):
            return reason
        m = self.machine
        free_gpus = self.free_gpus(demand.gpu_device)
        if demand.gpus > len(free_gpus):
            total = len([g for g in m.gpus if demand.gpu_device in (None, g.device)])
            return (f"no room for {_gpus(demand.gpus, demand.gpu_device)} on this machine: "
                    f"{len(free_gpus)} of {total} free")
        free_cores = self.free_cores()
        if demand.cores > len(free_cores):
            return (f"no room for {_cores(demand.cores)} on this machine: "
                    f"{len(free_cores)} of {len(m.cores)} free")
        free_memory = self.free_memory()
        if demand.memory > free_memory:
            return (f"no room for {format_size(demand.memory)} of memory on this machine: "
                    f"{format_size(max(free_memory, 0))} of {format_size(m.memory)} free")
        return None

    def reserve(self, holder: str, demand: Demand) -> Grant:
        """Take what ``demand`` asks for; raises ValueError with the reason if it does not fit."""
        if holder in self._held:
            raise ValueError(f"{holder} already holds a reservation")
        if reason := self.why_not_now(demand):
            raise ValueError(reason)
        grant = Grant(
            cores=tuple(self.free_cores()[: demand.cores]),
            memory=demand.memory,
            gpus=tuple(g.index for g in self.free_gpus(demand.gpu_device)[: demand.gpus]),
        )
        self._held[holder] = grant
        return grant

    def release(self, holder: str) -> None:
        self._held.pop(holder, None)
