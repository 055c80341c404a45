"""Deployments over time: the progress deadline, and failing a deployment.

Nomad's deployment watcher (nomad/deploymentwatcher/deployment_watcher.go) is the one
part of the server that acts on a clock. The fake reproduces its rules, driven by the
fake's clock (``Store.now``, moved by ``FakeNomad.advance``):

* the progress clock of a group starts when the deployment places its first allocation
  — a new one, or an old one updated in place into the deployment — at that moment plus
  ``ProgressDeadline``, and every allocation that turns healthy pushes it to its health
  time plus ``ProgressDeadline`` when that is later (nomad/state/state_store.go
  ``updateDeploymentWithAlloc``);
* when the earliest deadline of the groups that are not done passes (``watch``,
  ``getDeploymentProgressCutoff``, ``doneGroups``), the deployment fails if any group has
  fewer healthy allocations than its ``DesiredTotal`` (``shouldFail``), as "Failed due to
  progress deadline", reverting to the latest stable version when the group asks for
  ``AutoRevert`` — and an evaluation follows (``getEval``);
* an allocation that turns unhealthy fails the deployment at once only when the group
  has no progress deadline, or when its reschedule policy has no attempt left
  (``shouldFailEarly``); otherwise the watcher lets it be replaced and the deployment
  goes on (``handleAllocUpdate``: ``allowReplacements``).

What a failed deployment then stops is the reconciler's business (``reconcile.py``):
no further placement of that version's missing allocations.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from llmgw.testing.fake_nomad.records import (
    DEPLOYMENT_FAILED_ALLOCS,
    DEPLOYMENT_PROGRESS_DEADLINE,
    Alloc,
    Deployment,
)

if TYPE_CHECKING:
    from llmgw.testing.fake_nomad.cluster import Cluster

Json = dict[str, Any]


def placed(d: Deployment, group: str, at: int) -> None:
    """An allocation joined the deployment at ``at``: start the group's progress clock."""
    g = d.task_groups[group]
    g.placed_allocs += 1
    if g.progress_deadline and not g.require_progress_by:
        g.require_progress_by = at + g.progress_deadline


def became_healthy(d: Deployment, group: str, at: int) -> None:
    """A healthy allocation is progress: the deadline moves to ``at`` + ProgressDeadline."""
    g = d.task_groups[group]
    g.healthy_allocs += 1
    if g.progress_deadline and at + g.progress_deadline > g.require_progress_by:
        g.require_progress_by = at + g.progress_deadline


def reschedule_eligible(a: Alloc) -> bool:
    """Allocation.RescheduleEligible for the policies a service job gets (no interval)."""
    tg = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
    policy = tg.get("ReschedulePolicy") or {}
    return bool(policy.get("Unlimited")) or policy.get("Attempts", 0) > len(a.reschedule_events)


def turned_unhealthy(cluster: Cluster, a: Alloc, d: Deployment, idx: int,
                     now: int) -> Json | None:
    """``a`` of active deployment ``d`` is unhealthy: fail ``d`` now, or allow a replacement.

    Returns the job to revert to when the deployment failed and asks for it.
    """
    g = d.task_groups[a.task_group]
    g.unhealthy_allocs += 1
    d.modify_index, d.modify_time = idx, now
    if g.progress_deadline and reschedule_eligible(a):
        a.reschedule_allowed = True
        return None
    return fail(cluster, d, DEPLOYMENT_FAILED_ALLOCS, idx, now, revert=g.auto_revert)


def fail(cluster: Cluster, d: Deployment, why: str, idx: int, now: int, *,
         revert: bool) -> Json | None:
    """Mark ``d`` failed; the job version to roll back to when ``revert`` and one exists."""
    d.status, d.status_description = "failed", why
    d.modify_index, d.modify_time = idx, now
    if not revert:
        return None
    rec = cluster.store.jobs.get((d.namespace, d.job_id))
    stable = [v for v in (rec.versions if rec else []) if v.get("Stable")
              and v["Version"] < d.job_version]
    if not stable:
        d.status_description += " - no stable job version to auto revert to"
        return None
    d.status_description += f" - rolling back to job version {stable[-1]['Version']}"
    return copy.deepcopy(stable[-1])


def _done(cluster: Cluster, d: Deployment) -> dict[str, bool]:
    """doneGroups: enough healthy, non-terminal allocations of the deployment."""
    healthy: dict[str, int] = {}
    for a in cluster.store.job_allocs(d.namespace, d.job_id):
        if a.deployment_id == d.id and not a.terminal and a.healthy:
            healthy[a.task_group] = healthy.get(a.task_group, 0) + 1
    return {name: healthy.get(name, 0) >= g.desired_total for name, g in d.task_groups.items()}


def cutoff(cluster: Cluster, d: Deployment) -> int:
    """getDeploymentProgressCutoff: the earliest deadline of a group not done; 0 for none."""
    done = _done(cluster, d)
    deadlines = [g.require_progress_by for name, g in d.task_groups.items()
                 if not done[name] and g.require_progress_by]
    return min(deadlines, default=0)


def expire(cluster: Cluster) -> None:
    """Fail every active deployment whose progress deadline has passed (``watch``)."""
    store, reverts, failed = cluster.store, [], []
    with store.cond:
        now = store.now()
        due = [d for d in store.deployments.values()
               if d.status == "running" and 0 < cutoff(cluster, d) <= now]
        if not due:
            return
        idx = store.write("deployment")
        for d in due:
            short = [g for g in d.task_groups.values() if g.healthy_allocs < g.desired_total]
            if not short:
                continue  # shouldFail: every group has its healthy allocations
            revert = fail(cluster, d, DEPLOYMENT_PROGRESS_DEADLINE, idx, now,
                          revert=any(g.auto_revert for g in short))
            failed.append(d)
            if revert is not None:
                reverts.append(revert)
    for job in reverts:
        cluster.register(job, trigger="deployment-watcher")
    for d in failed:
        cluster.trigger(d.namespace, d.job_id, "deployment-watcher", deployment_id=d.id)
