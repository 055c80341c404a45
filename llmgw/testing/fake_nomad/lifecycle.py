"""What tests make happen on the clients: tasks starting and dying, checks, nodes.

Nomad learns these from its client agents; the fake has none, so tests drive them.
Each control changes state the way the corresponding client update would, and leaves
the consequences to the same machinery a real server runs:

* a failed allocation leaves the service catalog and turns unhealthy in an active
  deployment it was part of; that fails the deployment at once only when the group has
  no progress deadline or no reschedule attempt left (auto-reverting to the last stable
  version when the group asks for it), otherwise the deployment goes on and the
  allocation may be replaced (``deployments``); an ``alloc-failure`` evaluation follows;
* a node that goes ``down`` loses its allocations (``lost``, "alloc is lost since its
  node is down") and their replacements are placed elsewhere; a draining node has its
  allocations migrated; a node that becomes usable again unblocks waiting evaluations;
* check results live only on the client (Nomad servers do not store them,
  docs/nomad-api.md §4.4), so
  flipping one changes nothing in the catalog — it only feeds deployment health.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from llmgw.testing.fake_nomad import checkwatch, deployments
from llmgw.testing.fake_nomad.commit import event
from llmgw.testing.fake_nomad.records import (
    ALLOC_LOST,
    DEPLOYMENT_FAILED_BY_USER,
    Alloc,
)
from llmgw.testing.fake_nomad.wire import rfc3339

if TYPE_CHECKING:
    from llmgw.testing.fake_nomad.cluster import Cluster

CHECK_STATUSES = ("success", "failure", "pending")


def _alloc(cluster: Cluster, alloc_id: str) -> Alloc:
    a = cluster.store.allocs.get(alloc_id)
    if a is None:
        raise KeyError(f"no allocation {alloc_id!r} in the fake Nomad; list them with "
                       "nomad.allocations(job_id)")
    return a


def run_alloc(cluster: Cluster, alloc_id: str, *, through_prestart: bool) -> None:
    with cluster.store.cond:
        a = _alloc(cluster, alloc_id)
        if a.client_status != "pending":
            raise ValueError(f"allocation {a.name} is {a.client_status}, not pending")
    cluster.committer.run([alloc_id], through_prestart=through_prestart)


def finish_prestart(cluster: Cluster, alloc_id: str) -> None:
    with cluster.store.cond:
        a = _alloc(cluster, alloc_id)
        waiting = [n for n, t in a.tasks.items()
                   if t.stage == "prestart" and a.task_states[n].state == "running"]
        if a.client_status != "running" or not waiting:
            raise ValueError(f"allocation {a.name} has no prestart task running "
                             "(start it with run_alloc(..., through_prestart=False))")
    cluster.committer.finish_prestart([alloc_id])


def set_checks(cluster: Cluster, alloc_id: str, status: str, *, check: str | None = None,
               output: str | None = None, status_code: int | None = None) -> None:
    if status not in CHECK_STATUSES:
        raise ValueError(f"check status must be one of {', '.join(CHECK_STATUSES)}; "
                         f"got {status!r}")
    store = cluster.store
    with store.cond:
        a = _alloc(cluster, alloc_id)
        results = [c for c in store.checks.get(alloc_id, {}).values()
                   if check is None or c.check == check]
        if not results:
            what = f"a check named {check!r}" if check else "any Nomad-provider service check"
            raise ValueError(f"allocation {a.name} has no {what}")
        node = store.nodes[a.node_id]
        for c in results:
            checkwatch.status_changed(store, a.id, c.id, status, store.now())
            c.status = status
            c.timestamp = store.now() // 1_000_000_000
            c.status_code = status_code if status_code is not None else (
                200 if status == "success" else 0)
            c.output = output if output is not None else {
                "success": "nomad: http ok", "pending": "",
                "failure": f'nomad: Get "http://{node.address}/": dial tcp: connect: '
                           "connection refused"}[status]
    cluster.committer.judge_health([alloc_id])


def set_job_checks(cluster: Cluster, namespace: str, job_id: str, status: str) -> None:
    with cluster.store.cond:
        ids = [a.id for a in cluster.store.job_allocs(namespace, job_id)
               if not a.terminal and cluster.store.checks.get(a.id)]
    if not ids:
        raise ValueError(f"job {job_id!r} has no live allocation with checks")
    for alloc_id in ids:
        set_checks(cluster, alloc_id, status)


def fail_alloc(cluster: Cluster, alloc_id: str, reason: str) -> None:
    store, revert = cluster.store, None
    with store.cond:
        a = _alloc(cluster, alloc_id)
        if a.client_terminal:
            raise ValueError(f"allocation {a.name} is already {a.client_status}")
        idx = store.write("allocs", "service_registrations", "job_summary", "deployment")
        now = store.now()
        a.client_status, a.client_description = "failed", "Failed tasks"
        a.modify_index, a.modify_time = idx, now
        code = re.search(r"Exit Code: (\d+)", reason)
        for name, t in a.tasks.items():
            state = a.task_states[name]
            if t.stage in ("main", "sidecar", "poststart") and state.state != "dead":
                state.state, state.failed, state.finished_at = "dead", True, rfc3339(now)
                state.events = [*state.events,
                                event("Terminated", reason, at=now,
                                      exit_code=code.group(1) if code else "1"),
                                event("Not Restarting", "Exceeded allowed attempts 2 in interval "
                                                        "30m0s and mode is \"fail\"", at=now)]
        cluster.committer.remove_services(a.id)
        store.stopping.pop(a.id, None)
        cluster.exited(a.id)
        d = store.deployments.get(a.deployment_id) if a.deployment_id else None
        if d is not None and d.active and a.healthy is None:
            a.healthy, a.health_time = False, rfc3339(now)
            revert = deployments.turned_unhealthy(cluster, a, d, idx, now)
    if revert is not None:
        cluster.register(revert, trigger="deployment-watcher")
    cluster.trigger(a.namespace, a.job_id, "alloc-failure")
    cluster.unblock()


def fail_at_start(cluster: Cluster, alloc_id: str, task: str, message: str) -> None:
    """``task`` exited 1 right after it started (``volumes``: it could not write its
    cache), its restarts exhausted: it is failed, the tasks that had not started turn
    dead, and the allocation fails as ``fail_alloc`` fails one."""
    store, revert = cluster.store, None
    with store.cond:
        a = _alloc(cluster, alloc_id)
        if a.client_terminal:
            return
        idx = store.write("allocs", "service_registrations", "job_summary", "deployment")
        now = store.now()
        a.client_status, a.client_description = "failed", "Failed tasks"
        a.modify_index, a.modify_time = idx, now
        for name, state in a.task_states.items():
            if name == task:
                state.state, state.failed, state.finished_at = "dead", True, rfc3339(now)
                state.events = [*state.events,
                                event("Terminated", f"Exit Code: 1, Exit Message: {message!r}",
                                      at=now, exit_code="1"),
                                event("Not Restarting", "Exceeded allowed attempts 2 in "
                                      'interval 30m0s and mode is "fail"', at=now)]
            elif state.state != "dead":
                state.state, state.finished_at = "dead", rfc3339(now)
                state.events = [*state.events, event("Sibling Task Failed",
                                                     "Task's sibling failed", at=now)]
        cluster.committer.remove_services(a.id)
        cluster.exited(a.id)
        d = store.deployments.get(a.deployment_id) if a.deployment_id else None
        if d is not None and d.active and a.healthy is None:
            a.healthy, a.health_time = False, rfc3339(now)
            revert = deployments.turned_unhealthy(cluster, a, d, idx, now)
    if revert is not None:
        cluster.register(revert, trigger="deployment-watcher")
    # No alloc-failure evaluation here: its replacement would fail at once again, and
    # Nomad spaces them by the reschedule policy's delay (30 s, doubling), which the fake
    # does not play. The next evaluation of the job places one, which fails the same way.


def complete_alloc(cluster: Cluster, alloc_id: str) -> None:
    store = cluster.store
    with store.cond:
        a = _alloc(cluster, alloc_id)
        if a.client_terminal:
            raise ValueError(f"allocation {a.name} is already {a.client_status}")
        idx = store.write("allocs", "service_registrations", "job_summary")
        now = store.now()
        a.client_status, a.client_description = "complete", "All tasks have completed"
        a.modify_index, a.modify_time = idx, now
        for state in a.task_states.values():
            if state.state != "dead":
                if state.state == "pending":
                    state.events = [*state.events, event("Started", "Task started by client",
                                                         at=now)]
                state.state, state.finished_at = "dead", rfc3339(now)
                state.events = [*state.events, event("Terminated", "Exit Code: 0", at=now,
                                                     exit_code="0")]
        cluster.committer.remove_services(a.id)
        store.stopping.pop(a.id, None)
        cluster.exited(a.id)
    cluster.unblock()


def set_alloc_memory(cluster: Cluster, alloc_id: str, nbytes: int) -> None:
    with cluster.store.cond:
        _alloc(cluster, alloc_id).memory_usage = int(nbytes)


def set_node_rpc(cluster: Cluster, name: str, *, delay: float, error: str | None) -> None:
    with cluster.store.cond:
        node = cluster.store.node_by_name(name)
        node.rpc_delay, node.rpc_error = max(0.0, delay), error or ""
        cluster.store.cond.notify_all()  # requests waiting on the old fault move on


def set_node(cluster: Cluster, name: str, *, status: str | None, eligible: bool | None,
             drain: bool | None, meta: dict[str, str] | None = None) -> None:
    store = cluster.store
    if status not in (None, "ready", "down", "disconnected", "initializing"):
        raise ValueError(f"node status must be ready, down, disconnected or initializing; "
                         f"got {status!r}")
    with store.cond:
        node = store.node_by_name(name)
        before = node.schedulable
        idx = store.write("nodes")
        now = store.now()
        if status is not None:
            node.status = status
        if eligible is not None:
            node.eligibility = "eligible" if eligible else "ineligible"
        if drain is not None:
            node.drain = drain
        reclassed = meta is not None and meta != (node.client_meta or node.meta)
        if meta is not None:
            # Node.Meta is part of the computed class (nomad/structs/node_class.go
            # HashInclude), so a change re-runs feasibility for waiting evaluations. A
            # restarted client registers at once, its dynamic metadata (kept in its state)
            # over the new static set.
            from llmgw.testing.fake_nomad.clientapi import merged

            node.static_meta = dict(meta) if node.dynamic_meta else None
            node.meta = merged(dict(meta), node.dynamic_meta)
            node.client_meta, node.meta_due = None, 0
        node.modify_index, node.status_updated_at = idx, now
        on_node = [a for a in store.allocs.values() if a.node_id == node.id and not a.terminal]
        jobs: set[tuple[str, str]] = set()
        trigger = ""
        if status == "down" and on_node:
            idx = store.write("allocs", "service_registrations", "job_summary")
            for a in on_node:
                a.desired_status, a.desired_description = "stop", ALLOC_LOST
                a.client_status, a.client_description = "lost", ALLOC_LOST
                a.modify_index, a.modify_time = idx, now
                cluster.committer.remove_services(a.id)
                store.stopping.pop(a.id, None)
                cluster.exited(a.id)
                jobs.add((a.namespace, a.job_id))
            trigger = "node-update"
        elif drain and on_node:
            idx = store.write("allocs")
            for a in on_node:
                a.migrate, a.modify_index, a.modify_time = True, idx, now
                jobs.add((a.namespace, a.job_id))
            trigger = "node-drain"
        freed = (node.schedulable and not before) or (reclassed and node.schedulable)
    for namespace, job_id in sorted(jobs):
        cluster.trigger(namespace, job_id, trigger, node_id=node.id)
    if freed:
        cluster.unblock()


def finish_deployment(cluster: Cluster, namespace: str, job_id: str, status: str) -> None:
    if status not in ("successful", "failed"):
        raise ValueError(f"a deployment can be finished as successful or failed; got {status!r}")
    store = cluster.store
    with store.cond:
        d = store.latest_deployment(namespace, job_id)
        if d is None or not d.active:
            raise ValueError(f"job {job_id!r} has no active deployment")
        idx = store.write("deployment", "allocs")
        now = store.now()
        if status == "failed":
            d.status, d.status_description = "failed", DEPLOYMENT_FAILED_BY_USER
            d.modify_index, d.modify_time = idx, now
            return
        for a in store.job_allocs(namespace, job_id):
            if a.deployment_id == d.id and a.healthy is None and not a.terminal:
                a.healthy, a.health_time, a.modify_index = True, rfc3339(now), idx
        for g in d.task_groups.values():
            g.healthy_allocs = max(g.healthy_allocs, g.desired_total)
        cluster.committer.maybe_succeed(d, idx, now)
        cluster.committer.continue_rollout(namespace, job_id, d.id)
