"""Nomad answers shaped as the reference describes them (docs/nomad-api.md §3.2, §5.1), for the
pure modules' tests. Nodes are named after the machines they stand for.

Built as JSON dicts and decoded by llmgw's own wire structs, so these tests
also pin that the decoder reads the reference's shapes (attribute units,
omitted zero fields).
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from llmgw.catalog.model import GpuClass
from llmgw.catalog.units import Size
from llmgw.scheduler.nomad import wire

H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"
GPU_CLASSES = {
    "h100-80g": GpuClass(device=H100, memory=Size.parse("81559MiB")),
    "l40s-48g": GpuClass(device=L40S, memory=Size.parse("46068MiB")),
}
_NS = uuid.UUID("0b1e4c44-5a0c-4e47-a9a2-6c8f3e3c7d10")


def _id(*parts: str) -> str:
    return str(uuid.uuid5(_NS, "/".join(parts)))


def gpu_ids(node: str, n: int) -> list[str]:
    return [f"GPU-{_id(node, 'gpu', str(i))}" for i in range(n)]


def node_json(name: str, *, cores: int, mhz: int, memory_mb: int, gpus: int = 0,
              device: str | None = None, device_mib: int = 0, fabric: str | None = None,
              gpu_class: str | None = None, status: str = "ready",
              eligibility: str = "eligible", drain: bool = False,
              unhealthy: int = 0) -> dict[str, Any]:
    meta = {"rack": "r12"}
    if fabric:
        meta["llmgw_fabric"] = fabric
    if gpu_class:
        meta["llmgw_gpu_class"] = gpu_class
    devices = []
    if gpus:
        ids = gpu_ids(name, gpus)
        devices.append({
            "Vendor": "nvidia", "Type": "gpu", "Name": device,
            "Attributes": {"memory": {"Int": device_mib, "Unit": "MiB"},
                           "driver_version": {"String": "550.90.07"}},
            "Instances": [{"ID": gid, "Healthy": i >= unhealthy, "HealthDescription": "",
                           "Locality": {"PciBusID": f"0000:{i:02x}:00.0"}}
                          for i, gid in enumerate(ids)],
        })
    return {
        "ID": _id("node", name), "Name": name, "Datacenter": "dc1", "NodePool": "default",
        "NodeClass": "", "Status": status, "SchedulingEligibility": eligibility,
        "Drain": drain, "DrainStrategy": {"Deadline": 3600000000000} if drain else None,
        "Meta": meta,
        "Attributes": {"cpu.numcores": str(cores), "nomad.service_discovery": "true"},
        "NodeResources": {
            "Cpu": {"CpuShares": cores * mhz, "TotalCpuCores": cores,
                    "ReservableCpuCores": list(range(cores))},
            "Memory": {"MemoryMB": memory_mb}, "Disk": {"DiskMB": 1_000_000},
            "Devices": devices, "MinDynamicPort": 20000, "MaxDynamicPort": 32000,
        },
        "ReservedResources": {
            "Cpu": {"CpuShares": 2 * mhz, "ReservedCpuCores": [0, 1]},
            "Memory": {"MemoryMB": 8192}, "Disk": {"DiskMB": 0},
            "Networks": {"ReservedHostPorts": ""},
        },
        "ModifyIndex": 10,
    }


def node(raw: dict[str, Any]) -> wire.Node:
    return msgspec.convert(raw, wire.Node)


def node_8x_h100_80g(name: str, fabric: str, **kw: Any) -> wire.Node:
    """An HGX H100 box: 8× H100 80GB, 64 cores at 2800 MHz, ~1 TiB of memory."""
    return node(node_json(name, cores=64, mhz=2800, memory_mb=1_031_526, gpus=8, device=H100,
                          device_mib=81559, fabric=fabric, gpu_class="h100-80g", **kw))


def node_4x_l40s_48g(name: str, fabric: str | None = None, **kw: Any) -> wire.Node:
    """A PCIe inference server: 4× L40S 48GB, 48 cores, 512 GiB."""
    return node(node_json(name, cores=48, mhz=2900, memory_mb=514_823, gpus=4, device=L40S,
                          device_mib=46068, fabric=fabric, gpu_class="l40s-48g", **kw))


def node_cpu_64c(name: str, **kw: Any) -> wire.Node:
    """A CPU-only host: 64 cores at 3100 MHz, 384 GiB."""
    return node(node_json(name, cores=64, mhz=3100, memory_mb=386_000, **kw))


def alloc(on: wire.Node, *, cores: list[int] | None = None, mhz: int = 0,
          memory_mb: int = 0, gpus: list[str] | None = None, client_status: str = "running",
          desired: str = "run", prestart: tuple[int, int] | None = None,
          job: str = "llmgw-x") -> wire.Allocation:
    """An allocation stub with resources, as ``/v1/allocations?resources=true`` sends it.

    ``prestart`` is (MHz, MiB) of an ephemeral prestart task beside the engine.
    """
    per_core = on.NodeResources.Cpu.CpuShares // on.NodeResources.Cpu.TotalCpuCores \
        if on.NodeResources else 0
    engine: dict[str, Any] = {
        "Cpu": {"CpuShares": mhz or per_core * len(cores or []),
                **({"ReservedCores": cores} if cores else {})},
        "Memory": {"MemoryMB": memory_mb},
    }
    if gpus:
        engine["Devices"] = [{"Vendor": "nvidia", "Type": "gpu", "Name": H100,
                              "DeviceIDs": gpus}]
    tasks = {"engine": engine}
    lifecycles: dict[str, Any] = {"engine": None}
    if prestart:
        tasks["fetch"] = {"Cpu": {"CpuShares": prestart[0]}, "Memory": {"MemoryMB": prestart[1]}}
        lifecycles["fetch"] = {"Hook": "prestart", "Sidecar": False}
    raw = {
        "ID": _id("alloc", on.ID, job, str(cores), str(gpus), client_status, str(memory_mb)),
        "Name": f"{job}.serve[0]", "NodeID": on.ID, "NodeName": on.Name, "JobID": job,
        "TaskGroup": "serve", "DesiredStatus": desired, "ClientStatus": client_status,
        "AllocatedResources": {"Tasks": tasks, "TaskLifecycles": lifecycles,
                               "Shared": {"DiskMB": 300}},
    }
    return msgspec.convert(raw, wire.Allocation)
