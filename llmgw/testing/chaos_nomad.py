"""The chaos harness on Nomad: the real Nomad backend against the fake, with real engines.

``SimWorkloads`` plays what a Nomad client's driver does for the fake Nomad
(``FakeNomad(workloads=...)``): when an allocation's engine task starts it runs a
simulated engine (``python -m llmgw.testing.simengine``) on a free loopback port,
which is the address the task's service registers; when the allocation's tasks are
killed — after its service has gone and its ``shutdown_delay`` has passed — it stops
that process. ``checks`` plays the client's check runner: an engine that answers
``/health`` gets its allocation's checks set to ``success``.

``NomadChaos`` puts it together: a fake Nomad of CPU nodes, the ``NomadBackend``
reconciling one model onto it and discovering its replicas, so that the gateway in
front of it (``llmgw.testing.chaos.gateway``) learns of a replica leaving from the
service registrations, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator

import httpx
import msgspec

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import Model
from llmgw.config import NomadConfig, SchedulerConfig, ServerConfig
from llmgw.scheduler.nomad.backend import NomadBackend
from llmgw.scheduler.nomad.render import job_id
from llmgw.testing.chaos import free_port
from llmgw.testing.fake_nomad import FakeNomad
from llmgw.testing.fake_nomad.fixtures import node_cpu_64c
from llmgw.testing.simengine import SimSpec

MIRROR = "http://mirror.internal:8070"


class SimWorkloads:
    """Each allocation's engine task a simulated engine process on loopback."""

    def __init__(self, served: str, spec: SimSpec) -> None:
        self._argv = [sys.executable, "-m", "llmgw.testing.simengine", "--name", served,
                      "--spec", msgspec.json.encode(spec).decode()]
        self._lock = threading.Lock()
        self.running: dict[str, tuple[subprocess.Popen[bytes], str]] = {}  # alloc → (engine, URL)
        self.stopped: list[str] = []                 # allocation IDs, in the order stopped
        self._exited: list[subprocess.Popen[bytes]] = []

    def start(self, alloc_id: str, task: str) -> tuple[str, int]:
        port = free_port()
        proc = subprocess.Popen([*self._argv, "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with self._lock:
            self.running[alloc_id] = (proc, f"http://127.0.0.1:{port}")
        return "127.0.0.1", port

    def stop(self, alloc_id: str) -> None:
        with self._lock:
            proc, _ = self.running.pop(alloc_id, (None, ""))
            if proc is None:
                return
            self.stopped.append(alloc_id)
            self._exited.append(proc)
        proc.send_signal(signal.SIGTERM)

    def urls(self) -> dict[str, str]:
        with self._lock:
            return {alloc_id: url for alloc_id, (_, url) in self.running.items()}

    def close(self) -> None:
        with self._lock:
            procs = [p for p, _ in self.running.values()] + self._exited
            self.running.clear()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


class NomadChaos:
    """A fake Nomad of ``nodes`` CPU nodes running ``model`` through the Nomad backend."""

    def __init__(self, model: Model, spec: SimSpec, nodes: int = 4) -> None:
        self.model = model
        self.job = job_id(model.name)
        self.workloads = SimWorkloads(model.name, spec)
        self.nomad = FakeNomad([node_cpu_64c(f"cpu-{i:02d}") for i in range(1, nodes + 1)],
                               workloads=self.workloads)
        self.backend: NomadBackend | None = None

    def node_of(self, url: str) -> str:
        """The name of the node whose allocation serves ``url``."""
        alloc_id = next(a for a, u in self.workloads.urls().items() if u == url)
        [alloc] = [a for a in self.nomad.allocations(self.job) if a.id == alloc_id]
        return next(n.name for n in self.nomad.nodes if n.id == alloc.node_id)

    async def _checks(self) -> None:
        """The client's check runner: a running engine that is healthy passes its checks."""
        passed: set[str] = set()
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                for alloc_id, url in self.workloads.urls().items():
                    if alloc_id in passed:
                        continue
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"{url}/health")).status_code == 200:
                            self.nomad.set_check(alloc_id, "success")
                            passed.add(alloc_id)
                await asyncio.sleep(0.1)

    @contextlib.asynccontextmanager
    async def running(self, replicas: int) -> AsyncIterator[NomadBackend]:
        """The backend with ``replicas`` of the model registered and routable."""
        self.nomad.start()
        config = ServerConfig(
            scheduler=SchedulerConfig(kind="nomad", nomad=NomadConfig(
                address=self.nomad.address, namespace="default", datacenters=["dc1"],
                timeout=5.0)),
            mirror=MIRROR, models=[self.model])
        backend = NomadBackend(config, None, reconcile_interval=0.5, check_interval=0.1,
                               watch_wait=2.0, backoff_max=2.0, lease_ttl=5.0)
        checks = asyncio.create_task(self._checks())
        try:
            await backend.start()
            await backend.apply(build_catalog([self.model]))
            await backend.set_demand(self.model.name, replicas)
            async with asyncio.timeout(120):
                while len(backend.endpoints(self.model.name)) < replicas:
                    await backend.wait_changed(1.0)
            self.backend = backend
            yield backend
        finally:
            checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checks
            await backend.close()
            await asyncio.to_thread(self.nomad.close)
            await asyncio.to_thread(self.workloads.close)
