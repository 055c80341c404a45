"""What one evaluation decides for a job: the allocation reconciler, without a clock.

``compute`` compares a job's task groups with its allocations and returns a ``Plan``;
``/v1/job/:id/plan`` reports it (``Annotations.DesiredTGUpdates``, ``FailedTGAllocs``)
and the eval worker commits it with ``commit``. The rules are Nomad's
(scheduler/reconciler), reduced to what a service job sees:

* count: missing indexes ``job.group[i]`` are placed lowest first; a scale-down stops
  the **highest** indexes (docs/nomad-api.md §5.3);
* updates: an allocation of an older job version is updated *in place* unless the
  change is destructive — any task driver/config/env/resources/meta change, any group
  or job ``Meta`` change (docs/nomad-api.md §1.7, ``tasksUpdated``), networks, volumes,
  affinities or spreads at any level (scheduler/util.go ``affinitiesUpdated``,
  ``spreadsUpdated``), or a new constraint its node no longer meets. Everything else is
  in place: the job's ``UI`` block, a service's tags and checks, the count (§1.9).
  Destructive updates roll ``Update.MaxParallel`` at a time: the next batch waits
  until the previous one is healthy;
* a replacement that cannot be placed leaves the old allocation running;
* a batch job's allocation that completed holds its place for the job's version: it is
  not placed again, while one of an older version is ignored and the new version runs;
* a failed allocation is rescheduled (with no delay in the fake) when its reschedule
  policy allows — but not while it belongs to the active deployment unless the watcher
  allowed its replacement, nor once that deployment has failed (filters.go
  ``updateByReschedulable``, reconcile_cluster.go ``placeAllocs``) — and replaced by any
  newer job version; an alloc on a draining node is migrated;
* once the deployment of the job's current version has **failed**, nothing more of that
  version is placed: no missing allocation, no destructive update — only replacements
  of lost ones (reconcile_cluster.go ``computeGroup``: ``deploymentPlaceReady``). A model
  left short stays short, with nothing queued, until a new job version is registered;
* a new job version with work to do gets a deployment — even when nothing can be
  placed yet, which is why ``/scale`` is refused while a job waits for capacity;
  an older active deployment is cancelled ("Cancelled due to newer version of job").
  A group whose ``Update.MaxParallel`` is 0 has no update strategy at all
  (structs.go ``UpdateStrategy.IsEmpty``): no deployment, and a destructive update
  replaces every allocation at once (reconcile_cluster.go ``computeUnderProvisionedBy``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from llmgw.testing.fake_nomad.records import (
    ALLOC_MIGRATING,
    ALLOC_NOT_NEEDED,
    ALLOC_RESCHEDULED,
    ALLOC_UPDATING,
    Alloc,
    AllocMetric,
    Deployment,
    JobRecord,
    Node,
)
from llmgw.testing.fake_nomad.scheduler import (
    Eligibility,
    Placement,
    Usage,
    meets,
    place,
    usage_by_node,
)

Json = dict[str, Any]
_TASK_KEYS = ("Driver", "User", "Config", "Env", "Meta", "Resources", "Artifacts", "Templates",
              "Vault", "Lifecycle", "VolumeMounts", "Secrets")
_GROUP_KEYS = ("Meta", "Networks", "Volumes", "EphemeralDisk")
DESIRED_KEYS = ("Ignore", "Place", "Migrate", "Stop", "InPlaceUpdate", "DestructiveUpdate",
                "Canary", "Preemptions", "Disconnect", "Reconnect", "RescheduleNow",
                "RescheduleLater")


@dataclass
class NewAlloc:
    group: str
    index: int
    placement: Placement
    previous: str = ""
    reason: str = "place"  # place | destructive | migrate | reschedule


@dataclass
class Plan:
    stops: list[tuple[str, str]] = field(default_factory=list)
    places: list[NewAlloc] = field(default_factory=list)
    inplace: list[str] = field(default_factory=list)
    failed: dict[str, AllocMetric] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    desired: dict[str, Counter[str]] = field(default_factory=dict)
    deploy: bool = False


def _group(job: Json, name: str) -> Json | None:
    return next((g for g in job.get("TaskGroups", []) if g.get("Name") == name), None)


def _placement_prefs(job: Json, tg: Json) -> tuple[list[Any], list[Any]]:
    """Every affinity (job, group, tasks) and spread (job, group) that applies to ``tg``."""
    affinities = [*job.get("Affinities", []), *tg.get("Affinities", []),
                  *(a for t in tg.get("Tasks", []) for a in t.get("Affinities", []))]
    return affinities, [*job.get("Spreads", []), *tg.get("Spreads", [])]


def destructive(old_job: Json, new_job: Json, name: str, node: Node | None) -> bool:
    """Would moving an alloc from ``old_job`` to ``new_job`` replace it?"""
    old, new = _group(old_job, name), _group(new_job, name)
    if old is None or new is None or (old_job.get("Meta") or {}) != (new_job.get("Meta") or {}):
        return True
    if any(old.get(k) != new.get(k) for k in _GROUP_KEYS):
        return True
    if _placement_prefs(old_job, old) != _placement_prefs(new_job, new):
        return True
    old_tasks = {t["Name"]: t for t in old.get("Tasks", [])}
    new_tasks = {t["Name"]: t for t in new.get("Tasks", [])}
    if old_tasks.keys() != new_tasks.keys():
        return True
    if any(old_tasks[n].get(k) != new_tasks[n].get(k) for n in new_tasks for k in _TASK_KEYS):
        return True
    constraints = list(new_job.get("Constraints", [])) + list(new.get("Constraints", []))
    for t in new.get("Tasks", []):
        constraints += t.get("Constraints", [])
    return node is not None and not all(meets(c, node) for c in constraints)


def _reschedulable(a: Alloc, tg: Json) -> bool:
    policy = tg.get("ReschedulePolicy") or {}
    enabled = policy.get("Unlimited") or policy.get("Attempts", 0) > len(a.reschedule_events)
    return bool(enabled) and a.client_status == "failed" and a.desired_status == "run" \
        and not a.next_allocation


def compute(job: JobRecord | None, allocs: list[Alloc], nodes: dict[str, Node],
            all_allocs: list[Alloc], deployments: list[Deployment]) -> Plan:
    """Reconcile ``job`` with its ``allocs``; ``deployments`` are the job's, newest first."""
    plan = Plan()
    live = [a for a in allocs if not a.terminal]
    if job is None or job.spec.get("Stop"):
        for a in live:
            plan.stops.append((a.id, ALLOC_NOT_NEEDED))
            plan.desired.setdefault(a.task_group, Counter())["Stop"] += 1
        return plan
    spec, version = job.spec, job.spec["Version"]
    usage = usage_by_node(all_allocs)
    elig = Eligibility()
    node_list = list(nodes.values())
    latest = deployments[0] if deployments else None
    new_version = latest is None or latest.job_version != version or \
        latest.job_create_index != job.create_index
    # cancelUnneededDeployments: the deployment of this version, unless it succeeded
    current = None if new_version or latest is None or latest.status == "successful" \
        else latest
    failed = current is not None and current.status == "failed"
    place_ready = current is None or current.status not in ("failed", "paused", "pending",
                                                              "initializing")
    changes = 0
    for tg in spec.get("TaskGroups", []):
        name, count = tg["Name"], int(tg.get("Count", 0))
        desired = plan.desired.setdefault(name, Counter())
        group_live = sorted((a for a in live if a.task_group == name), key=lambda a: a.index)
        keep = [a for a in group_live if not a.migrate]
        for a in sorted(keep, key=lambda a: a.index, reverse=True)[: max(0, len(keep) - count)]:
            _stop(plan, usage, a, ALLOC_NOT_NEEDED)
            desired["Stop"] += 1
            keep.remove(a)
        replace: list[tuple[Alloc, str]] = [(a, "migrate") for a in group_live if a.migrate]
        stuck: set[int] = set()
        for a in allocs:
            if a.task_group != name or a.client_status != "failed" or \
                    a.desired_status != "run" or a.next_allocation:
                continue
            held = current is not None and a.deployment_id == current.id and (
                failed or (current.active and not a.reschedule_allowed))
            if a.job_version != version:
                replace.append((a, "replace"))  # a new version replaces it whatever happened
            elif not held and _reschedulable(a, tg):
                replace.append((a, "reschedule"))
            elif a.index < count:
                stuck.add(a.index)  # "untainted": holds its slot, neither replaced nor re-placed
        old = [a for a in keep if a.job_version != version]
        rolling = [a for a in old if destructive(a.job, spec, name, nodes.get(a.node_id))]
        for a in old:
            if a not in rolling:
                plan.inplace.append(a.id)
                desired["InPlaceUpdate"] += 1
        desired["Ignore"] += len(keep) - len(old)
        update = tg.get("Update") or {}
        limit = len(rolling) if place_ready else 0
        if place_ready and update.get("MaxParallel", 0) > 0:
            in_flight = sum(1 for a in keep if a.job_version == version and a.healthy is None
                            and a.deployment_id)
            limit = max(0, update["MaxParallel"] - in_flight)
        replace += [(a, "destructive") for a in rolling[:limit]]
        desired["Ignore"] += len(rolling) - min(limit, len(rolling))
        used = {a.index for a in keep} | stuck
        if spec.get("Type") in ("batch", "sysbatch"):
            # A batch allocation that finished keeps its name: the job is done there. One
            # of an older version is ignored, so a new version runs again
            # (reconcile_cluster.go ``filterOldTerminalAllocs``).
            used |= {a.index for a in allocs if a.task_group == name and a.index < count
                     and a.client_status == "complete" and a.job_version == version}
        for a, reason in replace:
            if reason != "destructive" and (len(used) >= count or a.index in used):
                _stop(plan, usage, a, ALLOC_NOT_NEEDED)
                continue
            if reason != "destructive":
                used.add(a.index)
            got = _try(plan, usage, spec, tg, node_list, elig, a.index, a, reason)
            if got:
                desired[{"destructive": "DestructiveUpdate", "replace": "DestructiveUpdate",
                         "migrate": "Migrate", "reschedule": "Place"}[reason]] += 1
        missing = [i for i in range(count) if i not in used][: max(0, count - len(used))]
        if not place_ready:  # only what was lost is replaced
            lost = {a.index for a in allocs if a.task_group == name and
                    a.client_status == "lost" and a.job_version == version}
            missing = [i for i in missing if i in lost]
        for i in missing:
            desired["Place"] += 1
            _try(plan, usage, spec, tg, node_list, elig, i, None, "place")
        # Work *wanted*, placed or not: a version nothing can place still gets its deployment.
        changes += desired["Place"] + desired["InPlaceUpdate"] + len(rolling) + len(replace)
    has_update = spec.get("Type") == "service" and any(
        (tg.get("Update") or {}).get("MaxParallel", 0) > 0 for tg in spec.get("TaskGroups", []))
    plan.deploy = has_update and new_version and changes > 0
    return plan


def _stop(plan: Plan, usage: dict[str, Usage], a: Alloc, why: str) -> None:
    plan.stops.append((a.id, why))
    if not a.client_terminal and a.node_id in usage:
        usage[a.node_id].remove(a)


def _try(plan: Plan, usage: dict[str, Usage], spec: Json, tg: Json, nodes: list[Node],
         elig: Eligibility, index: int, previous: Alloc | None, reason: str) -> bool:
    freed = previous is not None and not previous.client_terminal and \
        previous.node_id in usage
    if freed and previous is not None:
        usage[previous.node_id].remove(previous)
    result = place(spec, tg, nodes, usage, elig)
    name = tg["Name"]
    if isinstance(result, AllocMetric):
        if freed and previous is not None:
            usage[previous.node_id].add(previous)
        if name in plan.failed:
            plan.failed[name].coalesced_failures += 1
        else:
            plan.failed[name] = result
        if reason != "destructive":
            plan.queued[name] = plan.queued.get(name, 0) + 1
        return False
    usage.setdefault(result.node.id, Usage()).add_parts(
        result.tasks, result.disk_mb, result.ports, (spec["Namespace"], spec["ID"], name))
    plan.places.append(NewAlloc(group=name, index=index, placement=result,
                                previous=previous.id if previous else "", reason=reason))
    if previous is not None:
        plan.stops.append((previous.id, {"destructive": ALLOC_UPDATING,
                                         "replace": ALLOC_UPDATING,
                                         "migrate": ALLOC_MIGRATING,
                                         "reschedule": ALLOC_RESCHEDULED}[reason]))
    return True


def plan_annotations(plan: Plan, spec: Json) -> Json:
    """PlanAnnotations.DesiredTGUpdates, every group present with all counters."""
    updates = {}
    for tg in spec.get("TaskGroups", []):
        counts = plan.desired.get(tg["Name"], Counter())
        updates[tg["Name"]] = {k: counts.get(k, 0) for k in DESIRED_KEYS}
    return {"DesiredTGUpdates": updates, "PreemptedAllocs": None}
