"""What the reconciler should do to make Nomad match the catalog, decided without I/O.

The backend reads the jobs llmgw owns (``llmgw-*`` with ``llmgw_managed``
meta), hands them here with the catalog, and carries out the actions. The
rules, and what each one protects:

* A model with no live job is **registered** (the backend chooses its profile
  by planning each in order).
* A job whose count differs from the desired one is **scaled**. A job keeps
  whatever count the gateway last asked for (``set_demand``: the on-demand
  path, or the load-based scaler), clamped to ``[min, max]``: the reconciler
  must not undo a scale-up another process made a moment ago, and a catalog
  change of the range still applies.
* A job whose rendered spec differs from the registered one is left alone
  and reported **stale**. Re-registering would replace every running replica
  (a meta change is destructive, docs/nomad-api.md §9, item 8), and a replica that is
  serving is worth more than the imperfection; ``rollout`` applies the new
  spec when an operator chooses to.
* A job llmgw owns whose model left the catalog is **deregistered**. Jobs
  without llmgw's meta are never touched, whatever their name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.render import (
    GROUP,
    META_FINGERPRINT,
    META_MANAGED,
    META_MODEL,
    META_PROFILE,
    META_SPEC,
    job_id,
)


@dataclass(frozen=True)
class JobState:
    """One llmgw job as Nomad has it."""

    id: str
    model: str
    profile: str
    fingerprint: str
    spec: str
    stopped: bool
    queued: int
    count: int | None = None   # None: not read (the count is read only when needed)
    running: int = 0
    failed: int = 0

    @property
    def crash_loop(self) -> bool:
        """Replicas have failed and none runs, with nothing waiting for capacity:
        they start and die (Nomad keeps rescheduling them, with growing delays)."""
        return bool(self.count) and self.failed > 0 and self.running == 0 and self.queued == 0


@dataclass
class Actions:
    register: list[str] = field(default_factory=list)          # model names
    scale: dict[str, int] = field(default_factory=dict)         # model → count
    deregister: list[str] = field(default_factory=list)         # job IDs
    stale: dict[str, str] = field(default_factory=dict)         # model → why
    waiting: list[str] = field(default_factory=list)            # models with queued allocs


def job_state(stub: wire.JobListStub, count: int | None = None) -> JobState | None:
    """The job as llmgw sees it, or None when llmgw does not own it."""
    meta = stub.Meta or {}
    if meta.get(META_MANAGED) != "true" or not meta.get(META_MODEL):
        return None
    summary = (stub.JobSummary.Summary if stub.JobSummary else {}).get(GROUP)
    return JobState(
        id=stub.ID, model=meta[META_MODEL], profile=meta.get(META_PROFILE, ""),
        fingerprint=meta.get(META_FINGERPRINT, ""), spec=meta.get(META_SPEC, ""),
        stopped=stub.Stop,
        queued=summary.Queued if summary else 0, count=count,
        running=summary.Running if summary else 0, failed=summary.Failed if summary else 0,
    )


def desired_count(model: Model, current: int | None) -> int | None:
    """The count the job should have, or None when there is nothing to decide yet."""
    s = model.scaling
    high = s.max if s.max is not None else max(s.min, 1)
    if current is None:
        return s.min if s.min > 0 else None
    return max(s.min, min(current, high))


def decide(catalog: Catalog, jobs: Mapping[str, JobState],
           spec_of: Callable[[Model, str], str | None]) -> Actions:
    """The actions that bring Nomad to the catalog.

    ``spec_of(model, profile)`` is the spec hash the current catalog renders
    for that profile, or None when the profile no longer exists.
    """
    out = Actions()
    for m in catalog:
        if m.external:
            continue
        st = jobs.get(job_id(m.name))
        if st is None or st.stopped:
            out.register.append(m.name)
            continue
        want = desired_count(m, st.count)
        if want is not None and st.count is not None and want != st.count:
            out.scale[m.name] = want
        if st.queued > 0:
            out.waiting.append(m.name)
        current = spec_of(m, st.profile)
        if current is None:
            out.stale[m.name] = (
                f"it runs profile {st.profile!r}, which the catalog no longer has; "
                f"run `llmgw ctl rollout {m.name}`")
        elif current != st.spec:
            out.stale[m.name] = (
                f"its profile {st.profile!r} changed since it was registered; "
                f"run `llmgw ctl rollout {m.name}` to replace its replicas")
    wanted = {job_id(m.name) for m in catalog if not m.external}
    for jid, st in sorted(jobs.items()):
        if jid not in wanted and not st.stopped:
            out.deregister.append(jid)
    return out
