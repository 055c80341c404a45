"""The reconciler's lease and loop, the offloader's limit and the replica cache, under stress."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.scheduler.nomad.backend import LEASE
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.scheduler.nomad.offload import Offloader
from llmgw.scheduler.nomad.render import render_job
from llmgw.store import open_store
from llmgw.store.base import Store
from llmgw.testing.fake_nomad import FakeNomad

from .conftest import applied, catalog, config, cpu_model, eventually, make_backend
from .shapes import GPU_CLASSES


class LeaseHook:
    """A real store whose ``try_lease`` runs ``hook(call_number)`` before each call."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0
        self.hook: Callable[[int], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def try_lease(self, name: str, holder: str, ttl: float) -> bool:
        self.calls += 1
        if self.hook is not None:
            await self.hook(self.calls)
        return await self.store.try_lease(name, holder, ttl)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/llmgw.db")
    await s.open()
    yield s
    await s.close()


def _registers(fake: FakeNomad) -> int:
    return sum((r.method, r.path) == ("POST", "/v1/jobs") for r in fake.requests)


async def test_a_lease_lost_mid_pass_stops_the_pass_before_it_registers(fake, store):
    """Renewal before each register finds another holder: nothing is registered until it leaves."""
    hooked = LeaseHook(store)

    async def steal(call: int) -> None:
        if call == 2:   # the renewal right before the register
            await store.release_lease(LEASE, "api-a")
            assert await store.try_lease(LEASE, "api-b", 60)

    hooked.hook = steal
    a = make_backend(fake, hooked, holder="api-a")
    await a.start()
    try:
        await applied(a, catalog(cpu_model("embed")))
        assert hooked.calls >= 2
        assert not a.leader
        assert _registers(fake) == 0
        assert fake.job("llmgw-embed") is None
        await applied(a, catalog(cpu_model("embed")))       # b still holds it
        assert _registers(fake) == 0
        await store.release_lease(LEASE, "api-b")
        await eventually(lambda: fake.job("llmgw-embed"), what="a to register once it leads")
        assert a.leader
    finally:
        await a.close()


async def test_a_store_error_of_any_kind_means_not_leader_this_pass(fake, store):
    """try_lease raising a non-llmgw error: no action, the loop survives and leads later."""
    hooked = LeaseHook(store)
    broken = True

    async def fail(call: int) -> None:
        if broken:
            raise RuntimeError("driver exploded")

    hooked.hook = fail
    a = make_backend(fake, hooked, holder="api-a")
    await a.start()
    try:
        await applied(a, catalog(cpu_model("embed")))
        assert not a.leader
        assert fake.job("llmgw-embed") is None
        broken = False
        await applied(a, catalog(cpu_model("embed")))
        assert a.leader
        assert fake.job("llmgw-embed") is not None
    finally:
        await a.close()


async def test_apply_returns_without_waiting_for_the_pass(fake, store):
    """apply() only records the catalog: it returns while the pass is stuck on the store."""
    hooked = LeaseHook(store)
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def hold(call: int) -> None:
        entered.set()
        await gate.wait()

    hooked.hook = hold
    a = make_backend(fake, hooked, holder="api-a")
    await a.start()
    try:
        async with asyncio.timeout(10):
            await a.apply(catalog(cpu_model("embed")))
        await asyncio.wait_for(entered.wait(), 30)       # the pass runs, in the loop
        assert fake.job("llmgw-embed") is None
        hooked.hook = None
        gate.set()
        await a.reconciled()
        await eventually(lambda: fake.job("llmgw-embed"), what="the pass to register")
    finally:
        gate.set()
        await a.close()


async def test_a_pass_is_cut_off_at_half_the_lease_and_the_next_one_finishes(fake, store):
    """A renewal that hangs past lease_ttl/2 ends the pass; the next pass registers the model."""
    hooked = LeaseHook(store)
    registers_when_cut: list[int] = []

    async def hang(call: int) -> None:
        validated = any(r.path == "/v1/validate/job" for r in fake.requests)
        if validated and not registers_when_cut:   # the renewal right before the register
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                registers_when_cut.append(_registers(fake))
                raise

    hooked.hook = hang
    a = make_backend(fake, hooked, holder="api-a", lease_ttl=4.0)
    await a.start()
    try:
        await applied(a, catalog(cpu_model("embed")))    # would hang without the bound
        assert registers_when_cut == [0]
        await eventually(lambda: fake.job("llmgw-embed"), what="the next pass to register")
        fake.settle()
        assert _registers(fake) == 1
    finally:
        await a.close()


async def test_nothing_is_deregistered_before_the_first_apply(fake):
    """A pass before any catalog was applied leaves llmgw's existing jobs alone."""
    nomad = config(fake).scheduler.nomad
    m = cpu_model("embed")
    NomadClient(nomad).register(render_job(m, m.profiles[0], nomad, GPU_CLASSES, 1))
    fake.settle()
    b = make_backend(fake)
    await b.start()
    try:
        await b._reconcile()
        await b.reconciled()
        assert fake.job("llmgw-embed")["Stop"] is False
        assert not [r for r in fake.requests if r.method == "DELETE"]
    finally:
        await b.close()


async def test_the_chosen_profile_is_reported(fake, backend):
    """rolled_out_profile names the profile the job runs, from registration and from Nomad."""
    m = cpu_model("embed")
    assert backend.rolled_out_profile("embed") is None
    await applied(backend, catalog(m))
    assert backend.rolled_out_profile("embed") == "cpu"
    await backend.rollout("embed")
    assert backend.rolled_out_profile("embed") == "cpu"


async def test_a_cancelled_call_keeps_its_slot_until_its_thread_ends():
    """Cancelling the caller does not free the offloader's slot while the thread still runs."""
    off = Offloader(limit=1)
    release, started = threading.Event(), threading.Event()

    def blocking() -> str:
        started.set()
        release.wait(30)
        return "first"

    first = asyncio.create_task(off.run(blocking))
    await eventually(started.is_set, what="the first thread to start")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert off.busy == 1
    second = asyncio.create_task(off.run(lambda: "second"))
    await asyncio.sleep(0)
    assert not second.done()
    assert off.busy == 1
    release.set()
    assert await asyncio.wait_for(second, 30) == "second"
    await eventually(lambda: off.busy == 0, what="every slot to be free")


async def test_reading_one_models_replicas_keeps_the_others_cached(fake, backend):
    """Replica details cached for one model survive a read of another (no re-fetch)."""
    await applied(backend, catalog(cpu_model("a"), cpu_model("b")))
    fake.settle()
    [a_alloc] = fake.allocations("llmgw-a")
    assert len(await backend.replicas("a")) == 1
    assert len(await backend.replicas("b")) == 1
    fake.clear_requests()
    await asyncio.gather(*(backend.replicas(m) for m in ("a", "b", "a", "b")))
    assert [r.id for r in await backend.replicas("a")] == [a_alloc.id]
    fetched = [r.path for r in fake.requests
               if r.method == "GET" and r.path.startswith("/v1/allocation/")
               and not r.path.endswith("/checks")]
    assert fetched == []


async def test_discovery_survives_an_unexpected_error(fake, backend, monkeypatch):
    """A non-llmgw exception in the check poller is logged; endpoints keep updating."""
    await applied(backend, catalog(cpu_model("embed")))
    fake.settle()
    disc = backend._discovery
    real = disc._client.alloc_checks
    raised = []

    def flaky(alloc_id: str, timeout: float | None = None) -> object:
        if not raised:
            raised.append(True)
            raise ValueError("an answer nothing expected")
        return real(alloc_id, timeout)

    monkeypatch.setattr(disc._client, "alloc_checks", flaky)
    await eventually(lambda: fake.services("llmgw-embed"), what="the registration")
    await eventually(lambda: raised, what="the poller to hit the error")
    fake.set_job_checks("llmgw-embed", "success")
    await eventually(lambda: backend.endpoints("embed"), what="an endpoint after the error")
    assert all(not t.done() for t in disc._tasks)


async def test_a_job_without_llmgw_meta_is_never_touched_by_a_pass(fake, backend):
    """Deregistration only ever concerns llmgw's own jobs, even for an empty catalog."""
    nomad = config(fake).scheduler.nomad
    m = cpu_model("manual")
    job = render_job(m, m.profiles[0], nomad, GPU_CLASSES, 1)
    NomadClient(nomad).register(msgspec.structs.replace(job, Meta={}))
    fake.settle()
    await applied(backend, catalog())
    assert fake.job("llmgw-manual")["Stop"] is False
