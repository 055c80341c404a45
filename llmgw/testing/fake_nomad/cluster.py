"""The fake's server side: job writes, evaluations, and the worker that processes them.

As in Nomad, a write (register, scale, deregister) records the job and a *pending*
evaluation and returns at once; a scheduler worker picks the evaluation up, reconciles
the job (``reconcile.compute``) and commits the plan (``commit.commit``). Clients that
poll the evaluation or block on the allocations see the same sequence they would see
against a real cluster. ``settle()`` waits until the worker is idle, so tests need no
sleeps; an exception inside the worker is kept and re-raised by ``settle()``, so a bug
in the fake cannot pass as a quiet success.

Register follows nomad/job_endpoint.go ``Register`` (docs/nomad-api.md §1.1): the
check-and-set (``EnforceIndex``) runs before the spec comparison; an unchanged spec
keeps its Version but still gets a new evaluation, and ``JobModifyIndex`` answers the
job's existing ModifyIndex; a changed spec becomes Version+1.

Sections marked § are those of docs/nomad-api.md.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from llmgw.testing.fake_nomad import reconcile
from llmgw.testing.fake_nomad.commit import Committer
from llmgw.testing.fake_nomad.records import Eval, JobRecord, Node
from llmgw.testing.fake_nomad.state import Store
from llmgw.testing.fake_nomad.wire import ZERO_TIME, evaluation

Json = dict[str, Any]
_SERVER_FIELDS = ("Status", "StatusDescription", "Stable", "Version", "CreateIndex",
                  "ModifyIndex", "JobModifyIndex", "SubmitTime")


class NomadError(Exception):
    """An error response: HTTP ``status`` with the plain-text ``body`` Nomad sends."""

    def __init__(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(body)
        self.status = status
        self.body = body
        self.headers = headers or {}


def spec_changed(old: Json, new: Json) -> bool:
    """Job.SpecChanged: equal once the server-managed fields are copied over."""
    candidate = dict(new)
    for key in _SERVER_FIELDS:
        if key in old:
            candidate[key] = old[key]
    return candidate != old


def write_response(eval_id: str, eval_index: int, job_index: int, index: int,
                   warnings: str = "") -> Json:
    """JobRegisterResponse (server wire: QueryMeta left unset by the RPC)."""
    return {"EvalID": eval_id, "EvalCreateIndex": eval_index, "JobModifyIndex": job_index,
            "Warnings": warnings, "Index": index, "LastContact": 0, "KnownLeader": False,
            "NextToken": ""}


class Workloads(Protocol):
    """What runs a task for real, where a test wants more than the fake's bookkeeping:
    ``start`` when a main task with services starts, returning the loopback address it
    listens on (its services are registered with it, as a Nomad client registers a
    service with the host address and port of the label it names:
    client/serviceregistration/address.go ``GetAddress``); ``stop`` when the
    allocation's tasks are killed or die. Both are called with the fake's lock held:
    be quick."""

    def start(self, alloc_id: str, task: str) -> tuple[str, int]: ...

    def stop(self, alloc_id: str) -> None: ...


class Cluster:
    def __init__(self, nodes: list[Node], *, namespaces: set[str], auto_run: bool,
                 workloads: Workloads | None = None,
                 image_users: dict[str, int] | None = None) -> None:
        from llmgw.testing.fake_nomad.volumes import missing

        # A client whose host volume path is missing never starts (volumes.missing).
        self.unstarted = {n.name: why for n in nodes if (why := missing(n)) is not None}
        self.store = Store([n for n in nodes if n.name not in self.unstarted], namespaces)
        self.image_users = dict(image_users or {})
        self.auto_run = auto_run
        self.workloads = workloads
        self.timers: list[threading.Timer] = []   # shutdown delays running (shutdown.py)
        self.committer = Committer(self)
        self.errors: list[str] = []
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._busy = 0
        self._idle = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="fake-nomad-worker", daemon=True)
        self._worker.start()

    # -- the worker ---------------------------------------------------------------
    def submit(self, fn: Callable[[], None]) -> None:
        with self._idle:
            self._busy += 1
        self._queue.put(fn)

    def _run(self) -> None:
        while (fn := self._queue.get()) is not None:
            try:
                fn()
            except Exception:  # kept for settle(); the worker must survive to keep serving
                self.errors.append(traceback.format_exc())
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def settle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the fake Nomad's scheduler worker is still busy after "
                                       f"{timeout}s ({self._busy} evaluations queued)")
                self._idle.wait(remaining)
        if self.errors:
            raise RuntimeError("the fake Nomad's scheduler worker failed:\n" + self.errors[0])

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self._queue.put(None)
        self._worker.join(timeout=10)
        if self.workloads is not None:
            with self.store.cond:
                live = {alloc_id for alloc_id, _ in self.store.listening}
                self.store.listening.clear()
            for alloc_id in sorted(live):
                self.workloads.stop(alloc_id)

    def exited(self, alloc_id: str) -> None:
        """The allocation's tasks are dead: what ran them for real stops too."""
        listening = self.store.listening
        ran = [key for key in listening if key[0] == alloc_id]
        for key in ran:
            del listening[key]
        if ran and self.workloads is not None:
            self.workloads.stop(alloc_id)

    # -- evaluations --------------------------------------------------------------
    def new_eval(self, namespace: str, job_id: str, priority: int, trigger: str, *,
                 index: int, job_modify_index: int = 0, job_type: str = "service",
                 deployment_id: str = "", node_id: str = "") -> Eval:
        now = self.store.now()
        ev = Eval(id=str(uuid.uuid4()), namespace=namespace, priority=priority, type=job_type,
                  triggered_by=trigger, job_id=job_id, job_modify_index=job_modify_index,
                  deployment_id=deployment_id, node_id=node_id, create_index=index,
                  modify_index=index, create_time=now, modify_time=now)
        self.store.evals[ev.id] = ev
        self.submit(lambda: self.process(ev.id))
        return ev

    def trigger(self, namespace: str, job_id: str, trigger: str, **kw: Any) -> None:
        """Queue a fresh evaluation for a job (node update, alloc failure, watcher…)."""
        with self.store.cond:
            rec = self.store.jobs.get((namespace, job_id))
            if rec is None:
                return
            idx = self.store.write("evals")
            self.new_eval(namespace, job_id, rec.spec["Priority"], trigger, index=idx,
                          job_modify_index=rec.job_modify_index, job_type=rec.spec["Type"], **kw)

    def process(self, eval_id: str) -> None:
        with self.store.cond:
            ev = self.store.evals.get(eval_id)
            if ev is None or ev.status != "pending":
                return
            rec = self.store.jobs.get((ev.namespace, ev.job_id))
            plan = reconcile.compute(
                rec, self.store.job_allocs(ev.namespace, ev.job_id), self.store.nodes,
                list(self.store.allocs.values()),
                self.store.job_deployments(ev.namespace, ev.job_id))
            placed, stopped, updated = self.committer.commit(ev, rec, plan)
        self.committer.client_step(placed, stopped, updated)

    def unblock(self) -> None:
        """Capacity changed: blocked evaluations go back to the broker (§5.2 item 2)."""
        with self.store.cond:
            blocked = [e for e in self.store.evals.values() if e.status == "blocked"]
            if not blocked:
                return
            idx = self.store.write("evals")
            for ev in blocked:
                ev.status, ev.modify_index, ev.modify_time = "pending", idx, self.store.now()
                self.submit(lambda eid=ev.id: self.process(eid))  # type: ignore[misc]

    # -- job writes ---------------------------------------------------------------
    def register(self, job: Json, *, enforce_index: bool = False, job_modify_index: int = 0,
                 eval_priority: int = 0, preserve_counts: bool = False,
                 trigger: str = "job-register", warnings: str = "") -> Json:
        store = self.store
        with store.cond:
            key = (job["Namespace"], job["ID"])
            existing = store.jobs.get(key)
            if enforce_index:
                _enforce(existing, job_modify_index)
            if preserve_counts and existing is not None:  # groups that exist keep their Count
                counts = {g["Name"]: g["Count"] for g in existing.spec["TaskGroups"]}
                for tg in job.get("TaskGroups", []):
                    tg["Count"] = counts.get(tg["Name"], tg["Count"])
            if existing is not None and existing.spec["Type"] != job["Type"]:
                raise NomadError(500, f'cannot update job from type "{existing.spec["Type"]}" '
                                      f'to "{job["Type"]}"')
            priority = eval_priority or job["Priority"]
            if existing is not None and not spec_changed(existing.spec, job):
                idx = store.write("evals")
                ev = self.new_eval(*key, priority, trigger, index=idx,
                                   job_modify_index=existing.job_modify_index,
                                   job_type=job["Type"])
                return write_response(ev.id, idx, existing.modify_index, idx, warnings)
            idx = self.upsert(job, existing)
            ev = self.new_eval(*key, priority, trigger, index=idx, job_modify_index=idx,
                               job_type=job["Type"])
            return write_response(ev.id, idx, idx, idx, warnings)

    def upsert(self, job: Json, existing: JobRecord | None) -> int:
        """Store ``job`` as the next version (upsertJobImpl); returns the write index."""
        idx = self.store.write("jobs", "job_version", "job_summary", "evals")
        job.update({"Version": existing.spec["Version"] + 1 if existing else 0,
                    "CreateIndex": existing.create_index if existing else idx,
                    "ModifyIndex": idx, "JobModifyIndex": idx, "SubmitTime": self.store.now(),
                    "Stable": False, "Status": "pending", "StatusDescription": ""})
        versions = [*existing.versions, copy.deepcopy(job)] if existing else [copy.deepcopy(job)]
        self.store.jobs[(job["Namespace"], job["ID"])] = JobRecord(
            namespace=job["Namespace"], id=job["ID"], spec=job, versions=versions,
            create_index=job["CreateIndex"], modify_index=idx, job_modify_index=idx,
            scaling_events=existing.scaling_events if existing else {})
        return idx

    def deregister(self, namespace: str, job_id: str, *, purge: bool,
                   eval_priority: int = 0) -> Json:
        store = self.store
        with store.cond:
            rec = store.jobs.get((namespace, job_id))
            if rec is None:  # idempotent: 200 with an empty EvalID (§5.4)
                return {**write_response("", 0, 0, 0), "VolumeEvalID": "", "VolumeEvalIndex": 0}
            if purge:
                idx = store.write("jobs", "job_version", "job_summary", "evals")
                del store.jobs[(namespace, job_id)]
            else:
                idx = self.upsert({**copy.deepcopy(rec.spec), "Stop": True}, rec)
            ev = self.new_eval(namespace, job_id, eval_priority or rec.spec["Priority"],
                               "job-deregister", index=idx, job_modify_index=idx,
                               job_type=rec.spec["Type"])
            return {**write_response(ev.id, idx, idx, idx), "VolumeEvalID": "",
                    "VolumeEvalIndex": 0}

    def scale(self, namespace: str, job_id: str, group: str, count: int | None,
              request: Json) -> Json:
        """Job.Scale (nomad/job_endpoint.go l.931), errors in Nomad's order (§5.3)."""
        store = self.store
        with store.cond:
            rec = store.jobs.get((namespace, job_id))
            if rec is None:
                raise NomadError(404, f'job "{job_id}" not found')
            spec = copy.deepcopy(rec.spec)
            tg = next((g for g in spec["TaskGroups"] if g["Name"] == group), None)
            if tg is None:
                raise NomadError(400, f'task group "{group}" specified for scaling does not '
                                      "exist in job")
            event = {"Count": count, "PreviousCount": tg["Count"],
                     "Message": request.get("Message", ""), "Error": request.get("Error", False),
                     "Meta": request.get("Meta"), "EvalID": None, "Time": self.store.now(),
                     "CreateIndex": 0}
            if count is None:
                idx = store.write("scaling_event")
                event["CreateIndex"] = idx
                rec.scaling_events.setdefault(group, []).insert(0, event)
                return write_response("", 0, 0, idx)
            policy = tg.get("Scaling")
            if policy is not None and count < policy.get("Min", 0):
                raise NomadError(400, "group count was less than scaling policy minimum: "
                                      f"{count} < {policy.get('Min', 0)}")
            if policy is not None and policy.get("Max") is not None and count > policy["Max"]:
                raise NomadError(400, "group count was greater than scaling policy maximum: "
                                      f"{count} > {policy['Max']}")
            deployment = store.latest_deployment(namespace, job_id)
            if deployment is not None and deployment.active and \
                    deployment.job_create_index == rec.create_index:
                raise NomadError(400, "job scaling blocked due to active deployment")
            jmi = request.get("JobModifyIndex", 0)
            if jmi and jmi != rec.job_modify_index:
                raise NomadError(500, f"Enforcing job modify index {jmi}: job exists with "
                                      f"conflicting job modify index: {rec.job_modify_index}")
            tg["Count"] = count
            idx = self.upsert(spec, rec)
            ev = self.new_eval(namespace, job_id, spec["Priority"], "job-scaling", index=idx,
                               job_modify_index=idx, job_type=spec["Type"])
            event.update({"EvalID": ev.id, "CreateIndex": idx})
            rec.scaling_events.setdefault(group, []).insert(0, event)
            store.jobs[(namespace, job_id)].scaling_events = rec.scaling_events
            return write_response(ev.id, idx, idx, idx)

    def plan(self, job: Json, *, diff: bool) -> Json:
        """A dry run of register + reconcile against the current state (§1.1)."""
        store = self.store
        with store.cond:
            key = (job["Namespace"], job["ID"])
            existing = store.jobs.get(key)
            proposed = copy.deepcopy(job)
            changed = existing is None or spec_changed(existing.spec, job)
            version = (existing.spec["Version"] + (1 if changed else 0)) if existing else 0
            proposed.update({"Version": version, "Stop": job.get("Stop", False)})
            rec = JobRecord(namespace=key[0], id=key[1], spec=proposed, versions=[],
                            create_index=existing.create_index if existing else 0,
                            modify_index=0, job_modify_index=0)
            plan = reconcile.compute(rec, store.job_allocs(*key), store.nodes,
                                     list(store.allocs.values()),
                                     store.job_deployments(*key))
            created = None
            if plan.failed:
                idx = store.read_index("evals")
                blocked = Eval(id=str(uuid.uuid4()), namespace=key[0],
                               priority=job["Priority"], type=job["Type"],
                               triggered_by="queued-allocs", job_id=key[1], status="blocked",
                               status_description="created to place remaining allocations",
                               failed_tg_allocs=plan.failed, queued_allocations=plan.queued,
                               create_index=idx, modify_index=idx)
                created = [evaluation(blocked)]
            return {
                "Annotations": reconcile.plan_annotations(plan, proposed),
                "FailedTGAllocs": {k: msgspec.to_builtins(v) for k, v in plan.failed.items()}
                or None,
                "JobModifyIndex": existing.job_modify_index if existing else 0,
                "CreatedEvals": created,
                "Diff": _diff(existing.spec if existing else None, proposed, plan) if diff
                else None,
                "NextPeriodicLaunch": ZERO_TIME, "Warnings": "",
                "Index": existing.job_modify_index if existing else 0,
            }


def _enforce(existing: JobRecord | None, index: int) -> None:
    """Job.EnforceIndex (nomad/structs/job.go:308); no RPC code, hence HTTP 500."""
    prefix = "Enforcing job modify index"
    if existing is not None:
        if index == 0:
            raise NomadError(500, f"{prefix} 0: job already exists")
        if index != existing.job_modify_index:
            raise NomadError(500, f"{prefix} {index}: job exists with conflicting job modify "
                                  f"index: {existing.job_modify_index}")
    elif index != 0:
        raise NomadError(500, f"{prefix} {index}: job does not exist")


def _field_diffs(old: Json | None, new: Json, keys: list[str]) -> list[Json]:
    out = []
    for k in keys:
        a = None if old is None else old.get(k)
        b = new.get(k)
        if isinstance(b, dict | list) or a == b:
            continue
        kind = "Added" if a is None else "Deleted" if b is None else "Edited"
        out.append({"Type": kind, "Name": k, "Old": "" if a is None else str(a),
                    "New": "" if b is None else str(b), "Annotations": None})
    return out


def _diff(old: Json | None, new: Json, plan: reconcile.Plan) -> Json:
    """A JobDiff with the shape of nomad/structs/diff.go, at field granularity only."""
    groups = []
    old_groups = {g["Name"]: g for g in (old or {}).get("TaskGroups", [])}
    for tg in new.get("TaskGroups", []):
        before = old_groups.get(tg["Name"])
        fields = _field_diffs(before, tg, ["Count"])
        tasks = []
        for task in tg.get("Tasks", []):
            prev = next((t for t in (before or {}).get("Tasks", [])
                         if t["Name"] == task["Name"]), None)
            edited = prev != task
            tasks.append({"Type": "Added" if prev is None else "Edited" if edited else "None",
                          "Name": task["Name"], "Fields": _field_diffs(prev, task, ["Driver"]),
                          "Objects": None, "Annotations": ["forces create/destroy update"]
                          if prev is not None and edited else None})
        updates = {k: v for k, v in plan.desired.get(tg["Name"], {}).items() if v}
        kind = "Added" if before is None else "Edited" if before != tg else "None"
        groups.append({"Type": kind, "Name": tg["Name"], "Fields": fields, "Objects": None,
                       "Tasks": tasks, "Updates": updates or None})
    top = ["Priority", "Type", "Region", "NodePool", "Stop"]
    kind = "Added" if old is None else "Edited" if spec_changed(old, new) else "None"
    return {"Type": kind, "ID": new["ID"], "Fields": _field_diffs(old, new, top) or None,
            "Objects": None, "TaskGroups": groups}
