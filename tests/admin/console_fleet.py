"""A whole llmgw process for the console's browser tests: gateway, store, and replicas
that are simulated engines on loopback, so teams, keys and traffic are real.

``SimFleetBackend`` is the admin tests' scheduler double (``FleetBackend``)
whose replicas answer: each scheduled model's ``scaling.min`` replicas are
``SimEngine`` instances started in the server's own event loop, routed to by
the real gateway, holding cores the cost meter prices, and writing an access
log the replica page shows (``ReplicaLogs``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from llmgw.catalog.build import Catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.catalog.units import Duration
from llmgw.config import AdminToken, CostsConfig, GatewayConfig, ServerConfig
from llmgw.errors import NotFoundError
from llmgw.scheduler.base import Holding, Replica
from llmgw.server import Server
from llmgw.testing.simengine import SimEngine, SimSpec
from tests.mirror.servers import ThreadedMirror

from .conftest import ADMIN_TOKEN, GPU_CLASSES, FleetBackend, refuse_typos
from .live import LiveServer

DEADLINE = 60.0
CHAT = convert({
    "name": "team-chat", "source": "/models/team-chat.gguf", "engine": "llama.cpp",
    "profiles": [{"name": "cpu", "gpus": 0, "cpu_cores": 4, "memory": "8GiB"}],
    "scaling": {"min": 2, "max": 3}, "description": "The chat model every team uses",
}, Model)


def coder(mirror: str) -> Model:
    """A model whose weights are on the mirror."""
    return convert({
        "name": "coder", "source": f"{mirror}/coder/2025-01/coder.gguf",
        "engine": "llama.cpp",
        "profiles": [{"name": "cpu", "gpus": 0, "cpu_cores": 4, "memory": "8GiB"}],
        "scaling": {"min": 1},
    }, Model)


def mirror_dir(root: Path) -> Path:
    """A mirror holding the coder model's weights and an old model no entry uses."""
    for rel, size in (("coder/2025-01/coder.gguf", 3000), ("old-chat/2024-06/old.gguf", 7000),
                      ("old-chat/2024-06/tokenizer.json", 500)):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * size)
    return root
# Quick enough that a stream of 24 tokens takes a fraction of a second.
SPEC = SimSpec(step_time=0.004, default_max_tokens=24)


@dataclass
class SimFleetBackend(FleetBackend):
    engines: dict[str, list[SimEngine]] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)

    async def apply(self, catalog: Catalog) -> None:
        self.catalog = catalog
        for m in catalog:
            if m.external or m.name in self.waiting:
                continue
            running = self.engines.setdefault(m.name, [])
            while len(running) < m.scaling.min:
                engine = SimEngine(SPEC, name=m.name)
                await engine.start()
                running.append(engine)
                self.started_at[f"{m.name}-{len(running) - 1}"] = time.time()

    async def close(self) -> None:
        for running in self.engines.values():
            for engine in running:
                await engine.stop()

    def endpoints(self, model: str) -> list[str]:
        return [e.url for e in self.engines.get(model, [])]

    def _of(self, m: Model) -> list[Replica]:
        return [msgspec_replace(r, address=e.url, restarts=1 if i == 1 else 0,
                                phase="running", message="" if i == 0 else
                                "restarted after the engine exited with status 137 "
                                "(killed: out of memory)")
                for i, (r, e) in enumerate(zip(super()._of(m), self.engines.get(m.name, []),
                                               strict=False))]

    async def holdings(self) -> list[Holding]:
        return [Holding(id=rid, model=rid.rsplit("-", 1)[0], gpu_class="", gpus=0, cores=4.0,
                        start=at) for rid, at in self.started_at.items()]

    async def replica_log(self, replica: str, lines: int) -> list[str]:
        model, _, index = replica.rpartition("-")
        running = self.engines.get(model, [])
        if not index.isdigit() or int(index) >= len(running):
            raise NotFoundError(f"no replica {replica!r}")
        engine = running[int(index)]
        kept = [f"INFO:     127.0.0.1 - \"POST {p} HTTP/1.1\" 200" for p in engine.paths]
        return [f"engine {model} listening on {engine.url}", *kept][-lines:]


def msgspec_replace(r: Replica, **changes: Any) -> Replica:
    import msgspec

    return msgspec.structs.replace(r, **changes)


async def no_warnings(model: Model) -> list[str]:
    return []


def fleet_config(db: Path, mirror: str) -> ServerConfig:
    return ServerConfig(
        database=f"sqlite:///{db}", admin_tokens=[AdminToken(name="alice", token=ADMIN_TOKEN)],
        gpu_classes=GPU_CLASSES, models=[CHAT, coder(mirror)], mirror=mirror,
        gateway=GatewayConfig(ledger_interval=Duration.parse("200ms"),
                              scale_interval=Duration.parse("1s")),
        costs=CostsConfig(cpu_core_per_hour=0.04, meter_interval=Duration.parse("1s")),
    )


@dataclass
class Fleet:
    url: str
    server: Server
    backend: SimFleetBackend
    keys: dict[str, str]          # key name → secret

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=DEADLINE,
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})

    def chat(self, key: str, model: str = "team-chat", text: str = "hello",
             stream: bool = False) -> httpx.Response:
        """One chat request through the gateway, read to its end."""
        with httpx.Client(base_url=self.url, timeout=DEADLINE) as c:
            return c.post("/v1/chat/completions", headers={
                "Authorization": f"Bearer {self.keys[key]}"},
                json={"model": model, "messages": [{"role": "user", "content": text}],
                      "max_tokens": 24, "stream": stream,
                      **({"stream_options": {"include_usage": True}} if stream else {})})


def until(probe: Any, what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@dataclass
class Traffic:
    """What the fixture sent, to check the pages' figures against."""

    statuses: dict[str, list[int]] = field(default_factory=dict)   # key → statuses


class _Stop:
    def __init__(self, mirror: ThreadedMirror) -> None:
        self.mirror = mirror

    def close(self) -> None:
        self.mirror.stop()


def start_fleet(tmp: Path) -> Iterator[tuple[Fleet, Traffic]]:
    """Two teams, three keys, a few dozen requests; one team over its daily budget."""
    backend = SimFleetBackend()
    weights = ThreadedMirror(mirror_dir(tmp / "mirror"))
    server = Server(fleet_config(tmp / "llmgw.db", weights.url), backend=backend,
                    source_check=refuse_typos, reservation_check=no_warnings)
    async def app(scope: Any, receive: Any, send: Any) -> None:
        # A function of three arguments, which uvicorn takes for ASGI 3 (a bound
        # method it would take for ASGI 2).
        await server.asgi(scope, receive, send)

    with contextlib.closing(_Stop(weights)), LiveServer(app) as live:  # type: ignore[arg-type]
        fleet = Fleet(url=live.url, server=server, backend=backend, keys={})
        traffic = Traffic()
        with fleet.api() as api:
            for body in ({"name": "ml", "limits": {"log_requests": "bodies",
                                                   "tokens_per_day": 200000}},
                         {"name": "web", "limits": {"tokens_per_day": 400, "rpm": 600}}):
                assert api.post("/api/v1/teams", json=body).status_code == 201
            for name, team in (("ml-ci", "ml"), ("ml-notebook", "ml"), ("web-app", "web")):
                r = api.post("/api/v1/keys", json={"name": name, "team": team})
                assert r.status_code == 201, r.text
                fleet.keys[name] = r.json()["key"]
        until(lambda: fleet.chat("ml-ci").status_code == 200, "the runtime keys to be in force")
        traffic.statuses["ml-ci"] = [200]
        for i in range(12):
            for key in ("ml-ci", "ml-notebook", "web-app"):
                r = fleet.chat(key, text=f"request {i} of {key}", stream=i % 2 == 1)
                traffic.statuses.setdefault(key, []).append(r.status_code)
        # The budget is checked against the ledger as last read: a few more requests
        # may pass before the gateway sees the team over it (bounded overshoot).

        def refused() -> bool:
            r = fleet.chat("web-app", text="one more")
            traffic.statuses["web-app"].append(r.status_code)
            return r.status_code == 429

        until(refused, "the web team to be over its daily budget")
        yield fleet, traffic

