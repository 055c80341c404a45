"""Client nodes shaped like real machines, as a Nomad server would report them.

Every figure is one a real fingerprint produces (docs/nomad-api.md §3.2, §2): the NVIDIA
device plugin groups GPUs by their NVML name ("NVIDIA H100 80GB HBM3", "NVIDIA L40S"),
reports ``memory`` as an integer in MiB — 81559 for an "80GB" card, 46068 for a
"48GB" one, which is why a constraint of ``>= 80 GiB`` matches no H100 — and names
instances by GPU UUID. CPU is described as usable core IDs with a per-core MHz, so
``Cores`` reservations and ``CpuShares`` come out as the scheduler computes them.

IDs (node, GPU) are derived from the node name, so a fixture is identical from one
run to the next and a test can name ``node_8x_h100_80g("gpu-h100-01", "ib-a").id``.

Node meta carries what llmgw's job renderer constrains on: ``llmgw_gpu_class`` and
``llmgw_fabric`` (``NomadConfig.fabric_meta_key``). Each node also exposes the host
volume ``llmgw-model-cache`` (``NomadConfig.cache_volume``); pass ``cache_volume=None``
to build a node without it and see a job fail with "missing compatible host volumes".
"""

from __future__ import annotations

import hashlib
import uuid

from llmgw.testing.fake_nomad.records import DeviceGroup, DeviceInstance, HostVolume, Node

_NS = uuid.UUID("6f1c0d3e-3b7a-4c55-9a7e-1f4e2b9d8c01")
NOMAD_VERSION = "1.10.5"
DRIVER_VERSION = "550.90.07"
CACHE_VOLUME = "llmgw-model-cache"
CACHE_PATH = "/var/lib/llmgw/model-cache"

H100_80G = "NVIDIA H100 80GB HBM3"
L40S_48G = "NVIDIA L40S"
# PCI addresses of the eight SXM slots of an HGX H100 board.
_HGX_BUSES = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
              "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]
_PCIE_BUSES = ["0000:41:00.0", "0000:61:00.0", "0000:c1:00.0", "0000:e1:00.0"]


def node_id(name: str) -> str:
    """The stable node ID a fixture of this name gets."""
    return str(uuid.uuid5(_NS, f"node/{name}"))


def _address(name: str) -> str:
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return f"10.20.{h % 250 + 1}.{(h >> 8) % 250 + 1}"


def _gpus(node: str, model: str, memory_mib: int, buses: list[str], *, power_w: int,
          bar1_mib: int, cores_mhz: int, memory_mhz: int, pci_mb_s: int) -> DeviceGroup:
    return DeviceGroup(
        vendor="nvidia", type="gpu", name=model,
        attributes={
            "memory": {"Int": memory_mib, "Unit": "MiB"},
            "power": {"Int": power_w, "Unit": "W"},
            "bar1": {"Int": bar1_mib, "Unit": "MiB"},
            "cores_clock": {"Int": cores_mhz, "Unit": "MHz"},
            "memory_clock": {"Int": memory_mhz, "Unit": "MHz"},
            "pci_bandwidth": {"Int": pci_mb_s, "Unit": "MB/s"},
            "driver_version": {"String": DRIVER_VERSION},
            "display_state": {"String": "Disabled"},
            "persistence_mode": {"String": "Enabled"},
        },
        instances=[DeviceInstance(id=f"GPU-{uuid.uuid5(_NS, f'{node}/gpu/{i}')}",
                                  healthy=True, pci_bus_id=bus)
                   for i, bus in enumerate(buses)],
    )


def _node(name: str, *, cpu_model: str, sockets: int, cores: int, mhz: int, memory_mb: int,
          disk_mb: int, meta: dict[str, str], node_class: str, gpus: DeviceGroup | None,
          datacenter: str, cache_volume: str | None) -> Node:
    address = _address(name)
    reserved_cores = [0, 1]
    attributes = {
        "cpu.arch": "amd64", "cpu.modelname": cpu_model, "cpu.frequency": str(mhz),
        "cpu.numcores": str(cores), "cpu.reservablecores": str(cores - len(reserved_cores)),
        "cpu.totalcompute": str(cores * mhz),
        "cpu.usablecompute": str((cores - len(reserved_cores)) * mhz),
        "kernel.name": "linux", "kernel.arch": "x86_64", "kernel.version": "6.8.0-45-generic",
        "os.name": "ubuntu", "os.version": "22.04", "os.cgroups.version": "2",
        "memory.totalbytes": str(memory_mb * 1024 * 1024),
        "nomad.version": NOMAD_VERSION, "nomad.revision": "4e09b5b3ea2b",
        "nomad.advertise.address": f"{address}:4646", "nomad.service_discovery": "true",
        "driver.docker": "1", "driver.docker.version": "27.3.1", "driver.docker.os_type": "linux",
        "driver.docker.runtimes": "io.containerd.runc.v2,runc" + (",nvidia" if gpus else ""),
        "driver.exec": "1",
        "plugins.cni.version.bridge": "v1.5.1", "plugins.cni.version.firewall": "v1.5.1",
        "plugins.cni.version.host-local": "v1.5.1", "plugins.cni.version.loopback": "v1.5.1",
        "plugins.cni.version.portmap": "v1.5.1",
        "unique.hostname": name, "unique.network.ip-address": address,
        "unique.storage.volume": "/dev/nvme0n1p2",
        "unique.storage.bytestotal": str(disk_mb * 1024 * 1024),
        "unique.storage.bytesfree": str(disk_mb * 1024 * 1024 * 9 // 10),
    }
    volumes = {cache_volume: HostVolume(path=CACHE_PATH)} if cache_volume else {}
    return Node(
        id=node_id(name), name=name, address=address, datacenter=datacenter,
        node_class=node_class, attributes=attributes, meta=meta, cpu_model=cpu_model,
        sockets=sockets, core_mhz=mhz, core_ids=list(range(cores)),
        reserved_cores=reserved_cores, reserved_cpu_shares=len(reserved_cores) * mhz,
        memory_mb=memory_mb, reserved_memory_mb=8192, disk_mb=disk_mb, reserved_disk_mb=0,
        devices=[gpus] if gpus else [], host_volumes=volumes,
    )


def node_8x_h100_80g(name: str, fabric: str, *, datacenter: str = "dc1",
                     cache_volume: str | None = CACHE_VOLUME) -> Node:
    """An HGX H100 box: 8× H100 SXM 80GB, 2× 32-core Xeon (64 cores), 1 TiB RAM."""
    return _node(
        name, cpu_model="Intel(R) Xeon(R) Platinum 8462Y+", sockets=2, cores=64, mhz=2800,
        memory_mb=1031526, disk_mb=3_576_000, node_class="gpu-h100",
        meta={"llmgw_gpu_class": "h100-80g", "llmgw_fabric": fabric, "rack": "r12"},
        gpus=_gpus(name, H100_80G, 81559, _HGX_BUSES, power_w=700, bar1_mib=131072,
                   cores_mhz=1980, memory_mhz=2619, pci_mb_s=63015),
        datacenter=datacenter, cache_volume=cache_volume,
    )


def node_4x_l40s_48g(name: str, *, fabric: str | None = None, datacenter: str = "dc1",
                     cache_volume: str | None = CACHE_VOLUME) -> Node:
    """A PCIe inference server: 4× L40S 48GB, 2× 24-core EPYC (48 cores), 512 GiB RAM."""
    meta = {"llmgw_gpu_class": "l40s-48g", "rack": "r07"}
    if fabric:
        meta["llmgw_fabric"] = fabric
    return _node(
        name, cpu_model="AMD EPYC 9254 24-Core Processor", sockets=2, cores=48, mhz=2900,
        memory_mb=514_823, disk_mb=1_788_000, node_class="gpu-l40s", meta=meta,
        gpus=_gpus(name, L40S_48G, 46068, _PCIE_BUSES, power_w=350, bar1_mib=65536,
                   cores_mhz=2520, memory_mhz=9001, pci_mb_s=31508),
        datacenter=datacenter, cache_volume=cache_volume,
    )


def node_cpu_64c(name: str, *, datacenter: str = "dc1",
                 cache_volume: str | None = CACHE_VOLUME) -> Node:
    """A CPU-only host: one 64-core EPYC 9554, 384 GiB RAM, no GPU."""
    return _node(
        name, cpu_model="AMD EPYC 9554 64-Core Processor", sockets=1, cores=64, mhz=3100,
        memory_mb=386_000, disk_mb=1_788_000, node_class="cpu", meta={"rack": "r03"},
        gpus=None, datacenter=datacenter, cache_volume=cache_volume,
    )


def default_fleet() -> list[Node]:
    """Two 8×H100 nodes on fabric ib-a, one on ib-b, one 4×L40S, one CPU-only 64-core."""
    return [
        node_8x_h100_80g("gpu-h100-01", "ib-a"),
        node_8x_h100_80g("gpu-h100-02", "ib-a"),
        node_8x_h100_80g("gpu-h100-03", "ib-b"),
        node_4x_l40s_48g("gpu-l40s-01"),
        node_cpu_64c("cpu-01"),
    ]


FIXTURES = {"default": default_fleet}
