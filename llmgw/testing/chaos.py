"""A chaos harness: the gateway in front of simulated engines that really die, hang and leave.

What a client sees through a replica's death, a freeze, a scale-down or a
rollout depends on three parts working together: the embedded scheduler's
supervisor (which notices an exit, restarts, drains), the gateway (retries,
resumption, routing away from a withdrawn replica) and the engine's
processes. ``SimFleet`` puts the real supervisor (``ReplicaRunner``) around
real child processes that run the simulated engine
(``python -m llmgw.testing.simengine``), so a kill is a SIGKILL, a freeze a
SIGSTOP and a drain the supervisor's own; it publishes the healthy
replicas to the gateway as a scheduler does. ``drive`` is the load: clients
on loopback, half of them streaming long answers, each answer checked
against the deterministic engine's text.

``tests/gateway/test_chaos.py`` runs short scenarios with it and
``bench/chaos.py`` the long ones with a table; both bounded in clients and
time, traffic on loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import uvicorn

from llmgw.catalog.build import Catalog, build_catalog
from llmgw.catalog.model import Model
from llmgw.config import GatewayConfig, ServerConfig
from llmgw.gateway.app import Gateway
from llmgw.scheduler.base import ModelStatus
from llmgw.scheduler.local.engines import EngineLaunch
from llmgw.scheduler.local.supervisor import InFlight, PortPool, ReplicaRunner, Timing
from llmgw.store.sqlite import SqliteStore
from llmgw.testing.simengine import SimSpec, answer_text

# The supervisor's clocks for simulated engines: they start in a second.
FAST = Timing(stop_grace=3.0, probe_starting=0.1, probe_running=0.5, probe_timeout=2.0,
              backoff_base=0.2, backoff_max=1.0, stable_after=5.0)


_START = 60.0   # a simulated engine starts in a second; a loaded machine may take longer


class SimFleet:
    """Replicas of one model, each a simulated engine run by the supervisor; a Routing."""

    def __init__(self, model: str, spec: SimSpec, ports: tuple[int, int], *,
                 timing: Timing = FAST) -> None:
        self.model = model
        self.spec = spec
        self.timing = timing
        self.runners: list[ReplicaRunner] = []
        self.in_flight: InFlight | None = None      # the gateway's count, once it exists
        self._ports = PortPool(*ports)
        self._seq = 0
        self._changed = asyncio.Event()
        self._stopping: list[ReplicaRunner] = []

    # -- the scheduler's face to the gateway (llmgw.scheduler.base.Routing) ---

    def endpoints(self, model: str) -> list[str]:
        return [r.address for r in self.runners
                if r.model == model and r.healthy and r.state == "running" and r.address]

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (the Protocol's)
        event = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    async def set_demand(self, model: str, replicas: int) -> None:
        return None     # the scenarios decide the count

    def status(self, model: str) -> ModelStatus:
        return ModelStatus(desired=len(self.runners), ready=len(self.endpoints(model)))

    # -- replicas -----------------------------------------------------------

    def _notify(self, runner: ReplicaRunner, kind: str, message: str) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _count(self, address: str) -> int | None:
        return self.in_flight(address) if self.in_flight is not None else None

    async def _prepare(self, port: int) -> EngineLaunch:
        return EngineLaunch(
            argv=[sys.executable, "-m", "llmgw.testing.simengine", "--port", str(port),
                  "--name", self.model, "--spec", msgspec.json.encode(self.spec).decode()],
            env={}, health_path="/health", port=port)

    async def add(self) -> ReplicaRunner:
        """One more replica, returned once it is healthy."""
        self._seq += 1
        runner = ReplicaRunner(
            id=f"{self.model}-{self._seq}", model=self.model, profile="sim",
            fingerprint="sim", seq=self._seq, node="loopback", cpus=(), reserved_memory=None,
            prepare=self._prepare, ports=self._ports, timing=self.timing,
            on_change=self._notify, in_flight=self._count)
        self.runners.append(runner)
        runner.start()
        try:
            async with asyncio.timeout(_START):
                while not runner.healthy:
                    await self.wait_changed(1.0)
        except TimeoutError:
            raise AssertionError(f"replica {runner.id} did not become healthy within "
                                 f"{_START:g} s: {runner.message}") from None
        return runner

    async def remove(self, runner: ReplicaRunner, drain: float) -> None:
        """Stop one replica as a scale-down does: withdrawn, drained, then stopped."""
        self._stopping.append(runner)
        try:
            await runner.stop(drain)
        finally:
            self.runners.remove(runner)
            self._stopping.remove(runner)

    async def scale(self, replicas: int, drain: float) -> None:
        while len(self.runners) < replicas:
            await self.add()
        await asyncio.gather(*(self.remove(r, drain) for r in self.runners[replicas:]))

    async def rollout(self, drain: float) -> None:
        """Replace every replica, one at a time: the new one healthy before the old drains."""
        for old in list(self.runners):
            await self.add()
            await self.remove(old, drain)

    def kill(self, index: int = 0) -> int:
        """SIGKILL one replica's engine (the supervisor restarts it); its pid."""
        pid = self.runners[index].pid
        assert pid is not None, "the replica has no running engine"
        os.kill(pid, signal.SIGKILL)
        return pid

    async def freeze(self, seconds: float, index: int = 0) -> None:
        """SIGSTOP one replica's engine for ``seconds``, then SIGCONT."""
        pid = self.runners[index].pid
        assert pid is not None, "the replica has no running engine"
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    async def close(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.runners), return_exceptions=True)
        self.runners.clear()




class _Catalog:
    def __init__(self, models: Sequence[Model]) -> None:
        self.catalog: Catalog = build_catalog(list(models))


@contextlib.asynccontextmanager
async def gateway(model: Model, fleet: SimFleet, **settings: object
                  ) -> AsyncIterator[tuple[str, Gateway]]:
    """The gateway for ``model`` on the fleet, served on a free loopback port."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(f"sqlite:///{Path(tmp) / 'store.db'}")
        await store.open()
        config = ServerConfig(listen="127.0.0.1:8080",
                              gateway=msgspec.convert(settings, GatewayConfig))
        gw = Gateway(config, _Catalog([model]), fleet, store)
        fleet.in_flight = gw.balancer.outstanding
        await gw.start()
        server = uvicorn.Server(uvicorn.Config(gw, host="127.0.0.1", port=0, lifespan="off",
                                               log_level="warning", access_log=False))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                done, _ = await asyncio.wait([task], timeout=0.02)
                if done:
                    task.result()
                    raise AssertionError("the gateway stopped before it listened")
            port = server.servers[0].sockets[0].getsockname()[1]
            yield f"http://127.0.0.1:{port}", gw
        finally:
            server.should_exit = True
            await task
            await gw.close()
            await store.close()


@dataclass
class Outcome:
    """One client request: what it was, how long it took, what went wrong."""

    stream: bool
    started: float
    latency: float
    error: str = ""          # empty: the exact answer, whole


@dataclass
class Load:
    """The requests of one run; ``stop`` ends it after each client's current request."""

    outcomes: list[Outcome] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def errors(self, *, stream: bool | None = None) -> list[Outcome]:
        return [o for o in self.outcomes if o.error and (stream is None or o.stream == stream)]


async def _one(client: httpx.AsyncClient, model: str, stream: bool, tokens: int, n: int
               ) -> str:
    """One request; the error a client would see, or ""."""
    body = {"model": model, "max_tokens": tokens, "stream": stream,
            "messages": [{"role": "user", "content": f"Tell story number {n}."}]}
    expected = answer_text(tokens)
    if not stream:
        r = await client.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        text = r.json()["choices"][0]["message"]["content"]
        return "" if text == expected else "the answer differs from the engine's"
    parts: list[str] = []
    finishes: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return f"error event: {event['error'].get('message', '')[:200]}"
            for choice in event.get("choices", []):
                parts.append(choice["delta"].get("content") or "")
                if choice.get("finish_reason"):
                    finishes.append(choice["finish_reason"])
    if "".join(parts) != expected:
        return "the streamed text differs from an uninterrupted answer"
    if finishes != ["length"]:
        return f"finish reasons {finishes}"
    return ""


async def drive(url: str, model: str, load: Load, *, clients: int = 20,
                streaming: float = 0.5, stream_tokens: int = 300,
                plain_tokens: int = 40) -> None:
    """``clients`` concurrent clients until ``load.stop``; a share ``streaming`` of them
    stream long answers, the others ask for short JSON ones."""
    loop = asyncio.get_running_loop()
    streamers = round(clients * streaming)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client_loop(i: int, client: httpx.AsyncClient) -> None:
        stream = i < streamers
        n = 0
        while not load.stop.is_set():
            n += 1
            started = loop.time()
            try:
                error = await _one(client, model, stream,
                                   stream_tokens if stream else plain_tokens, i * 100000 + n)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            load.outcomes.append(Outcome(stream, started, loop.time() - started, error))

    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0),
                                 limits=limits) as client:
        await asyncio.gather(*(client_loop(i, client) for i in range(clients)))
