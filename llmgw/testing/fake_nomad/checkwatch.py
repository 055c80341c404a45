"""The client's check watcher: ``check_restart``, and when its grace period starts.

A Nomad-provider check runs from the allocation's ``Prerun`` whatever owns it
(client/allocrunner/checks_hook.go ``Prerun`` observes group *and* task services), so
its result reads ``pending`` or ``failure`` while a replica downloads. What restarts
anything is the watcher, and it starts watching a check only when the check's service
is **registered** (client/serviceregistration/nsd/nsd.go ``RegisterWorkload`` calls
``Watch``), with ``graceUntil`` = that moment + ``Grace``
(client/serviceregistration/watcher.go ``UniversalCheckWatcher.Watch``):

* a **group** service registers in the alloc runner's ``Prerun``
  (client/allocrunner/group_service_hook.go ``Prerun``) — before any task, so its grace
  covers image pulls, the prestart fetch and the engine's load together, and its
  restarter is the alloc runner, which restarts every task running at that moment
  (client/allocrunner/alloc_runner.go ``Restart``): a fetch still downloading starts
  over;
* a **task** service registers in that task's ``Poststart``
  (client/allocrunner/taskrunner/service_hook.go ``Poststart``) — once the task has
  started, so its grace starts with the engine, and only that task is restarted.

``restarter.apply``: a check that is not passing after ``graceUntil`` restarts its
workload once it has stayed so for ``Interval × (Limit − 1)``; a passing result clears
the count. A restarted workload is watched again from its next registration (a fresh
grace). The fake evaluates watches when its clock moves (``FakeNomad.advance``); a
restart counts against the group's restart policy, over the task's whole life rather
than per ``Interval``, and a task past ``Attempts`` fails its allocation.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import msgspec

from llmgw.testing.fake_nomad.records import Alloc

if TYPE_CHECKING:
    from llmgw.testing.fake_nomad.cluster import Cluster
    from llmgw.testing.fake_nomad.state import Store

Json = dict[str, Any]


class Watch(msgspec.Struct, kw_only=True):
    check_id: str
    check: str
    task: str | None          # the restarter: None is the alloc runner (a group service)
    grace_until: int          # Unix ns on the fake's clock
    interval: int             # ns
    limit: int
    unhealthy_since: int = 0  # when the check was last seen turning unhealthy; 0 = passing


def check_id(alloc_id: str, task: str | None, service: str, check: str) -> str:
    """A stable ID per (allocation, owner, service, check), as NomadCheckID is."""
    return hashlib.md5(f"{alloc_id}|{task or 'group'}|{service}|{check}".encode(),
                       usedforsecurity=False).hexdigest()


def watch(store: Store, a: Alloc, services: list[Json], task: str | None, now: int) -> None:
    """The services of ``task`` (None: the group's) registered now: watch their restarts."""
    watched = store.watches.setdefault(a.id, {})
    for svc in services:
        if svc.get("Provider") != "nomad":
            continue
        for c in svc.get("Checks", []):
            restart = c.get("CheckRestart") or {}
            if restart.get("Limit", 0) <= 0:  # ServiceCheck.TriggersRestarts
                continue
            cid = check_id(a.id, task, svc["Name"], c["Name"])
            result = store.checks.get(a.id, {}).get(cid)
            watched[cid] = Watch(
                check_id=cid, check=c["Name"], task=task,
                grace_until=now + restart.get("Grace", 0), interval=c["Interval"],
                limit=restart["Limit"],
                unhealthy_since=now if result is None or result.status != "success" else 0)


def status_changed(store: Store, alloc_id: str, cid: str, status: str, now: int) -> None:
    w = store.watches.get(alloc_id, {}).get(cid)
    if w is None:
        return
    if status == "success":
        w.unhealthy_since = 0
    elif not w.unhealthy_since:
        w.unhealthy_since = now


def _due(w: Watch, now: int) -> bool:
    if not w.unhealthy_since or now < w.grace_until:
        return False
    # The watcher first counts a failure once the grace is over (restarter.apply).
    first = max(w.unhealthy_since, w.grace_until)
    return now >= first + w.interval * (w.limit - 1)


def tick(cluster: Cluster) -> None:
    """Restart every workload whose watched check stayed unhealthy past its grace."""
    from llmgw.testing.fake_nomad import lifecycle

    store, exhausted = cluster.store, []
    with store.cond:
        now = store.now()
        due: list[tuple[Alloc, str | None, str]] = []
        for alloc_id, watched in list(store.watches.items()):
            a = store.allocs.get(alloc_id)
            if a is None or a.terminal:
                del store.watches[alloc_id]
                continue
            first: dict[str | None, str] = {}   # one restart per workload and interval
            for w in watched.values():
                if _due(w, now):
                    first.setdefault(w.task, w.check)
            due += [(a, task, check) for task, check in first.items()]
        if not due:
            return
        idx = store.write("allocs", "service_registrations")
        for a, task, check in due:
            if _restart(cluster, a, task, check, idx, now):
                exhausted.append((a.id, f'healthcheck: check "{check}" unhealthy'))
    for alloc_id, reason in exhausted:
        lifecycle.fail_alloc(cluster, alloc_id, reason)


def _restart(cluster: Cluster, a: Alloc, task: str | None, check: str, idx: int,
             now: int) -> bool:
    """Restart the running tasks of ``task``'s workload; True when one ran out of attempts."""
    from llmgw.testing.fake_nomad.commit import event

    store = cluster.store
    tg = next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)
    policy = tg.get("RestartPolicy") or {}
    reason = f'healthcheck: check "{check}" unhealthy'
    names = [task] if task is not None else [n for n, s in a.task_states.items()
                                             if s.state == "running"]
    exhausted = False
    for name in names:
        state = a.task_states[name]
        if state.state != "running":
            continue
        state.restarts += 1
        state.events = [*state.events, event("Restart Signaled", reason, at=now)]
        if policy.get("Mode") == "fail" and state.restarts > policy.get("Attempts", 0):
            exhausted = True
    a.modify_index, a.modify_time = idx, now
    # Watched again from the workload's next registration, with a fresh grace.
    watched = store.watches.get(a.id, {})
    for cid in [cid for cid, w in watched.items() if w.task == task]:
        del watched[cid]
    if exhausted:
        return True
    services = tg.get("Services", []) if task is None else next(
        t for t in tg["Tasks"] if t["Name"] == task).get("Services", [])
    cluster.committer.reregister_services(a, services, task, idx)
    watch(store, a, services, task, now)
    return False
