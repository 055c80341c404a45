"""Applying a plan, and what the Nomad *clients* then do with it.

``commit`` is the plan applier: one write creates the allocations (``pending``), marks
stops, updates in place, opens or cancels deployments, and completes the evaluation —
blocking a follow-up evaluation when allocations could not be placed
(docs/nomad-api.md §5.2 item 2).

Group services (Nomad provider only) are registered in that same write, before the
task has started and long before any check passes: the client's group-service hook
runs in ``Prerun`` (§4.4), so service discovery returns replicas that are
still loading. Task-level services follow when their task has started (``Poststart``),
which for a main task is after every prestart task has finished. Either registration
starts the ``check_restart`` watch of its checks (``checkwatch``).

``client_step`` plays the client: stopped allocations become ``complete`` and leave
the service catalog; with ``auto_run`` new allocations become ``running``. Health is
judged per deployment from the check results the tests set (``HealthCheck: checks``:
every healthiness check ``success``; ``task_states``: running; ``manual``: only
``finish_deployment``) — ``MinHealthyTime`` is not simulated; the progress deadline is
(``deployments``), on the fake's clock. An allocation updated in place into a new
deployment is judged again, as the client's health hook does on ``Update``. A
deployment turns ``successful`` when every group has ``DesiredTotal`` healthy allocs,
which marks the job version stable and lets a rolling update take its next batch.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import TYPE_CHECKING, Any

from llmgw.testing.fake_nomad import checkwatch, deployments, shutdown, volumes
from llmgw.testing.fake_nomad.gotext import quote
from llmgw.testing.fake_nomad.reconcile import Plan
from llmgw.testing.fake_nomad.records import (
    DEPLOYMENT_NEWER_JOB,
    DEPLOYMENT_STOPPED_JOB,
    DEPLOYMENT_SUCCESSFUL,
    Alloc,
    CheckResult,
    Deployment,
    Eval,
    GroupDeployment,
    JobRecord,
    ServiceReg,
    TaskState,
)
from llmgw.testing.fake_nomad.wire import rfc3339

if TYPE_CHECKING:
    from llmgw.testing.fake_nomad.cluster import Cluster


def lifecycle_fail_at_start(cluster: Cluster, alloc_id: str, task: str, message: str) -> None:
    from llmgw.testing.fake_nomad.lifecycle import fail_at_start

    fail_at_start(cluster, alloc_id, task, message)

Json = dict[str, Any]


def event(kind: str, message: str, *, at: int | None = None, **details: str) -> Json:
    """A TaskEvent (nomad/structs/structs.go). An exit result carries its code both as
    ``ExitCode`` and in ``Details`` with the signal (``SetExitCode``, ``SetSignal``: the
    Docker driver always reports signal 0, drivers/docker/handle.go ``run``)."""
    if "exit_code" in details:
        details.setdefault("signal", "0")
    return {"Type": kind, "Time": at if at is not None else time.time_ns(),
            "DisplayMessage": message, "Details": details or None, "Message": "",
            "FailsTask": False, "ExitCode": int(details.get("exit_code", "0")),
            "Signal": int(details.get("signal", "0"))}


class Committer:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.store = cluster.store

    def commit(self, ev: Eval, rec: JobRecord | None, plan: Plan
               ) -> tuple[list[str], list[str], list[str]]:
        """Apply ``plan`` in one write; returns the placed, stopped and in-place alloc IDs."""
        store, now = self.store, self.store.now()
        idx = store.write("allocs", "evals", "deployment", "service_registrations",
                          "job_summary")
        deployment = store.latest_deployment(ev.namespace, ev.job_id)
        if rec is None or rec.spec.get("Stop"):
            for d in store.job_deployments(ev.namespace, ev.job_id):
                if d.active:
                    d.status, d.status_description = "cancelled", DEPLOYMENT_STOPPED_JOB
                    d.modify_index, d.modify_time = idx, now
        elif plan.deploy:
            for d in store.job_deployments(ev.namespace, ev.job_id):
                if d.active:
                    d.status, d.status_description = "cancelled", DEPLOYMENT_NEWER_JOB
                    d.modify_index, d.modify_time = idx, now
            deployment = self._deployment(rec, idx, now)
        current = deployment if (deployment is not None and deployment.active and rec is not None
                                 and deployment.job_version == rec.spec["Version"]) else None
        for alloc_id, why in plan.stops:
            a = store.allocs[alloc_id]
            a.desired_status, a.desired_description = "stop", why
            a.modify_index, a.modify_time = idx, now
        snapshot = copy.deepcopy(rec.spec) if rec is not None else {}
        for alloc_id in plan.inplace:
            a = store.allocs[alloc_id]
            a.job, a.job_version = snapshot, snapshot["Version"]
            a.modify_index, a.modify_time = idx, now
            if current is not None and a.task_group in current.task_groups and \
                    a.deployment_id != current.id:
                a.deployment_id, a.healthy, a.health_time = current.id, None, None
                a.reschedule_allowed = False
                deployments.placed(current, a.task_group, now)
        placed = [self._place(p, ev, snapshot, current, idx, now).id for p in plan.places]
        self._finish_eval(ev, rec, plan, current, idx, now)
        return placed, [s[0] for s in plan.stops], list(plan.inplace)

    def _deployment(self, rec: JobRecord, idx: int, now: int) -> Deployment:
        groups = {}
        for tg in rec.spec.get("TaskGroups", []):
            u = tg.get("Update")
            if u is None or u.get("MaxParallel", 0) == 0:  # UpdateStrategy.IsEmpty
                continue
            # The progress clock starts with the first placement, not here.
            groups[tg["Name"]] = GroupDeployment(
                auto_revert=u["AutoRevert"], auto_promote=u["AutoPromote"],
                progress_deadline=u["ProgressDeadline"], desired_total=tg["Count"])
        d = Deployment(id=str(uuid.uuid4()), namespace=rec.namespace, job_id=rec.id,
                       job_version=rec.spec["Version"], job_modify_index=rec.job_modify_index,
                       job_spec_modify_index=rec.job_modify_index,
                       job_create_index=rec.create_index, task_groups=groups,
                       create_index=idx, modify_index=idx, create_time=now, modify_time=now)
        self.store.deployments[d.id] = d
        return d

    def _place(self, p: Any, ev: Eval, job: Json, current: Deployment | None, idx: int,
               now: int) -> Alloc:
        store, pl = self.store, p.placement
        a = Alloc(id=str(uuid.uuid4()), namespace=ev.namespace, eval_id=ev.id,
                  name=f"{ev.job_id}.{p.group}[{p.index}]", node_id=pl.node.id,
                  node_name=pl.node.name, job_id=ev.job_id, job_version=job["Version"], job=job,
                  task_group=p.group, tasks=pl.tasks, disk_mb=pl.disk_mb, ports=pl.ports,
                  task_states={t: TaskState(events=[event("Received",
                                                          "Task received by client", at=now)])
                               for t in pl.tasks},
                  previous_allocation=p.previous, metrics=pl.metric, create_index=idx,
                  modify_index=idx, alloc_modify_index=idx, create_time=now, modify_time=now)
        if current is not None and p.group in current.task_groups:
            a.deployment_id = current.id
            deployments.placed(current, p.group, now)
            current.modify_index = idx
        if p.previous:
            prev = store.allocs[p.previous]
            prev.next_allocation = a.id
            if p.reason == "reschedule":
                a.reschedule_events = [*prev.reschedule_events, {
                    "RescheduleTime": now, "PrevAllocID": prev.id, "PrevNodeID": prev.node_id,
                    "Delay": 0}]
        store.allocs[a.id] = a
        tg = next(g for g in job["TaskGroups"] if g["Name"] == p.group)
        # The checks hook observes group and task services from Prerun alike.
        checks: dict[str, CheckResult] = {}
        for svc, task in [(s, None) for s in tg.get("Services", [])] + [
                (s, t["Name"]) for t in tg.get("Tasks", []) for s in t.get("Services", [])]:
            if svc.get("Provider") != "nomad":
                continue
            for c in svc.get("Checks", []):
                cid = checkwatch.check_id(a.id, task, svc["Name"], c["Name"])
                checks[cid] = CheckResult(
                    id=cid, check=c["Name"], group=a.name, service=svc["Name"], task=task or "",
                    mode="readiness" if c.get("OnUpdate") == "ignore" else "healthiness",
                    timestamp=now // 1_000_000_000)
        store.checks[a.id] = checks
        self.register_services(a, tg.get("Services", []), None, idx)
        checkwatch.watch(store, a, tg.get("Services", []), None, now)
        return a

    def register_services(self, a: Alloc, services: list[Json], task: str | None,
                          idx: int) -> None:
        node = self.store.nodes[a.node_id]
        for svc in services:
            if svc.get("Provider") != "nomad":
                continue  # Consul-provider services never reach Nomad's catalog
            label = svc.get("PortLabel", "")
            port = next((p.value for p in a.ports if p.label == label),
                        int(label) if label.isdigit() else 0)
            owner = task if task else f"group-{a.task_group}"
            address, port = self.store.listening.get(
                (a.id, task or ""), (svc.get("Address") or node.address, port))
            reg = ServiceReg(id=f"_nomad-task-{a.id}-{owner}-{svc['Name']}-{label}",
                             service_name=svc["Name"], namespace=a.namespace, node_id=node.id,
                             datacenter=node.datacenter, job_id=a.job_id, alloc_id=a.id,
                             tags=list(svc.get("Tags") or []),
                             address=address, port=port,
                             create_index=idx, modify_index=idx)
            self.store.services[reg.id] = reg

    def reregister_services(self, a: Alloc, services: list[Json], task: str | None,
                            idx: int) -> None:
        """A restarted workload deregisters its services and registers them again."""
        owner = f"-{task}-" if task else f"-group-{a.task_group}-"
        for k in [k for k, s in self.store.services.items()
                  if s.alloc_id == a.id and k.startswith(f"_nomad-task-{a.id}{owner}")]:
            del self.store.services[k]
        self.register_services(a, services, task, idx)

    def remove_services(self, alloc_id: str) -> bool:
        gone = [k for k, s in self.store.services.items() if s.alloc_id == alloc_id]
        for k in gone:
            del self.store.services[k]
        return bool(gone)

    def _finish_eval(self, ev: Eval, rec: JobRecord | None, plan: Plan,
                     current: Deployment | None, idx: int, now: int) -> None:
        store = self.store
        reprocessed = ev.triggered_by == "queued-allocs"
        ev.modify_index, ev.modify_time, ev.snapshot_index = idx, now, idx - 1
        ev.deployment_id = ev.deployment_id or (current.id if current else "")
        if rec is not None:
            ev.queued_allocations = {tg["Name"]: plan.queued.get(tg["Name"], 0)
                                     for tg in rec.spec.get("TaskGroups", [])}
            store.queued[(ev.namespace, ev.job_id)] = dict(ev.queued_allocations)
        siblings = [e for e in store.job_evals(ev.namespace, ev.job_id)
                    if e.status == "blocked" and e.id != ev.id]
        if plan.failed and reprocessed:
            ev.status = "blocked"  # ReblockEval: the same eval waits again
            return
        ev.status = "complete"
        if plan.failed:
            ev.failed_tg_allocs = plan.failed
            blocked = Eval(id=str(uuid.uuid4()), namespace=ev.namespace, priority=ev.priority,
                           type=ev.type, triggered_by="queued-allocs", job_id=ev.job_id,
                           job_modify_index=ev.job_modify_index, status="blocked",
                           status_description="created to place remaining allocations",
                           previous_eval=ev.id, failed_tg_allocs=plan.failed,
                           create_index=idx, modify_index=idx,
                           create_time=now, modify_time=now)
            store.evals[blocked.id] = blocked
            ev.blocked_eval = blocked.id
            why = f"existing blocked evaluation exists for job {quote(ev.job_id)}"
        else:
            why = f'evaluation "{ev.id}" successful'
        for e in siblings:
            e.status, e.status_description = "canceled", why
            e.modify_index, e.modify_time = idx, now

    # -- the clients --------------------------------------------------------------
    def client_step(self, placed: list[str], stopped: list[str],
                    updated: list[str] | None = None) -> None:
        store, freed = self.store, False
        with store.cond:
            done = [store.allocs[i] for i in stopped if not store.allocs[i].client_terminal
                    and i not in store.stopping]
            if done:
                idx = store.write("allocs", "service_registrations", "job_summary")
                now = store.now()
                for a in done:
                    if shutdown.begin(self.cluster, a, idx, now):
                        shutdown.kill(self.cluster, a, idx, now)
                        freed = True
        if freed:
            self.cluster.unblock()
        if updated:
            self.judge_health(updated)
        if placed and self.cluster.auto_run:
            self.run(placed)

    def run(self, alloc_ids: list[str], *, through_prestart: bool = True) -> None:
        """The client starts allocations: pending → running, prestart tasks first.

        With ``through_prestart`` the prestart tasks also finish at once and the main
        tasks start; otherwise they stay running (a fetch downloading) until
        ``finish_prestart``.
        """
        store = self.store
        with store.cond:
            allocs = [store.allocs[i] for i in alloc_ids if store.allocs[i].client_status ==
                      "pending" and store.allocs[i].desired_status == "run"]
            if not allocs:
                return
            idx = store.write("allocs", "service_registrations", "job_summary")
            now = store.now()
            refused: list[tuple[Alloc, str, str]] = []
            for a in allocs:
                a.client_status = "running"
                a.client_description = "Tasks are running"
                a.modify_index, a.modify_time = idx, now
                for name, t in a.tasks.items():
                    if t.stage in ("prestart", "sidecar"):
                        self._start_task(a, name, now)
                why = self._cannot_write(a, "prestart")
                if why is None and through_prestart:
                    self._start_main(a, idx, now)
                    why = self._cannot_write(a, "main")
                if why is not None:
                    refused.append((a, *why))
            failed = {a.id for a, _, _ in refused}
            self.judge_health([a.id for a in allocs if a.id not in failed])
        for a, task, message in refused:
            lifecycle_fail_at_start(self.cluster, a.id, task, message)

    def finish_prestart(self, alloc_ids: list[str]) -> None:
        """The prestart tasks exit 0; the main tasks start and register their services."""
        store = self.store
        with store.cond:
            allocs = [store.allocs[i] for i in alloc_ids if store.allocs[i].client_status ==
                      "running" and not store.allocs[i].terminal]
            if not allocs:
                return
            idx = store.write("allocs", "service_registrations")
            now = store.now()
            refused: list[tuple[Alloc, str, str]] = []
            for a in allocs:
                a.modify_index, a.modify_time = idx, now
                self._start_main(a, idx, now)
                why = self._cannot_write(a, "main")
                if why is not None:
                    refused.append((a, *why))
            failed = {a.id for a, _, _ in refused}
            self.judge_health([a.id for a in allocs if a.id not in failed])
        for a, task, message in refused:
            lifecycle_fail_at_start(self.cluster, a.id, task, message)

    def _cannot_write(self, a: Alloc, stage: str) -> tuple[str, str] | None:
        """A started task of ``stage`` that cannot write its host volume (``volumes``)."""
        node = self.store.nodes[a.node_id]
        for name, t in a.tasks.items():
            if t.stage == stage or (stage == "main" and t.stage == "poststart"):
                why = volumes.refusal(a, node, name, self.cluster.image_users)
                if why is not None:
                    return name, why
        return None

    @staticmethod
    def _start_task(a: Alloc, name: str, now: int) -> None:
        state = a.task_states[name]
        state.state, state.started_at = "running", rfc3339(now)
        state.events = [*state.events, event("Task Setup", "Building Task Directory", at=now),
                        event("Started", "Task started by client", at=now)]

    def _start_main(self, a: Alloc, idx: int, now: int) -> None:
        """Prestart tasks done; main (and poststart) tasks run, then Poststart registers."""
        for name, t in a.tasks.items():
            state = a.task_states[name]
            if t.stage == "prestart" and state.state != "dead":
                if state.state != "running":
                    self._start_task(a, name, now)
                state.state, state.finished_at = "dead", rfc3339(now)
                state.events.append(event("Terminated", "Exit Code: 0", at=now, exit_code="0"))
            elif t.stage in ("main", "poststart") and state.state == "pending":
                self._start_task(a, name, now)
        tg = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
        for task in tg.get("Tasks", []):
            if a.tasks.get(task["Name"]) and a.tasks[task["Name"]].stage in ("main", "poststart"):
                if self.cluster.workloads is not None and task.get("Services"):
                    self.store.listening[(a.id, task["Name"])] = \
                        self.cluster.workloads.start(a.id, task["Name"])
                self.register_services(a, task.get("Services", []), task["Name"], idx)
                checkwatch.watch(self.store, a, task.get("Services", []), task["Name"], now)

    def judge_health(self, alloc_ids: list[str]) -> None:
        """Set deployment health where it is now decided, and advance deployments."""
        store = self.store
        with store.cond:
            now = store.now()
            changed = []
            for i in alloc_ids:
                a = store.allocs.get(i)
                d = store.deployments.get(a.deployment_id) if a and a.deployment_id else None
                if a is None or d is None or not d.active or a.healthy is not None or \
                        a.client_status != "running":
                    continue
                tg = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
                mode = (tg.get("Update") or {}).get("HealthCheck", "checks")
                checks = [c for c in store.checks.get(a.id, {}).values()
                          if c.mode == "healthiness"]
                if mode == "manual" or (mode == "checks" and
                                        any(c.status != "success" for c in checks)):
                    continue
                a.healthy, a.health_time = True, rfc3339(now)
                deployments.became_healthy(d, a.task_group, now)
                changed.append((a, d))
            if not changed:
                return
            idx = store.write("allocs", "deployment")
            for a, d in changed:
                a.modify_index = d.modify_index = idx
                self.maybe_succeed(d, idx, now)
            for ns, job_id, dep in {(a.namespace, a.job_id, a.deployment_id) for a, _ in changed}:
                self.continue_rollout(ns, job_id, dep)

    def continue_rollout(self, namespace: str, job_id: str, deployment_id: str) -> None:
        """The deployment watcher: a healthy batch lets a rolling update place the next."""
        rec = self.store.jobs.get((namespace, job_id))
        if rec is not None and any(not a.terminal and a.job_version != rec.spec["Version"]
                                   for a in self.store.job_allocs(namespace, job_id)):
            self.cluster.trigger(namespace, job_id, "deployment-watcher",
                                 deployment_id=deployment_id)

    def maybe_succeed(self, d: Deployment, idx: int, now: int) -> None:
        if d.status != "running" or any(g.healthy_allocs < g.desired_total
                                        for g in d.task_groups.values()):
            return
        d.status, d.status_description = "successful", DEPLOYMENT_SUCCESSFUL
        d.modify_index, d.modify_time = idx, now
        rec = self.store.jobs.get((d.namespace, d.job_id))
        if rec is not None:
            self.store.write("jobs", "job_version")
            for spec in [rec.spec, *rec.versions]:
                if spec["Version"] == d.job_version:
                    spec["Stable"] = True
