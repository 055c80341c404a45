"""The Nomad backend: the catalog as Nomad jobs, and Nomad's view back as replicas and fleet.

``NomadBackend`` implements ``llmgw.scheduler.base.Backend``. Decisions are
made by the pure modules beside it (``render``, ``placement``, ``fleet``,
``reconcile``); this module only fetches, acts, and remembers what happened
so that ``status()`` and ``health()`` can answer without I/O.

The reconciler runs in its own task: ``apply()`` records the catalog and
wakes it, so an add, scale or remove answers without waiting on Nomad, and
``reconciled()`` waits for the pass that follows. It acts only while this
process holds the store's ``reconciler`` lease, so several API instances
behind one load balancer never register the same job twice or fight over a
count. A pass can take long (serial Nomad calls, each with its own
timeout) while the lease lasts ``lease_ttl``, so the lease is renewed right
before every register, scale and deregister, and the pass stops acting the
moment it is lost; the acting part of a pass is also cut off after half the
lease and resumed by the next pass.

Nothing is deregistered before the first ``apply()``: until then the
reconciler has no catalog and runs no pass, so a process that starts during
a store outage cannot mistake "no catalog yet" for "every model removed".
(That the catalog handed to ``apply()`` includes the runtime models is the
caller's side: it applies one only after loading it from the store.) Explicit
operator actions — ``rollout`` — and the gateway's on-demand scaling
(``set_demand``) act from whichever instance received them: they are one
request each, and waiting for the leader would only add latency.

Each pass also reads every job's latest deployment, and re-submits a job
whose current version's deployment failed while replicas are missing —
Nomad places none of them after such a failure (``reconcile`` argues the
design, and why llmgw keeps deployments at all).

When Nomad answers 403, its ACL refuses llmgw's own token something
(``BackendPermissionError`` says what the call needed and from which token). That is
no outage: the reconciler keeps its interval rather than backing off, records the
refusal on the model whose action it was (``status().refused``, shown by ``ctl
replicas``, the API and the admin page) and logs it once with the fix; ``health()``
stays ok — Nomad is reachable and the gateway routes as ever — and names the refusal.

When Nomad cannot be reached the reconciler retries with exponential
back-off (1 s doubling to ``backoff_max``), ``health()`` reports the outage
with the time it began, and discovery keeps the endpoints it last knew
healthy. Other failures are per model: a job Nomad refuses, or a
profile no node can run, is recorded on that model (``status().last_error``)
and logged, and the pass goes on with the next model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import DECLARED, Catalog
from llmgw.catalog.model import Model, Profile
from llmgw.config import ServerConfig
from llmgw.errors import (
    BackendPermissionError,
    BackendUnavailableError,
    DefinitionError,
    LlmgwError,
    NotFoundError,
    PlacementError,
)
from llmgw.scheduler.base import (
    BackendHealth,
    Fleet,
    Holding,
    ModelStatus,
    NodeView,
    Prefetch,
    Replica,
)
from llmgw.scheduler.nomad import credentials, jobui, render, wire
from llmgw.scheduler.nomad import jobspec as js
from llmgw.scheduler.nomad.adapterstage import AdapterStager
from llmgw.scheduler.nomad.caches import CacheKeeper
from llmgw.scheduler.nomad.client import JobChangedError, NomadClient, ScaleBlockedError
from llmgw.scheduler.nomad.discovery import Discovery, backoff_delay
from llmgw.scheduler.nomad.fleet import build_fleet
from llmgw.scheduler.nomad.holdings import holdings_of
from llmgw.scheduler.nomad.offload import Offloader
from llmgw.scheduler.nomad.placement import Verdict, classify, failed_metric, latest_failure
from llmgw.scheduler.nomad.reconcile import (
    Actions,
    JobState,
    VersionAllocs,
    decide,
    job_state,
    latest_deployments,
    shortfall,
    version_allocs,
)
from llmgw.scheduler.nomad.replicas import ReplicaReader
from llmgw.scheduler.nomad.warmth import holds
from llmgw.store.base import Store

log = logging.getLogger("llmgw.nomad")
LEASE = "reconciler"
# How much of an engine's log the admin console's replica page reads: its last lines.
LOG_TAIL = 64 * 1024


@dataclass
class _ModelState:
    desired: int = 0
    waiting: str | None = None
    profile: str | None = None      # the profile its job runs, as last registered or read
    last_failure: str | None = None
    last_error: str | None = None
    stale: str | None = None
    crash_loop: bool = False
    shortfall: str | None = None
    deployment_failed: str | None = None
    refused: str | None = None      # what Nomad refuses llmgw's token for this model


@dataclass
class _Choice:
    job: js.Job | None
    verdict: Verdict
    tried: list[str] = field(default_factory=list)


class _LeaseLostError(Exception):
    """Another instance holds the reconciler lease now (or the store cannot say)."""


class NomadBackend:
    def __init__(self, config: ServerConfig, store: Store | None = None, *,
                 holder: str | None = None, reconcile_interval: float = 10.0,
                 check_interval: float = 2.0, watch_wait: float = 30.0,
                 lease_ttl: float = 30.0, backoff_max: float = 60.0) -> None:
        self._cfg = config.scheduler.nomad
        self._classes = dict(config.gpu_classes)
        self._mirror = config.mirror
        self._links = jobui.Links.of(config)
        self._store = store
        self._holder = holder or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._interval = reconcile_interval
        self._lease_ttl = lease_ttl
        self._backoff_max = backoff_max
        self._client = NomadClient(self._cfg)
        self._watch_client = NomadClient(self._cfg)  # its own session for the long polls
        self._offload = Offloader()
        self._discovery = Discovery(
            self._watch_client, self._offload, wait=watch_wait, check_interval=check_interval,
            backoff_max=backoff_max, on_outage=self._outage, on_ok=self._ok)
        self._replicas = ReplicaReader(self._client, self._offload)
        self._keeper = credentials.Keeper(self._client, self._cfg, config.mirror)
        self._cache_failure: str | None = None
        self._caches = CacheKeeper(self._client, self._cfg, self._classes, config.mirror,
                                   self._keeper)
        self._stager = AdapterStager(self._client, self._offload, self._cfg, config.mirror,
                                     self._keeper, self._discovery.node_of)
        self._catalog: Catalog | None = None
        self._states: dict[str, _ModelState] = {}
        self._counts: dict[str, tuple[int, int]] = {}   # job ID → (ModifyIndex, count)
        # job ID → the job as last read (version, ui block), good while its JobModifyIndex is
        self._versions: dict[str, wire.JobVersion] = {}
        # job ID → (what the summary said when read, the current version's allocations)
        self._current: dict[str, tuple[tuple[int, ...], VersionAllocs]] = {}
        self._pass_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._applied = 0           # apply() calls so far
        self._reconciled = 0        # the apply() count the last finished pass started from
        self._pass_done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._next_attempt = 0.0
        self._outages: dict[str, tuple[str, float]] = {}   # loop → (message, retry in)
        self._outage_since: float | None = None
        # What Nomad refused a whole pass (reading llmgw's jobs, say): no outage
        self._refusal: str | None = None
        self.leader = store is None

    # ---- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        self._discovery.start()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="llmgw-nomad-reconciler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._discovery.close()
        await self._stager.close()
        if self._store is not None and self.leader:
            try:
                await self._store.release_lease(LEASE, self._holder)
            except LlmgwError as exc:
                log.warning("releasing the reconciler lease: %s", exc)
        self._client.close()
        self._watch_client.close()

    # ---- health -------------------------------------------------------------

    def _outage(self, where: str, exc: BackendUnavailableError, retry_in: float) -> None:
        if self._outage_since is None:
            self._outage_since = time.time()
            log.warning("Nomad is unreachable (%s): %s", where, exc)
        self._outages[where] = (exc.message, retry_in)

    def _ok(self, where: str) -> None:
        self._outages.pop(where, None)
        if not self._outages and self._outage_since is not None:
            log.info("Nomad at %s is reachable again", self._cfg.address)
            self._outage_since = None

    def _refusals(self) -> list[str]:
        found = [self._refusal] if self._refusal else []
        found += [f"model {name}: {ms.refused}" for name, ms in sorted(self._states.items())
                  if ms.refused]
        return found

    def health(self) -> BackendHealth:
        refused = self._refusals()
        summary = None
        if refused:
            more = (f" (and {len(refused) - 1} more; `llmgw ctl replicas` lists them)"
                    if len(refused) > 1 else "")
            summary = refused[0] + more
        if self._outage_since is None:
            message = f"Nomad at {self._cfg.address}"
            if summary:
                message += (" answers, and refuses llmgw's token what some models need: "
                            f"{summary}")
            return BackendHealth(ok=True, message=message, refused=summary)
        where, (message, retry) = next(iter(self._outages.items()))
        return BackendHealth(
            ok=False, since=self._outage_since,
            message=(f"{message} ({where}; retrying in {retry:.0f}s with back-off; the gateway "
                     "keeps routing to the replicas it last knew healthy)"),
            refused=summary,
        )

    # ---- the reconciler -----------------------------------------------------

    async def apply(self, catalog: Catalog) -> None:
        """Record the catalog in force and wake the reconciler; returns at once."""
        self._catalog = catalog
        self._discovery.set_models(m.name for m in catalog if not m.external)
        for name in list(self._states):
            if name not in catalog:
                del self._states[name]
        self._applied += 1
        self._wake.set()   # in back-off, the loop still waits until the retry is due

    async def reconciled(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until a pass that began after the latest ``apply()`` has finished.

        Finished, not succeeded: a pass that met an unreachable Nomad counts
        (``health()`` says so). Raises TimeoutError after ``timeout`` seconds.
        """
        target = self._applied
        async with asyncio.timeout(timeout):
            while self._reconciled < target:
                await self._pass_done.wait()

    async def _loop(self) -> None:
        crashes = 0
        while True:
            try:
                wait = max(0.0, self._next_attempt - time.monotonic())
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that races the event, and this loop would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                if self._wake.is_set():
                    self._wake.clear()
                    if self._failures and time.monotonic() < self._next_attempt:
                        continue
                await self._reconcile()
                crashes = 0
            except Exception:
                # _reconcile catches what a pass raises; this is for a bug around
                # it. The loop must outlive it (CancelledError is not an Exception).
                crashes += 1
                log.exception("the Nomad reconciler loop failed; retrying")
                await asyncio.sleep(backoff_delay(crashes, cap=self._backoff_max))

    async def _lead(self) -> bool:
        """Take or renew the lease; any failure of the store means not leader this pass."""
        if self._store is None:
            return True
        try:
            self.leader = await self._store.try_lease(LEASE, self._holder, self._lease_ttl)
        except Exception as exc:   # the store's own errors, and anything its driver raises
            log.warning("cannot take the reconciler lease (not acting this pass): %s", exc)
            self.leader = False
        return self.leader

    async def _hold(self) -> None:
        """Renew the lease right before a change to Nomad; raise _LeaseLostError if it is gone."""
        if not await self._lead():
            raise _LeaseLostError

    async def _reconcile(self) -> None:
        async with self._pass_lock:
            started_from = self._applied
            try:
                await self._reconcile_once()
            finally:
                self._reconciled = max(self._reconciled, started_from)
                done, self._pass_done = self._pass_done, asyncio.Event()
                done.set()

    async def _reconcile_once(self) -> None:
        catalog = self._catalog
        if catalog is None:
            self._next_attempt = time.monotonic() + self._interval
            return
        try:
            # Instances that do not hold the lease still read Nomad, so the API
            # of every instance reports status; only the leader acts.
            act = await self._lead()
            await self._pass(catalog, act=act)
            if catalog.adapters:
                await self._note_nodes()
        except BackendUnavailableError as exc:
            self._failures += 1
            delay = backoff_delay(self._failures, cap=self._backoff_max)
            self._next_attempt = time.monotonic() + delay
            self._outage("reconciler", exc, delay)
            return
        except BackendPermissionError as exc:
            # Nomad answered: no outage and no back-off, since waiting longer changes
            # nothing; the next pass tries again at the usual interval, and says so once.
            if exc.message != self._refusal:
                log.exception("Nomad refuses the reconciler: %s", exc.message)
            self._refusal = exc.message
            self._failures = 0
            self._ok("reconciler")
            self._next_attempt = time.monotonic() + self._interval
            return
        except _LeaseLostError:
            log.warning("lost the reconciler lease during a pass; stopped acting "
                        "(another instance reconciles now)")
            self._next_attempt = time.monotonic() + self._interval
            return
        except Exception:
            # Never let the loop die; the traceback says what to fix.
            log.exception("the Nomad reconciler pass failed")
            self._next_attempt = time.monotonic() + self._interval
            return
        self._failures = 0
        self._refusal = None
        self._ok("reconciler")
        self._next_attempt = time.monotonic() + self._interval

    def _state(self, model: str) -> _ModelState:
        return self._states.setdefault(model, _ModelState())

    async def _jobs(self, only: str | None = None) -> dict[str, tuple[JobState, wire.JobListStub]]:
        stubs = await self._offload.run(self._client.jobs, render.job_id(only or ""))
        out = {}
        for stub in stubs:
            st = job_state(stub)
            if st is not None and (only is None or st.model == only):
                out[st.id] = (st, stub)
        return out

    async def _count(self, st: JobState, stub: wire.JobListStub) -> int | None:
        cached = self._counts.get(st.id)
        if cached and cached[0] == stub.ModifyIndex:
            return cached[1]
        try:
            status = await self._offload.run(self._client.scale_status, st.id)
        except NotFoundError:
            return None
        group = status.TaskGroups.get(render.GROUP)
        if group is None:
            return None
        self._counts[st.id] = (stub.ModifyIndex, group.Desired)
        return group.Desired

    def _render(self, m: Model, p: Profile, count: int, catalog: Catalog | None = None
                ) -> js.Job:
        """The job of ``m`` with profile ``p``, its ``ui`` block included."""
        known = catalog or self._catalog
        origin = known.origin(m.name) if known is not None else DECLARED
        classes = (catalog.gpu_classes if catalog is not None else None) or self._classes
        return render.render_job(m, p, self._cfg, classes, count, self._mirror,
                                 ui=jobui.ui_block(m, p, self._links, origin))

    def _spec_of(self, model: Model, profile: str) -> str | None:
        p = model.profile(profile)
        if p is None:
            return None
        try:
            job = render.render_job(model, p, self._cfg, self._classes, 0, self._mirror)
        except DefinitionError:
            return None
        return job.Meta[render.META_SPEC]

    def _ui_of(self, model: Model, profile: str) -> str | None:
        p = model.profile(profile)
        if p is None or self._catalog is None:
            return None
        return jobui.key(jobui.ui_block(model, p, self._links, self._catalog.origin(model.name)))

    async def _job(self, st: JobState) -> wire.JobVersion:
        """The job's version and ui block, read again only when its JobModifyIndex moved
        (a register or a /scale): one read per job at start, then one per change."""
        cached = self._versions.get(st.id)
        if cached is not None and cached.JobModifyIndex == st.job_modify_index:
            return cached
        job = await self._offload.run(self._client.job_version, st.id)
        self._versions[st.id] = job
        return job

    async def _version(self, st: JobState) -> int:
        """The job's current version: its current deployment says so, else read the job."""
        d = st.current_deployment
        if d is not None:
            return d.JobVersion
        return (await self._job(st)).Version

    async def _current_allocs(self, st: JobState) -> VersionAllocs | None:
        """The current version's allocations, read again only when the summary moved."""
        seen = (st.job_modify_index, st.running, st.starting, st.failed, st.queued)
        cached = self._current.get(st.id)
        if cached and cached[0] == seen:
            return cached[1]
        try:
            version = await self._version(st)
            allocs = await self._offload.run(self._client.job_allocations, st.id)
        except NotFoundError:
            return None
        counted = version_allocs(version, allocs)
        self._current[st.id] = (seen, counted)
        return counted

    async def _read_jobs(self) -> dict[str, JobState]:
        """llmgw's jobs with their counts, latest deployments and — where the summary
        says something may be wrong — the current version's allocations."""
        found = await self._jobs()
        deployments = latest_deployments(
            await self._offload.run(self._client.deployments)) if found else {}
        states: dict[str, JobState] = {}
        for jid, (listed, stub) in found.items():
            if listed.stopped:
                states[jid] = listed
                continue
            try:
                ui: str | None = jobui.registered_key((await self._job(listed)).UI)
            except NotFoundError:
                ui = None   # gone since it was listed
            st = dataclasses.replace(listed, count=await self._count(listed, stub),
                                     deployment=deployments.get(jid), ui=ui)
            if st.may_crash_loop or st.short:
                st = dataclasses.replace(st, current=await self._current_allocs(st))
            states[jid] = st
        for gone in set(self._current) - set(states):
            del self._current[gone]
        for gone in set(self._versions) - set(states):
            del self._versions[gone]
        return states

    async def _pass(self, catalog: Catalog, *, act: bool) -> None:
        states = await self._read_jobs()
        actions = decide(catalog, states, self._spec_of, self._ui_of)
        nodes: list[NodeView] | None = None
        if not act:
            actions.register, actions.scale, actions.deregister = [], {}, []
            actions.recover, actions.describe = {}, {}
        elif not await self._act(catalog, states, actions):
            return
        else:
            await self._observe_caches(catalog)
        for m in catalog:
            live = states.get(render.job_id(m.name))
            if m.external or live is None or live.stopped:
                continue
            ms = self._state(m.name)
            ms.stale = actions.stale.get(m.name)
            ms.profile = live.profile
            ms.crash_loop = live.crash_loop
            ms.desired = actions.scale.get(
                m.name, live.count if live.count is not None else ms.desired)
            if m.name in actions.waiting:
                if nodes is None:
                    nodes = (await self.fleet()).nodes
                ms.waiting = await self._waiting_reason(m, live, nodes)
                ms.last_failure = ms.waiting
            else:
                ms.waiting = None
            ms.shortfall = shortfall(live, ms.waiting) if m.name not in actions.scale else None
            ms.deployment_failed = actions.deployment_failed.get(m.name)

    async def _act(self, catalog: Catalog, states: dict[str, JobState],
                   actions: Actions) -> bool:
        """Carry out the leader's actions; False when cut off at half the lease.

        The bound keeps one slow pass from outliving the lease it started
        with; what is left is decided afresh by the next pass, started at once.
        """
        bound = asyncio.timeout(self._lease_ttl / 2)
        try:
            async with bound:
                for m in catalog:
                    # A rotated credential reaches the Variable, and only it: the job,
                    # whose spec names the Variable and not its content, stays as it is.
                    if not m.external:
                        await self._guard(m.name, self._offload.run(
                            self._keeper.ensure, m, render.job_id(m.name)))
                for name in actions.register:
                    m = catalog.models[name]
                    await self._guard(name, self._register(m, _initial_count(m), leased=True))
                for name, count in actions.scale.items():
                    await self._guard(name, self._scale(
                        catalog.models[name], states[render.job_id(name)], count, leased=True))
                for name, count in actions.recover.items():
                    await self._guard(name, self._recover(states[render.job_id(name)], count))
                for name, count in actions.describe.items():
                    await self._guard(name, self._describe(
                        catalog.models[name], states[render.job_id(name)], count))
                for jid in actions.deregister:
                    await self._hold()
                    await self._offload.run(self._client.deregister, jid)
                    log.info("deregistered %s: its model left the catalog", jid)
                    self._counts.pop(jid, None)
        except TimeoutError:
            if not bound.expired():
                raise
            log.warning("the reconciler's changes to Nomad took longer than %.0fs (half the "
                        "lease); the next pass carries on", self._lease_ttl / 2)
            self._wake.set()
            return False
        return True

    async def _observe_caches(self, catalog: Catalog) -> None:
        """Node metadata, sweeps and kept prefetches (``caches``); a failure there is
        logged and retried next pass, never a reason to stop reconciling models."""
        try:
            await self._offload.run(self._caches.observe, catalog)
        except LlmgwError as exc:
            # A token without node:write (nomad/llmgw-policy.hcl allows that choice)
            # refuses every write: say so once, not every pass.
            if exc.message != self._cache_failure:
                log.warning("keeping the nodes' cache metadata: %s", exc.message)
            self._cache_failure = exc.message
        else:
            self._cache_failure = None

    async def _guard(self, model: str, action: object) -> None:
        """Run one model's action; a failure of that model is recorded, not raised."""
        assert asyncio.iscoroutine(action)
        try:
            await action
        except BackendUnavailableError:
            raise
        except BackendPermissionError as exc:
            ms = self._state(model)
            if exc.message != ms.refused:
                log.exception("model %s: %s", model, exc.message)
            ms.refused = exc.message
        except LlmgwError as exc:
            self._state(model).last_error = exc.message
            log.warning("model %s: %s", model, exc.message)

    async def _waiting_reason(self, m: Model, st: JobState, nodes: Sequence[NodeView]) -> str:
        evals = await self._offload.run(self._client.job_evaluations, st.id)
        metric = latest_failure(evals, render.GROUP)
        p = m.profile(st.profile)
        if metric is None or p is None:
            return "replicas are queued; Nomad has not yet said why"
        need = render.need_of(m, p, self._cfg, self._classes)
        return classify(need, metric, nodes).reason

    # ---- choosing a profile and registering ---------------------------------

    async def _choose(self, m: Model, count: int) -> _Choice:
        """The first profile that fits now; else the first that fits the fleet at all."""
        waiting: _Choice | None = None
        reasons: list[str] = []
        nodes: list[NodeView] | None = None
        for p in m.profiles:
            try:
                job = self._render(m, p, max(count, 1))
            except DefinitionError as exc:
                reasons.append(f"profile {p.name!r}: {exc.message}")
                continue
            plan = await self._offload.run(self._client.plan, job)
            metric = failed_metric(plan, render.GROUP)
            if metric is None:
                return _Choice(render.with_count(job, count), Verdict("fits"))
            if nodes is None:
                nodes = (await self.fleet()).nodes
            verdict = classify(render.need_of(m, p, self._cfg, self._classes), metric, nodes)
            if verdict.kind == "not_now" and waiting is None:
                waiting = _Choice(render.with_count(job, count), verdict)
            reasons.append(f"profile {p.name!r}: {verdict.reason}")
        if waiting is not None:
            return waiting
        return _Choice(None, Verdict("never", "; ".join(reasons)))

    async def _validate(self, m: Model, job: js.Job) -> None:
        errors = await self._offload.run(self._client.validate, job)
        if errors:
            raise DefinitionError(
                f"model {m.name!r}: Nomad at {self._cfg.address} finds job {job.ID} invalid: "
                + "; ".join(e.strip() for e in errors), field="profiles")

    async def _register(self, m: Model, count: int, *, leased: bool = False,
                        failed: JobState | None = None) -> None:
        """Choose a profile and register the job; ``leased``: the reconciler's, so
        only while this process still holds the lease. ``failed``: the job as it runs,
        when its current deployment failed — registering the very same spec again is
        a no-op for Nomad (no new version: nomad/job_endpoint.go ``Register``), so that
        case goes through ``/scale``, which always makes one."""
        ms = self._state(m.name)
        choice = await self._choose(m, count)
        if choice.job is None:
            ms.last_failure = choice.verdict.reason
            raise PlacementError(f"model {m.name!r} cannot be placed: {choice.verdict.reason}",
                                 field="profiles")
        await self._validate(m, choice.job)
        if leased:
            await self._hold()
        # Before the job: a template reading a Variable that is not there waits forever.
        await self._offload.run(self._keeper.ensure, m, choice.job.ID)
        if failed is not None and choice.job.Meta[render.META_SPEC] == failed.spec:
            await self._offload.run(self._client.scale, failed.id, render.GROUP, count,
                                    "llmgw: rollout after a failed deployment")
        else:
            await self._offload.run(self._client.register, choice.job)
        log.info("registered %s (profile %s, %d replicas)", choice.job.ID,
                 choice.job.Meta[render.META_PROFILE], count)
        ms.desired, ms.stale, ms.last_error, ms.refused = count, None, None, None
        ms.profile = choice.job.Meta[render.META_PROFILE]
        ms.waiting = choice.verdict.reason if choice.verdict.kind == "not_now" else None
        if ms.waiting:
            ms.last_failure = ms.waiting

    async def _scale(self, m: Model, st: JobState, count: int, *,
                     leased: bool = False) -> None:
        ms = self._state(m.name)
        if leased:
            await self._hold()
        try:
            await self._offload.run(self._client.scale, st.id, render.GROUP, count,
                                    f"llmgw: {m.name} to {count} replicas")
        except ScaleBlockedError:
            # /scale is refused while a deployment runs, which for a model load
            # can be an hour (docs/nomad-api.md §5.3). Re-registering with the new count does the
            # same thing — but only when the spec is the one registered, or it
            # would replace every replica.
            p = m.profile(st.profile)
            job = self._render(m, p, count) if p else None
            if job is None or job.Meta[render.META_SPEC] != st.spec:
                ms.last_error = (f"scaling to {count} waits for the running deployment to "
                                 "finish (the job's spec is stale, so it is not re-registered)")
                return
            if leased:
                await self._hold()
            await self._offload.run(self._client.register, job)
        ms.desired, ms.last_error, ms.refused = count, None, None
        self._counts.pop(st.id, None)
        log.info("scaled %s to %d", st.id, count)

    async def _describe(self, m: Model, st: JobState, count: int) -> None:
        """Register the job's own spec and count again with its new ui block: a new job
        version Nomad applies in place (``reconcile`` argues it). Only if the job is still
        as read, so a scale made meanwhile is not undone."""
        p = m.profile(st.profile)
        assert p is not None   # decide() describes only a job whose spec is current
        job = self._render(m, p, count)
        if job.Meta[render.META_SPEC] != st.spec:
            return   # the catalog changed since the pass decided; the next pass decides again
        await self._hold()
        try:
            await self._offload.run(lambda: self._client.register(
                job, if_index=st.job_modify_index))
        except JobChangedError:
            log.info("%s changed while its ui block was being updated; the next pass compares "
                     "it again", st.id)
            return
        log.info("updated the description and links of %s in place (no replica restarts)",
                 st.id)
        self._counts.pop(st.id, None)

    async def _recover(self, st: JobState, count: int) -> None:
        """A new version of the same spec: Nomad places what a failed deployment left out."""
        await self._hold()
        try:
            await self._offload.run(
                self._client.scale, st.id, render.GROUP, count,
                f"llmgw: re-submitted after a failed deployment left {st.live} of {count}")
        except ScaleBlockedError:
            return   # a deployment started since the pass read it; nothing to recover
        log.warning("%s: its deployment failed with %d of %d replicas placed; submitted the "
                    "job again (a new version, same spec) to place the rest", st.id, st.live,
                    count)
        self._counts.pop(st.id, None)

    # ---- Backend: catalog-facing --------------------------------------------

    async def check_placement(self, model: Model, catalog: Catalog) -> None:
        if model.external:
            return
        for p in model.profiles:
            job = self._render(model, p, 1, catalog)
            await self._validate(model, job)
        choice = await self._choose(model, 1)
        if choice.job is None:
            raise PlacementError(
                f"model {model.name!r} cannot run on this fleet: {choice.verdict.reason}",
                field="profiles")
        # The last check before a runtime model is stored, and the one moment its source's
        # password is in hand: the store keeps only user:***@ (llmgw.scheduler.nomad.credentials).
        await self._offload.run(self._keeper.ensure, model, render.job_id(model.name))

    async def set_demand(self, model: str, replicas: int) -> None:
        # The on-demand path and the load-based scaler both land here. While a
        # deployment runs — for a model load, possibly the better part of an
        # hour — Nomad refuses /scale (docs/nomad-api.md §5.3); _scale then
        # re-registers the job with the new count when its spec is the one
        # registered, and otherwise records that the change waits for the
        # deployment, which the scaler's next tick asks for again.
        m = self._model(model)
        s = m.scaling
        high = s.max if s.max is not None else max(s.min, 1)
        count = max(s.min, min(replicas, high))
        found = await self._jobs(only=model)
        entry = found.get(render.job_id(model))
        if entry is None or entry[0].stopped:
            await self._register(m, count)
            return
        await self._scale(m, entry[0], count)

    async def rollout(self, model: str) -> str | None:
        m = self._model(model)
        found = await self._jobs(only=model)
        entry = found.get(render.job_id(model))
        count = _initial_count(m)
        failed = None
        if entry is not None and not entry[0].stopped:
            current = await self._count(*entry)
            count = m.scaling.min if m.scaling.min > 0 else (current or 0)
            deployments = latest_deployments(await self._offload.run(self._client.deployments))
            st = dataclasses.replace(entry[0], deployment=deployments.get(entry[0].id))
            failed = st if st.deployment_failed else None
        await self._register(m, count, failed=failed)
        return self.rolled_out_profile(model)

    def _model(self, name: str) -> Model:
        m = self._catalog.get(name) if self._catalog else None
        if m is None:
            raise NotFoundError(f"there is no model {name!r} in the catalog")
        if m.external:
            raise NotFoundError(f"model {name!r} is external (upstream); Nomad runs nothing for it")
        return m

    def status(self, model: str) -> ModelStatus:
        ms = self._states.get(model, _ModelState())
        return ModelStatus(desired=ms.desired, ready=len(self._discovery.endpoints(model)),
                           waiting_for_capacity=ms.waiting,
                           last_placement_failure=ms.last_failure, last_error=ms.last_error,
                           crash_loop=ms.crash_loop, shortfall=ms.shortfall,
                           deployment_failed=ms.deployment_failed, refused=ms.refused,
                           prefetch_error=self._caches.prefetch_errors.get(model))

    def rolled_out_profile(self, model: str) -> str | None:
        """The profile the model's job runs (the one registered, or read from Nomad last
        pass) — which may be a later one than the first, when the first did not fit."""
        ms = self._states.get(model)
        return ms.profile if ms else None

    def stale(self, model: str) -> str | None:
        """Why the model's job runs an older spec than the catalog renders, if it does."""
        ms = self._states.get(model)
        return ms.stale if ms else None

    # ---- Backend: views -----------------------------------------------------

    async def replicas(self, model: str | None = None) -> list[Replica]:
        found = await self._jobs(only=model)
        ids = sorted(jid for jid, (st, _) in found.items() if not st.stopped)
        health = dict(self._discovery.alloc_health)
        addresses = {r.AllocID: r for regs in self._discovery.registrations.values()
                     for r in regs}
        return await self._replicas.read(ids, health, dict(self._discovery.unknown), addresses,
                                         every_job=model is None,
                                         progress=self._caches.progress)

    async def replica_log(self, replica: str, lines: int) -> list[str]:
        """The engine task's recent stderr, where vLLM and llama.cpp write their log
        (Nomad's logs API; ``read-logs`` or ``read-fs``). A replica's id is its
        allocation's."""
        data = await self._offload.run(
            lambda: self._client.task_log(replica, render.ENGINE_TASK, "stderr", LOG_TAIL))
        text = data.decode("utf-8", "replace").splitlines()
        # The tail starts mid-line unless it holds the whole log.
        kept = text[1:] if len(data) >= LOG_TAIL and text else text
        return kept[-lines:] if lines > 0 else []

    async def holdings(self) -> list[Holding]:
        allocs = await self._offload.run(self._client.holding_allocations)
        return holdings_of(allocs, self._classes)

    async def fleet(self) -> Fleet:
        nodes, allocs = await self._offload.run(self._fleet_inputs)
        f = build_fleet(nodes, allocs, self._classes, self._cfg.fabric_meta_key)
        models = list(self._catalog) if self._catalog else []
        adapters = list(self._catalog.adapters.values()) if self._catalog else []
        # What llmgw wrote to a node's metadata counts before Nomad shows it (caches).
        meta = {n.ID: self._caches.meta(n) for n in nodes}
        views = [msgspec.structs.replace(v, warm=holds(meta.get(v.id), models, self._mirror,
                                                       adapters))
                 for v in f.nodes]
        return msgspec.structs.replace(f, nodes=views)

    async def prefetch(self, model: str, *, nodes: list[str] | None = None,
                       count: int | None = None) -> Prefetch:
        m = self._model(model)
        views = (await self.fleet()).nodes
        return await self._offload.run(
            lambda: self._caches.prefetch(m, nodes, count, views=views))

    async def prefetch_status(self, model: str) -> Prefetch:
        m = self._model(model)
        views = (await self.fleet()).nodes
        return await self._offload.run(self._caches.status, m, views)

    def _fleet_inputs(self) -> tuple[list[wire.Node], list[wire.Allocation]]:
        return self._client.nodes(), self._client.all_allocations()

    def endpoints(self, model: str) -> list[str]:
        return self._discovery.endpoints(model)

    async def _note_nodes(self) -> None:
        """Every instance's view of which nodes hold which adapters, each pass: the
        leader writes the metadata, every gateway prefers warm nodes by it. A refusal
        costs only that preference."""
        try:
            nodes = await self._offload.run(self._client.nodes)
        except BackendUnavailableError:
            raise
        except LlmgwError as exc:
            log.warning("reading the nodes for the adapters they hold: %s", exc.message)
            return
        self._stager.note_nodes(nodes, self._caches.meta)

    def adapter_warm(self, adapter: Adapter, address: str) -> bool:
        return self._stager.warm(adapter, address)

    async def stage_adapter(self, adapter: Adapter, address: str, *,
                            again: bool = False) -> None:
        await self._stager.stage(adapter, address, again=again)

    def profile_of(self, address: str) -> str | None:
        return self._discovery.profile_of(address)

    def node_of(self, address: str) -> str | None:
        """The ID of the node the replica at ``address`` runs on (no I/O)."""
        return self._discovery.node_of(address)

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (the Protocol's)
        await self._discovery.wait_changed(timeout)


def _initial_count(m: Model) -> int:
    return m.scaling.min
