"""NomadBackend against the fake Nomad: jobs, placement, replicas, discovery, reconciler."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from llmgw.catalog.build import build_catalog
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import GpuClass
from llmgw.catalog.units import Size
from llmgw.errors import BackendPermissionError, BackendUnavailableError, PlacementError
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.scheduler.nomad.render import render_job
from llmgw.store import open_store
from llmgw.testing.fake_nomad import FakeNomad, node_8x_h100_80g, node_cpu_64c

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
    # Which profile each replica runs comes from its service's tags (the ledger's GPU class).
    assert [backend.profile_of(u) for u in backend.endpoints("embed")] == ["cpu", "cpu"]
    assert backend.profile_of("http://10.9.9.9:1") is None
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
    await eventually(lambda: not fake.allocations("llmgw-hog"), what="the hog to be stopped")
    fake.advance(31)                      # its drain (shutdown_delay) ends: the GPUs free
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
    """A 403 (a permission error naming what the call needs) or garbage from Nomad while
    checking placement is an error naming Nomad."""
    m = cpu_model("embed")
    fake.inject("POST", r"/v1/validate/job", 403, "Permission denied")
    with pytest.raises(BackendPermissionError, match="NOMAD_TOKEN.*read-job in namespace"):
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


async def test_a_failed_deployment_never_leaves_a_model_short_silently(fake, backend):
    """Past its progress deadline with one of two placed, the next pass says so and
    re-submits the job; when GPUs free up, the missing replica is placed beside the first."""
    m = gpu_model("big", gpus=8, fabric="ib-b", min_=2)     # ib-b has one 8-GPU node
    await applied(backend, catalog(m))
    fake.settle()
    [first] = fake.allocations("llmgw-big")
    fake.set_check(first.id, "success")
    version = fake.job("llmgw-big")["Version"]
    deadline = fake.job("llmgw-big")["TaskGroups"][0]["Update"]["ProgressDeadline"] / 1e9
    fake.advance(deadline + 1)
    assert fake.deployment("llmgw-big").status == "failed"
    await applied(backend, catalog(m))                      # one pass
    status = backend.status("big")
    assert "Failed due to progress deadline" in (status.deployment_failed or "")
    assert (status.shortfall or "").startswith(
        "runs 1 of 2 replicas: Nomad's deployment of job version")
    fake.settle()
    assert fake.job("llmgw-big")["Version"] == version + 1  # re-submitted, same spec
    assert fake.deployment("llmgw-big").status == "running"
    fake.add_node(node_8x_h100_80g("gpu-h100-04", "ib-b"))
    fake.settle()
    allocs = fake.allocations("llmgw-big")
    assert len(allocs) == 2
    assert first.id in {a.id for a in allocs}              # the serving one was kept


async def test_the_crash_loop_report_reads_only_the_current_version():
    """Failures of an earlier version do not make a fresh rollout look like a crash loop."""
    with FakeNomad(auto_run=False) as fake:
        backend = make_backend(fake)
        await backend.start()
        try:
            old = cpu_model("embed", context=8192)
            await applied(backend, catalog(old))
            fake.settle()
            [a1] = fake.allocations("llmgw-embed")
            fake.run_alloc(a1.id)
            fake.set_check(a1.id, "success")
            fake.fail_alloc(a1.id, "Exit Code: 139")
            fake.settle()
            new = cpu_model("embed", context=4096)
            await applied(backend, catalog(new))
            await backend.rollout("embed")
            fake.settle()
            await applied(backend, catalog(new))
            assert backend.status("embed").crash_loop is False   # v1 is only loading
            [fresh] = fake.allocations("llmgw-embed")
            fake.run_alloc(fresh.id)
            fake.fail_alloc(fresh.id, "Exit Code: 1")
            fake.settle()
            await applied(backend, catalog(new))
            status = backend.status("embed")
            assert status.crash_loop is True
            assert "crash loop: 1 replica of job version" in (status.shortfall or "")
        finally:
            await backend.close()


async def test_rollout_after_a_failed_rollout_tries_again(fake, backend):
    """Registering an unchanged spec is a no-op for Nomad; rollout then makes a new version."""
    m = cpu_model("embed", min_=2)
    await applied(backend, catalog(m))
    fake.settle()
    fake.set_job_checks("llmgw-embed", "success")
    edited = cpu_model("embed", min_=2, context=4096)
    await applied(backend, catalog(edited))
    await backend.rollout("embed")
    fake.settle()
    deadline = fake.job("llmgw-embed")["TaskGroups"][0]["Update"]["ProgressDeadline"] / 1e9
    fake.advance(deadline + 1)                     # the new replica never turned healthy
    assert fake.deployment("llmgw-embed").status == "failed"
    await applied(backend, catalog(edited))
    assert "`llmgw ctl rollout embed` tries again" in (
        backend.status("embed").deployment_failed or "")
    version = fake.job("llmgw-embed")["Version"]
    await backend.rollout("embed")
    fake.settle()
    assert fake.job("llmgw-embed")["Version"] == version + 1
    assert fake.deployment("llmgw-embed").status == "running"


async def test_a_replica_still_downloading_is_not_restarted_by_its_health_check():
    """check_restart's grace starts when the engine starts, so a long fetch runs to its end;
    once the engine runs, a check that never passes restarts the engine, not the fetch."""
    with FakeNomad(auto_run=False) as fake:
        backend = make_backend(fake)
        await backend.start()
        try:
            await applied(backend, catalog(cpu_model("embed")))
            fake.settle()
            [alloc] = fake.allocations("llmgw-embed")
            fake.run_alloc(alloc.id, through_prestart=False)       # fetching the weights
            group = fake.job("llmgw-embed")["TaskGroups"][0]
            fake.advance(group["Update"]["HealthyDeadline"] / 1e9 + 60)
            states = fake.allocations("llmgw-embed")[0].task_states
            assert (states["fetch"].restarts, states["fetch"].state) == (0, "running")
            assert fake.services("llmgw-embed") == []               # not registered yet
            fake.finish_prestart(alloc.id)
            assert len(fake.services("llmgw-embed")) == 1
            engine = next(t for t in group["Tasks"] if t["Name"] == "engine")
            grace = engine["Services"][0]["Checks"][0]["CheckRestart"]["Grace"] / 1e9
            fake.advance(grace + 2 * 10 + 1)
            states = fake.allocations("llmgw-embed")[0].task_states
            assert (states["fetch"].restarts, states["engine"].restarts) == (0, 1)
        finally:
            await backend.close()


async def _two_healthy(fake, backend) -> tuple[str, str]:
    """Model a on fabric ib-a and model b on ib-b, both serving: different nodes."""
    a, b = gpu_model("a", gpus=1, fabric="ib-a"), gpu_model("b", gpus=1, fabric="ib-b")
    await applied(backend, catalog(a, b))
    fake.settle()
    fake.set_job_checks("llmgw-a", "success")
    fake.set_job_checks("llmgw-b", "success")
    await eventually(lambda: backend.endpoints("a") and backend.endpoints("b"),
                     what="both models to serve")
    [on_a] = fake.allocations("llmgw-a")
    [on_b] = fake.allocations("llmgw-b")
    assert on_a.node_name != on_b.node_name
    return on_a.node_name, on_b.id


async def test_a_node_answering_500_loses_its_traffic_and_the_rest_keep_updating(fake, backend):
    """A 500 for one allocation's checks makes that one unknown; others still change."""
    node_a, alloc_b = await _two_healthy(fake, backend)
    fake.set_node_rpc(node_a, error="session open: session shutdown")
    await eventually(lambda: backend.endpoints("a") == [], what="a to leave the rotation")
    assert backend.endpoints("b")
    fake.set_check(alloc_b, "failure")
    await eventually(lambda: backend.endpoints("b") == [], what="b's failure to be seen")
    assert backend.health().ok                          # a node's trouble, not an outage
    fake.set_node_rpc(node_a)
    await eventually(lambda: backend.endpoints("a"), what="a back once its node answers")


async def test_a_slow_node_does_not_hold_up_the_other_allocations(fake, backend):
    """While one node's check read hangs, another allocation's change shows at once."""
    node_a, alloc_b = await _two_healthy(fake, backend)
    fake.set_node_rpc(node_a, delay=120)
    fake.set_check(alloc_b, "failure")
    await eventually(lambda: backend.endpoints("b") == [], timeout=4,
                     what="b's failure while a's node hangs")
    await eventually(lambda: backend.endpoints("a") == [], what="a unknown after the timeout")
    fake.set_node_rpc(node_a)


async def test_replicas_are_listed_when_one_node_does_not_answer(fake, backend):
    """The listing answers; the troubled replica says its health and memory are unknown."""
    node_a, _ = await _two_healthy(fake, backend)
    fake.set_node_rpc(node_a, error="session open: session shutdown")
    await eventually(lambda: backend.endpoints("a") == [], what="a to leave the rotation")
    replicas = {r.model: r for r in await backend.replicas()}
    assert set(replicas) == {"a", "b"}
    assert not replicas["a"].healthy
    assert "health unknown, no traffic" in replicas["a"].message
    assert "session shutdown" in replicas["a"].message
    assert replicas["b"].healthy


async def test_every_node_failing_at_once_is_the_agents_trouble_and_routing_stands(
        fake, backend):
    """No check readable on any of two nodes: an outage; the last healthy set keeps serving."""
    node_a, _ = await _two_healthy(fake, backend)
    node_b = next(a.node_name for a in fake.allocations("llmgw-b"))
    known = (backend.endpoints("a"), backend.endpoints("b"))
    for node in (node_a, node_b):
        fake.set_node_rpc(node, error="session open: i/o deadline reached")
    await eventually(lambda: not backend.health().ok, what="the outage to be reported")
    assert "any of 2 nodes" in backend.health().message
    assert (backend.endpoints("a"), backend.endpoints("b")) == known


async def test_a_cpu_model_is_not_placed_on_a_gpu_node(fake, backend):
    """Even when bin-packing favours a busy GPU node, a CPU model goes to the CPU node."""
    await applied(backend, catalog(gpu_model("qwen", gpus=2)))
    fake.settle()
    await applied(backend, catalog(gpu_model("qwen", gpus=2), cpu_model("embed")))
    fake.settle()
    [alloc] = fake.allocations("llmgw-embed")
    assert alloc.node_name == "cpu-01"


def _two_cpu_nodes() -> FakeNomad:
    return FakeNomad([node_cpu_64c("cpu-01"), node_cpu_64c("cpu-02")])


async def test_replicas_are_spread_where_bin_packing_would_stack_them():
    """Four replicas on two nodes, one of them busy: two each, not three on the busy one."""
    with _two_cpu_nodes() as fake:
        backend = make_backend(fake)
        await backend.start()
        try:
            hog = cpu_model("hog", cores=40, memory="280GiB")
            await applied(backend, catalog(hog))
            fake.settle()
            assert [a.node_name for a in fake.allocations("llmgw-hog")] == ["cpu-01"]
            await applied(backend, catalog(hog, cpu_model("embed", cores=4, memory="8GiB",
                                                         min_=4)))
            fake.settle()
            nodes = sorted(a.node_name for a in fake.allocations("llmgw-embed"))
            assert nodes == ["cpu-01", "cpu-01", "cpu-02", "cpu-02"]
        finally:
            await backend.close()


async def test_distinct_hosts_waits_for_a_node_of_its_own_and_says_so():
    """Three replicas that must not share a node, two nodes: the third waits, with why."""
    with _two_cpu_nodes() as fake:
        backend = make_backend(fake)
        await backend.start()
        try:
            m = cpu_model("embed", min_=3)
            m = msgspec.structs.replace(m, profiles=[msgspec.structs.replace(
                m.profiles[0], distinct_hosts=True)])
            await applied(backend, catalog(m))
            fake.settle()
            assert sorted(a.node_name for a in fake.allocations("llmgw-embed")) == [
                "cpu-01", "cpu-02"]
            await applied(backend, catalog(m))
            status = backend.status("embed")
            assert status.waiting_for_capacity == (
                "2 nodes that could run it already run a replica of embed, and its profile "
                "asks for distinct_hosts; add nodes or lower its replicas")
            assert "runs 2 of 3 replicas: waiting for capacity" in (status.shortfall or "")
        finally:
            await backend.close()


MARKETING_80G = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("80GiB")),
                 "l40s-48g": GPU_CLASSES["l40s-48g"]}


async def test_a_gpu_class_declaring_more_memory_than_cards_report_is_named_with_both_numbers(
        fake):
    """"80GiB" for an H100 that reports 81559 MiB: placement and the fleet say which
    constraint excludes the nodes, with both numbers and the value to write."""
    cfg = msgspec.structs.replace(config(fake), gpu_classes=MARKETING_80G)
    backend = make_backend(fake, cfg=cfg)
    await backend.start()
    try:
        m = gpu_model("qwen", gpus=2)
        with pytest.raises(PlacementError) as err:
            await backend.check_placement(m, build_catalog([m], MARKETING_80G))
        assert ("the device memory constraint (${device.attr.memory} >= 81920 MiB, from gpu "
                "class h100-80g) excludes every node with NVIDIA H100 80GB HBM3: their cards "
                "report 81559 MiB; set gpu_classes.h100-80g.memory to 81559MiB"
                ) in err.value.message
        fleet = await backend.fleet()
        [warning] = fleet.warnings
        assert warning.startswith("gpu class h100-80g declares 81920 MiB per card but "
                                  "gpu-h100-01, gpu-h100-02, gpu-h100-03 report 81559 MiB")
        node = next(n for n in fleet.nodes if n.name == "gpu-h100-01")
        assert "excludes it; set gpu_classes.h100-80g.memory to 81559MiB" in (node.warning or "")
        assert next(n for n in fleet.nodes if n.name == "gpu-l40s-01").warning is None
    finally:
        await backend.close()


async def test_holdings_are_each_allocations_cards_from_placement_until_its_client_freed_them(
        fake, backend):
    """Costs read what Nomad's scheduler counts as used: an allocation's devices and cores
    from CreateTime until its client reports it terminal (FinishedAt of its last task)."""
    await applied(backend, catalog(gpu_model("qwen", gpus=2), cpu_model("embed", cores=8)))
    fake.settle()
    [gpu] = fake.allocations("llmgw-qwen")
    [cpu] = fake.allocations("llmgw-embed")
    fake.advance(600)
    held = {h.id: h for h in await backend.holdings()}
    assert set(held) == {gpu.id, cpu.id}
    assert (held[gpu.id].model, held[gpu.id].gpu_class, held[gpu.id].gpus) == \
        ("qwen", "h100-80g", 2)
    assert held[gpu.id].start == gpu.create_time / 1e9
    assert held[gpu.id].end is None                  # running: held
    assert (held[cpu.id].model, held[cpu.id].gpus, held[cpu.id].cores) == ("embed", 0, 8)
    before = fake.now() / 1e9
    fake.fail_alloc(gpu.id)
    failed_at = fake.now() / 1e9
    fake.settle()
    held = {h.id: h for h in await backend.holdings()}
    end = held[gpu.id].end
    assert end is not None
    assert before - 1e-3 <= end <= failed_at + 1e-3
    # Its replacement is an allocation of its own, held from its own placement.
    [replacement] = [a for a in fake.allocations("llmgw-qwen") if a.id != gpu.id]
    assert held[replacement.id].start >= before
    assert held[replacement.id].end is None


async def test_a_version_whose_replicas_fail_is_not_submitted_again_and_says_why(fake, backend):
    """Replicas that crash until the deployment fails: no new version of the same spec
    (one progress deadline per cycle, forever); the model names the engine's last event
    and the way out."""
    m = cpu_model("embed")
    await applied(backend, catalog(m))
    fake.settle()
    [a] = fake.allocations("llmgw-embed")
    fake.fail_alloc(a.id, "Exit Code: 1, Exit Message: \"model file is corrupt\"")
    fake.settle()
    deadline = fake.job("llmgw-embed")["TaskGroups"][0]["Update"]["ProgressDeadline"] / 1e9
    fake.advance(deadline + 1)
    for replacement in fake.allocations("llmgw-embed"):
        fake.fail_alloc(replacement.id, "Exit Code: 1, Exit Message: \"model file is corrupt\"")
    fake.settle()
    assert fake.deployment("llmgw-embed").status == "failed"
    version = fake.job("llmgw-embed")["Version"]
    for _ in range(2):
        await applied(backend, catalog(m))
    fake.settle()
    assert fake.job("llmgw-embed")["Version"] == version      # not submitted again
    status = backend.status("embed")
    said = status.deployment_failed or ""
    assert "its replicas failed" in said
    assert "task engine: Exit Code: 1" in said
    assert "then run `llmgw ctl rollout embed`" in said
