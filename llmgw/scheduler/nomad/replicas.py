"""Replicas as Nomad's allocations: where each runs, whether it serves, what it was
started with, and what memory it reserved against what it uses.

The allocation list has neither the job's meta nor the reservation
(docs/nomad-api.md §5.1), so each allocation is read once in full
(``/v1/allocation/:id``) for the fingerprint and profile its job version
carried and its reserved memory. Both are fixed for an allocation's life,
so they are cached by allocation ID. Measured memory comes from the node's
live statistics (``/v1/client/allocation/:id/stats``) on every call.

Reads for different models run at once on different threads, so the cache is
guarded by a lock (held only around the dictionary, never across a Nomad
call), and a read evicts only entries of the jobs it has just listed: a read
of one model must not drop what a read of another has cached.

The fingerprint is read from the allocation's own copy of the job, not the
job as it is now: after a rollout starts, old and new allocations carry
different ones, and that difference is exactly "stale profile".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.errors import BackendUnavailableError, LlmgwError, NotFoundError
from llmgw.scheduler.base import Replica, ReplicaState
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.scheduler.nomad.discovery import checks_pass, endpoint_url
from llmgw.scheduler.nomad.render import (
    ENGINE_TASK,
    META_FINGERPRINT,
    META_MODEL,
    META_PROFILE,
    PORT_LABEL,
    model_of_job,
)

log = logging.getLogger("llmgw.nomad")
MIB = 1024 * 1024


@dataclass(frozen=True)
class _Detail:
    job: str
    model: str
    profile: str
    fingerprint: str
    reserved: int | None
    address: str | None


def listed(a: wire.Allocation) -> bool:
    """Allocations worth showing: live ones, and failed ones Nomad has not replaced."""
    if a.ClientStatus in ("pending", "running"):
        return True
    return a.DesiredStatus == "run" and not a.NextAllocation and a.ClientStatus != "complete"


def replica_state(a: wire.Allocation, healthy: bool) -> ReplicaState:
    live = a.ClientStatus in ("pending", "running")
    if a.DesiredStatus in ("stop", "evict") and live:
        return "stopping"
    if a.ClientStatus == "running":
        return "running" if healthy else "starting"
    if a.ClientStatus in ("failed", "lost"):
        return "failed"
    if a.ClientStatus == "complete":
        return "stopped"
    return "pending"


def measured_memory(stats: wire.AllocStats) -> int | None:
    """Resident memory when the node measures it (cgroups v1), else total usage (v2)."""
    ms = stats.ResourceUsage.MemoryStats if stats.ResourceUsage else None
    if ms is None:
        return None
    if "RSS" in (ms.Measured or ()) and ms.RSS:
        return ms.RSS
    return ms.Usage or ms.RSS or None


def _message(a: wire.Allocation) -> tuple[int, str]:
    task = (a.TaskStates or {}).get(ENGINE_TASK)
    restarts = task.Restarts if task else 0
    if a.ClientStatus not in ("failed", "lost") and not (task and task.Failed):
        return restarts, ""
    events = [e.DisplayMessage for e in (task.Events or ()) if e.DisplayMessage] if task else []
    parts = [p for p in (a.ClientDescription, events[-1] if events else "") if p]
    return restarts, "; ".join(parts)


def _detail(a: wire.Allocation) -> _Detail:
    meta = (a.Job.Meta if a.Job else None) or {}
    res = a.AllocatedResources
    engine = (res.Tasks or {}).get(ENGINE_TASK) if res else None
    port = next((p for p in (res.Shared.Ports or ()) if p.Label == PORT_LABEL), None) \
        if res else None
    address = f"http://{port.HostIP}:{port.Value}" if port and port.HostIP else None
    return _Detail(
        job=a.JobID, model=meta.get(META_MODEL) or model_of_job(a.JobID) or a.JobID,
        profile=meta.get(META_PROFILE, ""), fingerprint=meta.get(META_FINGERPRINT, ""),
        reserved=engine.Memory.MemoryMB * MIB if engine and engine.Memory.MemoryMB else None,
        address=address,
    )


class ReplicaReader:
    """Reads replicas with blocking calls; run it off the event loop."""

    def __init__(self, client: NomadClient) -> None:
        self._client = client
        self._details: dict[str, _Detail] = {}   # allocation ID → detail
        self._lock = threading.Lock()

    def read(self, job_ids: Sequence[str], health: Mapping[str, bool],
             registrations: Mapping[str, wire.ServiceRegistration], *,
             every_job: bool = False) -> list[Replica]:
        """The replicas of ``job_ids``. ``every_job``: these are all of llmgw's live
        jobs, so cached entries of any other job are dropped too."""
        out: list[Replica] = []
        seen: set[str] = set()
        for jid in job_ids:
            for a in self._client.job_allocations(jid):
                if not listed(a):
                    continue
                with self._lock:
                    detail = self._details.get(a.ID)
                if detail is None:
                    try:
                        detail = _detail(self._client.allocation(a.ID))
                    except NotFoundError:
                        continue  # garbage-collected between the list and the read
                    with self._lock:
                        self._details[a.ID] = detail
                seen.add(a.ID)
                out.append(self._replica(a, detail, health, registrations))
        read = set(job_ids)
        with self._lock:
            gone = [aid for aid, d in self._details.items()
                    if aid not in seen and (every_job or d.job in read)]
            for aid in gone:
                del self._details[aid]
        return out

    def _replica(self, a: wire.Allocation, d: _Detail, health: Mapping[str, bool],
                 registrations: Mapping[str, wire.ServiceRegistration]) -> Replica:
        running = a.ClientStatus == "running"
        healthy = health.get(a.ID)
        if healthy is None and running:
            try:
                healthy = checks_pass(self._client.alloc_checks(a.ID))
            except NotFoundError:
                healthy = False
        measured = None
        if running:
            try:
                measured = measured_memory(self._client.alloc_stats(a.ID))
            except BackendUnavailableError:
                raise
            except LlmgwError as exc:  # the node is unreachable from the server, or gone
                log.info("no statistics for allocation %s: %s", a.ID, exc)
        reg = registrations.get(a.ID)
        restarts, message = _message(a)
        return Replica(
            id=a.ID, model=d.model, profile=d.profile, fingerprint=d.fingerprint,
            node=a.NodeName or a.NodeID, state=replica_state(a, bool(healthy)),
            healthy=bool(healthy) and running,
            address=endpoint_url(reg) if reg else d.address,
            reserved_memory=d.reserved, measured_memory=measured,
            restarts=restarts, message=message,
        )
