"""Fixtures for the model service and the control API: real stores, a recording backend."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmgw.catalog.build import Catalog
from llmgw.catalog.model import GpuClass, Model
from llmgw.catalog.units import Size
from llmgw.errors import PlacementError
from llmgw.scheduler.base import (
    BackendHealth,
    Fleet,
    Holding,
    ModelStatus,
    Prefetch,
    PrefetchNode,
    Replica,
    SameDisk,
)
from llmgw.store import open_store
from llmgw.store.base import Store

GPU_CLASSES = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB"))}


class RecordingBackend(SameDisk):
    """A scheduler double for control-plane tests: it records what it is asked to run.

    Placement refuses profiles needing more than 8 GPUs on one node, the
    largest machine of the fleet it stands for.
    """

    def __init__(self) -> None:
        self.applied: list[Catalog] = []
        self.replica_list: list[Replica] = []
        self.rollouts: list[str] = []
        self.prefetches: list[tuple[str, list[str] | None, int | None]] = []
        self.healthy = BackendHealth(ok=True)

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
        self.applied.append(catalog)

    async def set_demand(self, model: str, replicas: int) -> None:
        return None

    async def rollout(self, model: str) -> str | None:
        self.rollouts.append(model)
        m = self.applied[-1].get(model) if self.applied else None
        return m.profiles[0].name if m and m.profiles else None

    async def replicas(self, model: str | None = None) -> list[Replica]:
        return [r for r in self.replica_list if model is None or r.model == model]

    async def holdings(self) -> list[Holding]:
        return []

    def status(self, model: str) -> ModelStatus:
        mine = [r for r in self.replica_list if r.model == model]
        return ModelStatus(desired=len(mine), ready=sum(r.healthy for r in mine))

    async def fleet(self) -> Fleet:
        return Fleet(nodes=[], pools=[])

    def health(self) -> BackendHealth:
        return self.healthy

    def endpoints(self, model: str) -> list[str]:
        return []

    def profile_of(self, address: str) -> str | None:
        return None

    async def wait_changed(self, timeout: float) -> None:
        return None

    async def prefetch(self, model: str, *, nodes: list[str] | None = None,
                       count: int | None = None) -> Prefetch:
        self.prefetches.append((model, nodes, count))
        return await self.prefetch_status(model)

    async def prefetch_status(self, model: str) -> Prefetch:
        if not self.prefetches:
            return Prefetch(model=model, message="no prefetch has run")
        _, nodes, count = self.prefetches[-1]
        names = nodes or [f"node-{i + 1}" for i in range(count or 1)]
        return Prefetch(model=model, warm=["node-9"], message=f"fetching onto {len(names)}",
                        nodes=[PrefetchNode(node=n, state="fetching", percent=40.0)
                               for n in names])


@pytest.fixture
def backend() -> RecordingBackend:
    return RecordingBackend()


def _postgres_schema_url(base: str) -> Iterator[str]:
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database of each kind; Postgres when LLMGW_TEST_POSTGRES is set."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/llmgw.db"
        return
    base = os.environ.get("LLMGW_TEST_POSTGRES")
    if not base:
        pytest.skip("LLMGW_TEST_POSTGRES is not set")
    yield from _postgres_schema_url(base)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_store(store_url)
    await s.open()
    yield s
    await s.close()


class TcpProxy:
    """A loopback TCP proxy in its own thread that can be cut, standing for a
    database that goes away mid-run."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        self._cut.set()
        self._listener.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
