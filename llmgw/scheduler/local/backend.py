"""The embedded scheduler: the catalog run as child processes on this machine.

``LocalBackend`` implements the same ``Backend`` Protocol as Nomad, so the
reconciler, the API and the gateway cannot tell which one runs. Where Nomad
has a job per model and an allocation per replica, this has a
``ReplicaRunner`` per replica (``supervisor.py``) and a ``Ledger`` of this
machine's cores, memory and GPUs (``resources.py``).

Every decision is taken in one synchronous pass, ``_reconcile``: which
replicas to start and stop (``planner.plan``), where each fits, what the model
shows when one does not. It never awaits, so two triggers (a catalog change and
an engine dying) cannot interleave half-way through a decision; a trigger that
arrives from a replica schedules a pass instead of running one inside the
replica's callback. Processes start and stop in the runners' own tasks.

A replica keeps the model definition and profile it was started with, for its
restarts too, as a Nomad allocation keeps its job version: a profile edit
shows the replica as stale until ``rollout``.

Only one LocalBackend may run per machine and port range: it owns its
children, and a second one would count the same cores again.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, cast

import msgspec

from llmgw.catalog.build import Catalog
from llmgw.catalog.fingerprint import fingerprint, is_stale
from llmgw.catalog.model import Model, Profile, Timeouts
from llmgw.catalog.source import PathSource, PkgSource
from llmgw.config import ServerConfig
from llmgw.errors import NotFoundError, PlacementError, RefusedError
from llmgw.scheduler.base import (
    BackendHealth,
    Fleet,
    Holding,
    ModelStatus,
    NodeView,
    Pool,
    Prefetch,
    PrefetchNode,
    Replica,
    SameDisk,
)
from llmgw.scheduler.local.engines import EngineLaunch, engine_refusal, launch_for
from llmgw.scheduler.local.journal import HEARTBEAT, HoldingsJournal
from llmgw.scheduler.local.machine import detect_machine
from llmgw.scheduler.local.planner import ReplicaView, desired_count, plan
from llmgw.scheduler.local.resources import Demand, Grant, Ledger, Machine, demand_of
from llmgw.scheduler.local.supervisor import (
    LaunchError,
    PortPool,
    ReplicaRunner,
    Timing,
    kill_all_groups,
    rss_of,
)
from llmgw.weights.gguf import NotGgufError, read_gguf
from llmgw.weights.local import SourceError, local_source_refusal, resolve_source

log = logging.getLogger("llmgw.scheduler.local")

EventKind = Literal["loading", "ready", "unhealthy", "failed", "stopped", "waiting",
                    "unplaceable"]


class LocalEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Something a person starting ``llmgw serve`` wants to see happen.

    ``loading``: an engine process started and is loading the model;
    ``ready``: it answers its health check and takes traffic (``address``);
    ``unhealthy``: a running engine stopped answering; ``failed``: it exited or
    could not start (``message`` has why and its last output lines; it is
    restarted with back-off); ``stopped``: it was stopped on purpose;
    ``waiting``: a replica does not fit in what is free now; ``unplaceable``:
    no profile of the model could ever run on this machine.
    """

    kind: EventKind
    model: str
    replica: str | None = None
    address: str | None = None
    message: str = ""
    at: float = 0.0          # time.time()

    def line(self) -> str:
        """One line for a terminal: ``gemma-3-270m: ready at http://127.0.0.1:28000 after 2.1s``."""
        who = f"{self.model} ({self.replica})" if self.replica else self.model
        first = self.message.splitlines()[0] if self.message else ""
        if self.kind == "loading":
            return f"{who}: loading ({first})"
        if self.kind == "ready":
            return f"{who}: ready at {first}" if first.startswith("http") else f"{who}: ready"
        if self.kind == "failed":
            return f"{who}: failed: {first}; it is restarted with back-off"
        if self.kind == "stopped":
            return f"{who}: stopped"
        if self.kind == "unhealthy":
            return f"{who}: not answering its health check ({first}); taken out of routing"
        if self.kind == "waiting":
            return f"{who}: waiting for capacity: {first}"
        return f"{who}: cannot run here: {first}"


EventCallback = Callable[[LocalEvent], None]

_atexit_registered = False


class _Wait(msgspec.Struct, frozen=True):
    reason: str


class _Never(msgspec.Struct, frozen=True):
    reason: str

# How long a released replica's holding is still reported: the cost meter reads
# them every minute, so a day covers any outage of the meter worth covering.
HOLDINGS_KEPT = 86400.0


class LocalBackend(SameDisk):
    """Runs the catalog's models as child processes of this llmgw."""

    def __init__(
        self, config: ServerConfig, store: object | None = None, *,
        machine: Machine | None = None, on_event: EventCallback | None = None,
        timing: Timing | None = None,
    ) -> None:
        # ``store`` is accepted so every backend is built the same way; one
        # machine has one scheduler, so there is nothing to share through it.
        local = config.scheduler.local
        low, high = local.port_range
        if timing is None:
            timing = Timing(stop_grace=local.stop_grace, start_timeout=local.start_timeout)
        self.config = config
        self.machine = machine or detect_machine(local)
        self._ledger = Ledger(self.machine)
        self._ports = PortPool(low, high)
        self._timing = timing
        self._python = local.python or sys.executable
        self._catalog: Catalog | None = None
        self._demand: dict[str, int] = {}
        self._desired: dict[str, int] = {}
        self._runners: dict[str, ReplicaRunner] = {}
        self._waiting: dict[str, str] = {}
        self._never: dict[str, str] = {}
        self._placement_failure: dict[str, str] = {}
        self._blocked: set[str] = set()
        self._seq = 0
        # Each replica's hold on cards and cores (costs); replica ids restart with
        # llmgw, so a holding's id carries this backend's own prefix.
        self._holdings: dict[str, Holding] = {}
        # Kept on disk with state_dir, so a restart loses none of them (``journal``).
        self._journal = HoldingsJournal(local.state_dir) if local.state_dir else None
        if self._journal is not None:
            self._holdings.update((h.id, h) for h in self._journal.load())
        self._journal_wake = asyncio.Event()
        self._journal_task: asyncio.Task[None] | None = None
        self._run_id = os.urandom(4).hex()
        self.clock: Callable[[], float] = time.time
        self._listeners: list[EventCallback] = [on_event] if on_event else []
        self._changed = asyncio.Event()
        self._stoppers: set[asyncio.Task[None]] = set()
        self._kick_pending = False
        self._closed = False
        self._fault: str | None = None
        self._pkg_paths: dict[str, Path] = {}
        # Weights brought into this machine's cache ahead of a replica (``prefetch``):
        # model → its state and what it said.
        self._prefetches: dict[str, PrefetchNode] = {}
        self._prefetch_tasks: dict[str, asyncio.Task[None]] = {}
        # Requests in flight at a replica's address, from the gateway routing to it in
        # this process; None (gateway workers in other processes): a drain runs its
        # whole timeout.
        self.in_flight: Callable[[str], int | None] | None = None

    # -- events ------------------------------------------------------------

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback`` with every LocalEvent from now on; returns the unsubscribe."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    def _emit(self, kind: EventKind, model: str, *, replica: str | None = None,
              address: str | None = None, message: str = "") -> None:
        event = LocalEvent(kind=kind, model=model, replica=replica, address=address,
                           message=message, at=time.time())
        # Failures go to the log in full (with the engine's output lines);
        # the routine life of a replica only at debug level, since `llmgw
        # serve` prints it as one line per event.
        if kind in ("failed", "unhealthy", "waiting", "unplaceable"):
            log.warning("%s", event.line() if kind != "failed" else
                        f"{model} ({replica}): {message}")
        else:
            log.debug("%s", event.line())
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("an event listener failed on %s", event)

    def _notify_changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- the Protocol ------------------------------------------------------

    async def start(self) -> None:
        global _atexit_registered
        if not _atexit_registered:
            # The last line of defence if the server dies without close():
            # engines must not outlive llmgw (PDEATHSIG covers a SIGKILL).
            atexit.register(kill_all_groups)
            _atexit_registered = True
        if self._journal is not None and self._journal_task is None:
            self._journal_task = asyncio.create_task(self._keep_journal(),
                                                     name="llmgw-local-holdings")

    async def _keep_journal(self) -> None:
        """Write the holdings when they change and every ``HEARTBEAT`` (see ``journal``)."""
        journal = self._journal
        assert journal is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT):
                    await self._journal_wake.wait()
            self._journal_wake.clear()
            try:
                await asyncio.to_thread(journal.save, list(self._holdings.values()),
                                        self.clock())
            except OSError as exc:
                log.warning("cannot write the holdings to %s: %s", journal.path, exc)

    async def close(self) -> None:
        """Stop every replica (gracefully, then by force) and return when all have exited."""
        self._closed = True
        runners = list(self._runners.values())
        for r in runners:
            r.request_stop()
        self._notify_changed()
        await asyncio.gather(*(r.stop() for r in runners), return_exceptions=True)
        await self._close_journal()
        for task in list(self._stoppers):
            try:
                await task
            except asyncio.CancelledError:
                # That stopper was cancelled: go on with the others, unless
                # it is close() itself that is being cancelled.
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise

    async def _close_journal(self) -> None:
        task, self._journal_task = self._journal_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._journal is not None:
            try:
                await asyncio.to_thread(self._journal.save, list(self._holdings.values()),
                                        self.clock())
            except OSError as exc:
                log.warning("cannot write the holdings to %s: %s", self._journal.path, exc)

    async def check_placement(self, model: Model, catalog: Catalog) -> None:
        if model.external:
            return
        if refusal := engine_refusal(model, bool(self.machine.gpus)):
            raise PlacementError(refusal, field="engine")
        if refusal := local_source_refusal(model.source):
            raise PlacementError(refusal, field="source")
        reasons = []
        for i, p in enumerate(model.profiles):
            reason = self._ledger.never_fits(demand_of(p, catalog.gpu_classes))
            if reason is None:
                return
            reasons.append((i, reason))
        raise PlacementError(
            f"model {model.name!r} cannot run on this machine ({self.machine.name}): "
            + "; ".join(r for _, r in reasons),
            field=f"profiles[{reasons[0][0]}]" if reasons else "profiles",
        )

    async def apply(self, catalog: Catalog) -> None:
        if self._closed:
            return
        self._catalog = catalog
        for m in catalog:
            # One machine: scaling.prefetch keeps the weights ready on it.
            if m.scaling.prefetch and not m.external and m.name not in self._prefetches \
                    and local_source_refusal(m.source) is None:
                self._start_prefetch(m)
        self._reconcile()

    # -- prefetch ------------------------------------------------------------

    async def prefetch(self, model: str, *, nodes: list[str] | None = None,
                       count: int | None = None) -> Prefetch:
        """Bring the model's file into this machine's cache (a package's ``assemble()``),
        so its first replica starts without doing it; one machine, so ``nodes`` may name
        only it and ``count`` is at most 1."""
        m = self._model(model)
        why = local_source_refusal(m.source)
        if why is not None:
            raise RefusedError(f"model {model!r} has no source to prefetch here: {why}")
        here = self.machine.name
        if nodes and any(n not in (here, "local") for n in nodes):
            raise NotFoundError(f"the local scheduler has one node, {here!r}; "
                                f"{', '.join(n for n in nodes if n not in (here, 'local'))} "
                                "is not it")
        running = self._prefetch_tasks.get(model)
        if running is None or running.done():
            self._start_prefetch(m)
        return await self.prefetch_status(model)

    def _start_prefetch(self, m: Model) -> None:
        self._prefetches[m.name] = PrefetchNode(node=self.machine.name, state="fetching")

        async def run() -> None:
            try:
                path = await self._resolve(m)
            except SourceError as exc:
                self._prefetches[m.name] = PrefetchNode(node=self.machine.name, state="failed",
                                                        message=str(exc))
                return
            self._prefetches[m.name] = PrefetchNode(node=self.machine.name, state="done",
                                                    percent=100.0, message=str(path))
        self._prefetch_tasks[m.name] = asyncio.create_task(run(), name=f"prefetch-{m.name}")

    async def prefetch_status(self, model: str) -> Prefetch:
        m = self._model(model)
        p = self._prefetches.get(model)
        return Prefetch(model=model, nodes=[p] if p else [],
                        warm=[self.machine.name] if model in self._warm() else [],
                        message=f"{m.name}: no prefetch has run" if p is None else
                        "done" if p.state == "done" else p.state)

    def _warm(self) -> set[str]:
        """Models whose file is in place: prefetched, or resolved for a replica."""
        done = {name for name, p in self._prefetches.items() if p.state == "done"}
        dists = {d for d, path in self._pkg_paths.items() if path.is_file()}
        catalog = self._catalog
        for m in catalog or ():
            if isinstance(m.source, PathSource) or (
                    isinstance(m.source, PkgSource) and m.source.distribution in dists):
                done.add(m.name)
        return done

    async def set_demand(self, model: str, replicas: int) -> None:
        self._model(model)
        self._demand[model] = max(0, replicas)
        self._reconcile()

    async def rollout(self, model: str) -> str | None:
        """Replace the model's stale replicas; each keeps serving until its successor is ready."""
        m = self._model(model)
        for r in self._live(model):
            if self._stale(m, r):
                r.retiring = True
        self._reconcile()
        catalog = self._catalog
        chosen = self._choose(m, catalog) if catalog is not None else None
        return chosen[0].name if isinstance(chosen, tuple) else None

    async def replicas(self, model: str | None = None) -> list[Replica]:
        runners = sorted((r for r in self._runners.values() if model in (None, r.model)),
                         key=lambda r: (r.model, r.seq))
        return [r.replica(measured_memory=rss_of(r.pid)) for r in runners]

    async def replica_log(self, replica: str, lines: int) -> list[str]:
        """The engine's output as the supervisor keeps it (its last ``output_lines``)."""
        runner = self._runners.get(replica)
        if runner is None:
            raise NotFoundError(f"the local scheduler runs no replica {replica!r}; "
                                "`llmgw ctl replicas` lists them")
        kept = list(runner.lines)
        return kept[-lines:] if lines > 0 else []

    def _class_of(self, device: str) -> str | None:
        """The configured gpu class whose cards are ``device``, if one is."""
        return next((name for name, gc in self.config.gpu_classes.items()
                     if gc.device == device), None)

    async def holdings(self) -> list[Holding]:
        """From each reservation to its release, as Nomad holds an allocation's resources;
        a released one is remembered for ``HOLDINGS_KEPT``."""
        horizon = self.clock() - HOLDINGS_KEPT
        for rid, h in list(self._holdings.items()):
            if h.end is not None and h.end < horizon:
                del self._holdings[rid]
        return list(self._holdings.values())

    def status(self, model: str) -> ModelStatus:
        live = self._live(model)
        # A replica that failed and is not serving again: its message stays the
        # model's error through the restart attempts, so it does not flicker.
        failing = [r for r in live if r.message and not r.healthy]
        last_error = self._never.get(model) or (failing[0].message if failing else None)
        return ModelStatus(
            desired=self._desired.get(model, 0),
            ready=sum(1 for r in live if r.healthy),
            waiting_for_capacity=self._waiting.get(model),
            last_placement_failure=self._placement_failure.get(model),
            last_error=last_error,
            crash_loop=any(r.crash_loop for r in live),
        )

    async def fleet(self) -> Fleet:
        m = self.machine
        device = m.gpus[0].device if m.gpus else None
        gpu_class = self._class_of(device) if device is not None else None
        gpu_memory = m.gpus[0].memory if m.gpus else None
        gpus_free = len(self._ledger.free_gpus())
        node = NodeView(
            name=m.name, id="local", status="ready", schedulable=not self._closed,
            gpu_class=gpu_class, gpu_device=device, fabric=None,
            gpus_total=len(m.gpus), gpus_free=gpus_free, gpu_memory=gpu_memory,
            cores_total=len(m.cores), cores_free=len(self._ledger.free_cores()),
            memory_total=m.memory, memory_free=max(self._ledger.free_memory(), 0),
            warm=sorted(self._warm()),
        )
        pool = Pool(name=gpu_class or ("gpu" if m.gpus else "cpu"), gpu_class=gpu_class,
                    fabric=None, gpu_memory=gpu_memory, nodes=[m.name],
                    gpus_total=len(m.gpus), gpus_free=gpus_free,
                    largest_free_gpus_on_a_node=gpus_free)
        return Fleet(nodes=[node], pools=[pool])

    def health(self) -> BackendHealth:
        if self._fault:
            return BackendHealth(ok=False, message=self._fault)
        if self._closed:
            return BackendHealth(ok=False, message="the local scheduler is stopped")
        live = [r for r in self._runners.values() if not r.stopping]
        ready = sum(1 for r in live if r.healthy)
        return BackendHealth(
            ok=True, message=f"local scheduler on {self.machine.name}: "
                             f"{ready} of {len(live)} replicas ready")

    def endpoints(self, model: str) -> list[str]:
        return [r.address for r in sorted(self._live(model), key=lambda r: r.seq)
                if r.healthy and r.state == "running" and r.address]

    def profile_of(self, address: str) -> str | None:
        return next((r.profile for r in self._runners.values() if r.address == address), None)

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (the Protocol's)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    # -- deciding ----------------------------------------------------------

    def _model(self, name: str) -> Model:
        m = self._catalog.get(name) if self._catalog else None
        if m is None or m.external:
            raise NotFoundError(f"the local scheduler runs no model named {name!r}")
        return m

    def _live(self, model: str) -> list[ReplicaRunner]:
        return [r for r in self._runners.values() if r.model == model and not r.stopping]

    @staticmethod
    def _stale(model: Model, r: ReplicaRunner) -> bool:
        p = model.profile(r.profile)
        return p is None or is_stale(r.fingerprint, fingerprint(model, p))

    def _kick(self) -> None:
        """Run a reconcile pass soon (not inside the caller's callback)."""
        if self._kick_pending or self._closed:
            return
        self._kick_pending = True

        def run() -> None:
            self._kick_pending = False
            self._reconcile()

        asyncio.get_running_loop().call_soon(run)

    def _reconcile(self) -> None:
        if self._closed or self._catalog is None:
            return
        try:
            catalog = self._catalog
            for r in list(self._runners.values()):
                m = catalog.get(r.model)
                if not r.stopping and (m is None or m.external):
                    self._stop_runner(r)
            for name in set(self._desired) - set(catalog.models):
                for table in (self._desired, self._waiting, self._never,
                              self._placement_failure, self._demand):
                    table.pop(name, None)
                self._blocked.discard(name)
            for m in catalog:
                if not m.external:
                    self._reconcile_model(m, catalog)
            self._fault = None
        except Exception as exc:
            log.exception("the local scheduler failed to reconcile the catalog")
            self._fault = f"the local scheduler failed to reconcile the catalog: {exc!r}"

    def _reconcile_model(self, m: Model, catalog: Catalog) -> None:
        name = m.name
        desired = desired_count(m, self._demand.get(name))
        self._desired[name] = desired
        live = self._live(name)
        views = [ReplicaView(id=r.id, healthy=r.healthy, stale=self._stale(m, r),
                             retiring=r.retiring, seq=r.seq) for r in live]
        decided = plan(desired, views, blocked=name in self._blocked)
        for rid in decided.stop:
            self._stop_runner(self._runners[rid])
        was_blocked = name in self._blocked
        self._blocked.discard(name)
        for _ in range(decided.start):
            choice = self._choose(m, catalog)
            if isinstance(choice, _Never):
                if self._never.get(name) != choice.reason:
                    self._emit("unplaceable", name, message=choice.reason)
                self._never[name] = self._placement_failure[name] = choice.reason
                self._waiting.pop(name, None)
                return
            if isinstance(choice, _Wait):
                if self._waiting.get(name) != choice.reason:
                    self._emit("waiting", name, message=choice.reason)
                self._waiting[name] = self._placement_failure[name] = choice.reason
                self._blocked.add(name)
                if not was_blocked and any(r.retiring for r in live):
                    self._kick()      # a rollout may free room by stopping an old replica
                return
            profile, demand = choice
            self._launch(m, profile, demand)
            self._placement_failure.pop(name, None)
        self._waiting.pop(name, None)
        self._never.pop(name, None)

    def _choose(self, m: Model, catalog: Catalog) -> tuple[Profile, Demand] | _Wait | _Never:
        """The first profile that fits now; else why it must wait, or can never run."""
        refusal = (engine_refusal(m, bool(self.machine.gpus))
                   or local_source_refusal(m.source))
        if refusal:
            return _Never(refusal)
        waits: list[str] = []
        nevers: list[str] = []
        for p in m.profiles:
            demand = demand_of(p, catalog.gpu_classes)
            if reason := self._ledger.never_fits(demand):
                nevers.append(reason)
            elif reason := self._ledger.why_not_now(demand):
                waits.append(reason)
            else:
                return p, demand
        if waits:
            return _Wait(waits[0])
        return _Never(f"model {m.name!r} cannot run on this machine: " + "; ".join(nevers))

    def _launch(self, m: Model, profile: Profile, demand: Demand) -> None:
        self._seq += 1
        rid = f"{m.name}-{self._seq}"
        grant = self._ledger.reserve(rid, demand)
        device = demand.gpu_device
        gpu_class = (self._class_of(device) or device) if device is not None else ""
        self._holdings[rid] = Holding(
            id=f"local:{self._run_id}:{rid}", model=m.name, gpu_class=gpu_class,
            gpus=len(grant.gpus), cores=len(grant.cores) or demand.cores, start=self.clock())
        self._journal_wake.set()
        runner = ReplicaRunner(
            id=rid, model=m.name, profile=profile.name, fingerprint=fingerprint(m, profile),
            seq=self._seq, node=self.machine.name,
            cpus=grant.cores if self.machine.pinnable else (),
            reserved_memory=demand.memory or None,
            prepare=functools.partial(self._prepare, m, profile, grant),
            ports=self._ports, timing=self._timing, on_change=self._on_runner,
            in_flight=self._count_in_flight,
        )
        self._runners[rid] = runner
        runner.start()

    def _count_in_flight(self, address: str) -> int | None:
        return self.in_flight(address) if self.in_flight is not None else None

    def _stop_runner(self, r: ReplicaRunner) -> None:
        """Stop a replica leaving on purpose: out of the endpoints now, its engine after its
        requests (or the model's ``timeouts.drain``)."""
        m = self._catalog.get(r.model) if self._catalog else None
        drain = float(m.timeouts.drain if m is not None else Timeouts().drain)
        r.request_stop(drain)
        self._notify_changed()
        task = asyncio.get_running_loop().create_task(r.stop(drain), name=f"stop-{r.id}")
        self._stoppers.add(task)
        task.add_done_callback(self._stoppers.discard)

    def _on_runner(self, r: ReplicaRunner, kind: str, message: str) -> None:
        if kind == "stopped":
            self._ledger.release(r.id)
            held = self._holdings.get(r.id)
            if held is not None and held.end is None:
                self._holdings[r.id] = msgspec.structs.replace(held, end=self.clock())
                self._journal_wake.set()
            self._runners.pop(r.id, None)
        self._notify_changed()
        if kind in ("loading", "ready", "unhealthy", "failed", "stopped"):
            self._emit(cast(EventKind, kind), r.model, replica=r.id, address=r.address,
                       message=message)
        self._kick()

    # -- launching (runs in the replica's task) ------------------------------

    async def _resolve(self, m: Model) -> Path:
        source = m.source
        dist = source.distribution if isinstance(source, PkgSource) else None
        if dist is not None and (known := self._pkg_paths.get(dist)) and known.is_file():
            return known
        path = await asyncio.to_thread(resolve_source, source,
                                       want_gguf=m.engine == "llama.cpp")
        if dist is not None:
            self._pkg_paths[dist] = path
        return path

    async def _prepare(self, m: Model, profile: Profile, grant: Grant, port: int) -> EngineLaunch:
        """The launch of one attempt; any failure is a LaunchError the replica shows.

        Errors nobody foresaw (a model package that misbehaves, a defect) are
        LaunchErrors too, so the attempt is retried with back-off and the
        model shows the sentence; the traceback goes to the log.
        """
        try:
            return await self._launch_of(m, profile, grant, port)
        except LaunchError:
            raise
        except Exception as exc:
            log.exception("model %s: preparing a replica's launch failed", m.name)
            raise LaunchError(
                f"preparing the launch of model {m.name!r} "
                f"(source {m.source.shown if m.source else None!r}) failed: "
                f"{type(exc).__name__}: {exc}; see llmgw's log for the traceback") from None

    async def _launch_of(self, m: Model, profile: Profile, grant: Grant,
                         port: int) -> EngineLaunch:
        try:
            path = await self._resolve(m)
        except SourceError as exc:
            raise LaunchError(str(exc)) from None
        info = None
        if m.engine == "llama.cpp":
            try:
                info = await asyncio.to_thread(read_gguf, path)
            except NotGgufError as exc:
                raise LaunchError(str(exc)) from None
            except OSError as exc:
                raise LaunchError(f"cannot read model file {str(path)!r}: {exc.strerror}; "
                                  "check its permissions") from None
        return launch_for(m, profile, python=self._python, model_path=str(path), port=port,
                          gguf=info, gpu_indexes=grant.gpus)
