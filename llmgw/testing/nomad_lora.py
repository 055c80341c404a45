"""LoRA adapters on the fake Nomad with everything but Nomad real, for tests and benches.

``lora_on_nomad`` stands up two CPU nodes, each a directory standing for its host
volumes; a mirror (``MirrorServer`` over a directory the caller fills, ``publish``);
the fake Nomad, whose engine tasks run the simulated vLLM behind the base job's own
command line (``nomad_vllm.JobWorkloads``, reading through the task's volume mount)
and whose ``llmgw fetch`` tasks run for real (``nomad_fetch.FetchTasks``); the real
``NomadBackend`` with one replica of a LoRA base ``qwen`` on each node; and a
``Gateway`` in front, served on loopback, for the ``openai`` client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import Catalog, Runtime, build_catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.catalog.source import Source
from llmgw.config import GatewayConfig, NomadConfig, SchedulerConfig, ServerConfig
from llmgw.gateway import Gateway
from llmgw.scheduler.nomad.adapterjob import ADAPTER_PREFIX
from llmgw.scheduler.nomad.backend import NomadBackend
from llmgw.scheduler.nomad.render import adapter_fetch_of, job_id
from llmgw.store.sqlite import SqliteStore
from llmgw.testing.fake_nomad import FakeNomad
from llmgw.testing.fake_nomad.fixtures import CACHE_VOLUME, node_cpu_64c
from llmgw.testing.nomad_fetch import FetchTasks
from llmgw.testing.nomad_vllm import JobWorkloads
from llmgw.testing.serving import serve
from llmgw.testing.simengine import SimSpec
from llmgw.weights.mirror.server import MirrorServer


class Catalogs:
    """The gateway's view of the catalog, which ``LoraStack.add`` swaps."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog


NODES = ("cpu-01", "cpu-02")
SPEC = SimSpec(step_time=0.002, prefill_per_token=0.00001, lora_load_time=0.05)
ADAPTER_FILES = {"adapter_config.json": json.dumps({"r": 8, "peft_type": "LORA"}).encode(),
                 "adapter_model.safetensors": b"\x00" * 4096}


def base(mirror: str) -> Model:
    """The LoRA base: two slots, one replica a node (two nodes, two replicas)."""
    return convert({
        "name": "qwen", "source": f"{mirror}/qwen2-5-7b/", "engine": "vllm",
        "served_name": "Qwen/Qwen2.5-7B-Instruct", "lora": {"slots": 2, "cpu_slots": 4},
        "routing": {"policy": "least-outstanding"}, "scaling": {"min": 2, "max": 2},
        "profiles": [{"name": "cpu", "cpu_cores": 2, "memory": "2GiB",
                      "distinct_hosts": True}]}, Model)


def adapter(name: str, mirror: str) -> Adapter:
    """An adapter of the base, at its mirror directory (``publish``)."""
    return Adapter(name=name, base="qwen", source=Source.parse(f"{mirror}/adapters/{name}/"))


def publish(root: Path, name: str, *, wrong_sum: bool = False, size: int | None = None
            ) -> None:
    """An adapter on the mirror; ``wrong_sum``: its weights' published sha256 is not theirs
    (a corrupted upload), which the fetch must refuse; ``size``: bytes of weights."""
    where = root / "adapters" / name
    where.mkdir(parents=True)
    files = dict(ADAPTER_FILES)
    if size is not None:
        files["adapter_model.safetensors"] = b"\x00" * size
    for file, data in files.items():
        (where / file).write_bytes(data)
    if wrong_sum:
        (where / "adapter_model.safetensors.sha256").write_text(
            hashlib.sha256(b"something else").hexdigest() + "\n")


@dataclass
class LoraStack:
    """The cluster, the gateway in front of it, and what the fake's clients ran."""

    mirror: str
    nomad: FakeNomad
    backend: NomadBackend
    gateway: Gateway
    catalogs: Catalogs
    url: str
    disks: dict[str, Path]
    fetches: FetchTasks
    workloads: JobWorkloads

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def catalog(self, adapters: list[Adapter]) -> Catalog:
        return build_catalog([base(self.mirror)], runtime=Runtime(scheduler="nomad",
                                                                  mirror=self.mirror),
                             adapters=adapters)

    async def add(self, *adapters: Adapter) -> None:
        """Adapters added at run time: the control plane's catalog and the gateway's."""
        catalog = self.catalog(list(adapters))
        self.catalogs.catalog = catalog
        await self.backend.apply(catalog)
        await self.backend.reconciled(60)

    def node_of(self, url: str) -> str:
        node_id = self.backend.node_of(url)
        return next(n.name for n in self.nomad.nodes if n.id == node_id)

    def on_disk(self, node: str, a: Adapter) -> Path:
        found = adapter_fetch_of(a, self.mirror)
        assert found is not None
        return self.disks[node] / CACHE_VOLUME / found[1].removeprefix("/llmgw-cache/")

    async def loaded(self) -> dict[str, list[str]]:
        """Replica URL → the adapters its engine lists (``/v1/models``, ``parent`` set)."""
        out = {}
        async with httpx.AsyncClient() as http:
            for url in self.backend.endpoints("qwen"):
                cards = (await http.get(f"{url}/v1/models")).json()["data"]
                out[url] = [c["id"] for c in cards if c.get("parent")]
        return out

    def adapter_jobs(self) -> list[str]:
        jobs = httpx.get(f"{self.nomad.address}/v1/jobs", params={"prefix": ADAPTER_PREFIX})
        return sorted(j["ID"] for j in jobs.json())


@contextlib.asynccontextmanager
async def lora_on_nomad(workdir: Path, published: Callable[[Path], None]
                        ) -> AsyncIterator[LoraStack]:
    """The stack, its mirror holding what ``published`` put there; ``workdir`` holds the
    mirror, the nodes' disks and the store."""
    root = workdir / "mirror"
    (root / "qwen2-5-7b").mkdir(parents=True)
    published(root)
    mirror_server = MirrorServer(root)
    await mirror_server.start("127.0.0.1", 0)
    mirror = mirror_server.url.rstrip("/")
    disks = {n: workdir / "disks" / n for n in NODES}
    for d in disks.values():
        (d / CACHE_VOLUME).mkdir(parents=True)
    workloads = JobWorkloads(SPEC, [job_id("qwen")], disks)
    nomad = FakeNomad([node_cpu_64c(n) for n in NODES], workloads=workloads)
    workloads.nomad = nomad
    nomad.start()
    fetches = FetchTasks(nomad, disks).start()
    config = ServerConfig(
        scheduler=SchedulerConfig(kind="nomad", nomad=NomadConfig(
            address=nomad.address, namespace="default", datacenters=["dc1"], timeout=5.0)),
        mirror=mirror, models=[base(mirror)],
        gateway=convert({"eject_for": "30s", "signal_interval": "200ms"}, GatewayConfig))
    backend = NomadBackend(config, None, reconcile_interval=0.5, check_interval=0.1,
                           watch_wait=2.0, backoff_max=2.0, lease_ttl=5.0)

    async def checks() -> None:
        passed: set[str] = set()
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                for alloc_id, url in workloads.urls().items():
                    if alloc_id not in passed:
                        with contextlib.suppress(httpx.HTTPError):
                            if (await client.get(f"{url}/health")).status_code == 200:
                                nomad.set_check(alloc_id, "success")
                                passed.add(alloc_id)
                await asyncio.sleep(0.1)

    runner = asyncio.create_task(checks())
    store = SqliteStore(f"sqlite:///{workdir / 'store.db'}")
    await store.open()
    try:
        await backend.start()
        catalogs = Catalogs(build_catalog([base(mirror)], runtime=Runtime(scheduler="nomad",
                                                                          mirror=mirror)))
        await backend.apply(catalogs.catalog)
        async with asyncio.timeout(120):
            while len(backend.endpoints("qwen")) < 2:
                await backend.wait_changed(1.0)
        gw = Gateway(config, catalogs, backend, store)
        await gw.start()
        try:
            async with serve(gw) as url:
                yield LoraStack(mirror=mirror, nomad=nomad, backend=backend, gateway=gw,
                            catalogs=catalogs, url=url, disks=disks, fetches=fetches,
                            workloads=workloads)
        finally:
            await gw.close()
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await backend.close()
        await store.close()
        await asyncio.to_thread(fetches.close)
        await asyncio.to_thread(nomad.close)
        await asyncio.to_thread(workloads.close)
        await mirror_server.close()
