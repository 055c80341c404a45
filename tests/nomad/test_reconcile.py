"""The reconciler's decisions: register, scale, leave stale, deregister."""

from __future__ import annotations

import msgspec

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.reconcile import (
    JobState,
    decide,
    desired_count,
    job_state,
    latest_deployments,
    shortfall,
    version_allocs,
)

from .shapes import GPU_CLASSES

P = Profile(name="cpu-8", gpus=0, cpu_cores=8, memory=Size.parse("4GiB"))


def _model(name: str, min_: int = 1, max_: int | None = None) -> Model:
    return Model(name=name, source=Source.parse("http://mirror/x.gguf"), engine="llama.cpp",
                 profiles=[P],
                 scaling=Scaling(min=min_, max=max_))


def _job(model: str, count: int | None = 1, spec: str = "s1", stopped: bool = False,
         queued: int = 0, profile: str = "cpu-8") -> JobState:
    return JobState(id=f"llmgw-{model}", model=model, profile=profile, fingerprint="fp",
                    spec=spec, stopped=stopped, queued=queued, count=count)


def _spec(model: Model, profile: str) -> str | None:
    return "s1" if model.profile(profile) else None


def test_a_model_without_a_live_job_is_registered():
    """Missing and stopped jobs are registered."""
    cat = build_catalog([_model("a"), _model("b")], GPU_CLASSES)
    actions = decide(cat, {"llmgw-b": _job("b", stopped=True)}, _spec)
    assert actions.register == ["a", "b"]


def test_a_model_with_a_minimum_keeps_the_scaled_count_within_its_range():
    """Min > 0: a count the scaler set within [min, max] stays; one outside is clamped."""
    cat = build_catalog([_model("a", min_=3, max_=5)], GPU_CLASSES)
    assert decide(cat, {"llmgw-a": _job("a", count=5)}, _spec).scale == {}
    assert decide(cat, {"llmgw-a": _job("a", count=4)}, _spec).scale == {}
    assert decide(cat, {"llmgw-a": _job("a", count=2)}, _spec).scale == {"a": 3}
    assert decide(cat, {"llmgw-a": _job("a", count=8)}, _spec).scale == {"a": 5}
    fixed = build_catalog([_model("a", min_=3)], GPU_CLASSES)
    assert decide(fixed, {"llmgw-a": _job("a", count=5)}, _spec).scale == {"a": 3}


def test_an_on_demand_model_keeps_the_count_the_gateway_set_up_to_max():
    """Min 0: the reconciler leaves the demand alone and only clamps it to max."""
    m = _model("a", min_=0, max_=2)
    assert desired_count(m, 1) == 1
    assert desired_count(m, 4) == 2
    assert desired_count(m, None) is None
    cat = build_catalog([m], GPU_CLASSES)
    assert decide(cat, {"llmgw-a": _job("a", count=1)}, _spec).scale == {}


def test_a_changed_spec_is_reported_stale_and_not_re_registered():
    """A profile edit leaves the running job alone (no register) and says to roll out."""
    cat = build_catalog([_model("a")], GPU_CLASSES)
    actions = decide(cat, {"llmgw-a": _job("a", spec="old")}, _spec)
    assert actions.register == []
    assert actions.scale == {}
    assert "llmgw ctl rollout a" in actions.stale["a"]
    gone = decide(cat, {"llmgw-a": _job("a", profile="h100-tp2")}, _spec)
    assert "no longer has" in gone.stale["a"]


def test_a_stale_job_is_still_scaled():
    """Scaling does not change the spec, so a stale job's count still follows the catalog."""
    cat = build_catalog([_model("a", min_=2)], GPU_CLASSES)
    actions = decide(cat, {"llmgw-a": _job("a", spec="old", count=1)}, _spec)
    assert actions.scale == {"a": 2}
    assert "a" in actions.stale


def test_owned_jobs_whose_model_left_are_deregistered_and_others_are_untouched():
    """Only jobs carrying llmgw's meta are ever deregistered."""
    cat = build_catalog([_model("a")], GPU_CLASSES)
    jobs = {"llmgw-a": _job("a"), "llmgw-gone": _job("gone"),
            "llmgw-done": _job("done", stopped=True)}
    assert decide(cat, jobs, _spec).deregister == ["llmgw-gone"]
    foreign = msgspec.convert({"ID": "llmgw-hand-made", "Meta": {"team": "x"}}, wire.JobListStub)
    assert job_state(foreign) is None
    ours = msgspec.convert({"ID": "llmgw-a", "Meta": {"llmgw_managed": "true",
                                                      "llmgw_model": "a"},
                            "JobSummary": {"Summary": {"serve": {"Queued": 2}}}},
                           wire.JobListStub)
    st = job_state(ours)
    assert st is not None
    assert st.model == "a"
    assert st.queued == 2


def test_external_models_have_no_job():
    """An upstream model is never registered."""
    ext = Model(name="hosted", upstream=["http://partner:8000"])
    assert decide(build_catalog([ext], GPU_CLASSES), {}, _spec).register == []


def _alloc(version: int, status: str, desired: str = "run", index: int = 1,
           message: str = "") -> wire.Allocation:
    return msgspec.convert({
        "ID": f"a-{version}-{status}-{index}", "JobVersion": version, "TaskGroup": "serve",
        "ClientStatus": status, "DesiredStatus": desired, "ModifyIndex": index,
        "ClientDescription": message}, wire.Allocation)


def test_a_crash_loop_is_judged_on_the_current_versions_allocations():
    """Old versions' failures are history: only the current version's count."""
    history = _job("a", count=2)
    history = JobState(**{**history.__dict__, "failed": 5, "running": 0, "starting": 1})
    assert history.may_crash_loop
    fresh = version_allocs(4, [_alloc(3, "failed"), _alloc(3, "failed", index=2),
                               _alloc(4, "pending")])
    assert (fresh.failed, fresh.pending) == (0, 1)
    assert JobState(**{**history.__dict__, "current": fresh}).crash_loop is False
    looping = version_allocs(4, [_alloc(4, "failed", message="Failed tasks"),
                                 _alloc(4, "pending", index=2)])
    st = JobState(**{**history.__dict__, "current": looping})
    assert st.crash_loop is True
    assert "crash loop: 1 replica of job version 4 failed" in (shortfall(st, None) or "")
    assert "(last: Failed tasks)" in (shortfall(st, None) or "")
    waiting = JobState(**{**st.__dict__, "queued": 1})
    assert waiting.crash_loop is False


def _deployment(version: int, status: str, *, spec_index: int = 7, create: int = 1,
                healthy: int = 1, total: int = 2, index: int = 10, placed: int = 1,
                unhealthy: int = 0) -> wire.Deployment:
    return msgspec.convert({
        "ID": f"d{version}-{index}", "JobID": "llmgw-a", "JobVersion": version,
        "JobSpecModifyIndex": spec_index, "JobCreateIndex": create, "Status": status,
        "StatusDescription": "Failed due to progress deadline", "CreateIndex": index,
        "TaskGroups": {"serve": {"HealthyAllocs": healthy, "DesiredTotal": total,
                                 "PlacedAllocs": placed, "UnhealthyAllocs": unhealthy}}},
        wire.Deployment)


def _deployed(d: wire.Deployment, *, running: int, count: int = 2) -> JobState:
    return JobState(**{**_job("a", count=count).__dict__, "running": running,
                       "create_index": 1, "job_modify_index": 7, "deployment": d})


def test_a_failed_deployment_that_left_replicas_missing_is_recovered():
    """Short of its count after a failed deployment: the same count goes to /scale."""
    cat = build_catalog([_model("a", min_=2)], GPU_CLASSES)
    st = _deployed(_deployment(3, "failed"), running=1)
    actions = decide(cat, {"llmgw-a": st}, _spec)
    assert actions.recover == {"a": 2}
    assert actions.scale == {}
    assert "failed with 1 of 2 healthy (Failed due to progress deadline)" in \
        actions.deployment_failed["a"]
    text = shortfall(st, None) or ""
    assert text.startswith("runs 1 of 2 replicas: Nomad's deployment of job version 3 failed")
    assert "places no more replicas" in text


def test_a_failed_deployment_with_nothing_missing_is_reported_not_retried():
    """A failed rollout with the old replicas serving is shown, and left to `rollout`."""
    cat = build_catalog([_model("a", min_=2)], GPU_CLASSES)
    actions = decide(cat, {"llmgw-a": _deployed(_deployment(3, "failed"), running=2)}, _spec)
    assert actions.recover == {}
    assert "llmgw ctl rollout a" in actions.deployment_failed["a"]


def test_a_failed_deployment_of_an_earlier_version_is_history():
    """Once the job moved on (a new JobModifyIndex), its old deployment's failure is moot."""
    cat = build_catalog([_model("a", min_=2)], GPU_CLASSES)
    old = _deployed(_deployment(3, "failed", spec_index=5), running=1)
    actions = decide(cat, {"llmgw-a": old}, _spec)
    assert (actions.recover, actions.deployment_failed) == ({}, {})
    assert shortfall(old, "no node with 2 free H100") == \
        "runs 1 of 2 replicas: waiting for capacity: no node with 2 free H100"


def test_the_latest_deployment_of_each_job_is_the_newest_created():
    """latest_deployments keeps the highest CreateIndex per job."""
    newest = _deployment(4, "running", index=20)
    got = latest_deployments([_deployment(3, "failed", index=10), newest])
    assert got == {"llmgw-a": newest}


def test_a_job_with_all_its_replicas_has_no_shortfall():
    """Running its count (or more, while one stops) is not short."""
    assert shortfall(_deployed(_deployment(3, "failed"), running=2), None) is None
    assert shortfall(JobState(**{**_job("a", count=0).__dict__}), None) is None


def _ui(model: Model, profile: str) -> str | None:
    return "ui-new" if model.profile(profile) else None


def _described(st: JobState, cat_min: int = 2) -> dict[str, int]:
    cat = build_catalog([_model("a", min_=cat_min)], GPU_CLASSES)
    return decide(cat, {"llmgw-a": st}, _spec, _ui).describe


def test_a_new_ui_block_on_a_current_spec_is_registered_again_at_the_jobs_own_count():
    """Only the description or links differ: the job is described again, count unchanged."""
    st = JobState(**{**_job("a", count=2).__dict__, "ui": "ui-old"})
    assert _described(st) == {"a": 2}
    assert _described(JobState(**{**st.__dict__, "ui": "ui-new"})) == {}


def test_a_ui_block_is_not_rewritten_where_that_would_disturb_the_job():
    """Not on a stale spec (rollout brings it), not while a rollout runs or after one
    failed (a new version would restart or retry it), not while the count changes, and
    not before the registered block was read."""
    base = {**_job("a", count=2).__dict__, "ui": "ui-old"}
    assert _described(JobState(**{**base, "spec": "old"})) == {}
    running = _deployed(_deployment(3, "running"), running=2)
    assert _described(JobState(**{**running.__dict__, "ui": "ui-old"})) == {}
    failed = _deployed(_deployment(3, "failed"), running=2)
    assert _described(JobState(**{**failed.__dict__, "ui": "ui-old"})) == {}
    done = _deployed(_deployment(3, "successful"), running=2)
    assert _described(JobState(**{**done.__dict__, "ui": "ui-old"})) == {"a": 2}
    assert _described(JobState(**base), cat_min=3) == {}
    assert _described(JobState(**{**base, "ui": None})) == {}


def test_a_deployment_failed_by_its_replicas_is_reported_with_the_way_out_not_retried():
    """Replicas that failed (UnhealthyAllocs > 0) mean a broken version: no /scale (which
    would make a new version of the same spec, one progress deadline per cycle forever);
    the report names the failing task's last event and says to fix the spec, then roll out."""
    cat = build_catalog([_model("a", min_=2)], GPU_CLASSES)
    d = _deployment(3, "failed", healthy=0, placed=2, unhealthy=2)
    st = _deployed(d, running=0)
    crashed = version_allocs(3, [_alloc_with_task(3, "failed", "engine",
                                                  "Exit Code: 1, Exit Message: CUDA OOM")])
    st = JobState(**{**st.__dict__, "current": crashed})
    actions = decide(cat, {"llmgw-a": st}, _spec)
    assert actions.recover == {}
    said = actions.deployment_failed["a"]
    assert "replicas failed" in said
    assert "task engine: Exit Code: 1, Exit Message: CUDA OOM" in said
    assert "fix the model's definition, then run `llmgw ctl rollout a`" in said
    text = shortfall(st, None) or ""
    assert "submits the job again" not in text
    assert "llmgw ctl rollout a" in text


def test_only_a_deployment_that_waited_for_capacity_is_recovered():
    """Placed fewer than desired and none unhealthy: the replicas waited for room, so the
    same spec is submitted again; one unhealthy replica makes it a failure of the version."""
    cat = build_catalog([_model("a", min_=2)], GPU_CLASSES)
    waited = _deployed(_deployment(3, "failed", placed=1, unhealthy=0), running=1)
    assert decide(cat, {"llmgw-a": waited}, _spec).recover == {"a": 2}
    broke = _deployed(_deployment(3, "failed", placed=2, unhealthy=1), running=1)
    assert decide(cat, {"llmgw-a": broke}, _spec).recover == {}


def _alloc_with_task(version: int, status: str, task: str, last: str) -> wire.Allocation:
    return msgspec.convert({
        "ID": f"a-{version}-{task}", "JobVersion": version, "TaskGroup": "serve",
        "ClientStatus": status, "DesiredStatus": "run", "ModifyIndex": 5,
        "ClientDescription": "Failed tasks", "TaskStates": {
            "fetch": {"State": "dead", "Failed": False, "Events": [
                {"Type": "Terminated", "DisplayMessage": "Exit Code: 0"}]},
            task: {"State": "dead", "Failed": True, "Events": [
                {"Type": "Started", "DisplayMessage": "Task started by client"},
                {"Type": "Terminated", "DisplayMessage": last}]}}}, wire.Allocation)
