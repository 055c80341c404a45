"""Chaos, short: replicas killed, frozen and scaled away under load, with no client error.

Simulated engines run as real processes under the embedded scheduler's
supervisor (``llmgw.testing.chaos``); each scenario waits on conditions
(requests done before and after the fault), never on the clock.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from llmgw.catalog.decode import convert
from llmgw.catalog.model import Model
from llmgw.gateway.app import Gateway
from llmgw.testing.chaos import Load, SimFleet, drive, gateway
from llmgw.testing.simengine import SimSpec
from tests.gateway.conftest import wait_for

pytestmark = pytest.mark.slow

SPEC = SimSpec(step_time=0.004, prefill_per_token=0.00001)
CLIENTS = 6


def sim_model(**kw: object) -> Model:
    return convert({"name": "m", "source": "/models/x", "engine": "vllm",
                    "profiles": [{"name": "sim", "cpu_cores": 1, "memory": "1GiB"}],
                    "routing": {"policy": "least-outstanding"}, **kw}, Model)


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    low = random.randrange(40000, 48000, 50)
    fleet = SimFleet("m", SPEC, (low, low + 49))
    try:
        await fleet.scale(3, drain=0)
        yield fleet
    finally:
        await fleet.close()


async def run(fleet: SimFleet, gw_url: str, fault: object) -> Load:
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
