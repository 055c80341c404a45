"""Replicas as Nomad's allocations: where each runs, whether it serves, what it was
started with, and what memory it reserved against what it uses.

The allocation list has neither the job's meta nor the reservation
(docs/nomad-api.md §5.1), so each allocation is read once in full
(``/v1/allocation/:id``) for the fingerprint and profile its job version
carried and its reserved memory. Both are fixed for an allocation's life,
so they are cached by allocation ID. Measured memory comes from the node's
live statistics (``/v1/client/allocation/:id/stats``) on every call.

The per-allocation reads run at once, each on its own: statistics and checks
are forwarded to the allocation's node, and one wedged node must cost its own
replicas their figures, not the whole listing its answer. A replica whose node
does not answer is listed with what the servers know and a note saying so.

Reads for different models run at once too, so the cache is guarded by a lock
(held only around the dictionary, never across a Nomad call), and a read
evicts only entries of the jobs it has just listed: a read of one model must
not drop what a read of another has cached.

The fingerprint is read from the allocation's own copy of the job, not the
job as it is now: after a rollout starts, old and new allocations carry
different ones, and that difference is exactly "stale profile".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from llmgw.errors import BackendUnavailableError, LlmgwError, NotFoundError
from llmgw.scheduler.base import Replica, ReplicaState
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.client import NodeUnreachableError, NomadClient
from llmgw.scheduler.nomad.discovery import checks_pass, endpoint_url
from llmgw.scheduler.nomad.offload import Offloader
from llmgw.scheduler.nomad.reconcile import failure_text
from llmgw.scheduler.nomad.render import (
    ENGINE_TASK,
    FETCH_TASK,
    META_FINGERPRINT,
    META_MODEL,
    META_PROFILE,
    PORT_LABEL,
    model_of_job,
)
from llmgw.scheduler.nomad.warmth import phase

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
    # The task that failed says why: a fetch that could not write the cache, or the engine.
    return restarts, failure_text(a)


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
    """Reads replicas: one call per job, then each allocation's reads at once."""

    def __init__(self, client: NomadClient, offload: Offloader) -> None:
        self._client = client
        self._offload = offload
        self._details: dict[str, _Detail] = {}   # allocation ID → detail
        self._lock = threading.Lock()

    async def read(self, job_ids: Sequence[str], health: Mapping[str, bool],
                   unknown: Mapping[str, str],
                   registrations: Mapping[str, wire.ServiceRegistration], *,
                   every_job: bool = False,
                   progress: Callable[[str], float | None] | None = None) -> list[Replica]:
        """The replicas of ``job_ids``. ``health``: what discovery last read of each
        allocation's checks; ``unknown``: allocations whose node does not answer, and why.
        ``every_job``: these are all of llmgw's live jobs, so cached entries of any other
        job are dropped too."""
        listed_allocs: list[wire.Allocation] = []
        for jid in job_ids:
            allocs = await self._offload.run(self._client.job_allocations, jid)
            listed_allocs += [a for a in allocs if listed(a)]
        found = await asyncio.gather(*(self._one(a, health, unknown, registrations, progress)
                                       for a in listed_allocs))
        out = [r for r in found if r is not None]
        seen = {r.id for r in out}
        read = set(job_ids)
        with self._lock:
            gone = [aid for aid, d in self._details.items()
                    if aid not in seen and (every_job or d.job in read)]
            for aid in gone:
                del self._details[aid]
        return out

    async def _one(self, a: wire.Allocation, health: Mapping[str, bool],
                   unknown: Mapping[str, str],
                   registrations: Mapping[str, wire.ServiceRegistration],
                   progress: Callable[[str], float | None] | None = None) -> Replica | None:
        with self._lock:
            detail = self._details.get(a.ID)
        if detail is None:
            try:
                detail = _detail(await self._offload.run(self._client.allocation, a.ID))
            except NotFoundError:
                return None  # garbage-collected between the list and the read
            with self._lock:
                self._details[a.ID] = detail
        running = a.ClientStatus == "running"
        notes: list[str] = []
        healthy = health.get(a.ID)
        if a.ID in unknown:
            healthy = False
            notes.append(f"health unknown, no traffic: {unknown[a.ID]}")
        elif healthy is None and running:
            try:
                healthy = checks_pass(await self._offload.run(self._client.alloc_checks, a.ID))
            except NotFoundError:
                healthy = False
            except NodeUnreachableError as exc:
                healthy = False
                notes.append(f"health unknown: {exc.message}")
        measured = None
        if running:
            try:
                measured = measured_memory(
                    await self._offload.run(self._client.alloc_stats, a.ID))
            except NodeUnreachableError as exc:
                if a.ID not in unknown:
                    notes.append(f"no memory figures: {exc.message}")
            except BackendUnavailableError:
                raise   # the agent itself: the listing cannot be answered
            except LlmgwError as exc:  # gone from the node, or refused: no figures
                log.info("no statistics for allocation %s: %s", a.ID, exc)
        percent = None
        fetch = (a.TaskStates or {}).get(FETCH_TASK)
        if progress is not None and fetch is not None and fetch.State == "running":
            # Only while the fetch runs: one small read through the client fs API.
            percent = await self._offload.run(progress, a.ID)
        now = phase(a, bool(healthy) and running, percent)
        return msgspec.structs.replace(
            self._replica(a, detail, bool(healthy), measured, registrations, notes),
            phase=now.text)

    @staticmethod
    def _replica(a: wire.Allocation, d: _Detail, healthy: bool, measured: int | None,
                 registrations: Mapping[str, wire.ServiceRegistration],
                 notes: list[str]) -> Replica:
        running = a.ClientStatus == "running"
        reg = registrations.get(a.ID)
        restarts, message = _message(a)
        return Replica(
            id=a.ID, model=d.model, profile=d.profile, fingerprint=d.fingerprint,
            node=a.NodeName or a.NodeID, state=replica_state(a, healthy),
            healthy=healthy and running,
            address=endpoint_url(reg) if reg else d.address,
            reserved_memory=d.reserved, measured_memory=measured,
            restarts=restarts, message="; ".join(p for p in (message, *notes) if p),
        )
