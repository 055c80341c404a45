"""The nodes' weight caches as Nomad sees them: metadata written, prefetches, sweeps.

``CacheKeeper`` carries out what ``warmth`` decides. It runs inside the reconciler's
pass, on the leader only, and every call it makes is one the pass can lose without
harm: a key not written now is written on the next pass, a sweep not submitted now
is submitted on the next one. Its calls block; the backend runs them on its threads.

Each pass it reads the namespace's allocations once and:

* for every allocation whose fetch task (a replica's prestart fetch, a prefetch, or
  an adapter's fetch, ``adapterjob``) finished, sets the node's ``llmgw_cache_<name>``
  keys for the weights it fetched — unless the node's metadata already says so;
* for every sweep allocation that completed and was not read yet, reads its report
  through the client fs API and makes the node's keys exactly what the report holds;
* when ``cache_sweep`` has passed since the last sweep, submits a new one over every
  ready node with the cache volume, keeping the entries of running and starting
  allocations and every adapter's;
* for each model with ``scaling.prefetch`` N, starts a prefetch onto more nodes when
  fewer than N nodes that run none of its replicas hold its weights, and no prefetch
  of it is under way; one model's failure to start one is recorded on that model
  (``prefetch_errors``) and the others' are kept all the same.

**Its own writes, remembered.** A node's metadata written through
``/v1/client/metadata`` is the client's at once, but the servers — ``GET
/v1/node/:id``, and so ``observe``'s next read — show it only after the client's
batched re-register, 5 to 10 s later (client/client.go ``watchNodeUpdates``,
``retryIntv``). A pass in between would see a node it just marked as cold: write the
key again, and — worse — count too few warm nodes and prefetch again onto nodes that
already hold the weights. So every write is remembered per node and key, and laid
over what Nomad shows until Nomad shows it too (or ``PENDING_FOR`` passes: a client
that never reports it is not believed forever). The fleet view's ``warm`` reads the
same overlay.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import Catalog
from llmgw.catalog.model import GpuClass, Model
from llmgw.config import NomadConfig
from llmgw.errors import BackendUnavailableError, LlmgwError, NotFoundError, RefusedError
from llmgw.scheduler.base import NodeView, Prefetch, PrefetchNode
from llmgw.scheduler.nomad import adapterjob, credentials, render, warmth, wire
from llmgw.scheduler.nomad.client import NomadClient
from llmgw.weights import cache

log = logging.getLogger("llmgw.nomad")
_LIVE = ("pending", "running")
# How long a metadata write is believed before Nomad shows it: far beyond a client's
# re-register (10 s at most, then retried), short enough that a lost one is redone.
PENDING_FOR = 300.0


class CacheKeeper:
    def __init__(self, client: NomadClient, cfg: NomadConfig, classes: Mapping[str, GpuClass],
                 mirror: str | None, keeper: credentials.Keeper, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._client, self._cfg, self._classes = client, cfg, classes
        self._mirror, self._keeper, self._clock = mirror, keeper, clock
        self._models: list[Model] = []   # the catalog's, as the last pass saw it
        self._adapters: list[Adapter] = []
        # The first sweep waits one interval: a restarted control plane would otherwise
        # submit one to every node each time it starts.
        self._last_sweep = clock()
        self._reports_read: set[str] = set()   # sweep allocations already applied
        # allocation ID → the weights tag its job version fetches (its job's meta, fixed
        # for the allocation's life): what a finished fetch proves, and what a running
        # replica of an older version still uses after its model's source changed.
        self._tags: dict[str, str | None] = {}
        self._lock = threading.Lock()
        # model → why its kept prefetch (scaling.prefetch) could not be started
        self.prefetch_errors: dict[str, str] = {}
        # node ID → key → (value written, None for an unset; when): until Nomad shows it
        self._written: dict[str, dict[str, tuple[str | None, float]]] = {}

    # ---- each pass ------------------------------------------------------------

    def observe(self, catalog: Catalog) -> None:
        """One pass over the caches (blocking; the leader's reconciler calls it)."""
        nodes = {n.ID: n for n in self._client.nodes()}
        allocs = [a for a in self._client.namespace_allocations()
                  if a.JobID.startswith(("llmgw-", warmth.PREFETCH_PREFIX, warmth.SWEEP_JOB,
                                         adapterjob.ADAPTER_PREFIX))]
        models = list(catalog)
        self._models = models
        self._adapters = list(catalog.adapters.values())
        for gone in set(self.prefetch_errors) - {m.name for m in models}:
            del self.prefetch_errors[gone]
        listed = {a.ID for a in allocs}
        for gone in set(self._tags) - listed:
            del self._tags[gone]
        self._record_fetches(allocs, nodes, catalog)
        self._apply_reports(allocs, nodes, models)
        self._maybe_sweep(allocs, nodes, catalog)
        self._keep_prefetched(allocs, nodes, catalog)

    @staticmethod
    def _adapter_of(job: str, catalog: Catalog) -> bool:
        """Whether ``job`` fetches an adapter the catalog has (``adapterjob``)."""
        found = adapterjob.of_job(job)
        return found is not None and found[0] in catalog.adapters

    def _model_of(self, job: str, catalog: Catalog) -> Model | None:
        name = render.model_of_job(job) or warmth.model_of_prefetch(job)
        return catalog.get(name) if name else None

    def meta(self, node: wire.Node) -> dict[str, str]:
        """The node's metadata as llmgw knows it: Nomad's, with llmgw's own writes that
        Nomad does not show yet laid over it."""
        out = dict(node.Meta or {})
        now = self._clock()
        with self._lock:
            pending = self._written.get(node.ID)
            if not pending:
                return out
            for key, (value, at) in list(pending.items()):
                shown = out.get(key) == value if value is not None else key not in out
                if shown or now - at > PENDING_FOR:
                    del pending[key]
                elif value is None:
                    out.pop(key, None)
                else:
                    out[key] = value
            if not pending:
                del self._written[node.ID]
        return out

    def fleet_views(self, nodes: Sequence[wire.Node] | None = None,
                    allocs: Sequence[wire.Allocation] | None = None,
                    models: Sequence[Model] = ()) -> list[NodeView]:
        """The fleet's nodes, each with the models whose weights it holds by ``meta``."""
        from llmgw.scheduler.nomad.fleet import build_fleet

        nodes = list(nodes) if nodes is not None else self._client.nodes()
        allocs = list(allocs) if allocs is not None else self._client.all_allocations()
        views = build_fleet(nodes, allocs, self._classes, self._cfg.fabric_meta_key).nodes
        by_id = {n.ID: n for n in nodes}
        known = list(models) or self._models
        return [msgspec.structs.replace(v, warm=warmth.holds(
            self.meta(by_id[v.id]) if v.id in by_id else None, known, self._mirror))
            for v in views]

    def _write(self, node: wire.Node, body: dict[str, str | None]) -> None:
        if not body:
            return
        try:
            self._client.apply_node_meta(node.ID, body)
        except NotFoundError:
            return   # the node is gone, or down: its keys are set again when it is back
        now = self._clock()
        with self._lock:
            pending = self._written.setdefault(node.ID, {})
            for key, value in body.items():
                pending[key] = (value, now)
        log.info("node %s: cache metadata %s", node.Name or node.ID,
                 ", ".join(f"{k}={v or '(unset)'}" for k, v in sorted(body.items())))

    def _tag(self, a: wire.Allocation) -> str | None:
        """The weights tag of the allocation's own job version (read once per allocation)."""
        if a.ID not in self._tags:
            try:
                full = self._client.allocation(a.ID)
            except NotFoundError:
                return None
            self._tags[a.ID] = ((full.Job.Meta if full.Job else None) or {}).get(
                render.META_WEIGHTS)
        return self._tags[a.ID]

    def _record_fetches(self, allocs: Sequence[wire.Allocation], nodes: Mapping[str, wire.Node],
                        catalog: Catalog) -> None:
        found: dict[str, set[str]] = {}
        for a in allocs:
            m = self._model_of(a.JobID, catalog)
            fetching = (m is not None and not m.external) or self._adapter_of(a.JobID, catalog)
            if not fetching or a.NodeID not in nodes or not warmth.fetched(a):
                continue
            tag = self._tag(a)
            if tag is not None:
                found.setdefault(a.NodeID, set()).add(tag)
        for node_id, tags in found.items():
            node = nodes[node_id]
            wanted = warmth.keys_for(tags, catalog, self._mirror, self._adapters)
            self._write(node, warmth.changes(self.meta(node), wanted, complete=False))

    def _apply_reports(self, allocs: Sequence[wire.Allocation],
                       nodes: Mapping[str, wire.Node], models: Sequence[Model]) -> None:
        done = [a for a in allocs if a.JobID == warmth.SWEEP_JOB
                and a.ClientStatus == "complete" and a.ID not in self._reports_read]
        for a in done:
            node = nodes.get(a.NodeID)
            data = self._client.alloc_file(a.ID, warmth.REPORT_FILE)
            self._reports_read.add(a.ID)
            if node is None or data is None:
                continue
            try:
                report = msgspec.json.decode(data, type=cache.Report)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("node %s: the cache sweep's report is unreadable (%s)",
                            node.Name or node.ID, exc)
                continue
            for e in report.evicted:
                log.info("node %s: evicted %s (%d bytes, last used %s)", node.Name or node.ID,
                         e.path, e.size, time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.used)))
            wanted = warmth.keys_for((e.tag for e in report.entries), models, self._mirror,
                                     self._adapters)
            self._write(node, warmth.changes(self.meta(node), wanted, complete=True))

    def _maybe_sweep(self, allocs: Sequence[wire.Allocation], nodes: Mapping[str, wire.Node],
                     catalog: Catalog) -> None:
        now = self._clock()
        if now - self._last_sweep < self._cfg.cache_sweep:
            return
        targets = sorted(n.ID for n in nodes.values() if n.Status == "ready" and not n.Drain
                         and self._cfg.cache_volume in (n.HostVolumes or {}))
        # Every adapter's entry: a replica that pushed one out of its host memory reads
        # it from disk again at the next request for it, and they are small.
        keep = {found[1] for ad in catalog.adapters.values()
                if (found := render.adapter_fetch_of(ad, self._mirror)) is not None}
        for a in allocs:
            if render.model_of_job(a.JobID) is None or a.ClientStatus not in _LIVE:
                continue
            m = self._model_of(a.JobID, catalog)
            entry = render.weights_entry(m, self._mirror) if m and not m.external else None
            if entry is not None:
                keep.add(entry)
            # What this allocation's own version fetched, whatever the catalog says now.
            tag = self._tag(a)
            if tag is not None:
                keep.add(tag)
        self._last_sweep = now
        if not targets:
            return
        # An hour of slack for the nodes' clocks: an entry stamped within it is spared.
        job = warmth.sweep_job(self._cfg, targets, keep, since=now - 3600, run=f"{now:.0f}")
        self._client.register(job)
        log.info("submitted a cache sweep of %d nodes (%d entries kept)", len(targets),
                 len(keep))

    def _keep_prefetched(self, allocs: Sequence[wire.Allocation],
                         nodes: Mapping[str, wire.Node], catalog: Catalog) -> None:
        for m in catalog:
            want = m.scaling.prefetch
            if not want or warmth.prefetch_refusal(m, self._mirror) is not None:
                continue
            pid = warmth.prefetch_job_id(m.name)
            if any(a.JobID == pid and a.ClientStatus in _LIVE for a in allocs):
                continue   # one under way: judge again when it is done
            serving = {a.NodeID for a in allocs if a.JobID == render.job_id(m.name)
                       and a.ClientStatus in _LIVE}
            warm = {nid for nid, n in nodes.items()
                    if m.name in warmth.holds(self.meta(n), [m], self._mirror)}
            short = want - len(warm - serving)
            if short <= 0:
                self.prefetch_errors.pop(m.name, None)
                continue
            try:
                # Not onto nodes serving it: their own fetch brings the weights there.
                started = self.prefetch(m, None, short, views=None, skip=serving)
            except RefusedError as exc:
                log.info("model %s: keeps its weights on %d of %d spare nodes: %s",
                         m.name, len(warm - serving), want, exc.message)
                self.prefetch_errors.pop(m.name, None)
                continue
            except BackendUnavailableError:
                raise    # Nomad is down: the pass stops, every model alike
            except LlmgwError as exc:
                # This model's own trouble (its credentials, a job Nomad refuses): said on
                # the model, and the other models' prefetches are kept all the same.
                if self.prefetch_errors.get(m.name) != exc.message:
                    log.warning("model %s: cannot prefetch its weights: %s", m.name,
                                exc.message)
                self.prefetch_errors[m.name] = exc.message
                continue
            self.prefetch_errors.pop(m.name, None)
            log.info("model %s: prefetching onto %s to keep its weights on %d spare "
                     "nodes", m.name, ", ".join(p.node for p in started.nodes), want)

    # ---- prefetch -------------------------------------------------------------

    def prefetch(self, m: Model, nodes: list[str] | None, count: int | None, *,
                 views: Sequence[NodeView] | None,
                 skip: set[str] | frozenset[str] = frozenset()) -> Prefetch:
        """Submit the prefetch job of ``m`` onto the named nodes, or onto ``count`` chosen
        ones (blocking): nodes not warm for it (by ``meta``, llmgw's own writes included)
        nor in ``skip``."""
        why = warmth.prefetch_refusal(m, self._mirror)
        if why is not None:
            raise RefusedError(why)
        if views is None:
            views = self.fleet_views(models=[m])
        need = render.need_of(m, m.profiles[0], self._cfg, self._classes)
        warm = {v.id for v in views if m.name in v.warm}
        if nodes:
            chosen = [_resolve(views, n) for n in nodes]
        else:
            chosen = warmth.choose_nodes(need, views, warm | set(skip), count or 1)
            if not chosen:
                raise RefusedError(
                    f"model {m.name!r}: every node that could run it holds its weights "
                    "already, or none is ready; `llmgw ctl fleet` shows them")
        jid = warmth.prefetch_job_id(m.name)
        # Its fetch reads the same credentials as the model's replicas, from its own path.
        self._keeper.ensure(m, render.job_id(m.name))
        self._keeper.ensure(m, jid, fallback_job=render.job_id(m.name))
        keys = credentials.needs(m, self._cfg, self._mirror).fetch
        job = warmth.prefetch_job(m, self._cfg, self._mirror, [v.id for v in chosen],
                                  run=uuid.uuid4().hex[:12], keys=keys)
        self._client.register(job)
        return Prefetch(model=m.name, warm=sorted(v.name for v in views if v.id in warm),
                        nodes=[PrefetchNode(node=v.name, state="queued") for v in chosen],
                        message=f"fetching {m.name}'s weights onto "
                                f"{', '.join(v.name for v in chosen)}")

    def status(self, m: Model, views: Sequence[NodeView]) -> Prefetch:
        """The latest prefetch of ``m`` node by node, with the fetch's progress (blocking)."""
        names = {v.id: v.name for v in views}
        warm = sorted(v.name for v in views if m.name in v.warm)
        try:
            allocs = self._client.job_allocations(warmth.prefetch_job_id(m.name))
        except NotFoundError:
            allocs = []
        latest = max((a.JobVersion for a in allocs), default=None)
        out = []
        for a in sorted((a for a in allocs if a.JobVersion == latest),
                        key=lambda a: names.get(a.NodeID, a.NodeName)):
            node = names.get(a.NodeID, a.NodeName or a.NodeID)
            out.append(self._node_state(a, node))
        if not allocs:
            message = "no prefetch has run" if not warm else ""
        elif all(p.state == "done" for p in out):
            message = "done"
        else:
            message = f"{sum(p.state == 'done' for p in out)} of {len(out)} nodes done"
        return Prefetch(model=m.name, nodes=out, warm=warm, message=message)

    def _node_state(self, a: wire.Allocation, node: str) -> PrefetchNode:
        if a.ClientStatus == "complete":
            return PrefetchNode(node=node, state="done", percent=100.0)
        if a.ClientStatus in ("failed", "lost"):
            events = [e.DisplayMessage for s in (a.TaskStates or {}).values()
                      for e in s.Events or () if e.DisplayMessage]
            return PrefetchNode(node=node, state="failed",
                                message=events[-1] if events else a.ClientDescription)
        state = (a.TaskStates or {}).get(render.FETCH_TASK)
        if a.ClientStatus != "running" or state is None or state.State != "running":
            return PrefetchNode(node=node, state="queued")
        return PrefetchNode(node=node, state="fetching", percent=self.progress(a.ID))

    def progress(self, alloc_id: str) -> float | None:
        """The share of the weights a running fetch has on disk, from its progress file."""
        try:
            data = self._client.alloc_file(alloc_id, render.PROGRESS_FILE, timeout=2.0)
        except LlmgwError:
            return None
        p = cache.read_progress(data) if data else None
        return p.percent if p else None


def _resolve(views: Sequence[NodeView], wanted: str) -> NodeView:
    """A node by name, ID or unique ID prefix (as ``nomad node status`` takes them)."""
    exact = [v for v in views if wanted in (v.name, v.id)]
    found = exact or [v for v in views if v.id.startswith(wanted)]
    if len(found) != 1:
        what = "no node" if not found else f"{len(found)} nodes"
        raise NotFoundError(f"{what} named {wanted!r} (a name, ID or ID prefix); "
                            "`llmgw ctl fleet` lists them")
    if not found[0].schedulable:
        raise RefusedError(f"node {found[0].name} is {found[0].status}: Nomad places nothing "
                           "there; choose a ready node")
    return found[0]
