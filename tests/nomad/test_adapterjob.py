"""The adapter fetch job, its outcome and what it makes a node's metadata say (pure)."""

from __future__ import annotations

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.source import Source
from llmgw.config import NomadConfig
from llmgw.gateway.adapterplace import Placement
from llmgw.scheduler.nomad import adapterjob, warmth, wire
from llmgw.scheduler.nomad.render import CACHE_DIR, adapter_fetch_of, cache_key
from llmgw.weights import cache

MIRROR = "http://llmgw:secret@mirror.internal:8070"
NODE = "2f1b6c1e-7d0a-4c55-9a53-0b6f7e1d2c3a"
CFG = NomadConfig(namespace="llm", datacenters=["dc1"])


def sql(source: str = "hf://acme/qwen-sql-lora") -> Adapter:
    return Adapter(name="qwen-sql", base="qwen", source=Source.parse(source))


def alloc(version: int, status: str, *, exit_code: int = 0, index: int = 10,
          desired: str = "run", words: str = "") -> wire.Allocation:
    events = [wire.TaskEvent(Type="Started", DisplayMessage="Task started by client")]
    if status in ("complete", "failed"):
        events.append(wire.TaskEvent(Type="Terminated", DisplayMessage=words or
                                     f"Exit Code: {exit_code}", ExitCode=exit_code))
    state = wire.TaskState(State="dead" if status in ("complete", "failed") else "running",
                           Failed=status == "failed", Events=events)
    return wire.Allocation(ID=f"a{index}", JobVersion=version, ClientStatus=status,
                           DesiredStatus=desired, CreateIndex=index,
                           ClientDescription="Failed tasks" if status == "failed" else "",
                           TaskStates={"fetch": state})


def test_a_hub_adapter_is_fetched_from_the_mirror_into_the_path_its_engine_loads() -> None:
    """The fetch's URL is the mirror's copy without the password; the entry is where
    the gateway points vLLM's lora_path."""
    url, entry = adapter_fetch_of(sql(), MIRROR) or ("", "")
    assert url.startswith("http://mirror.internal:8070/")
    assert "secret" not in url
    assert entry.startswith(f"{CACHE_DIR}/mirror.internal_8070/")
    assert adapter_fetch_of(sql(), None) is None
    assert adapter_fetch_of(sql("/srv/adapters/qwen-sql"), MIRROR) is None


def test_the_fetch_job_runs_once_on_the_one_node_as_the_fetch_user() -> None:
    """A batch job pinned to the node, one attempt (no restart, no reschedule), the cache
    volume writable, ``llmgw fetch`` as uid fetch_user, the entry's tag in its meta."""
    job = adapterjob.fetch_job(sql(), CFG, MIRROR, NODE, run="r1")
    _, entry = adapter_fetch_of(sql(), MIRROR) or ("", "")
    assert f"llmgw_adapter_qwen-sql_{NODE}" == job.ID
    assert job.Type == "batch"
    assert job.Meta[adapterjob.META_ADAPTER] == "qwen-sql"
    assert job.Meta["llmgw_weights"] == cache.tag(entry)
    [group] = job.TaskGroups
    assert group.Count == 1
    assert [(c.LTarget, c.Operand, c.RTarget) for c in group.Constraints] == \
        [("${node.unique.id}", "=", NODE)]
    assert group.RestartPolicy is not None
    assert group.RestartPolicy.Attempts == 0
    assert group.ReschedulePolicy is not None
    assert group.ReschedulePolicy.Attempts == 0
    assert not group.ReschedulePolicy.Unlimited
    [task] = group.Tasks
    assert task.User == CFG.fetch_user
    assert task.Lifecycle is None
    url, _ = adapter_fetch_of(sql(), MIRROR) or ("", "")
    assert task.Config["args"][:3] == ["fetch", url, entry]
    assert [(m.Destination, m.ReadOnly) for m in task.VolumeMounts] == [(CACHE_DIR, False)]
    assert group.Volumes["cache"].Source == CFG.cache_volume
    # A new attempt is a new version; the same attempt is the same spec.
    assert adapterjob.fetch_job(sql(), CFG, MIRROR, NODE, run="r1") == job
    assert adapterjob.fetch_job(sql(), CFG, MIRROR, NODE, run="r2") != job


def test_the_job_id_is_a_variable_path_and_splits_back() -> None:
    """At most 128 of Nomad's Variable path characters, and (adapter, node) again."""
    name = "a" * 57
    jid = adapterjob.job_id(name, NODE)
    assert len(f"nomad/jobs/{jid}") <= 128
    assert adapterjob.of_job(jid) == (name, NODE)
    assert adapterjob.of_job("llmgw-qwen") is None
    assert adapterjob.of_job("llmgw_prefetch_qwen") is None


def test_the_outcome_is_the_latest_versions_allocation() -> None:
    """No job, not placed yet, running, done, failed; an older version's result does not
    count for the newer one; a stopped fetch is not done."""
    assert adapterjob.outcome(None, []).state == "none"
    assert adapterjob.outcome(1, [alloc(0, "complete")]).state == "running"
    assert adapterjob.outcome(1, [alloc(1, "running")]).state == "running"
    assert adapterjob.outcome(1, [alloc(0, "failed"), alloc(1, "complete", index=11)]
                              ).state == "done"
    failed = adapterjob.outcome(0, [alloc(0, "failed", exit_code=1)])
    assert failed.state == "failed"
    assert "Exit Code: 1" in failed.reason
    said = adapterjob.outcome(0, [alloc(0, "failed", exit_code=1)],
                              progress_error="…: sha256 mismatch")
    assert said.reason == "…: sha256 mismatch"
    full = wire.AllocationMetric(NodesEvaluated=1, DimensionExhausted={"memory": 1})
    unplaced = adapterjob.outcome(1, [alloc(0, "complete")], unplaced=full)
    assert unplaced.state == "failed"
    assert "1 node out of memory" in unplaced.reason
    killed = adapterjob.outcome(0, [alloc(0, "complete", exit_code=143, desired="stop")])
    assert killed.state == "failed"


def test_a_finished_fetch_and_a_sweep_report_name_the_adapter_on_the_node() -> None:
    """The adapter's key is set from the entry's tag, kept when a sweep reports the
    entry, cleared when it does not; a key for another entry does not count as warm."""
    a = sql()
    _, entry = adapter_fetch_of(a, MIRROR) or ("", "")
    tag = cache.tag(entry)
    wanted = warmth.keys_for([tag], [], MIRROR, [a])
    assert wanted == {cache_key("qwen-sql"): tag}
    assert adapterjob.warm(wanted, a, MIRROR)
    assert not adapterjob.warm({cache_key("qwen-sql"): "other"}, a, MIRROR)
    report = warmth.keys_for([], [], MIRROR, [a])
    assert warmth.changes(wanted, report, complete=True) == {cache_key("qwen-sql"): None}


def test_of_two_idle_replicas_the_one_whose_disk_holds_the_adapter_loads_it() -> None:
    """Queue, requests and free slots equal: warmth decides, whichever is listed first."""
    for warm in ("http://r1", "http://r2"):
        p = Placement()
        found = p.target("qwen-sql", ["http://r1", "http://r2"], lambda _: (0, 0),
                         lambda _: 4, set(), 0.0, warm=lambda u, w=warm: u == w)
        assert found == (warm, None)
    # A shorter queue still wins over a warm disk.
    p = Placement()
    found = p.target("qwen-sql", ["http://r1", "http://r2"],
                     lambda u: (0, 0) if u == "http://r1" else (2, 2), lambda _: 4, set(),
                     0.0, warm=lambda u: u == "http://r2")
    assert found == ("http://r1", None)
