"""Fetching an adapter onto a node through the fake Nomad: shared attempts, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.source import Source
from llmgw.config import NomadConfig
from llmgw.scheduler.nomad import adapterjob, credentials
from llmgw.scheduler.nomad.adapterstage import AdapterFetchError, AdapterStager
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.scheduler.nomad.offload import Offloader
from llmgw.testing.fake_nomad import FakeNomad

from .conftest import MIRROR

REPLICA = "http://10.0.0.7:31000"
SQL = Adapter(name="qwen-sql", base="qwen",
              source=Source.parse(f"{MIRROR}/adapters/qwen-sql/"))


@pytest.fixture
def stagers(fake: FakeNomad) -> Iterator[list[AdapterStager]]:
    """Two gateway processes' stagers, each with its own client, on the same node."""
    cfg = NomadConfig(address=fake.address, namespace="default", datacenters=["dc1"],
                      timeout=5.0)
    node = fake.nodes[0].id
    clients = [NomadClient(cfg) for _ in range(2)]
    yield [AdapterStager(c, Offloader(), cfg, MIRROR, credentials.Keeper(c, cfg, MIRROR),
                         lambda _: node, poll=0.05) for c in clients]
    for c in clients:
        c.close()


async def _running(fake: FakeNomad, job: str) -> str:
    async with asyncio.timeout(30):
        while True:
            found = [a.id for a in await asyncio.to_thread(fake.allocations, job)
                     if a.client_status == "running"]
            if found:
                return found[0]
            await asyncio.sleep(0.05)


async def test_two_processes_asking_at_once_share_one_fetch(
        fake: FakeNomad, stagers: list[AdapterStager]) -> None:
    """However the two reads and registers interleave, EnforceIndex lets one attempt
    through, both wait on it, and both know the node holds the adapter afterwards."""
    job = adapterjob.job_id(SQL.name, fake.nodes[0].id)
    waiting = [asyncio.create_task(s.stage(SQL, REPLICA)) for s in stagers for _ in range(3)]
    alloc = await _running(fake, job)
    await asyncio.to_thread(fake.complete_alloc, alloc)
    async with asyncio.timeout(30):
        await asyncio.gather(*waiting)
    assert sum(s.fetches for s in stagers) == 1
    assert len(fake.allocations(job, include_terminal=True)) == 1
    assert all(s.warm(SQL, REPLICA) for s in stagers)


async def test_a_failed_fetch_says_why_and_is_not_tried_again_at_once(
        fake: FakeNomad, stagers: list[AdapterStager]) -> None:
    """The reason is the one the fetch left in its progress file; a second ask within
    the retry interval is answered from memory, with no new attempt; ``again`` after a
    success registers a new version."""
    stager = stagers[0]
    job = adapterjob.job_id(SQL.name, fake.nodes[0].id)
    first = asyncio.create_task(stager.stage(SQL, REPLICA))
    alloc = await _running(fake, job)
    fake.write_alloc_file(alloc, "alloc/llmgw-fetch.json",
                          b'{"url": "x", "done": 0, "total": null, "rate": 0, "started": 0,'
                          b' "updated": 0, "error": "adapter_model.safetensors: HTTP 404"}')
    await asyncio.to_thread(fake.fail_alloc, alloc, "Exit Code: 1")
    with pytest.raises(AdapterFetchError, match="failed: adapter_model.safetensors: HTTP 404"):
        await first
    with pytest.raises(AdapterFetchError, match="HTTP 404"):
        await stager.stage(SQL, REPLICA)
    assert stager.fetches == 1
    # Another process has no such memory: it tries, and this time the fetch succeeds.
    other = stagers[1]
    second = asyncio.create_task(other.stage(SQL, REPLICA))
    async with asyncio.timeout(30):
        while len(fake.allocations(job, include_terminal=True)) < 2:
            await asyncio.sleep(0.05)
    [retry] = [a.id for a in fake.allocations(job, include_terminal=True) if a.id != alloc]
    await _running(fake, job)
    await asyncio.to_thread(fake.complete_alloc, retry)
    await second
    assert other.warm(SQL, REPLICA)
    again = asyncio.create_task(other.stage(SQL, REPLICA, again=True))
    async with asyncio.timeout(30):
        while len(fake.allocations(job, include_terminal=True)) < 3:
            await asyncio.sleep(0.05)
    assert (await asyncio.to_thread(fake.job, job) or {})["Version"] == 2
    again.cancel()
    await other.close()


async def test_a_fetch_nomad_cannot_place_fails_at_once_with_nomads_reason(
        fake: FakeNomad, stagers: list[AdapterStager]) -> None:
    """The replica's node takes no new work (ineligible): the fetch's evaluation places
    nothing, and the caller hears Nomad's account at once, not at the gateway's bound."""
    fake.set_node(fake.nodes[0].name, eligible=False)
    async with asyncio.timeout(30):
        with pytest.raises(AdapterFetchError, match="Nomad cannot place the fetch on the node"):
            await stagers[0].stage(SQL, REPLICA)
