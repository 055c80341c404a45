"""Warm nodes: the affinity in rendered jobs, the node metadata llmgw keeps, prefetch and
sweep jobs, and a starting replica's phase.

Nomad's behaviour is the fake's (llmgw.testing.fake_nomad.clientapi, scheduler): dynamic
metadata from nomad/client_meta_endpoint.go ``NodeMeta.Apply``, affinity scoring from
scheduler/feasible/rank.go ``NodeAffinityIterator.Next``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from llmgw.catalog.build import Runtime, build_catalog
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.config import NomadConfig
from llmgw.errors import DefinitionError, RefusedError
from llmgw.scheduler.nomad import credentials, render, warmth, wire
from llmgw.scheduler.nomad.caches import CacheKeeper
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.scheduler.nomad.fleet import build_fleet
from llmgw.testing.fake_nomad import FakeNomad, default_fleet, node_id
from llmgw.weights import cache

from .conftest import MIRROR, applied, catalog, config, cpu_model, eventually, gpu_model
from .shapes import GPU_CLASSES

CFG = NomadConfig(namespace="default", datacenters=["dc1"])


def _entry(m: Model) -> str:
    entry = render.weights_entry(m, MIRROR)
    assert entry is not None
    return entry


# ---- rendering (pure) ---------------------------------------------------------------

def test_a_rendered_job_prefers_nodes_holding_its_weights() -> None:
    """The group's affinity targets ${meta.llmgw_cache_<model>} = the tag of the fetch's
    cache entry, and the job's meta records the same tag."""
    m = cpu_model("embed")
    job = render.render_job(m, m.profiles[0], CFG, GPU_CLASSES, 1, MIRROR)
    [aff] = job.TaskGroups[0].Affinities
    tag = cache.tag(_entry(m))
    assert (aff.LTarget, aff.Operand, aff.RTarget, aff.Weight) == (
        "${meta.llmgw_cache_embed}", "=", tag, 100)
    assert job.Meta[render.META_WEIGHTS] == tag


def test_a_model_vllm_downloads_itself_has_no_affinity() -> None:
    """With no mirror there is no fetch task, no cache entry and nothing to prefer."""
    m = Model(name="qwen", engine="vllm", source=Source.parse("hf://Qwen/Qwen2.5-7B"),
              profiles=[Profile(name="h100", gpu_class="h100-80g", gpus=1)])
    job = render.render_job(m, m.profiles[0], CFG, GPU_CLASSES, 1, None)
    assert job.TaskGroups[0].Affinities == []
    assert render.META_WEIGHTS not in job.Meta
    assert "no mirrorable source" in (warmth.prefetch_refusal(m, None) or "")


def test_a_prefetch_job_is_a_batch_fetch_pinned_to_the_chosen_nodes() -> None:
    """One fetch a node: the node IDs in a set_contains_any constraint, distinct_hosts, the
    cache volume mounted writable, and llmgw's fetch of the model's URL into its entry."""
    m = gpu_model("qwen")
    job = warmth.prefetch_job(m, CFG, MIRROR, ["n1", "n2"], run="r1")
    assert (job.ID, job.Type) == ("llmgw_prefetch_qwen", "batch")
    assert render.META_MANAGED not in job.Meta
    [group] = job.TaskGroups
    assert group.Count == 2
    pinned, distinct = group.Constraints
    assert (pinned.LTarget, pinned.Operand, pinned.RTarget) == (
        "${node.unique.id}", "set_contains_any", "n1,n2")
    assert distinct.Operand == "distinct_hosts"
    [task] = group.Tasks
    assert task.Lifecycle is None
    assert task.Config["args"][:3] == ["fetch", f"{MIRROR}/qwen/v1/", _entry(m)]


def test_the_sweep_job_keeps_entries_and_bounds_the_cache() -> None:
    """The sweep runs `llmgw cache sweep` with the bound, a --keep for each entry in use
    and the time after which a use spares an entry."""
    cfg = msgspec.structs.replace(CFG, cache_max=msgspec.convert(2**40, int))
    job = warmth.sweep_job(cfg, ["n1"], ["/llmgw-cache/a/", "/llmgw-cache/b"], since=1000.0,
                           run="1")
    args = job.TaskGroups[0].Tasks[0].Config["args"]
    assert args[:3] == ["cache", "sweep", render.CACHE_DIR]
    assert args[args.index("--max-bytes") + 1] == str(2**40)
    assert args[args.index("--since") + 1] == "1000"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--keep"] == [
        "/llmgw-cache/a/", "/llmgw-cache/b"]


# ---- metadata decisions (pure) ----------------------------------------------------------

def test_a_finished_fetch_sets_keys_and_a_sweep_report_also_clears_them() -> None:
    """A fetch proves what is there (sets only); a report is all there is (clears the
    llmgw_cache_* keys of what it lacks, and never another key)."""
    a, b = cpu_model("a"), cpu_model("b")
    wanted = warmth.keys_for([cache.tag(_entry(a))], [a, b], MIRROR)
    assert wanted == {"llmgw_cache_a": cache.tag(_entry(a))}
    meta = {"llmgw_cache_b": "stale", "rack": "r1"}
    assert warmth.changes(meta, wanted, complete=False) == wanted
    assert warmth.changes(meta, wanted, complete=True) == {**wanted, "llmgw_cache_b": None}
    assert warmth.changes({**meta, **wanted}, wanted, complete=False) == {}


def test_two_models_of_one_source_are_both_warm() -> None:
    """Models sharing a cache entry both get their key from one fetch."""
    a = cpu_model("a")
    twin = msgspec.structs.replace(cpu_model("twin"), source=a.source)
    wanted = warmth.keys_for([cache.tag(_entry(a))], [a, twin], MIRROR)
    assert set(wanted) == {"llmgw_cache_a", "llmgw_cache_twin"}


def test_prefetch_chooses_cold_nodes_that_could_run_the_model_with_room_first() -> None:
    """H100 nodes on the profile's fabric, not already warm, one with free GPUs before a
    full one; CPU and other-class nodes never."""
    m = gpu_model("qwen", gpus=8)
    need = render.need_of(m, m.profiles[0], CFG, GPU_CLASSES)
    views = build_fleet(_full(default_fleet()), [], GPU_CLASSES, CFG.fabric_meta_key).nodes
    chosen = warmth.choose_nodes(need, views, warm={node_id("gpu-h100-01")}, count=5)
    assert [v.name for v in chosen] == ["gpu-h100-02"]


def _full(fake_nodes: list[Any]) -> list[wire.Node]:
    """The fixture nodes as /v1/node/:id answers them."""
    with FakeNomad(fake_nodes) as fake:
        client = NomadClient(NomadConfig(address=fake.address))
        try:
            return client.nodes()
        finally:
            client.close()


def _alloc(**states: dict[str, Any]) -> wire.Allocation:
    return msgspec.convert({"ID": "a1", "ClientStatus": "running", "DesiredStatus": "run",
                            "TaskStates": states}, wire.Allocation)


def test_a_starting_replica_says_which_phase_it_is_in() -> None:
    """Pulling an image, fetching weights with the percentage, loading, healthy."""
    pulling = {"State": "pending", "Events": [{"Type": "Received"}, {
        "Type": "Driver", "DisplayMessage": "Downloading image"}]}
    assert warmth.phase(_alloc(fetch=pulling, engine={"State": "pending"}), False).text == \
        "pulling image"
    fetching = _alloc(fetch={"State": "running"}, engine={"State": "pending"})
    assert warmth.phase(fetching, False, 42.4).text == "fetching weights 42%"
    assert warmth.phase(fetching, False).text == "fetching weights"
    loading = _alloc(fetch={"State": "dead", "Events": [{"Type": "Terminated"}]},
                     engine={"State": "running"})
    assert warmth.phase(loading, False).text == "loading"
    assert warmth.phase(loading, True).text == "healthy"


def test_scaling_prefetch_is_checked_where_the_catalog_is_built() -> None:
    """A negative prefetch, or one for weights no node can fetch, names scaling.prefetch."""
    m = cpu_model("embed")
    bad = msgspec.structs.replace(m, scaling=Scaling(prefetch=-1))
    with pytest.raises(DefinitionError, match=r"scaling\.prefetch: -1 is negative"):
        build_catalog([bad], GPU_CLASSES)
    hub = Model(name="qwen", engine="vllm", source=Source.parse("hf://Qwen/Qwen2.5-7B"),
                profiles=[Profile(name="h100", gpu_class="h100-80g", gpus=1)],
                scaling=Scaling(prefetch=1))
    with pytest.raises(DefinitionError, match="no mirror is configured"):
        build_catalog([hub], GPU_CLASSES, Runtime(scheduler="nomad"))


# ---- against the fake Nomad ------------------------------------------------------------

def _keeper(fake: FakeNomad, models: list[Model], clock: list[float] | None = None,
            **nomad: Any) -> tuple[CacheKeeper, NomadClient]:
    cfg = config(fake, models, **nomad)
    client = NomadClient(cfg.scheduler.nomad)
    now = clock or [1000.0]
    keeper = CacheKeeper(client, cfg.scheduler.nomad, GPU_CLASSES, MIRROR,
                         credentials.Keeper(client, cfg.scheduler.nomad, MIRROR),
                         clock=lambda: now[0])
    return keeper, client


async def test_a_finished_fetch_marks_its_node_warm_and_the_next_replica_goes_there(
        fake: FakeNomad) -> None:
    """After a replica's fetch ends, its node carries llmgw_cache_<model>; a new replica of
    the model, with that node free again, lands there rather than on an emptier one."""
    from .conftest import make_backend

    m = cpu_model("embed", cores=4)
    backend = make_backend(fake, cfg=config(fake, [m]))
    await backend.start()
    try:
        await applied(backend, catalog(m))
        fake.settle()
        [a] = fake.allocations("llmgw-embed")
        tag = cache.tag(_entry(m))
        await eventually(lambda: fake.node_meta(a.node_name).get("llmgw_cache_embed") == tag,
                         what="the node's metadata names the weights")
        fake.advance(10)
        fleet = await backend.fleet()
        assert [v.name for v in fleet.nodes if "embed" in v.warm] == [a.node_name]
    finally:
        await backend.close()


def test_prefetch_fetches_onto_chosen_nodes_and_reports_progress() -> None:
    """A prefetch of two nodes is a batch job there; a running fetch shows its percentage
    from the progress file, a completed one is done and makes its node warm."""
    m = gpu_model("qwen", gpus=8)
    with FakeNomad(default_fleet()) as fake:
        keeper, client = _keeper(fake, [m])
        try:
            started = keeper.prefetch(m, None, 2, views=None)
            assert sorted(p.node for p in started.nodes) == ["gpu-h100-01", "gpu-h100-02"]
            fake.settle()
            allocs = fake.allocations("llmgw_prefetch_qwen")
            assert sorted(a.node_name for a in allocs) == ["gpu-h100-01", "gpu-h100-02"]
            first, second = allocs
            fake.write_alloc_file(first.id, render.PROGRESS_FILE, msgspec.json.encode(
                cache.Progress(url="u", done=30, total=120, rate=1.0, started=0, updated=1)))
            fake.complete_alloc(second.id)
            views = build_fleet(client.nodes(), client.all_allocations(), GPU_CLASSES,
                                "llmgw_fabric").nodes
            status = {p.node: p for p in keeper.status(m, views).nodes}
            assert (status[first.node_name].state, status[first.node_name].percent) == (
                "fetching", 25.0)
            assert status[second.node_name].state == "done"
            keeper.observe(catalog(m))
            fake.advance(10)                  # the client's batched update reaches Nomad
            assert fake.node(second.node_name).meta["llmgw_cache_qwen"] == cache.tag(_entry(m))
            assert "llmgw_cache_qwen" not in fake.node(first.node_name).meta
        finally:
            client.close()


def test_a_prefetch_of_weights_no_node_can_fetch_is_refused_with_the_reason() -> None:
    """A Hub model vLLM downloads itself has nothing to prefetch; the refusal says why."""
    m = Model(name="qwen", engine="vllm", source=Source.parse("hf://Qwen/Qwen2.5-7B"),
              profiles=[Profile(name="h100", gpu_class="h100-80g", gpus=1)])
    with FakeNomad(default_fleet()) as fake:
        cfg = config(fake, [m])
        client = NomadClient(cfg.scheduler.nomad)
        keeper = CacheKeeper(client, cfg.scheduler.nomad, GPU_CLASSES, None,
                             credentials.Keeper(client, cfg.scheduler.nomad, None))
        try:
            with pytest.raises(RefusedError, match="no mirrorable source"):
                keeper.prefetch(m, None, 1, views=None)
        finally:
            client.close()


def test_a_stale_key_is_cleared_by_the_sweep_report(fake: FakeNomad) -> None:
    """A node whose metadata claims weights its disk lacks (edited by hand) is corrected:
    the next sweep's report holds no such entry, and the key goes."""
    m = cpu_model("embed")
    now = [1000.0]
    keeper, client = _keeper(fake, [m], clock=now)
    try:
        fake.apply_node_meta("cpu-01", {"llmgw_cache_embed": cache.tag(_entry(m))})
        fake.advance(10)                      # the hand edit reaches the servers
        now[0] += 3600
        keeper.observe(catalog(m))
        fake.settle()
        [sweep] = [a for a in fake.allocations("llmgw.cache-sweep") if a.node_name == "cpu-01"]
        fake.write_alloc_file(sweep.id, warmth.REPORT_FILE, msgspec.json.encode(
            cache.Report(root=render.CACHE_DIR, entries=[])))
        fake.complete_alloc(sweep.id)
        keeper.observe(catalog(m))
        fake.advance(10)
        assert "llmgw_cache_embed" not in fake.node("cpu-01").meta
        assert "llmgw_cache_embed" not in fake.node_meta("cpu-01")
    finally:
        client.close()


def test_the_sweep_keeps_what_running_replicas_use_and_evictions_clear_keys(
        fake: FakeNomad) -> None:
    """The sweep job is told to keep the entry of a running replica; an entry its report
    says was evicted loses its node's key."""
    serving, gone = cpu_model("serving", cores=4), cpu_model("gone", cores=4)
    now = [1000.0]
    keeper, client = _keeper(fake, [serving, gone], clock=now, cache_max=2**40)
    try:
        job = render.render_job(serving, serving.profiles[0], client.cfg, GPU_CLASSES, 1,
                                MIRROR)
        client.register(job)
        fake.settle()
        [a] = fake.allocations("llmgw-serving")
        fake.apply_node_meta(a.node_name, {"llmgw_cache_gone": cache.tag(_entry(gone))})
        fake.advance(10)
        now[0] += 3600
        keeper.observe(catalog(serving, gone))
        fake.settle()
        spec = fake.job("llmgw.cache-sweep")
        assert spec is not None
        args = spec["TaskGroups"][0]["Tasks"][0]["Config"]["args"]
        assert {args[i + 1] for i, x in enumerate(args) if x == "--keep"} == {
            _entry(serving), cache.tag(_entry(serving))}
        [sweep] = [s for s in fake.allocations("llmgw.cache-sweep")
                   if s.node_name == a.node_name]
        kept = cache.Entry(path=_entry(serving), tag=cache.tag(_entry(serving)), size=1,
                           used=1.0)
        evicted = cache.Entry(path=_entry(gone), tag=cache.tag(_entry(gone)), size=1, used=0.0)
        fake.write_alloc_file(sweep.id, warmth.REPORT_FILE, msgspec.json.encode(
            cache.Report(root=render.CACHE_DIR, entries=[kept], evicted=[evicted])))
        fake.complete_alloc(sweep.id)
        keeper.observe(catalog(serving, gone))
        fake.advance(10)
        meta = fake.node(a.node_name).meta
        assert meta["llmgw_cache_serving"] == kept.tag
        assert "llmgw_cache_gone" not in meta
    finally:
        client.close()


def test_scaling_prefetch_keeps_weights_on_spare_nodes() -> None:
    """A model with scaling.prefetch 1 gets a prefetch onto a node other than the one
    serving it, and no second one while that runs."""
    m = msgspec.structs.replace(cpu_model("embed", cores=4), scaling=Scaling(min=1,
                                                                             prefetch=1))
    big = [n for n in default_fleet() if n.name == "cpu-01"]
    from llmgw.testing.fake_nomad import node_cpu_64c

    with FakeNomad([*big, node_cpu_64c("cpu-02")]) as two:
        keeper, client = _keeper(two, [m])
        try:
            client.register(render.render_job(m, m.profiles[0], client.cfg, GPU_CLASSES, 1,
                                              MIRROR))
            two.settle()
            [a] = two.allocations("llmgw-embed")
            keeper.observe(catalog(m))
            two.settle()
            [p] = two.allocations("llmgw_prefetch_embed")
            assert p.node_name != a.node_name
            keeper.observe(catalog(m))
            assert len(two.allocations("llmgw_prefetch_embed", include_terminal=True)) == 1
        finally:
            client.close()


async def test_replicas_show_the_phase_and_the_fetchs_percentage() -> None:
    """While the fetch runs, the replica reads "fetching weights 40%" from its progress
    file; once the engine runs it is "loading", and "healthy" when its check passes."""
    from .conftest import make_backend

    m = cpu_model("embed", cores=4)
    with FakeNomad(default_fleet(), auto_run=False) as fake:
        backend = make_backend(fake, cfg=config(fake, [m]))
        await backend.start()
        try:
            await applied(backend, catalog(m))
            fake.settle()
            [a] = fake.allocations("llmgw-embed")
            fake.run_alloc(a.id, through_prestart=False)
            fake.write_alloc_file(a.id, render.PROGRESS_FILE, msgspec.json.encode(
                cache.Progress(url="u", done=40, total=100, rate=1.0, started=0, updated=1)))
            [r] = await backend.replicas("embed")
            assert r.phase == "fetching weights 40%"
            fake.finish_prestart(a.id)
            [r] = await backend.replicas("embed")
            assert r.phase == "loading"
            fake.set_check(a.id, "success")

            async def healthy() -> bool:
                [r] = await backend.replicas("embed")
                return r.phase == "healthy"
            await eventually(healthy, what="the replica healthy")
        finally:
            await backend.close()


def test_a_replica_of_an_older_source_keeps_the_weights_it_uses(fake: FakeNomad) -> None:
    """After a model's source changes, its running replica of the older version still has
    its weights kept by the sweep (by the tag its own job carried), and its finished fetch
    does not mark the node warm for the new source."""
    old = cpu_model("embed", cores=4)
    new = msgspec.structs.replace(old, source=Source.parse(f"{MIRROR}/embed/q4/embed.gguf"))
    now = [1000.0]
    keeper, client = _keeper(fake, [new], clock=now)
    try:
        client.register(render.render_job(old, old.profiles[0], client.cfg, GPU_CLASSES, 1,
                                          MIRROR))
        fake.settle()
        [a] = fake.allocations("llmgw-embed")
        now[0] += 3600
        keeper.observe(catalog(new))
        fake.settle()
        spec = fake.job("llmgw.cache-sweep")
        assert spec is not None
        args = spec["TaskGroups"][0]["Tasks"][0]["Config"]["args"]
        assert cache.tag(_entry(old)) in args
        assert "llmgw_cache_embed" not in fake.node(a.node_name).meta
    finally:
        client.close()


def test_a_fetch_killed_mid_download_does_not_mark_its_node_warm() -> None:
    """A replica stopped while its fetch downloads leaves Terminated with exit code 143
    (not 0): the node is not recorded as holding the weights."""
    m = cpu_model("embed", cores=4)
    with FakeNomad(default_fleet(), auto_run=False) as fake:
        keeper, client = _keeper(fake, [m])
        try:
            client.register(render.render_job(m, m.profiles[0], client.cfg, GPU_CLASSES, 1,
                                              MIRROR))
            fake.settle()
            [a] = fake.allocations("llmgw-embed")
            fake.run_alloc(a.id, through_prestart=False)
            client.deregister("llmgw-embed")
            fake.settle()
            fake.advance(600)              # past the engine's shutdown_delay: the kill
            [gone] = fake.allocations("llmgw-embed", include_terminal=True)
            assert gone.task_states["fetch"].state == "dead"
            keeper.observe(catalog(m))
            assert "llmgw_cache_embed" not in fake.node(a.node_name).meta
            assert "llmgw_cache_embed" not in fake.node_meta(a.node_name)
        finally:
            client.close()


def test_only_a_clean_exit_of_the_fetch_counts_as_fetched() -> None:
    """warmth.fetched: the fetch task dead with its last Terminated exit code 0; a kill's
    Terminated (143) and a failure are not."""
    def alloc(code: int, failed: bool = False) -> wire.Allocation:
        return _alloc(fetch={"State": "dead", "Failed": failed, "Events": [
            {"Type": "Started"}, {"Type": "Terminated", "ExitCode": code,
                                  "Details": {"exit_code": str(code)}}]})
    assert warmth.fetched(alloc(0))
    assert not warmth.fetched(alloc(143))
    assert not warmth.fetched(alloc(1, failed=True))


def test_kept_prefetches_count_the_nodes_made_warm_before_nomad_shows_it() -> None:
    """A node's new metadata reaches the servers 5-10 s after it is written (the client's
    batched re-register, client/client.go watchNodeUpdates): passes in between count the
    nodes llmgw itself just marked, so a finished prefetch is not started again."""
    from llmgw.testing.fake_nomad import node_cpu_64c

    m = msgspec.structs.replace(cpu_model("embed", cores=4), scaling=Scaling(min=1,
                                                                             prefetch=1))
    with FakeNomad([node_cpu_64c("cpu-01"), node_cpu_64c("cpu-02"),
                    node_cpu_64c("cpu-03")]) as fake:
        keeper, client = _keeper(fake, [m])
        try:
            client.register(render.render_job(m, m.profiles[0], client.cfg, GPU_CLASSES, 1,
                                              MIRROR))
            fake.settle()
            [replica] = fake.allocations("llmgw-embed")
            keeper.observe(catalog(m))          # marks the replica's node; starts a prefetch
            fake.settle()
            [p] = fake.allocations(warmth.prefetch_job_id("embed"))
            assert p.node_name != replica.node_name
            fake.complete_alloc(p.id)
            keeper.observe(catalog(m))          # marks the prefetched node
            keeper.observe(catalog(m))          # Nomad shows neither mark yet
            assert "llmgw_cache_embed" not in fake.node(p.node_name).meta
            fake.settle()
            runs = fake.allocations(warmth.prefetch_job_id("embed"), include_terminal=True)
            assert len(runs) == 1               # no second prefetch
            views = {v.name: v for v in keeper.fleet_views()}
            assert "embed" in views[p.node_name].warm
            fake.advance(10)                    # the clients' updates land
            assert fake.node(p.node_name).meta["llmgw_cache_embed"] == cache.tag(_entry(m))
            keeper.observe(catalog(m))
            fake.settle()
            runs = fake.allocations(warmth.prefetch_job_id("embed"), include_terminal=True)
            assert len(runs) == 1
        finally:
            client.close()


def test_the_fake_shows_new_node_metadata_only_after_the_clients_update() -> None:
    """/v1/client/metadata answers the new metadata at once; /v1/node/:id and placement
    see it once the client's re-register lands, 5-10 s later on the fake's clock."""
    with FakeNomad(default_fleet()) as fake:
        client = NomadClient(NomadConfig(address=fake.address))
        try:
            answer = client.apply_node_meta(node_id("cpu-01"), {"llmgw_cache_x": "t1"})
            assert (answer.Meta or {})["llmgw_cache_x"] == "t1"
            assert "llmgw_cache_x" not in fake.node("cpu-01").meta
            fake.advance(4.9)
            assert "llmgw_cache_x" not in fake.node("cpu-01").meta
            fake.advance(5.2)
            assert fake.node("cpu-01").meta["llmgw_cache_x"] == "t1"
        finally:
            client.close()


def test_the_sweep_keeps_every_adapter_and_a_report_keeps_or_clears_its_key(
        fake: FakeNomad) -> None:
    """Adapters are small and a replica reads one from disk again when it pushed it out of
    host memory, so the sweep keeps each adapter's entry; a node's adapter key stays while
    its report holds the entry and goes when it does not."""
    from llmgw.catalog.adapter import Adapter
    from llmgw.catalog.decode import convert

    base = convert({"name": "qwen", "source": f"{MIRROR}/qwen/", "engine": "vllm",
                    "lora": {"slots": 2},
                    "profiles": [{"name": "cpu", "cpu_cores": 2, "memory": "2GiB"}]}, Model)
    kept, dropped = (Adapter(name=n, base="qwen",
                             source=Source.parse(f"{MIRROR}/adapters/{n}/"))
                     for n in ("qwen-sql", "qwen-old"))
    cat = build_catalog([base], GPU_CLASSES, Runtime(scheduler="nomad", mirror=MIRROR),
                        adapters=[kept, dropped])
    entry = {a.name: (render.adapter_fetch_of(a, MIRROR) or ("", ""))[1]
             for a in (kept, dropped)}
    now = [1000.0]
    keeper, client = _keeper(fake, [base], clock=now)
    try:
        fake.apply_node_meta("cpu-01", {f"llmgw_cache_{a}": cache.tag(e)
                                        for a, e in entry.items()})
        fake.advance(10)
        now[0] += 3600
        keeper.observe(cat)
        fake.settle()
        spec = fake.job("llmgw.cache-sweep")
        assert spec is not None
        args = spec["TaskGroups"][0]["Tasks"][0]["Config"]["args"]
        assert {args[i + 1] for i, x in enumerate(args) if x == "--keep"} == set(entry.values())
        [sweep] = [a for a in fake.allocations("llmgw.cache-sweep") if a.node_name == "cpu-01"]
        held = cache.Entry(path=entry["qwen-sql"], tag=cache.tag(entry["qwen-sql"]), size=1,
                           used=1.0)
        fake.write_alloc_file(sweep.id, warmth.REPORT_FILE, msgspec.json.encode(
            cache.Report(root=render.CACHE_DIR, entries=[held])))
        fake.complete_alloc(sweep.id)
        keeper.observe(cat)
        fake.advance(10)
        meta = fake.node("cpu-01").meta
        assert meta["llmgw_cache_qwen-sql"] == held.tag
        assert "llmgw_cache_qwen-old" not in meta
    finally:
        client.close()
