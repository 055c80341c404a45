"""Test doubles for what the gateway reads: the catalog in force and the scheduler backend.

``FakeBackend`` implements the Backend Protocol with real engines behind it:
its endpoints are the URLs of FakeEngines the test started (healthy ones
only, as a real backend reports), and ``set_demand`` can start one, as a
scheduler would, some time after it was asked.

``FileBackend`` shares its state through files, so that two gateway
processes see the same replicas: endpoints are read from a JSON file the test
writes, and each ``set_demand`` call is appended to a log the test counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from llmgw.catalog.build import Catalog, build_catalog
from llmgw.catalog.model import GpuClass, Model
from llmgw.scheduler.base import BackendHealth, Fleet, Holding, ModelStatus, Replica, SameDisk


class CatalogHolder:
    """A CatalogView whose catalog a test can swap."""

    def __init__(self, models: list[Model],
                 gpu_classes: Mapping[str, GpuClass] | None = None) -> None:
        self.catalog: Catalog = build_catalog(models, gpu_classes or {})


class _BackendBase:
    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def check_placement(self, model: Model, catalog: Catalog) -> None:
        return None

    async def apply(self, catalog: Catalog) -> None:
        return None

    async def rollout(self, model: str) -> None:
        return None

    async def replicas(self, model: str | None = None) -> list[Replica]:
        return []

    async def holdings(self) -> list[Holding]:
        return []

    async def fleet(self) -> Fleet:
        return Fleet(nodes=[], pools=[])

    def health(self) -> BackendHealth:
        return BackendHealth(ok=True)


class FakeBackend(_BackendBase, SameDisk):
    def __init__(self) -> None:
        self._endpoints: dict[str, list[str]] = {}
        self._changed = asyncio.Event()
        self.demand_calls: list[tuple[str, int]] = []
        self.desired: dict[str, int] = {}
        # Called (as a background task) on each set_demand, like a scheduler
        # starting or stopping replicas after it has accepted the request.
        self.on_demand: Callable[[str, int], Awaitable[None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.profiles: dict[str, str] = {}      # endpoint → the profile it runs
        self.crash_looping: set[str] = set()     # models whose status says crash_loop
        self.scheduler_health = BackendHealth(ok=True)

    def set_endpoints(self, model: str, urls: list[str]) -> None:
        self._endpoints[model] = list(urls)
        self._changed.set()
        self._changed = asyncio.Event()

    def endpoints(self, model: str) -> list[str]:
        return self._endpoints.get(model, [])

    def profile_of(self, address: str) -> str | None:
        return self.profiles.get(address)

    async def wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    async def set_demand(self, model: str, replicas: int) -> None:
        self.demand_calls.append((model, replicas))
        self.desired[model] = replicas
        if self.on_demand is not None:
            task = asyncio.create_task(self.on_demand(model, replicas))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def status(self, model: str) -> ModelStatus:
        return ModelStatus(desired=self.desired.get(model, 0),
                           ready=len(self._endpoints.get(model, [])),
                           crash_loop=model in self.crash_looping)

    def health(self) -> BackendHealth:
        return self.scheduler_health


class FileBackend(_BackendBase, SameDisk):
    """Endpoints from ``endpoints.json`` (model -> URLs); set_demand appends to ``demand.log``."""

    def __init__(self, directory: Path) -> None:
        self.endpoints_file = directory / "endpoints.json"
        self.demand_log = directory / "demand.log"
        self._endpoints: dict[str, list[str]] = {}
        self._signature: tuple[int, int] | None = None
        self._desired: dict[str, int] = {}

    def _refresh(self) -> bool:
        try:
            st = self.endpoints_file.stat()
        except FileNotFoundError:
            return False
        signature = (st.st_mtime_ns, st.st_size)
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            self._endpoints = json.loads(self.endpoints_file.read_text() or "{}")
        except json.JSONDecodeError:
            self._signature = None  # caught half-written; read it again
            return False
        return True

    def endpoints(self, model: str) -> list[str]:
        self._refresh()
        return self._endpoints.get(model, [])

    def profile_of(self, address: str) -> str | None:
        return None

    async def wait_changed(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._refresh():
                return
            await asyncio.sleep(0.02)

    async def set_demand(self, model: str, replicas: int) -> None:
        self._desired[model] = replicas
        with open(self.demand_log, "a") as f:
            f.write(f"{os.getpid()} {model} {replicas}\n")

    def status(self, model: str) -> ModelStatus:
        return ModelStatus(desired=self._desired.get(model, 0))


def write_endpoints(path: Path, endpoints: dict[str, list[str]]) -> None:
    """Replace the endpoints file atomically, so a reader never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(endpoints))
    os.replace(tmp, path)
