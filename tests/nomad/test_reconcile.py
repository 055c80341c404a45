"""The reconciler's decisions: register, scale, leave stale, deregister."""

from __future__ import annotations

import msgspec

from llmgw.catalog.build import build_catalog
from llmgw.catalog.model import Model, Profile, Scaling
from llmgw.catalog.source import Source
from llmgw.catalog.units import Size
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.reconcile import JobState, decide, desired_count, job_state

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


def test_failed_replicas_with_none_running_read_as_a_crash_loop():
    """Failures and nothing running or queued is a crash loop; waiting for capacity is not."""
    assert _job("a", count=2).crash_loop is False
    looping = JobState(id="llmgw-a", model="a", profile="cpu-8", fingerprint="fp", spec="s1",
                       stopped=False, queued=0, count=2, running=0, failed=3)
    assert looping.crash_loop is True
    recovered = JobState(**{**looping.__dict__, "running": 1})
    assert recovered.crash_loop is False
    waiting = JobState(**{**looping.__dict__, "queued": 2})
    assert waiting.crash_loop is False
