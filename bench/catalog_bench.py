"""Catalog build and model listing at 2,000 models.

Targets (issue 2): building and validating a catalog of 2,000 models < 100 ms;
GET /api/v1/models with 2,000 models < 50 ms median, in-process.

    .venv/bin/python bench/catalog_bench.py
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time

from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.catalog import GpuClass, Model, Profile, Scaling, build_catalog
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import AdminToken, ServerConfig
from llmgw.control.context import AppContext
from llmgw.modelsvc import ModelService
from llmgw.scheduler.base import BackendHealth, Fleet, ModelStatus, Replica
from llmgw.store import open_store

N = 2000
CLASSES = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB"))}


def models(n: int) -> list[Model]:
    out = []
    for i in range(n):
        profiles = [
            Profile(name="tp2", gpu_class="h100-80g", gpus=2, fabric="ib-a", context=32768,
                    cpu_cores=16, memory=Size.parse("192GiB"),
                    engine_args=["--enable-prefix-caching"]),
            Profile(name="cpu", gpus=0, cpu_cores=8, memory=Size.parse("16GiB"),
                    quantization="q4_K_M"),
        ]
        fallbacks = [f"model-{i - 1}"] if i else []
        out.append(Model(name=f"model-{i}", source=Source.parse(f"hf://org/model-{i}"),
                         engine="vllm",
                         profiles=profiles, scaling=Scaling(min=i % 3), fallbacks=fallbacks))
    return out


class IdleBackend:
    """Reports no replicas: the listing cost measured is the control plane's own."""

    async def replicas(self, model: str | None = None) -> list[Replica]:
        return []

    def status(self, model: str) -> ModelStatus:
        return ModelStatus()

    def health(self) -> BackendHealth:
        return BackendHealth(ok=True)

    async def fleet(self) -> Fleet:
        return Fleet(nodes=[], pools=[])


def bench_build(ms: list[Model]) -> list[float]:
    times = []
    for _ in range(15):
        t = time.perf_counter()
        build_catalog(ms, CLASSES)
        times.append((time.perf_counter() - t) * 1000)
    return times


async def bench_list(ms: list[Model]) -> tuple[list[float], int]:
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/bench.db")
        await store.open()
        config = ServerConfig(admin_tokens=[AdminToken(name="b", token="t")],
                              gpu_classes=CLASSES, models=ms)
        svc = ModelService(ms, CLASSES, store)
        await svc.load()
        ctx = AppContext(config=config, models=svc, backend=IdleBackend(), store=store)  # type: ignore[arg-type]
        times = []
        async with AsyncTestClient(create_app(ctx)) as client:
            size = 0
            for _ in range(25):
                t = time.perf_counter()
                r = await client.get("/api/v1/models", headers={"Authorization": "Bearer t"})
                times.append((time.perf_counter() - t) * 1000)
                size = len(r.content)
                assert r.status_code == 200
        await store.close()
        return times, size


def main() -> None:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    ms = models(N)
    build = bench_build(ms)
    listing, size = asyncio.run(bench_list(ms))
    print(f"build_catalog({N} models): median {statistics.median(build):.1f} ms, "
          f"min {min(build):.1f} ms (target < 100 ms)")
    print(f"GET /api/v1/models ({N} models, {size / 1e6:.1f} MB): median "
          f"{statistics.median(listing):.1f} ms, min {min(listing):.1f} ms (target < 50 ms)")


if __name__ == "__main__":
    main()
