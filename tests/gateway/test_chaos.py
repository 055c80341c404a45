"""Chaos, short: replicas killed, frozen, scaled away and drained under load, with no
client error; one of two gateway processes restarted, costing at most its requests in
flight.

Simulated engines run as real processes under the embedded scheduler's
supervisor (``llmgw.testing.chaos``) or as the fake Nomad's allocations
(``llmgw.testing.chaos_nomad``); each scenario waits on conditions (requests
done before and after the fault), never on the clock.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.gateway.app import Gateway
from llmgw.testing.chaos import GatewayProcess, Load, SimFleet, drive, gateway
from llmgw.testing.chaos_nomad import MIRROR, NomadChaos
from llmgw.testing.simengine import SimSpec
from tests.gateway.conftest import wait_for

pytestmark = pytest.mark.slow

SPEC = SimSpec(step_time=0.004, prefill_per_token=0.00001)
CLIENTS = 6


def sim_entry(**kw: object) -> dict[str, object]:
    return {"name": "m", "source": "/models/x", "engine": "vllm",
            "profiles": [{"name": "sim", "cpu_cores": 1, "memory": "1GiB"}],
            "routing": {"policy": "least-outstanding"}, **kw}


def sim_model(**kw: object) -> Model:
    return convert(sim_entry(**kw), Model)


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    low = random.randrange(40000, 48000, 50)
    fleet = SimFleet("m", SPEC, (low, low + 49))
    try:
        await fleet.scale(3, drain=0)
        yield fleet
    finally:
        await fleet.close()


async def run(fleet: SimFleet | NomadChaos, gw_url: str, fault: object) -> Load:
    """Load until ``fault`` has run and as many requests again have finished after it."""
    load = Load()
    driving = asyncio.create_task(drive(gw_url, "m", load, clients=CLIENTS,
                                        stream_tokens=150, plain_tokens=20))
    try:
        await wait_for(lambda: len(load.outcomes) >= CLIENTS or driving.done(),
                       timeout=120, what="load to be under way")
        assert callable(fault)
        await fault()
        after = len(load.outcomes) + 2 * CLIENTS
        await wait_for(lambda: len(load.outcomes) >= after or driving.done(), timeout=120,
                       what="requests to finish after the fault")
    finally:
        load.stop.set()
        await driving
    return load


def resumed(gw: Gateway) -> float:
    return gw.metrics.resumed.labels("m")._value.get()


async def streams_on(gw: Gateway, url: str | None) -> None:
    """Until a stream is under way on the replica at ``url``."""
    assert url is not None
    await wait_for(lambda: gw.balancer.answering(url) >= 1, timeout=60,
                   what="a stream under way on the replica")


async def test_killing_a_replica_costs_no_client_anything(fleet: SimFleet) -> None:
    """SIGKILL of a replica serving streams: requests before their first byte are retried,
    broken streams are resumed with the exact text, and nobody sees an error."""
    async with gateway(sim_model(), fleet) as (url, gw):
        async def kill() -> None:
            await streams_on(gw, fleet.runners[0].address)
            fleet.kill(0)

        load = await run(fleet, url, kill)
    assert [o.error for o in load.outcomes if o.error] == []
    assert any(o.stream for o in load.outcomes)
    assert resumed(gw) >= 1


async def test_a_frozen_replica_costs_streams_a_pause_not_their_answer(
        fleet: SimFleet) -> None:
    """SIGSTOP of a replica for longer than timeouts.idle: its streams resume elsewhere."""
    async with gateway(sim_model(timeouts={"idle": "500ms"}), fleet) as (url, gw):
        async def freeze() -> None:
            await streams_on(gw, fleet.runners[0].address)
            await fleet.freeze(2.0, 0)

        load = await run(fleet, url, freeze)
    assert [o.error for o in load.outcomes if o.error] == []
    assert resumed(gw) >= 1


async def test_scaling_3_to_1_drains_without_a_broken_stream(fleet: SimFleet) -> None:
    """Two replicas leave with a drain: their streams finish where they are (nothing needs
    resuming) and new requests go to the one left."""
    async with gateway(sim_model(), fleet) as (url, gw):
        async def scale_down() -> None:
            await streams_on(gw, fleet.runners[2].address)
            await fleet.scale(1, drain=60)

        load = await run(fleet, url, scale_down)
    assert [o.error for o in load.outcomes if o.error] == []
    assert len(fleet.runners) == 1
    assert resumed(gw) == 0
    assert gw.metrics.upstream_errors.labels("m", "stream_broken")._value.get() == 0


async def test_draining_a_nomad_node_costs_no_client_anything() -> None:
    """A node drained in (the fake) Nomad under load: its allocation's service goes first,
    so the gateway sends it nothing new, its streams finish during shutdown_delay, then
    it is killed; the replacement runs on another node. No error, nothing to resume."""
    model = sim_model(source=f"{MIRROR}/m/q8_0/m.gguf", engine="llama.cpp",
                      profiles=[{"name": "cpu", "cpu_cores": 8, "memory": "4GiB"}],
                      scaling={"min": 3}, timeouts={"drain": "10s"})
    chaos = NomadChaos(model, SPEC)
    async with chaos.running(3) as backend, gateway(model, backend) as (url, gw):
        drained: dict[str, str] = {}

        async def drain() -> None:
            await wait_for(lambda: any(gw.balancer.answering(u) >= 1
                                       for u in backend.endpoints("m")),
                           timeout=60, what="a stream under way")
            victim = next(u for u in backend.endpoints("m") if gw.balancer.answering(u))
            [alloc] = [a for a, u in chaos.workloads.urls().items() if u == victim]
            drained.update(node=chaos.node_of(victim), alloc=alloc)
            chaos.nomad.set_node(drained["node"], drain=True)
            await wait_for(lambda: alloc in chaos.workloads.stopped, timeout=120,
                           what="the drained allocation to be killed after its delay")
            await wait_for(lambda: len(backend.endpoints("m")) == 3, timeout=120,
                           what="three replicas again")

        load = await run(chaos, url, drain)
        live = chaos.nomad.allocations(chaos.job)
        nodes = {n.id: n.name for n in chaos.nomad.nodes}
    assert [o.error for o in load.outcomes if o.error] == []
    assert resumed(gw) == 0
    assert gw.metrics.upstream_errors.labels("m", "stream_broken")._value.get() == 0
    assert len(live) == 3
    assert drained["alloc"] not in {a.id for a in live}
    assert drained["node"] not in {nodes[a.node_id] for a in live}


async def test_a_rollout_replaces_every_replica_without_a_broken_stream(
        fleet: SimFleet) -> None:
    """Each replica is replaced by a new one, healthy before the old drains: no error and
    nothing to resume."""
    async with gateway(sim_model(), fleet) as (url, gw):
        old = {r.id for r in fleet.runners}

        async def rollout() -> None:
            await streams_on(gw, fleet.runners[0].address)
            await fleet.rollout(drain=60)

        load = await run(fleet, url, rollout)
    assert [o.error for o in load.outcomes if o.error] == []
    assert not old & {r.id for r in fleet.runners}
    assert len(fleet.runners) == 3
    assert resumed(gw) == 0


async def restart_one_of_two(fleet: SimFleet, tmp_path: Path, sig: int
                             ) -> tuple[Load, float, float]:
    """Two gateway processes on one store before the fleet, clients spread over both;
    instance 0 is stopped with ``sig`` under load and started again. The load, and
    when the signal was sent and the process had ended (the load's clock)."""
    replicas = [r.address for r in fleet.runners if r.address]
    first, second = (GatewayProcess(sim_entry(), replicas, tmp_path / "store.db")
                     for _ in range(2))
    loop = asyncio.get_running_loop()
    load = Load()
    try:
        await first.start()
        await second.start()
        driving = asyncio.create_task(drive([first.url, second.url], "m", load,
                                            clients=CLIENTS, stream_tokens=150,
                                            plain_tokens=20))
        try:
            await wait_for(lambda: len(load.outcomes) >= 2 * CLIENTS or driving.done(),
                           timeout=120, what="load to be under way on both instances")
            # Stopped while it is answering a stream: on a busy CPU every request it has
            # could otherwise still be waiting for its first byte, and a request with no
            # answer yet is sent to the other instance, so nothing would be in flight.
            await wait_for(lambda: load.streaming.get(0, 0) > 0 or driving.done(),
                           timeout=120, what="instance 0 to be answering a stream")
            signalled = loop.time()
            await first.stop(sig)
            ended = loop.time()
            await first.start()
            await wait_for(lambda: driving.done() or any(
                o.via == 0 and o.started > ended and not o.error for o in load.outcomes),
                timeout=120, what="the restarted instance to answer again")
        finally:
            load.stop.set()
            await driving
    finally:
        await first.stop()
        await second.stop()
    return load, signalled, ended


async def test_restarting_one_gateway_of_two_costs_no_client_anything(
        fleet: SimFleet, tmp_path: Path) -> None:
    """SIGTERM to one of two gateways: it answers what it has in flight before it exits,
    and while it is away the clients' connections are refused and go to the other."""
    load, _, ended = await restart_one_of_two(fleet, tmp_path, signal.SIGTERM)
    assert [o.error for o in load.outcomes if o.error] == []
    assert any(o.via == 0 and o.started > ended for o in load.outcomes)


async def test_a_gateway_crash_costs_only_the_requests_it_had_in_flight(
        fleet: SimFleet, tmp_path: Path) -> None:
    """SIGKILL to one of two gateways: the requests it was answering fail, no other."""
    load, signalled, ended = await restart_one_of_two(fleet, tmp_path, signal.SIGKILL)
    in_flight = [o for o in load.outcomes
                 if o.via == 0 and o.started < ended and o.started + o.latency > signalled]
    assert in_flight
    assert [o for o in load.outcomes if o.error and o not in in_flight] == []
    assert any(o.via == 0 and o.started > ended and not o.error for o in load.outcomes)
