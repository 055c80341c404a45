"""Fixtures for the admin page: the real app over a real SQLite store, a scheduler double.

The double stands where Nomad or the local scheduler would: it reports
replicas that follow the catalog it was last told to apply, and lets a test
say that one of a model's replicas was started with an older profile, that a
model waits for capacity, or that a replica uses more memory than reserved.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from llmgw.catalog.build import Catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import GpuClass, Model
from llmgw.catalog.units import Size
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.errors import DefinitionError, PlacementError
from llmgw.modelsvc import ModelService
from llmgw.scheduler.base import (
    BackendHealth,
    Fleet,
    Holding,
    ModelStatus,
    NodeView,
    Pool,
    Prefetch,
    PrefetchNode,
    Replica,
    SameDisk,
)
from llmgw.server import control_app
from llmgw.store import open_store

ADMIN_TOKEN = "adm-7f3c9a1e5b2d4c6f8a0b1c2d3e4f5a6b"
OTHER_TOKEN = "adm-0000aaaa1111bbbb2222cccc3333dddd"
INFERENCE_KEY = "sk-llmgw-5a1f0c9e7d3b4a2c8e6f1d0b9a7c5e3f"
GIB = 1024**3
GPU_CLASSES = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB"))}
DECLARED = convert({
    "name": "prod-chat", "source": "/models/prod-chat.gguf", "engine": "llama.cpp",
    "profiles": [{"name": "cpu", "gpus": 0, "cpu_cores": 4, "memory": "8GiB"}],
    "scaling": {"min": 2}, "description": "The reviewed production chat model",
}, Model)
OLD_FINGERPRINT = "sha256:00000000deadbeef"


def cpu_yaml(name: str, *, source: str | None = None, description: str = "", min_: int = 1,
             extra: str = "") -> str:
    """One CPU model entry as an operator would paste it."""
    desc = f"description: {description!r}\n" if description else ""
    return (
        f"name: {name}\n"
        f"{desc}"
        f"source: {source or f'/models/{name}.gguf'}\n"
        "engine: llama.cpp\n"
        "profiles:\n"
        "  - name: cpu\n"
        "    gpus: 0\n"
        "    cpu_cores: 4\n"
        "    memory: 8GiB\n"
        "scaling:\n"
        f"  min: {min_}\n"
        f"{extra}"
    )


async def refuse_typos(model: Model) -> None:
    """A source check that knows one kind of mistake: a Hugging Face org named 'typo'."""
    if model.source and model.source.text.startswith("hf://typo/"):
        raise DefinitionError(
            f"source: {model.source!r} does not exist on the Hugging Face Hub (404); "
            "check the organisation and repository names", field="source")


def node_8x_h100_80g(name: str, fabric: str, free: int) -> NodeView:
    return NodeView(name=name, id=f"{name}-id", status="ready", schedulable=True,
                    gpu_class="h100-80g", gpu_device="NVIDIA H100 80GB HBM3", fabric=fabric,
                    gpus_total=8, gpus_free=free, gpu_memory=81559 * 1024**2, cores_total=96,
                    cores_free=40, memory_total=1024 * GIB, memory_free=600 * GIB)


def node_cpu_64c(name: str) -> NodeView:
    return NodeView(name=name, id=f"{name}-id", status="ready", schedulable=True,
                    gpu_class=None, gpu_device=None, fabric=None, gpus_total=0, gpus_free=0,
                    gpu_memory=None, cores_total=64, cores_free=52, memory_total=256 * GIB,
                    memory_free=200 * GIB)


@dataclass
class FleetBackend(SameDisk):
    """A scheduler double whose replicas follow the catalog it last applied."""

    catalog: Catalog | None = None
    stale: set[str] = field(default_factory=set)          # one replica on an old profile
    hungry: set[str] = field(default_factory=set)         # measured memory above reserved
    waiting: dict[str, str] = field(default_factory=dict)  # waiting for capacity, and why
    placement_failures: dict[str, str] = field(default_factory=dict)
    shortfalls: dict[str, str] = field(default_factory=dict)      # fewer than desired, why
    deployments_failed: dict[str, str] = field(default_factory=dict)
    rollouts: list[str] = field(default_factory=list)
    fleet_warnings: list[str] = field(default_factory=list)
    prefetched: dict[str, int] = field(default_factory=dict)   # model → nodes asked for

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def check_placement(self, model: Model, catalog: Catalog) -> None:
        for p in model.profiles:
            if p.gpus > 8:
                raise PlacementError(
                    f"profile {p.name!r}: no node has {p.gpus} GPUs of class {p.gpu_class}; "
                    "the largest has 8", field="profiles")

    async def apply(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def set_demand(self, model: str, replicas: int) -> None:
        return None

    async def rollout(self, model: str) -> str | None:
        self.rollouts.append(model)
        self.stale.discard(model)
        m = self.catalog.get(model) if self.catalog else None
        return m.profiles[0].name if m and m.profiles else None

    def _of(self, m: Model) -> list[Replica]:
        if m.external or not m.profiles or m.name in self.waiting:
            return []
        p = m.profiles[0]
        reserved = int(p.memory) if p.memory is not None else None
        out = []
        for i in range(m.scaling.min):
            old = i == 0 and m.name in self.stale
            measured = None
            if reserved is not None:
                measured = reserved + GIB if m.name in self.hungry else int(reserved * 0.8)
            out.append(Replica(
                id=f"{m.name}-{i}", model=m.name, profile=p.name,
                fingerprint=OLD_FINGERPRINT if old else fingerprint(m, p),
                node=f"cpu-64c-{i + 1}", state="running", healthy=True,
                address=f"http://10.0.3.{17 + i}:24117", reserved_memory=reserved,
                measured_memory=measured))
        return out

    async def replicas(self, model: str | None = None) -> list[Replica]:
        models = list(self.catalog or [])
        return [r for m in models if model in (None, m.name) for r in self._of(m)]

    async def holdings(self) -> list[Holding]:
        return []

    def status(self, model: str) -> ModelStatus:
        m = self.catalog.get(model) if self.catalog else None
        if m is None:
            return ModelStatus()
        running = self._of(m)
        return ModelStatus(desired=m.scaling.min, ready=len(running),
                           waiting_for_capacity=self.waiting.get(model),
                           last_placement_failure=self.placement_failures.get(model),
                           shortfall=self.shortfalls.get(model),
                           deployment_failed=self.deployments_failed.get(model))

    async def fleet(self) -> Fleet:
        nodes = [node_8x_h100_80g("gpu-h100-a1", "ib-a", 3),
                 node_8x_h100_80g("gpu-h100-a2", "ib-a", 8),
                 node_8x_h100_80g("gpu-h100-b1", "ib-b", 0), node_cpu_64c("cpu-64c-1")]
        pools = [
            Pool(name="h100-80g/ib-a", gpu_class="h100-80g", fabric="ib-a",
                 gpu_memory=81559 * 1024**2, nodes=["gpu-h100-a1", "gpu-h100-a2"],
                 gpus_total=16, gpus_free=11, largest_free_gpus_on_a_node=8),
            Pool(name="h100-80g/ib-b", gpu_class="h100-80g", fabric="ib-b",
                 gpu_memory=81559 * 1024**2, nodes=["gpu-h100-b1"], gpus_total=8, gpus_free=0,
                 largest_free_gpus_on_a_node=0),
            Pool(name="cpu", gpu_class=None, fabric=None, gpu_memory=None, nodes=["cpu-64c-1"],
                 gpus_total=0, gpus_free=0, largest_free_gpus_on_a_node=0),
        ]
        nodes = [msgspec.structs.replace(n, warm=sorted(self.prefetched))
                 if n.name == "cpu-64c-1" else n for n in nodes]
        if self.fleet_warnings:
            nodes = [msgspec.structs.replace(n, warning=self.fleet_warnings[0])
                     if n.gpu_class else n for n in nodes]
        return Fleet(nodes=nodes, pools=pools, warnings=list(self.fleet_warnings))

    def health(self) -> BackendHealth:
        return BackendHealth(ok=True)

    def endpoints(self, model: str) -> list[str]:
        return []

    def profile_of(self, address: str) -> str | None:
        return None

    async def wait_changed(self, timeout: float) -> None:
        return None

    async def prefetch(self, model: str, *, nodes: list[str] | None = None,
                       count: int | None = None) -> Prefetch:
        self.prefetched[model] = count or len(nodes or [])
        return Prefetch(model=model, message=f"fetching {model}'s weights onto "
                                             f"{self.prefetched[model]} nodes")

    async def prefetch_status(self, model: str) -> Prefetch:
        asked = self.prefetched.get(model)
        if asked is None:
            return Prefetch(model=model)
        return Prefetch(model=model, warm=["cpu-64c-1"], nodes=[
            PrefetchNode(node=f"cpu-64c-{i + 2}", state="fetching", percent=37.0)
            for i in range(asked)])


def make_config(tokens: list[AdminToken | str] | None = None) -> ServerConfig:
    if tokens is None:
        tokens = [AdminToken(name="alice", token=ADMIN_TOKEN)]
    return ServerConfig(admin_tokens=tokens, gpu_classes=GPU_CLASSES, models=[DECLARED])


def make_app(db: Path, backend: FleetBackend, config: ServerConfig | None = None,
             ) -> tuple[Litestar, AppContext]:
    """The real app over a real SQLite file; the store opens in the app's own event loop."""
    config = config or make_config()
    store = open_store(f"sqlite:///{db}")
    svc = ModelService(config.models, dict(config.gpu_classes), store,
                       placement_check=backend.check_placement)
    ctx = AppContext(config=config, models=svc, backend=backend, store=store,
                     source_check=refuse_typos)
    app = control_app(ctx)

    async def start() -> None:
        await store.open()
        svc.subscribe(backend.apply)
        await svc.load()
        await backend.apply(svc.catalog)

    async def stop() -> None:
        await store.close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop)
    return app, ctx


@pytest.fixture
def backend() -> FleetBackend:
    return FleetBackend()


@pytest.fixture
def app_and_ctx(tmp_path: Path, backend: FleetBackend) -> tuple[Litestar, AppContext]:
    return make_app(tmp_path / "llmgw.db", backend)


@pytest.fixture
def ctx(app_and_ctx: tuple[Litestar, AppContext]) -> AppContext:
    return app_and_ctx[1]


@pytest.fixture
async def client(app_and_ctx: tuple[Litestar, AppContext]) -> AsyncIterator[AsyncTestClient]:
    """An in-process client with no session."""
    async with AsyncTestClient(app_and_ctx[0]) as c:
        yield c


_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def sign_in(client: AsyncTestClient, token: str = ADMIN_TOKEN) -> str:
    """Sign ``client`` in through the form; returns the session's CSRF token."""
    form = await client.get("/admin/signin")
    r = await client.post("/admin/signin", data={
        "csrf": csrf_of(form.text), "token": token, "next": "/admin/models"},
        follow_redirects=False)
    assert r.status_code == 303, r.text
    page = await client.get("/admin/models")
    assert page.status_code == 200
    return csrf_of(page.text)


@pytest.fixture
async def admin(client: AsyncTestClient) -> AsyncTestClient:
    """The client, signed in as alice."""
    await sign_in(client)
    return client
