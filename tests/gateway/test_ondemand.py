"""On-demand models: held requests, one scale-up per burst, idle scale-down."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from llmgw.catalog.build import build_catalog
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.ondemand import OnDemand
from llmgw.store.sqlite import SqliteStore
from tests.gateway.conftest import GatewayFactory, chat_model, wait_for
from tests.gateway.doubles import FakeBackend, write_endpoints
from tests.gateway.engine import FakeEngine

ROOT = Path(__file__).resolve().parents[2]


def scheduler_for(backend: FakeBackend, started: list[FakeEngine],
                  loaded: asyncio.Event | None = None, gate: asyncio.Event | None = None,
                  ) -> Callable[[str, int], object]:
    """A set_demand hook that starts (or stops) a real engine, as a scheduler would; the
    replica finishes loading when ``loaded`` is set (at once without it), and holds its
    streams after the first chunk until ``gate`` is set."""

    async def on_demand(model: str, replicas: int) -> None:
        if replicas == 0:
            backend.set_endpoints(model, [])
            return
        if loaded is not None:
            await loaded.wait()  # the replica loads
        engine = FakeEngine(f"{model}-replica")
        engine.gate = gate
        await engine.start()
        started.append(engine)
        backend.set_endpoints(model, [engine.url])

    return on_demand


def scaled_down(backend: FakeBackend, model: str) -> bool:
    """The gateway asked for zero replicas and the scheduler has stopped them: it does so
    in a task of its own after set_demand returns, so the call alone is not the effect."""
    return (model, 0) in backend.demand_calls and not backend.endpoints(model)


async def test_a_burst_for_a_stopped_model_is_held_and_scales_up_once(
        make_gateway: GatewayFactory) -> None:
    """Concurrent requests for a model at zero all wait for its one new replica and succeed."""
    backend = FakeBackend()
    started: list[FakeEngine] = []
    loaded = asyncio.Event()
    backend.on_demand = scheduler_for(backend, started, loaded)  # type: ignore[assignment]
    gw = await make_gateway([chat_model("m", scaling={"min": 0, "wait": "30s"})],
                            backend=backend)
    try:
        async def twelve() -> list[httpx.Response]:
            return await asyncio.gather(*(gw.chat("m") for _ in range(12)))

        burst = asyncio.create_task(twelve())
        # The replica comes up only once every request of the burst is held.
        await wait_for(lambda: gw.gateway.ondemand.in_flight.get("m") == 12 or burst.done(),
                       what="all 12 requests to be held")
        loaded.set()
        results = await burst
        assert [r.status_code for r in results] == [200] * 12
        assert backend.demand_calls == [("m", 1)]
        assert len(started) == 1
        assert len(started[0].requests) == 12
        assert await gw.store.lease_holder("scale-up:m") is not None
        metrics = (await gw.client.get("/metrics")).text
        assert 'llmgw_gateway_scale_ups_total{model="m"} 1.0' in metrics
        assert 'llmgw_gateway_cold_start_wait_seconds_count{model="m"} 12.0' in metrics
    finally:
        for engine in started:
            await engine.stop()


async def test_when_the_wait_ends_a_fallback_that_is_up_answers(make_gateway: GatewayFactory,
                                                               engines) -> None:
    """A replica that does not come up within scaling.wait hands the request to a fallback."""
    spare = await engines("spare")
    backend = FakeBackend()   # accepts the demand, never starts anything
    gw = await make_gateway([
        chat_model("big", scaling={"min": 0, "wait": "300ms"}, fallbacks=["small"]),
        chat_model("small", upstream=[spare.url]),
    ], backend=backend)
    r = await gw.chat("big")
    assert r.status_code == 200
    assert r.headers["x-llmgw-model"] == "small"
    assert backend.demand_calls == [("big", 1)]


async def test_when_the_wait_ends_without_fallback_it_is_503_with_retry_after(
        make_gateway: GatewayFactory) -> None:
    """With no fallback up, a request that waited scaling.wait gets 503 and Retry-After."""
    backend = FakeBackend()
    gw = await make_gateway([chat_model("m", scaling={"min": 0, "wait": "300ms"})],
                            backend=backend)
    r = await gw.chat("m")
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "model_unavailable"


async def test_idle_model_scales_to_zero_but_never_while_a_request_is_in_flight(
        make_gateway: GatewayFactory) -> None:
    """A stream longer than idle_timeout keeps the model up; once it ends and the model stays
    idle, the gateway scales it back to zero."""
    backend = FakeBackend()
    started: list[FakeEngine] = []
    gate = asyncio.Event()
    backend.on_demand = scheduler_for(backend, started, gate=gate)  # type: ignore[assignment]
    gw = await make_gateway(
        [chat_model("m", scaling={"min": 0, "wait": "30s", "idle_timeout": "400ms"})],
        backend=backend, activity_interval="100ms")
    ondemand = gw.gateway.ondemand
    try:
        loop = asyncio.get_running_loop()
        # The stream is the request that brings the model up: with no request before it,
        # no pause of a busy CPU between two requests can pass for idleness.
        async with gw.client.stream("POST", "/v1/chat/completions",
                                    json={"model": "m", "stream": True}) as response:
            lines = response.aiter_lines()
            assert "tok0" in await anext(lines)
            held_from, ticks = loop.time(), ondemand.ticks
            # Hold the stream for well over the idle timeout, through many ticks.
            await wait_for(lambda: loop.time() - held_from > 1.6 and ondemand.ticks > ticks + 8,
                           what="the idle timeout to pass several times over")
            assert backend.demand_calls == [("m", 1)]
            # The stream cannot end before this: a bound the load cannot shift, where the
            # client's own view of the end lags the gateway's by however busy the CPU is.
            released = loop.time()
            gate.set()
            rest = [line async for line in lines]
        assert "data: [DONE]" in rest
        await wait_for(lambda: scaled_down(backend, "m"), what="the scale-down")
        # idle_timeout, less at most one activity_interval of throttled marking
        assert loop.time() - released >= 0.4 - 0.1 - 0.05
        # Several ticks later the model is still asked to stop once only.
        ticks = ondemand.ticks
        await wait_for(lambda: ondemand.ticks > ticks + 3, what="three more ticks")
        assert backend.demand_calls.count(("m", 0)) == 1
    finally:
        for engine in started:
            await engine.stop()


async def test_scale_up_happens_again_after_a_scale_down(make_gateway: GatewayFactory) -> None:
    """After an idle scale-down, the next request brings the model back (the lease is free)."""
    backend = FakeBackend()
    started: list[FakeEngine] = []
    backend.on_demand = scheduler_for(backend, started)  # type: ignore[assignment]
    gw = await make_gateway(
        [chat_model("m", scaling={"min": 0, "wait": "30s", "idle_timeout": "300ms"})],
        backend=backend, activity_interval="50ms")
    try:
        assert (await gw.chat("m")).status_code == 200
        await wait_for(lambda: scaled_down(backend, "m"), what="the scale-down")
        assert (await gw.chat("m")).status_code == 200
        assert backend.demand_calls == [("m", 1), ("m", 0), ("m", 1)]
    finally:
        for engine in started:
            await engine.stop()


async def test_two_gateway_processes_sharing_a_store_scale_up_once(tmp_path: Path) -> None:
    """A burst spread over two gateway processes with one SQLite store makes one set_demand."""
    store_path = tmp_path / "store.db"
    store = SqliteStore(f"sqlite:///{store_path}")
    await store.open()   # create the schema once, before both processes start
    await store.close()
    models = json.dumps([{"name": "m", "source": "/models/m.gguf", "engine": "llama.cpp",
                          "profiles": [{"name": "cpu", "cpu_cores": 1, "memory": "1GiB"}],
                          "scaling": {"min": 0, "wait": "60s"}}])
    procs = []
    engine = FakeEngine("shared")
    try:
        for _ in range(2):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.gateway.gateway_process", "--store",
                str(store_path), "--dir", str(tmp_path), "--models", models,
                cwd=ROOT, stdout=asyncio.subprocess.PIPE)
            procs.append(proc)
        urls = []
        for proc in procs:
            assert proc.stdout is not None
            urls.append((await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip())
        demand_log = tmp_path / "demand.log"

        async def request(url: str) -> int:
            async with httpx.AsyncClient(base_url=url, timeout=90) as client:
                r = await client.post("/v1/chat/completions", json={"model": "m"})
                return r.status_code

        burst = [asyncio.create_task(request(url)) for url in urls for _ in range(8)]
        # Act as the scheduler: once asked, start the replica and publish it.
        await wait_for(demand_log.exists, timeout=60, what="a set_demand call")
        await engine.start()
        write_endpoints(tmp_path / "endpoints.json", {"m": [engine.url]})
        assert await asyncio.gather(*burst) == [200] * 16
        lines = demand_log.read_text().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].endswith(" m 1"), lines
        assert len(engine.requests) == 16
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        await engine.stop()


class _SlowMarkStore(SqliteStore):
    """A store whose activity mark for one model waits for a gate; every model looks idle."""

    def __init__(self, dsn: str, slow: str) -> None:
        super().__init__(dsn)
        self.slow = slow
        self.gate = asyncio.Event()
        self.marking = asyncio.Event()

    async def mark_activity(self, model: str) -> None:
        if model == self.slow:
            self.marking.set()
            await self.gate.wait()
        await super().mark_activity(model)

    async def last_activity(self, model: str) -> float | None:
        return 3600.0


async def test_a_request_beginning_during_a_tick_is_not_forgotten(tmp_path: Path) -> None:
    """A request that begins while tick() awaits a store mark keeps its model in flight, so the
    same tick does not scale that model down under it."""
    store = _SlowMarkStore(f"sqlite:///{tmp_path / 'store.db'}", slow="a")
    await store.open()
    try:
        backend = FakeBackend()
        backend.set_endpoints("b", ["http://127.0.0.1:9"])
        scaling = {"min": 0, "idle_timeout": "1s"}
        a, b = chat_model("a", scaling=scaling), chat_model("b", scaling=scaling)
        loop = asyncio.get_running_loop()
        ondemand = OnDemand(backend, store, GatewayMetrics(lambda: []), "test", 60.0, loop.time)
        ondemand.in_flight.update({"a": 1, "b": 0})   # b: its last request has ended
        tick = asyncio.create_task(ondemand.tick(build_catalog([a, b])))
        await asyncio.wait_for(store.marking.wait(), 30)   # tick is marking a
        ondemand.begin(b)                                     # a request for b starts
        store.gate.set()
        await asyncio.wait_for(tick, 30)
        assert ondemand.in_flight.get("b") == 1
        assert ("b", 0) not in backend.demand_calls
        ondemand.end(b)
        assert ondemand.in_flight.get("b") == 0
        await ondemand.close()
    finally:
        await store.close()


async def test_an_on_demand_fallback_that_answers_is_in_flight(make_gateway: GatewayFactory,
                                                               engines) -> None:
    """While an on-demand fallback streams an answer, it (not only the model asked for) counts
    as in flight, so idle scale-down cannot stop it mid-stream."""
    broken, spare = await engines("broken"), await engines("spare")
    broken.fail_status = 500
    spare.gate = asyncio.Event()
    backend = FakeBackend()
    backend.set_endpoints("small", [spare.url])
    gw = await make_gateway([
        chat_model("big", upstream=[broken.url], fallbacks=["small"]),
        chat_model("small", scaling={"min": 0, "wait": "30s", "idle_timeout": "1h"}),
    ], backend=backend)
    ondemand = gw.gateway.ondemand
    async with gw.client.stream("POST", "/v1/chat/completions",
                                json={"model": "big", "stream": True}) as response:
        assert response.headers["x-llmgw-model"] == "small"
        lines = response.aiter_lines()
        assert "tok0" in await anext(lines)
        assert ondemand.in_flight.get("small") == 1
        spare.gate.set()
        rest = [line async for line in lines]
    assert "data: [DONE]" in rest
    await wait_for(lambda: ondemand.in_flight.get("small") == 0, what="the stream to end")
