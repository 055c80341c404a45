"""Fixtures for the Nomad backend against the fake Nomad (llmgw.testing.fake_nomad)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import pytest

from llmgw.catalog.build import Catalog, build_catalog
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.config import NomadConfig, SchedulerConfig, ServerConfig
from llmgw.scheduler.nomad.backend import NomadBackend
from llmgw.testing.fake_nomad import FakeNomad, default_fleet

from .shapes import GPU_CLASSES

MIRROR = "http://mirror.internal:8070"


def config(fake: FakeNomad, models: Sequence[Model] = (), *,
           server: dict[str, Any] | None = None, **nomad: Any) -> ServerConfig:
    settings = {"address": fake.address, "namespace": "default", "datacenters": ["dc1"],
                "timeout": 5.0, **nomad}
    return ServerConfig(
        scheduler=SchedulerConfig(kind="nomad", nomad=NomadConfig(**settings)),
        gpu_classes=GPU_CLASSES, mirror=MIRROR, models=list(models), **(server or {}))


def cpu_model(name: str, *, cores: int = 8, memory: str = "4GiB", min_: int = 1,
              max_: int | None = None, context: int = 8192) -> Model:
    return Model(name=name, engine="llama.cpp",
                 source=Source.parse(f"{MIRROR}/{name}/q8_0/{name}.gguf"),
                 profiles=[Profile(name="cpu", gpus=0, cpu_cores=cores, memory=Size.parse(memory),
                                   context=context)],
                 scaling=Scaling(min=min_, max=max_))


def gpu_model(name: str, *, gpus: int = 2, fabric: str | None = "ib-a", min_: int = 1,
              profiles: list[Profile] | None = None) -> Model:
    return Model(name=name, engine="vllm", source=Source.parse(f"{MIRROR}/{name}/v1/"),
                 profiles=profiles or [Profile(name="h100", gpu_class="h100-80g", gpus=gpus,
                                               fabric=fabric, cpu_cores=16,
                                               memory=Size.parse("128GiB"),
                                               context=32768)],
                 scaling=Scaling(min=min_))


def catalog(*models: Model) -> Catalog:
    return build_catalog(models, GPU_CLASSES)


async def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)


async def applied(backend: NomadBackend, cat: Catalog) -> None:
    """apply() and wait for the reconciler pass that follows it to finish."""
    await backend.apply(cat)
    await backend.reconciled()


@pytest.fixture
def fake() -> Iterator[FakeNomad]:
    with FakeNomad(default_fleet()) as f:
        yield f


def make_backend(fake: FakeNomad, store: Any = None, cfg: ServerConfig | None = None,
                 **kw: Any) -> NomadBackend:
    opts = {"reconcile_interval": 0.5, "check_interval": 0.1, "watch_wait": 2.0,
            "backoff_max": 2.0, "lease_ttl": 5.0, **kw}
    return NomadBackend(cfg or config(fake), store, **opts)


@pytest.fixture
async def backend(fake: FakeNomad) -> AsyncIterator[NomadBackend]:
    b = make_backend(fake)
    await b.start()
    yield b
    await b.close()
