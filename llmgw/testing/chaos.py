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

``GatewayProcess`` runs a gateway as a process of its own in front of fixed
replicas (``python -m llmgw.testing.chaos``), so that one of two instances
can be stopped and started again under load; ``drive`` with several URLs
spreads its clients over the instances as a load balancer would.

``tests/gateway/test_chaos.py`` runs short scenarios with it and
``bench/chaos.py`` the long ones with a table; both bounded in clients and
time, traffic on loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import uvicorn

from llmgw.catalog.build import Catalog, build_catalog
from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.config import GatewayConfig, ServerConfig
from llmgw.connection import uvicorn_options
from llmgw.gateway.app import Gateway
from llmgw.scheduler.base import BackendHealth, ModelStatus, Routing, SameDisk
from llmgw.scheduler.local.engines import EngineLaunch
from llmgw.scheduler.local.supervisor import InFlight, PortPool, ReplicaRunner, Timing
from llmgw.store.sqlite import SqliteStore
from llmgw.testing.simengine import SimSpec, answer_text

# The supervisor's clocks for simulated engines: they start in a second.
FAST = Timing(stop_grace=3.0, probe_starting=0.1, probe_running=0.5, probe_timeout=2.0,
              backoff_base=0.2, backoff_max=1.0, stable_after=5.0)


_START = 60.0   # a simulated engine starts in a second; a loaded machine may take longer


class SimFleet(SameDisk):
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

    def profile_of(self, address: str) -> str | None:
        return next((r.profile for r in self.runners if r.address == address), None)

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (the Protocol's)
        event = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    async def set_demand(self, model: str, replicas: int) -> None:
        return None     # the scenarios decide the count

    def status(self, model: str) -> ModelStatus:
        return ModelStatus(desired=len(self.runners), ready=len(self.endpoints(model)))

    def health(self) -> BackendHealth:
        return BackendHealth(ok=True, message=f"{len(self.runners)} simulated replicas")

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
async def gateway(model: Model, fleet: SimFleet | Routing, **settings: object
                  ) -> AsyncIterator[tuple[str, Gateway]]:
    """The gateway for ``model`` on the fleet (or any scheduler's routing), served on a
    free loopback port."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(f"sqlite:///{Path(tmp) / 'store.db'}")
        await store.open()
        config = ServerConfig(listen="127.0.0.1:8080",
                              gateway=msgspec.convert(settings, GatewayConfig))
        gw = Gateway(config, _Catalog([model]), fleet, store)
        if isinstance(fleet, SimFleet):
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


class Fixed(SameDisk):
    """A Routing over replicas that stay where they are (a gateway process's view of them)."""

    def __init__(self, model: str, replicas: Sequence[str]) -> None:
        self.model = model
        self.replicas = list(replicas)

    def endpoints(self, model: str) -> list[str]:
        return list(self.replicas) if model == self.model else []

    def profile_of(self, address: str) -> str | None:
        return None

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (the Protocol's)
        await asyncio.sleep(timeout)

    async def set_demand(self, model: str, replicas: int) -> None:
        return None

    def status(self, model: str) -> ModelStatus:
        n = len(self.endpoints(model))
        return ModelStatus(desired=n, ready=n)

    def health(self) -> BackendHealth:
        return BackendHealth(ok=True, message="fixed replicas")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class GatewayProcess:
    """A gateway in a process of its own on a fixed loopback port, in front of fixed
    replicas, with its store in a SQLite file that other instances share."""

    def __init__(self, model: dict[str, object], replicas: Sequence[str], store: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [sys.executable, "-m", "llmgw.testing.chaos", "--port", str(self.port),
                      "--store", str(store), "--model", json.dumps(model),
                      *(f"--replica={r}" for r in replicas)]
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start the process; return once it listens."""
        proc = await asyncio.create_subprocess_exec(*self._argv, stdout=asyncio.subprocess.PIPE)
        self._proc = proc
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(_START):
                line = await proc.stdout.readline()
        except TimeoutError:
            line = b""
        if line.decode().strip() != self.url:
            await self.stop(signal.SIGKILL)
            raise AssertionError(f"the gateway process did not listen on {self.url}")

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the process and wait for it to end (SIGTERM: uvicorn's graceful stop)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            async with asyncio.timeout(_START):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _serve_process(args: argparse.Namespace) -> None:
    model = convert(json.loads(args.model), Model)
    store = SqliteStore(f"sqlite:///{args.store}")
    await store.open()
    config = ServerConfig(listen=f"127.0.0.1:{args.port}")
    gw = Gateway(config, _Catalog([model]), Fixed(model.name, args.replica), store)
    await gw.start()
    # Served as `llmgw serve` serves the gateway: its connection handling is part of a stop.
    server = uvicorn.Server(uvicorn.Config(gw, host="127.0.0.1", port=args.port,
                                           lifespan="off", log_level="warning",
                                           access_log=False, **uvicorn_options(config.gateway)))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            done, _ = await asyncio.wait([task], timeout=0.02)
            if done:
                task.result()
                return
        print(f"http://127.0.0.1:{args.port}", flush=True)
        # SIGTERM ends serve() once the requests in flight are answered; a process
        # its parent forgot ends by itself.
        await asyncio.wait_for(task, 900)
    finally:
        await gw.close()
        await store.close()


@dataclass
class Outcome:
    """One client request: what it was, how long it took, what went wrong."""

    stream: bool
    started: float
    latency: float
    error: str = ""          # empty: the exact answer, whole
    via: int = 0             # the gateway instance that answered (an index into the URLs)


@dataclass
class Load:
    """The requests of one run; ``stop`` ends it after each client's current request."""

    outcomes: list[Outcome] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # By instance: the streams whose answer has begun and not ended, so a test can
    # stop an instance while it is answering rather than between answers.
    streaming: dict[int, int] = field(default_factory=dict)

    def errors(self, *, stream: bool | None = None) -> list[Outcome]:
        return [o for o in self.outcomes if o.error and (stream is None or o.stream == stream)]


class UnansweredError(Exception):
    """The connection closed or was reset before any of the answer arrived."""


async def _one(client: httpx.AsyncClient, model: str, stream: bool, tokens: int, n: int,
               answering: Callable[[int], None] = lambda change: None) -> str:
    """One request; the error a client would see, or "". ``answering(+1)`` once its
    answer has begun, ``answering(-1)`` once it has ended."""
    body = {"model": model, "max_tokens": tokens, "stream": stream,
            "messages": [{"role": "user", "content": f"Tell story number {n}."}]}
    expected = answer_text(tokens)
    request = client.build_request("POST", "/v1/chat/completions", json=body)
    try:
        r = await client.send(request, stream=True)
    except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
        raise UnansweredError(f"{type(exc).__name__}: {exc}") from exc
    answering(+1)
    try:
        return await _read(r, stream, expected)
    finally:
        answering(-1)
        await r.aclose()


async def _read(r: httpx.Response, stream: bool, expected: str) -> str:
    """The error a client would see in answer ``r``, or ""."""
    if not stream:
        await r.aread()
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        text = r.json()["choices"][0]["message"]["content"]
        return "" if text == expected else "the answer differs from the engine's"
    parts: list[str] = []
    finishes: list[str] = []
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


async def drive(url: str | Sequence[str], model: str, load: Load, *, clients: int = 20,
                streaming: float = 0.5, stream_tokens: int = 300,
                plain_tokens: int = 40) -> None:
    """``clients`` concurrent clients until ``load.stop``; a share ``streaming`` of them
    stream long answers, the others ask for short JSON ones.

    With several URLs (gateway instances) client ``i`` sends to instance ``i mod n``
    and sends a request to the next instance instead when its connection was refused,
    or closed or reset before any of the answer arrived: what a load balancer does
    for a backend that is down (HAProxy's ``retry-on conn-failure empty-response``
    with ``option redispatch``). A stopping server resets connections still in its
    accept queue when it closes its listening socket; nothing of their requests ran."""
    loop = asyncio.get_running_loop()
    urls = [url] if isinstance(url, str) else list(url)
    streamers = round(clients * streaming)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client_loop(i: int, pool: list[httpx.AsyncClient]) -> None:
        stream = i < streamers
        n = 0
        while not load.stop.is_set():
            n += 1
            started = loop.time()
            via = i % len(pool)
            for attempt in range(len(pool)):
                via = (i + attempt) % len(pool)

                def answering(change: int, via: int = via) -> None:
                    if stream:
                        load.streaming[via] = load.streaming.get(via, 0) + change
                try:
                    error = await _one(pool[via], model, stream,
                                       stream_tokens if stream else plain_tokens,
                                       i * 100000 + n, answering)
                except httpx.ConnectError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    continue
                except UnansweredError as exc:
                    error = str(exc)
                    continue
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                break
            load.outcomes.append(Outcome(stream, started, loop.time() - started, error, via))

    async with contextlib.AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=u, timeout=httpx.Timeout(120.0), limits=limits)) for u in urls]
        await asyncio.gather(*(client_loop(i, pool) for i in range(clients)))


def main() -> None:
    """``python -m llmgw.testing.chaos``: one gateway process (``GatewayProcess``)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", required=True, help="the model's catalog entry, as JSON")
    parser.add_argument("--replica", action="append", default=[], help="a replica's base URL")
    asyncio.run(_serve_process(parser.parse_args()))


if __name__ == "__main__":
    main()
