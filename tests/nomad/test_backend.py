"""NomadBackend against the fake Nomad: jobs, placement, replicas, discovery, reconciler."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.units import Size
from llmgw.errors import BackendUnavailableError, PlacementError
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.scheduler.nomad.render import render_job
from llmgw.store import open_store
from llmgw.testing.fake_nomad import FakeNomad

from .conftest import applied, catalog, config, cpu_model, eventually, gpu_model, make_backend
from .shapes import GPU_CLASSES

GIB = 1024**3


def _engine(job: dict) -> dict:
    return next(t for t in job["TaskGroups"][0]["Tasks"] if t["Name"] == "engine")


def _urls(fake: FakeNomad, job: str, alloc_ids: set[str]) -> list[str]:
    return sorted(f"http://{s.address}:{s.port}" for s in fake.services(job)
                  if s.alloc_id in alloc_ids)


async def test_a_model_becomes_a_job_whose_allocations_are_its_replicas(fake, backend):
    """apply() registers the job with its GPUs, cores and memory; allocations list as replicas."""
    m = gpu_model("qwen", gpus=2, min_=2)
    await applied(backend, catalog(m))
    fake.settle()
    engine = _engine(fake.job("llmgw-qwen"))
    assert engine["Resources"]["Devices"][0]["Count"] == 2
    assert engine["Resources"]["Cores"] == 16
    assert engine["Resources"]["MemoryMB"] == 128 * 1024
    allocs = fake.allocations("llmgw-qwen")
    assert len(allocs) == 2
    fake.set_alloc_memory(allocs[0].id, 100 * GIB)
    replicas = {r.id: r for r in await backend.replicas("qwen")}
    assert set(replicas) == {a.id for a in allocs}
    for r in replicas.values():
        assert r.model == "qwen"
        assert r.profile == "h100"
        assert r.node in {"gpu-h100-01", "gpu-h100-02"}        # fabric ib-a
        assert r.fingerprint == fingerprint(m, m.profiles[0])
        assert r.reserved_memory == 128 * GIB
        assert r.state == "starting"                           # running, checks pending
        assert not r.healthy
    assert replicas[allocs[0].id].measured_memory == 100 * GIB
    assert backend.status("qwen").desired == 2


async def test_a_registered_but_loading_replica_gets_no_traffic(fake, backend):
    """Endpoints are only replicas whose checks all pass; wait_changed wakes on changes."""
    m = cpu_model("embed", min_=2)
    await applied(backend, catalog(m))
    fake.settle()
    a0, a1 = (a.id for a in fake.allocations("llmgw-embed"))
    await eventually(lambda: len(fake.services("llmgw-embed")) == 2, what="registrations")

    async def registered() -> bool:
        return all(r.address for r in await backend.replicas("embed"))

    await eventually(registered, what="discovery to see both registrations")
    assert backend.endpoints("embed") == []          # registered, still loading
    fake.set_check(a0, "success")
    await eventually(lambda: backend.endpoints("embed") == _urls(fake, "llmgw-embed", {a0}))
    waiter = asyncio.create_task(backend.wait_changed(30))
    fake.set_check(a1, "success")
    await asyncio.wait_for(waiter, 30)
    await eventually(lambda: backend.endpoints("embed") == _urls(fake, "llmgw-embed", {a0, a1}))
    assert backend.status("embed").ready == 2
    fake.set_check(a0, "failure")
    await eventually(lambda: backend.endpoints("embed") == _urls(fake, "llmgw-embed", {a1}))


async def test_a_profile_no_node_could_ever_run_is_refused_with_the_reason(fake, backend):
    """More GPUs than a node has, or an unknown fabric: PlacementError, nothing registered."""
    huge = gpu_model("huge", gpus=16)
    with pytest.raises(PlacementError) as err:
        await backend.check_placement(huge, catalog(huge))
    assert "no node has 16 NVIDIA H100 80GB HBM3 on fabric ib-a" in err.value.message
    nowhere = gpu_model("nowhere", gpus=1, fabric="ib-c")
    with pytest.raises(PlacementError) as err:
        await backend.check_placement(nowhere, catalog(nowhere))
    assert "on fabric ib-c (nodes with it are on ib-a, ib-b)" in err.value.message
    assert fake.job("llmgw-huge") is None
    assert fake.job("llmgw-nowhere") is None


async def test_a_profile_that_fits_later_waits_for_capacity_with_the_reason(fake, backend):
    """Busy GPUs: accepted, registered, 'waiting for capacity' until the hog leaves."""
    hog = gpu_model("hog", gpus=8, fabric="ib-b")
    await applied(backend, catalog(hog))
    fake.settle()
    want = gpu_model("want", gpus=4, fabric="ib-b")
    await backend.check_placement(want, catalog(hog, want))       # not refused
    await applied(backend, catalog(hog, want))
    fake.settle()
    assert fake.allocations("llmgw-want") == []
    reason = backend.status("want").waiting_for_capacity
    assert reason == "no node with 4 free NVIDIA H100 80GB HBM3 on fabric ib-b; " \
                     "best: gpu-h100-03 has 0"
    await applied(backend, catalog(hog, want))                        # a later pass keeps it
    assert backend.status("want").waiting_for_capacity == reason
    await applied(backend, catalog(want))                             # the hog leaves
    fake.settle()
    await eventually(lambda: fake.allocations("llmgw-want"), what="the waiting job to place")
    await applied(backend, catalog(want))
    assert backend.status("want").waiting_for_capacity is None
    assert backend.status("want").last_placement_failure.startswith(
        "no node with 4 free NVIDIA H100 80GB HBM3 on fabric ib-b")


async def test_the_first_profile_that_fits_now_is_chosen(fake, backend):
    """Profiles are tried in order; one that cannot place now yields to one that can."""
    hog = gpu_model("hog", gpus=8, fabric="ib-b")
    await applied(backend, catalog(hog))
    fake.settle()
    from llmgw.catalog.model import Profile

    m = gpu_model("two", profiles=[
        Profile(name="ib-b", gpu_class="h100-80g", gpus=2, fabric="ib-b", cpu_cores=8,
                memory=Size.parse("64GiB")),
        Profile(name="l40s", gpu_class="l40s-48g", gpus=1, cpu_cores=8, memory=Size.parse("64GiB")),
    ])
    await applied(backend, catalog(hog, m))
    fake.settle()
    assert fake.job("llmgw-two")["Meta"]["llmgw_profile"] == "l40s"
    assert [a.node_name for a in fake.allocations("llmgw-two")] == ["gpu-l40s-01"]


async def test_scaling_during_a_deployment_re_registers_without_replacing_replicas(fake, backend):
    """/scale refused mid-deployment: the same spec is re-registered with the new count."""
    await applied(backend, catalog(cpu_model("embed", min_=1)))
    fake.settle()
    [first] = fake.allocations("llmgw-embed")
    assert fake.deployment("llmgw-embed").status == "running"      # checks still pending
    fake.clear_requests()
    await applied(backend, catalog(cpu_model("embed", min_=3)))
    fake.settle()
    ids = {a.id for a in fake.allocations("llmgw-embed")}
    assert len(ids) == 3
    assert first.id in ids
    calls = [(r.method, r.path) for r in fake.requests]
    assert ("POST", "/v1/job/llmgw-embed/scale") in calls
    assert calls.index(("POST", "/v1/jobs")) > calls.index(("POST", "/v1/job/llmgw-embed/scale"))
    assert backend.status("embed").desired == 3


async def test_scaling_after_the_deployment_uses_the_scale_endpoint(fake, backend):
    """With no deployment running, /scale changes the count and nothing is re-registered."""
    await applied(backend, catalog(cpu_model("embed", min_=1)))
    fake.settle()
    fake.set_job_checks("llmgw-embed", "success")
    await eventually(lambda: fake.deployment("llmgw-embed").status == "successful")
    version = fake.job("llmgw-embed")["Version"]
    fake.clear_requests()
    await applied(backend, catalog(cpu_model("embed", min_=2)))
    fake.settle()
    assert len(fake.allocations("llmgw-embed")) == 2
    assert ("POST", "/v1/jobs") not in [(r.method, r.path) for r in fake.requests]
    assert fake.job("llmgw-embed")["Version"] >= version


async def test_a_profile_edit_leaves_replicas_running_until_rollout(fake, backend):
    """An edited profile is not re-registered (stale); rollout registers the new version."""
    old = cpu_model("embed", context=8192)
    await applied(backend, catalog(old))
    fake.settle()
    version = fake.job("llmgw-embed")["Version"]
    [alloc] = fake.allocations("llmgw-embed")
    new = cpu_model("embed", context=4096)
    await applied(backend, catalog(new))
    fake.settle()
    assert fake.job("llmgw-embed")["Version"] == version
    assert [a.id for a in fake.allocations("llmgw-embed")] == [alloc.id]
    assert "llmgw ctl rollout embed" in (backend.stale("embed") or "")
    [r] = await backend.replicas("embed")
    assert r.fingerprint == fingerprint(old, old.profiles[0])
    assert r.fingerprint != fingerprint(new, new.profiles[0])

    await backend.rollout("embed")
    fake.settle()
    job = fake.job("llmgw-embed")
    assert job["Version"] == version + 1
    assert job["Meta"]["llmgw_fingerprint"] == fingerprint(new, new.profiles[0])
    await eventually(lambda: any(a.job_version == version + 1
                                 for a in fake.allocations("llmgw-embed")))
    await applied(backend, catalog(new))
    assert backend.stale("embed") is None


async def test_removed_models_are_deregistered_and_foreign_jobs_left_alone(fake, backend):
    """Only jobs with llmgw's meta are deregistered when their model leaves the catalog."""
    await applied(backend, catalog(cpu_model("embed")))
    manual = cpu_model("manual")
    job = render_job(manual, manual.profiles[0], config(fake).scheduler.nomad, GPU_CLASSES, 1)
    NomadClient(config(fake).scheduler.nomad).register(msgspec.structs.replace(job, Meta={}))
    fake.settle()
    await applied(backend, catalog())
    fake.settle()
    assert fake.job("llmgw-embed")["Stop"] is True
    assert fake.job("llmgw-manual")["Stop"] is False


async def test_an_on_demand_model_is_scaled_by_demand_and_kept_there(fake, backend):
    """Min 0: registered at 0; set_demand scales it (up to max); the reconciler keeps it."""
    m = cpu_model("burst", min_=0, max_=2)
    await applied(backend, catalog(m))
    fake.settle()
    assert fake.job("llmgw-burst")["TaskGroups"][0]["Count"] == 0
    await backend.set_demand("burst", 1)
    fake.settle()
    assert len(fake.allocations("llmgw-burst")) == 1
    await applied(backend, catalog(m))
    fake.settle()
    assert len(fake.allocations("llmgw-burst")) == 1
    await backend.set_demand("burst", 5)
    fake.settle()
    assert len(fake.allocations("llmgw-burst")) == 2
    await backend.set_demand("burst", 0)
    fake.settle()
    assert fake.allocations("llmgw-burst") == []


async def test_the_scaler_moves_a_model_within_min_and_max_and_the_reconciler_keeps_it(
        fake, backend):
    """Min 1, max 3: set_demand scales within the range (clamped), and a pass keeps it."""
    m = cpu_model("chat", min_=1, max_=3)
    await applied(backend, catalog(m))
    fake.settle()
    assert len(fake.allocations("llmgw-chat")) == 1
    await backend.set_demand("chat", 3)
    fake.settle()
    assert len(fake.allocations("llmgw-chat")) == 3
    await applied(backend, catalog(m))
    fake.settle()
    assert len(fake.allocations("llmgw-chat")) == 3
    assert backend.status("chat").desired == 3
    await backend.set_demand("chat", 0)
    fake.settle()
    assert fake.job("llmgw-chat")["TaskGroups"][0]["Count"] == 1


async def test_the_fleet_groups_the_fake_nodes_and_counts_what_is_placed(fake, backend):
    """Pools by class and fabric; a placed 2-GPU replica takes 2 from its node."""
    before = {p.name: p for p in (await backend.fleet()).pools}
    assert sorted(before) == ["cpu", "h100-80g@ib-a", "h100-80g@ib-b", "l40s-48g"]
    assert before["h100-80g@ib-a"].gpus_free == 16
    await applied(backend, catalog(gpu_model("qwen", gpus=2)))
    fake.settle()
    after = await backend.fleet()
    pools = {p.name: p for p in after.pools}
    assert pools["h100-80g@ib-a"].gpus_free == 14
    [alloc] = fake.allocations("llmgw-qwen")
    node = next(n for n in after.nodes if n.name == alloc.node_name)
    assert node.gpus_free == 6
    assert node.cores_free == node.cores_total - 16


async def test_nomad_down_backs_off_reports_the_outage_and_keeps_endpoints(fake, backend):
    """Unreachable Nomad → health says so with since, retries back off, endpoints stay."""
    m = cpu_model("embed")
    await applied(backend, catalog(m))
    fake.settle()
    fake.set_job_checks("llmgw-embed", "success")
    await eventually(lambda: backend.endpoints("embed"), what="a healthy endpoint")
    known = backend.endpoints("embed")
    fake.stop()
    await applied(backend, catalog(m))
    health = backend.health()
    assert not health.ok
    assert health.since is not None
    assert f"cannot reach Nomad at {fake.address}" in health.message
    assert "retrying in 1s" in health.message
    await eventually(lambda: "retrying in 2s" in backend.health().message, what="back-off")
    assert backend.endpoints("embed") == known
    fake.start()
    await eventually(lambda: backend.health().ok, what="recovery")
    assert backend.endpoints("embed") == known


async def test_nomad_errors_at_add_time_say_what_happened(fake, backend):
    """A 403 or garbage from Nomad while checking placement is an error naming Nomad."""
    m = cpu_model("embed")
    fake.inject("POST", r"/v1/validate/job", 403, "Permission denied")
    with pytest.raises(BackendUnavailableError, match="NOMAD_TOKEN"):
        await backend.check_placement(m, catalog(m))
    fake.clear_injections()
    fake.inject("POST", r"/v1/job/.*/plan", 200, "<html>proxy</html>")
    with pytest.raises(BackendUnavailableError, match="not Nomad's JSON"):
        await backend.check_placement(m, catalog(m))


async def test_only_the_lease_holder_reconciles(fake, tmp_path: Path):
    """Two backends on one SQLite store: one registers; when it stops, the other takes over."""
    store = open_store(f"sqlite:///{tmp_path}/llmgw.db")
    await store.open()
    a = make_backend(fake, store, holder="api-a", lease_ttl=3.0)
    b = make_backend(fake, store, holder="api-b", lease_ttl=3.0)
    await a.start()
    await b.start()
    try:
        cat = catalog(cpu_model("embed"))
        await applied(a, cat)
        await applied(b, cat)
        assert a.leader
        assert not b.leader
        fake.settle()
        registers = [r for r in fake.requests if (r.method, r.path) == ("POST", "/v1/jobs")]
        assert len(registers) == 1
        assert b.status("embed").desired == 1          # the follower still reads Nomad
        await a.close()                                  # releases the lease
        await applied(b, catalog())
        assert b.leader
        fake.settle()
        assert fake.job("llmgw-embed")["Stop"] is True
    finally:
        await a.close()
        await b.close()
        await store.close()
