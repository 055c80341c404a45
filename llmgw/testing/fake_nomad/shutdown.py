"""How a client stops an allocation: services leave first, ``shutdown_delay``, then the kill.

A stopped allocation (desired ``stop``: scale-down, rollout, node drain) is not killed
at once by its client. Nomad's alloc runner first runs its pre-kill hooks
(client/allocrunner/alloc_runner.go ``killTasks`` → ``preKillHooks``): the group
service hook deregisters the **group**'s services and waits the group's
``shutdown_delay`` (client/allocrunner/group_service_hook.go ``preKillLocked``). Then
each task runner handles its kill (client/allocrunner/taskrunner/task_runner.go
``handleKill``): its pre-kill hooks deregister the **task**'s own services
(taskrunner/service_hook.go ``PreKilling``), the task waits its own ``shutdown_delay``
with the event "Waiting for shutdown delay" (its state ``pending`` meanwhile), and only
then is it signalled. The allocation stays ``running`` until its tasks are dead.

The kill itself leaves the events a client records (client/allocrunner/alloc_runner.go
``killTasks``; taskrunner/task_runner.go ``handleKill``, ``handleTaskExitResult``,
``emitExitResultEvent``, ``shouldRestart``): ``Killing`` ("Sent interrupt. Waiting 30s
before force killing", the task's ``kill_timeout``) on every task not yet finished,
before its shutdown delay; then, for a task that had started, ``Terminated`` with the
exit code the signal left — 143 for a process ended by SIGTERM, which the Docker driver
reports with signal 0 — and ``Killed`` ("Task successfully killed"); a task that never
started only turns ``dead``. ``Failed`` stays false: a killed fetch is not a failed one,
and not a finished one either.

The fake keeps the same order on its clock: ``begin`` removes the group's services and,
if the group has a delay, waits it; then the tasks' services go, each task is told
``Killing`` and the longest task delay runs; then the tasks are killed and the
allocation is ``complete``. A delay falls due on a timer in real time or when
``FakeNomad.advance`` moves the clock past it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import msgspec

from llmgw.testing.fake_nomad.records import Alloc
from llmgw.testing.fake_nomad.wire import rfc3339

if TYPE_CHECKING:
    from llmgw.testing.fake_nomad.cluster import Cluster

Json = dict[str, Any]


class Stopping(msgspec.Struct, kw_only=True):
    phase: str      # "group": the group's delay runs; "tasks": the tasks' delays run
    due: int        # Unix ns on the fake's clock


def _group(a: Alloc) -> Json:
    return next(g for g in a.job["TaskGroups"] if g["Name"] == a.task_group)


def _task_delay(a: Alloc) -> int:
    return max((t.get("ShutdownDelay") or 0 for t in _group(a).get("Tasks", [])
                if a.task_states.get(t["Name"]) and a.task_states[t["Name"]].state != "dead"),
               default=0)


def _remove(cluster: Cluster, a: Alloc, *, group: bool) -> None:
    """Deregister the group's services (``group``) or the tasks' (not ``group``)."""
    owner = f"_nomad-task-{a.id}-group-{a.task_group}-"
    services = cluster.store.services
    for k in [k for k, s in services.items()
              if s.alloc_id == a.id and k.startswith(owner) == group]:
        del services[k]


def begin(cluster: Cluster, a: Alloc, idx: int, now: int) -> bool:
    """``a`` was told to stop: start its kill sequence. True when it is over (no delay
    left), and the caller marks the allocation complete. The caller holds the lock and
    has taken ``idx`` for a write to allocs and service registrations."""
    _remove(cluster, a, group=True)
    delay = _group(a).get("ShutdownDelay") or 0
    if delay:
        _wait(cluster, a, Stopping(phase="group", due=now + delay), idx, now)
        return False
    return _tasks(cluster, a, idx, now)


# SIGTERM's exit code for a process that does not catch it (128 + 15).
SIGTERM_EXIT = 143
_DEFAULT_KILL_TIMEOUT = 5_000_000_000


def _tasks(cluster: Cluster, a: Alloc, idx: int, now: int) -> bool:
    from llmgw.testing.fake_nomad.commit import event
    from llmgw.testing.fake_nomad.gotext import duration

    _remove(cluster, a, group=False)
    specs = {t["Name"]: t for t in _group(a).get("Tasks", [])}
    for name, task_state in a.task_states.items():
        if task_state.state != "dead" and not task_state.finished_at:
            timeout = (specs.get(name) or {}).get("KillTimeout") or _DEFAULT_KILL_TIMEOUT
            task_state.events = [*task_state.events, event(
                "Killing", f"Sent interrupt. Waiting {duration(timeout)} before force killing",
                at=now, kill_timeout=duration(timeout))]
    delay = _task_delay(a)
    if not delay:
        cluster.store.stopping.pop(a.id, None)
        return True
    for task in _group(a).get("Tasks", []):
        state = a.task_states.get(task["Name"])
        if state is not None and state.state == "running" and task.get("ShutdownDelay"):
            state.state = "pending"
            state.events = [*state.events, event(
                "Waiting for shutdown delay", f"Waiting for shutdown_delay of "
                f"{task['ShutdownDelay'] / 1e9:g}s before killing the task.", at=now)]
    _wait(cluster, a, Stopping(phase="tasks", due=now + delay), idx, now)
    return False


def _wait(cluster: Cluster, a: Alloc, stop: Stopping, idx: int, now: int) -> None:
    cluster.store.stopping[a.id] = stop
    a.modify_index, a.modify_time = idx, now
    timer = threading.Timer((stop.due - now) / 1e9, lambda: cluster.submit(
        lambda: fire(cluster)))
    timer.daemon = True
    cluster.timers.append(timer)
    timer.start()


def fire(cluster: Cluster) -> None:
    """Move on every allocation whose delay is over; kill those whose sequence ended."""
    store = cluster.store
    with store.cond:
        now = store.now()
        due = [(i, s) for i, s in store.stopping.items() if s.due <= now]
        if not due:
            return
        idx = store.write("allocs", "service_registrations", "job_summary")
        for alloc_id, s in due:
            del store.stopping[alloc_id]
            a = store.allocs.get(alloc_id)          # gone: garbage-collected meanwhile
            if a is None or a.client_terminal:
                continue
            if s.phase == "group" and not _tasks(cluster, a, idx, now):
                continue
            kill(cluster, a, idx, now)
    cluster.unblock()


def kill(cluster: Cluster, a: Alloc, idx: int, now: int) -> None:
    """The tasks are signalled and exit: the allocation is ``complete``."""
    from llmgw.testing.fake_nomad.commit import event

    a.client_status = "complete"
    a.client_description = "All tasks have completed"
    for state in a.task_states.values():
        if state.state != "dead":
            if state.started_at:
                state.events = [*state.events,
                                event("Terminated", f"Exit Code: {SIGTERM_EXIT}", at=now,
                                      exit_code=str(SIGTERM_EXIT)),
                                event("Killed", "Task successfully killed", at=now)]
            state.state, state.finished_at = "dead", rfc3339(now)
    a.modify_index, a.modify_time = idx, now
    cluster.committer.remove_services(a.id)
    cluster.store.stopping.pop(a.id, None)
    cluster.exited(a.id)
