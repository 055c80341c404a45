"""Bringing a LoRA adapter's weights onto the node of the replica that loads it (pure).

vLLM loads an adapter from a path (``/v1/load_lora_adapter`` ``lora_path``), and on
Nomad the path is in the node's cache volume, where the base's weights are: the
mirror URL's ``render.cache_path``. An adapter is added at run time, after its
base's replicas started, so nothing in the base's job put it there. This module
renders the job that does, and judges its outcome; ``adapterstage`` does the I/O.

**A batch job per adapter and node**, ``llmgw_adapter_<adapter>_<node ID>``, one
allocation pinned to the node (``${node.unique.id}`` ``=``), running ``llmgw fetch``
into the cache volume as ``fetch_user`` — the task a prefetch runs, with the same
mirror, checksums and progress file. The gateway asks for it when it is about to
load the adapter on a replica whose node does not hold it, and waits for it inside
the load's bound (``gateway.adapter_load_wait``). The alternatives weighed:

* a **poststart sidecar in the base's group** that watches which adapters its
  replica should hold: adding it changes the base's job, so every replica is
  replaced the first time (against "adapter changes never restart the base"); it
  would have to learn what to fetch from somewhere — a Variable it polls, or the
  gateway — and a long-running task with a token or a network path back to llmgw on
  every node is more standing privilege than a job that runs for seconds; and it
  holds CPU and memory for the life of the replica to do nothing most of the time;
* **a fetch inside the engine's container** (vLLM downloads from the Hub with
  ``lora_path`` a repo name): the replica would reach the Hub, never the mirror,
  with no checksum and a token in the engine's environment; refused by the rule
  that a replica loads an adapter from local disk only;
* **one job per adapter** with a count per node: Nomad runs every allocation of a
  new batch version again (scheduler/reconciler/filters.go
  ``filterOldTerminalAllocs`` sets aside the terminal allocations of older versions), so
  adding a node would refetch onto every node that already has it, and a second
  gateway adding another node would kill the first's fetch in flight.

One job per (adapter, node) makes every fetch its own job: two gateway processes
asking for the same one register one spec — the second register is checked with
``EnforceIndex`` against the index it read, 0 for "create only" (nomad/job_endpoint.go
``Register``, which calls ``Job.EnforceIndex`` before it applies anything;
docs/nomad-api.md §1.1, "Check-and-set"), so one of them registers and both wait on
the same allocation. A finished attempt's allocation keeps its place for its
version, and a new version runs again (docs/nomad-api.md, "Node metadata at run
time, affinities, allocation files"), which is how a fetch is tried again.
A fetch is tried once (restart and reschedule attempts 0): the gateway, not
Nomad, decides whether to try again — on the next request, or on another replica.

**The job ID is a Variable path.** The fetch reads a mirror or source password from
``nomad/jobs/<job ID>`` as a prefetch does (``warmth``); Nomad allows
``[a-zA-Z0-9-_~/]{1,128}`` there (nomad/structs/variables.go ``validVariablePath``).
A catalog name is at most 57 of ``[a-z0-9-]`` and a node ID a 36-character UUID,
so the path is at most 119 characters, and the last underscore splits it back.

**When it fails** the fetch's progress file (in the allocation directory, read with
``read-fs`` as a prefetch's progress is) carries the error ``llmgw fetch`` printed —
a 404 from the mirror, a checksum that does not match, a cache it may not write —
and that reason is what the gateway's 503 says; a request for the adapter is never
answered by the base instead.

**Warmth.** A finished fetch sets the node's ``llmgw_cache_<adapter>`` metadata to the
tag of the entry it filled, as a model's fetch does (a name is either a model's or
an adapter's, never both, so the key space is shared); the leader's ``CacheKeeper``
writes it, and the gateway prefers a replica on a node that holds the adapter when
it chooses where to load it (``adapterplace``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.config import NomadConfig
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.jobspec import ns
from llmgw.scheduler.nomad.placement import metric_text
from llmgw.scheduler.nomad.render import (
    CACHE_VOLUME,
    FETCH_TASK,
    META_WEIGHTS,
    adapter_fetch_of,
    cache_key,
    fetch_task,
)
from llmgw.scheduler.nomad.warmth import fetched
from llmgw.weights import cache

ADAPTER_PREFIX = "llmgw_adapter_"
ADAPTER_GROUP = "fetch"
META_KIND = "llmgw_kind"
META_ADAPTER = "llmgw_adapter"
META_RUN = "llmgw_run"
# An adapter is megabytes, not gigabytes: a small share of the node, so the fetch
# places beside replicas that reserve nearly all of it. The prefetch's 500 MHz and
# 512 MiB would not fit on a node whose memory the replicas took.
_CPU_MHZ, _MEMORY_MB = 200, 256
_NO_RESTART = js.RestartPolicy(Attempts=0, Interval=ns(600), Delay=ns(1), Mode="fail")
_NO_RESCHEDULE = js.ReschedulePolicy(Unlimited=False, Attempts=0, Interval=ns(600),
                                     Delay=ns(1), DelayFunction="constant", MaxDelay=ns(1))


fetch_of = adapter_fetch_of


def job_id(adapter: str, node_id: str) -> str:
    return f"{ADAPTER_PREFIX}{adapter}_{node_id}"


def of_job(job: str) -> tuple[str, str] | None:
    """(adapter, node ID) of an adapter fetch's job ID; None for any other job."""
    if not job.startswith(ADAPTER_PREFIX):
        return None
    name, sep, node = job[len(ADAPTER_PREFIX):].rpartition("_")
    return (name, node) if sep and name and node else None


def fetch_job(adapter: Adapter, cfg: NomadConfig, mirror: str | None, node_id: str,
              run: str, keys: tuple[str, ...] = ()) -> js.Job:
    """The batch job fetching ``adapter`` onto node ``node_id`` once. ``run`` makes each
    attempt a new version; ``keys``: the credentials its fetch reads from its own
    Variable. The caller checked ``render.adapter_fetch_of``."""
    found = adapter_fetch_of(adapter, mirror)
    assert found is not None, f"adapter {adapter.name!r} is not fetched onto nodes"
    url, entry = found
    jid = job_id(adapter.name, node_id)
    base = fetch_task(cfg, url, entry, jid, keys, prestart=False)
    task = msgspec.structs.replace(base, Resources=js.Resources(CPU=_CPU_MHZ,
                                                                 MemoryMB=_MEMORY_MB))
    group = js.TaskGroup(
        Name=ADAPTER_GROUP, Count=1,
        Constraints=[js.Constraint(LTarget="${node.unique.id}", Operand="=",
                                   RTarget=node_id)],
        Volumes={CACHE_VOLUME: js.VolumeRequest(Name=CACHE_VOLUME, Type="host",
                                                Source=cfg.cache_volume, ReadOnly=False)},
        Tasks=[task], RestartPolicy=_NO_RESTART, ReschedulePolicy=_NO_RESCHEDULE)
    meta = {META_KIND: "adapter", META_ADAPTER: adapter.name, META_WEIGHTS: cache.tag(entry),
            META_RUN: run}
    return js.Job(ID=jid, Name=jid, Type="batch", Namespace=cfg.namespace or None,
                  Region=cfg.region or None, Datacenters=list(cfg.datacenters),
                  NodePool=cfg.node_pool or None, Meta=meta, TaskGroups=[group])


class Outcome(msgspec.Struct, frozen=True):
    """Where the latest attempt of a fetch is: not tried (``none``), ``running`` (placed
    or not yet), ``done``, or ``failed`` with the reason."""

    state: Literal["none", "running", "done", "failed"]
    reason: str = ""


def outcome(version: int | None, allocs: Sequence[wire.Allocation],
            progress_error: str | None = None,
            unplaced: wire.AllocationMetric | None = None) -> Outcome:
    """The outcome of the job's version ``version`` (None: no job) from its allocations;
    ``progress_error``: what the failed fetch wrote to its progress file; ``unplaced``:
    why the evaluation of that version placed nothing (its failed-allocation metric).

    A fetch Nomad cannot place on its node (the node is full, draining, or lacks the
    cache volume) is a failure at once rather than a wait to the gateway's bound: its
    evaluation stays blocked until the node changes, which a request cannot wait for,
    and the operator reads Nomad's reason in the 503."""
    if version is None:
        return Outcome("none")
    mine = [a for a in allocs if a.JobVersion == version]
    if not mine:
        if unplaced is not None:
            return Outcome("failed", f"Nomad cannot place the fetch on the node "
                                     f"({metric_text(unplaced)})")
        return Outcome("running")     # registered; the evaluation has not placed it yet
    latest = max(mine, key=lambda a: a.CreateIndex)
    if latest.ClientStatus == "complete" and fetched(latest):
        return Outcome("done")
    if latest.ClientStatus in ("pending", "running") and latest.DesiredStatus == "run":
        return Outcome("running")
    return Outcome("failed", progress_error or _said(latest))


def _said(a: wire.Allocation) -> str:
    """The fetch task's last words as Nomad records them, when its own are not there."""
    state = (a.TaskStates or {}).get(FETCH_TASK)
    events = [e.DisplayMessage for e in (state.Events if state else None) or ()
              if e.DisplayMessage]
    words = events[-1] if events else ""
    status = a.ClientDescription or a.ClientStatus or "stopped"
    return f"{status} ({words})" if words else status


def warm(meta: Mapping[str, str] | None, adapter: Adapter, mirror: str | None) -> bool:
    """Whether a node's metadata says its cache holds ``adapter``'s weights."""
    found = adapter_fetch_of(adapter, mirror)
    return found is not None and (meta or {}).get(cache_key(adapter.name)) == \
        cache.tag(found[1])

