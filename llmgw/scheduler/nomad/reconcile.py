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
* A job whose spec is current but whose ``ui`` block is not (a new description, a
  new public URL) is **described**: the same spec is registered again with the new
  block and the job's own count, as a check-and-set on the JobModifyIndex read, so a
  scale made meanwhile is never undone. Nomad updates every allocation in place:
  ``tasksUpdated`` never reads ``Job.UI`` (scheduler/util.go; ``jobui`` says more).
  Not while a deployment of the job's current version is running: the new version
  would restart its progress clock mid-rollout; the next pass after it ends does it.
* A job llmgw owns whose model left the catalog is **deregistered**. Jobs
  without llmgw's meta are never touched, whatever their name.
* A job whose current version's **deployment failed while its replicas waited
  for capacity** and that runs fewer replicas than its count is **recovered**:
  the same count is submitted again through ``/scale``, which Nomad registers as
  a new job version with no spec change (nomad/job_endpoint.go ``Job.Scale``
  always writes the job; nomad/state/state_store.go ``upsertJobImpl`` bumps the
  version). Its running allocations are updated in place, a new deployment
  starts, and the missing ones are placed — which Nomad refuses for a failed
  deployment's version (scheduler/reconciler/reconcile_cluster.go
  ``computeGroup``: ``deploymentPlaceReady``).
* A deployment that failed **because its replicas failed** is reported, never
  retried. The deployment watcher counts every allocation of the deployment
  that turned unhealthy — a task that died, or one not healthy by its
  ``healthy_deadline`` (client/allocrunner/health_hook.go ``watchHealth``) — in
  the group's ``UnhealthyAllocs`` (nomad/deploymentwatcher/deployment_watcher.go
  ``handleAllocUpdate``), while replicas that waited for capacity were never
  placed: ``PlacedAllocs`` < ``DesiredTotal`` with nothing unhealthy. Submitting
  a broken version again would make one more version of the same spec, fail it
  one progress deadline later and start over, forever. The report names the
  failing task's last event and the way out: fix the model's definition, then
  ``llmgw ctl rollout``. A failed deployment that left nothing missing (a
  rollout whose new replicas never turned healthy, the old ones still serving)
  is reported the same way.

Why keep deployments at all, when llmgw could run with ``Update.MaxParallel``
0 and have none (nomad/structs/structs.go ``UpdateStrategy.IsEmpty``)? Because
the deployment is what makes a replacement *rolling*. Without an update
strategy Nomad replaces every allocation of a destructive change in one plan
(reconcile_cluster.go ``computeUnderProvisionedBy`` returns the whole count when
the strategy is empty), so ``llmgw ctl rollout`` — and replacing replicas on a
stale profile, which is a rollout — would stop all three replicas of a 70B
model at once and leave it with none for the half hour of download and load.
With ``MaxParallel`` 1 the next replica is replaced only after the previous one
is healthy. The price of deployments is exactly the failure handled above, and
``/scale`` being refused while one runs (``backend``'s ``_scale``).

Every deployment's state is read once per pass (``GET /v1/deployments``, one
call for all jobs), so a failure shows up, and is acted on, within one pass.
The crash-loop report counts the current version's allocations only: the
job summary's ``Failed`` counts every allocation that ever failed, of every
version, and never goes down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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

# Deployment statuses in which Nomad is still rolling the version out
# (nomad/structs/deployment.go ``Deployment.Active``).
ACTIVE_DEPLOYMENT = frozenset({"running", "paused", "pending", "blocked", "unblocking",
                               "initializing"})


@dataclass(frozen=True)
class VersionAllocs:
    """The allocations of the job's current version, by client status."""

    version: int
    running: int = 0
    pending: int = 0
    failed: int = 0
    last_failure: str = ""   # what the newest failed one said


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
    running: int = 0           # the job summary's, over every version
    starting: int = 0
    failed: int = 0            # ever, over every version: never read as "failing now"
    create_index: int = 0
    job_modify_index: int = 0
    deployment: wire.Deployment | None = None   # the job's latest, whichever version
    current: VersionAllocs | None = None        # read only when something may be wrong
    ui: str | None = None      # the registered ui block's key (jobui.key); None: not read

    @property
    def live(self) -> int:
        """Allocations placed and not finished: running or still starting."""
        return self.running + self.starting

    @property
    def short(self) -> bool:
        return bool(self.count) and self.live < (self.count or 0)

    @property
    def current_deployment(self) -> wire.Deployment | None:
        """The deployment of the job's current version, if the latest is that one."""
        d = self.deployment
        if d is None or d.JobCreateIndex != self.create_index or \
                d.JobSpecModifyIndex != self.job_modify_index:
            return None
        return d

    @property
    def deploying(self) -> bool:
        """A deployment of the job's current version is under way."""
        d = self.current_deployment
        return d is not None and d.Status in ACTIVE_DEPLOYMENT

    @property
    def deployment_failed(self) -> bool:
        d = self.current_deployment
        return d is not None and d.Status == "failed"

    @property
    def may_crash_loop(self) -> bool:
        """What the summary can say: worth reading the current version's allocations."""
        return bool(self.count) and self.failed > 0 and self.queued == 0

    @property
    def crash_loop(self) -> bool:
        """Replicas of the current version have failed and none of them runs, with nothing
        waiting for capacity: they start and die (Nomad keeps rescheduling them)."""
        c = self.current
        return (self.may_crash_loop and c is not None and c.failed > 0 and c.running == 0)


@dataclass
class Actions:
    register: list[str] = field(default_factory=list)          # model names
    scale: dict[str, int] = field(default_factory=dict)         # model → count
    deregister: list[str] = field(default_factory=list)         # job IDs
    recover: dict[str, int] = field(default_factory=dict)       # model → count, via /scale
    stale: dict[str, str] = field(default_factory=dict)         # model → why
    waiting: list[str] = field(default_factory=list)            # models with queued allocs
    deployment_failed: dict[str, str] = field(default_factory=dict)   # model → what happened
    describe: dict[str, int] = field(default_factory=dict)      # model → count, ui changed


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
        running=summary.Running if summary else 0,
        starting=summary.Starting if summary else 0,
        failed=summary.Failed if summary else 0,
        create_index=stub.CreateIndex, job_modify_index=stub.JobModifyIndex,
    )


def latest_deployments(deployments: Iterable[wire.Deployment]) -> dict[str, wire.Deployment]:
    """Job ID → its most recent deployment (by CreateIndex)."""
    out: dict[str, wire.Deployment] = {}
    for d in deployments:
        seen = out.get(d.JobID)
        if seen is None or (d.CreateIndex, d.ModifyIndex) > (seen.CreateIndex, seen.ModifyIndex):
            out[d.JobID] = d
    return out


def version_allocs(version: int, allocs: Iterable[wire.Allocation]) -> VersionAllocs:
    """Count the allocations of ``version`` that Nomad still means to run."""
    running = pending = failed = 0
    last: tuple[int, str] = (-1, "")
    for a in allocs:
        if a.JobVersion != version or a.TaskGroup != GROUP:
            continue
        if a.ClientStatus == "running" and a.DesiredStatus == "run":
            running += 1
        elif a.ClientStatus == "pending" and a.DesiredStatus == "run":
            pending += 1
        elif a.ClientStatus == "failed":
            failed += 1
            if a.ModifyIndex > last[0]:
                last = (a.ModifyIndex, failure_text(a))
    return VersionAllocs(version=version, running=running, pending=pending, failed=failed,
                         last_failure=last[1])


# Events that follow a task's failure rather than say what it was
# (nomad/structs/structs.go TaskNotRestarting, TaskRestarting, TaskKilling, TaskKilled,
# TaskSiblingFailed): the failure itself is the event before them.
_AFTERMATH = frozenset({"Not Restarting", "Restarting", "Killing", "Killed",
                        "Sibling Task Failed"})


def failure_text(a: wire.Allocation) -> str:
    """The client's description and the failing task's last event, as Nomad reported
    them: the task whose state says it failed (else the last event of any task), and its
    last event that says what happened — an exit, a driver failure — rather than what
    followed (not restarting)."""
    states = a.TaskStates or {}
    failing = [(name, st) for name, st in sorted(states.items()) if st.Failed] or \
        sorted(states.items())
    last = ""
    for name, st in failing:
        events = [e for e in st.Events or () if e.DisplayMessage]
        said = [e.DisplayMessage for e in events if e.Type not in _AFTERMATH] or \
            [e.DisplayMessage for e in events]
        if said:
            last = f"task {name}: {said[-1]}" if st.Failed else said[-1]
            if st.Failed:
                break
    return "; ".join(p for p in (a.ClientDescription, last) if p)


def waited_for_capacity(d: wire.Deployment) -> bool:
    """The deployment failed with replicas never placed and none unhealthy: what it lacked
    was room, not a working version (``UnhealthyAllocs`` counts every replica of the
    deployment that died or missed its healthy deadline)."""
    g = (d.TaskGroups or {}).get(GROUP)
    return g is not None and g.UnhealthyAllocs == 0 and g.PlacedAllocs < g.DesiredTotal


def _broken(st: JobState, model: str) -> str:
    """Why the version's replicas failed, and the way out."""
    c = st.current
    last = f" (last: {c.last_failure})" if c is not None and c.last_failure else \
        "; `llmgw ctl replicas` shows each replica's last message"
    return (f"its replicas failed{last}: submitting the same version again would fail "
            f"again; fix the model's definition, then run `llmgw ctl rollout {model}`")


def deployment_text(d: wire.Deployment) -> str:
    g = (d.TaskGroups or {}).get(GROUP)
    healthy = f" with {g.HealthyAllocs} of {g.DesiredTotal} healthy" if g else ""
    return (f"Nomad's deployment of job version {d.JobVersion} failed{healthy} "
            f"({d.StatusDescription or 'no reason given'})")


def shortfall(st: JobState, waiting: str | None) -> str | None:
    """Why the job runs fewer replicas than its count, in one sentence; None if it does not.

    A crash loop counts as short even while Nomad has a replacement starting: none of
    the current version's replicas runs.
    """
    c = st.current
    if not st.short and not (st.crash_loop and c is not None):
        return None
    head = f"runs {st.live} of {st.count} replicas"
    d = st.current_deployment
    if st.short and d is not None and d.Status == "failed":
        if not waited_for_capacity(d):
            return f"{head}: {deployment_text(d)}: {_broken(st, st.model)}"
        return (f"{head}: {deployment_text(d)}, and Nomad places no more replicas of a "
                "failed deployment's version; llmgw submits the job again (same spec, a new "
                "version) to place them")
    if st.crash_loop and c is not None:
        last = f" (last: {c.last_failure})" if c.last_failure else ""
        return (f"runs {c.running} of {st.count} replicas: crash loop: {c.failed} "
                f"replica{'s' if c.failed != 1 else ''} of job version {c.version} failed "
                f"after starting and none runs{last}; `llmgw ctl replicas` shows each one's "
                "message")
    if waiting:
        return f"{head}: waiting for capacity: {waiting}"
    if c is not None and c.failed:
        return (f"{head}: Nomad is replacing failed replicas (its reschedule delay grows "
                "with each failure)")
    return f"{head}: Nomad has not placed the others yet"


def desired_count(model: Model, current: int | None) -> int | None:
    """The count the job should have, or None when there is nothing to decide yet."""
    s = model.scaling
    high = s.max if s.max is not None else max(s.min, 1)
    if current is None:
        return s.min if s.min > 0 else None
    return max(s.min, min(current, high))


def decide(catalog: Catalog, jobs: Mapping[str, JobState],
           spec_of: Callable[[Model, str], str | None],
           ui_of: Callable[[Model, str], str | None] | None = None) -> Actions:
    """The actions that bring Nomad to the catalog.

    ``spec_of(model, profile)`` is the spec hash the current catalog renders
    for that profile, or None when the profile no longer exists; ``ui_of`` the key
    of the ``ui`` block it renders (``jobui.key``).
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
        if st.deployment_failed:
            d = st.current_deployment
            assert d is not None
            if st.short and st.count and not waited_for_capacity(d):
                out.deployment_failed[m.name] = f"{deployment_text(d)}: {_broken(st, m.name)}"
            elif st.short and st.count and m.name not in out.scale:
                out.recover[m.name] = st.count
                out.deployment_failed[m.name] = (
                    f"{deployment_text(d)}; llmgw submitted the job again to place the "
                    "missing replicas")
            elif not st.short:
                out.deployment_failed[m.name] = (
                    f"{deployment_text(d)}; replicas of the earlier version keep serving; "
                    f"`llmgw ctl rollout {m.name}` tries again")
        current = spec_of(m, st.profile)
        if current is None:
            out.stale[m.name] = (
                f"it runs profile {st.profile!r}, which the catalog no longer has; "
                f"run `llmgw ctl rollout {m.name}`")
        elif current != st.spec:
            out.stale[m.name] = (
                f"its profile {st.profile!r} changed since it was registered; "
                f"run `llmgw ctl rollout {m.name}` to replace its replicas")
        elif (ui_of is not None and st.ui is not None and st.count is not None
              and not st.deploying and not st.deployment_failed
              and m.name not in out.scale and ui_of(m, st.profile) not in (None, st.ui)):
            out.describe[m.name] = st.count
    wanted = {job_id(m.name) for m in catalog if not m.external}
    for jid, st in sorted(jobs.items()):
        if jid not in wanted and not st.stopped:
            out.deregister.append(jid)
    return out
