"""Where each model's healthy replicas are, from Nomad's service discovery.

Nomad's catalog does not filter by health (docs/nomad-api.md §4.4): a group
service is registered before its task starts, so a replica that is still
loading 140 GB of weights is listed next to one that is serving. Routing to
the list as given is the classic failure of LLM gateways. So two loops
cooperate here:

* a **watcher** holds a blocking query on ``/v1/services``; Nomad's index for
  it is the whole registrations table, so it wakes on any change anywhere,
  and then re-reads ``/v1/service/llmgw-<model>`` for each model of the
  catalog. One long poll covers every model, where one per model would park
  a thread per model for nothing: every one of them would wake together.
* a **check poller** reads ``/v1/allocation/:id/checks`` for every registered
  allocation, every ``check_interval`` and whenever the registrations change.

A replica is an endpoint only when every check of its allocation has run and
passed. When Nomad cannot be reached, neither loop overwrites what it knew:
the gateway keeps routing to the replicas last known healthy, and the
loops retry with back-off.

The servers answer a check read by forwarding it to the node that runs the
allocation (nomad/client_alloc_endpoint.go ``ClientAllocations.Checks``), so
one wedged node makes its reads hang or fail with a 500 while every other
node answers (command/agent/alloc_endpoint.go ``allocChecks``). So the reads
run **concurrently and each on its own**: a read that times out or fails for
one allocation marks that allocation *unknown* — no traffic, since nothing
says it still serves — while the others keep updating every interval. A
read still in flight is not started again, a node that is slow or did not
answer is probed ``PER_NODE`` reads at a time, and the reads have threads of
their own, so a wedged node cannot take the threads the rest (or the
reconciler) need. Two cases stay
"Nomad is unreachable" rather than "that node": the agent refusing
connections, and a round in which every read failed on allocations of two or
more nodes — one fault shared by every node is the agent's, and the last
known health stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from llmgw.errors import BackendUnavailableError, LlmgwError, NotFoundError
from llmgw.scheduler.nomad import wire
from llmgw.scheduler.nomad.client import NodeUnreachableError, NomadClient
from llmgw.scheduler.nomad.offload import Offloader
from llmgw.scheduler.nomad.render import job_id

log = logging.getLogger("llmgw.nomad")
PER_NODE = 2          # check reads in flight on one node at a time
CHECK_THREADS = 16    # check reads in flight at all, on threads of their own


class _Round:
    """The reads one poll started together, to tell one bad node from a bad agent."""

    def __init__(self, size: int) -> None:
        self.pending = size
        self.succeeded = False
        self.failed: dict[str, tuple[str, str]] = {}   # alloc → (node, why), held back


def backoff_delay(failures: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds before retry number ``failures`` (1, 2, 4, … up to ``cap``)."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(failures - 1, 30)))


def checks_pass(checks: Mapping[str, wire.CheckStatus]) -> bool:
    """Every check has run and passed. No checks yet (``null``) is not healthy."""
    return bool(checks) and all(c.Status == "success" for c in checks.values())


PROFILE_TAG = "profile="


def endpoint_url(reg: wire.ServiceRegistration) -> str:
    host = f"[{reg.Address}]" if ":" in reg.Address else reg.Address
    return f"http://{host}:{reg.Port}"


class Discovery:
    def __init__(self, client: NomadClient, offload: Offloader, *, wait: float = 30.0,
                 check_interval: float = 2.0, backoff_max: float = 60.0,
                 on_outage: Callable[[str, BackendUnavailableError, float], None],
                 on_ok: Callable[[str], None]) -> None:
        self._client = client
        self._offload = offload
        self._wait = wait
        self._check_interval = check_interval
        self._backoff_max = backoff_max
        self._on_outage = on_outage
        self._on_ok = on_ok
        self._models: set[str] = set()
        self.registrations: dict[str, list[wire.ServiceRegistration]] = {}
        self.alloc_health: dict[str, bool] = {}       # last answer of each allocation's checks
        self.unknown: dict[str, str] = {}             # allocation → why its health is unknown
        self._checks = Offloader(limit=CHECK_THREADS, name="llmgw-nomad-checks")
        self._inflight: dict[str, str] = {}           # allocation → node, while a read runs
        self._reads: set[asyncio.Task[None]] = set()
        self._agent_failures = 0
        self._endpoints: dict[str, list[str]] = {}
        self._profiles: dict[str, str] = {}           # endpoint → profile, from its tags
        self._changed = asyncio.Event()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ---- what the gateway reads ------------------------------------------------

    def endpoints(self, model: str) -> list[str]:
        return list(self._endpoints.get(model, ()))

    def profile_of(self, address: str) -> str | None:
        return self._profiles.get(address)

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (Backend's shape)
        event = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    def node_of(self, address: str) -> str | None:
        """The ID of the node the replica at ``address`` runs on, from its registration."""
        for regs in self.registrations.values():
            for r in regs:
                if endpoint_url(r) == address and r.NodeID:
                    return r.NodeID
        return None

    def address_of(self, alloc_id: str) -> str | None:
        for regs in self.registrations.values():
            for r in regs:
                if r.AllocID == alloc_id:
                    return endpoint_url(r)
        return None

    # ---- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._watch(), name="llmgw-nomad-services"),
                           asyncio.create_task(self._poll(), name="llmgw-nomad-checks")]

    async def close(self) -> None:
        for t in [*self._tasks, *self._reads]:
            t.cancel()
        for t in [*self._tasks, *self._reads]:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    def set_models(self, names: Iterable[str]) -> None:
        """The scheduled models of the catalog in force; new ones are read at once."""
        names = set(names)
        added = names - self._models
        self._models = names
        for gone in set(self.registrations) - names:
            del self.registrations[gone]
        self._recompute()
        if added and self._tasks:
            task = asyncio.create_task(self._refresh(sorted(added)))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # ---- loops --------------------------------------------------------------

    async def _refresh(self, models: list[str]) -> None:
        try:
            regs = await self._offload.run(self._read_services, models)
        except LlmgwError as exc:
            log.warning("reading the services of %s failed: %s", ", ".join(models), exc)
            return
        except Exception:   # the watcher reads them again on its next wake
            log.exception("reading the services of %s failed", ", ".join(models))
            return
        self.registrations.update({m: r for m, r in regs.items() if m in self._models})
        self._recompute()
        self._kick.set()

    def _read_services(self, models: list[str]) -> dict[str, list[wire.ServiceRegistration]]:
        return {m: self._client.service(job_id(m)) for m in models}

    async def _watch(self) -> None:
        index, failures = 0, 0
        while True:
            started = time.monotonic()
            try:
                listing, new_index = await self._offload.unbounded(
                    self._client.services, index, self._wait)
                names = {s.ServiceName for ns in listing for s in ns.Services or ()}
                models = sorted(self._models)
                present = [m for m in models if job_id(m) in names]
                regs = await self._offload.run(self._read_services, present)
                self._on_ok("service discovery")
                self.registrations = {m: regs.get(m, []) for m in models if m in self._models}
                self._recompute()
                self._kick.set()
            except BackendUnavailableError as exc:
                failures += 1
                delay = backoff_delay(failures, cap=self._backoff_max)
                self._on_outage("service discovery", exc, delay)
                await asyncio.sleep(delay)
                continue
            except LlmgwError as exc:
                failures += 1
                log.warning("service discovery: %s", exc)
                await asyncio.sleep(backoff_delay(failures, cap=self._backoff_max))
                continue
            except Exception:
                # A bug, or an answer nothing expected: the loop must outlive it,
                # or every endpoint would freeze where it is. (CancelledError is
                # not an Exception, so close() still stops the loop.)
                failures += 1
                log.exception("service discovery failed unexpectedly; retrying")
                await asyncio.sleep(backoff_delay(failures, cap=self._backoff_max))
                continue
            failures = 0
            # An index that goes backwards means the servers' state was reset;
            # start over rather than block until it catches up (docs/nomad-api.md §4.3).
            unchanged = new_index == index
            index = new_index if new_index >= index else 0
            if unchanged and time.monotonic() - started < 1.0:
                await asyncio.sleep(1.0)  # a server that does not block: do not spin

    async def _poll(self) -> None:
        failures = 0
        while True:
            self._kick.clear()
            delay = self._check_interval
            try:
                self._start_reads()
                if self._agent_failures:
                    delay = backoff_delay(self._agent_failures, cap=self._backoff_max)
                failures = 0
            except Exception:
                # Never let the loop die (endpoints would freeze); CancelledError
                # is not an Exception, so close() still stops it.
                failures += 1
                delay = backoff_delay(failures, cap=self._backoff_max)
                log.exception("reading allocation checks failed unexpectedly; retrying")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()

    def _start_reads(self) -> None:
        """Start a read for every registered allocation not already being read."""
        nodes = {r.AllocID: r.NodeID for regs in self.registrations.values() for r in regs}
        for gone in set(self.alloc_health) - nodes.keys():
            del self.alloc_health[gone]
        for gone in set(self.unknown) - nodes.keys():
            del self.unknown[gone]
        busy: dict[str, int] = {}
        for node in self._inflight.values():
            busy[node] = busy.get(node, 0) + 1
        # A node still answering an earlier round, or whose allocations did not answer,
        # is probed PER_NODE reads at a time; the others have all theirs read at once.
        slow = set(busy) | {nodes[a] for a in self.unknown if a in nodes}
        batch = []
        for alloc_id, node in sorted(nodes.items()):
            if alloc_id in self._inflight or (node in slow and busy.get(node, 0) >= PER_NODE):
                continue
            busy[node] = busy.get(node, 0) + 1
            batch.append((alloc_id, node))
        rnd = _Round(len(batch))
        for alloc_id, node in batch:
            self._inflight[alloc_id] = node
            task = asyncio.create_task(self._check(alloc_id, node, rnd))
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)

    async def _check(self, alloc_id: str, node: str, rnd: _Round) -> None:
        """Read one allocation's checks; what goes wrong is that allocation's alone."""
        try:
            checks = await self._checks.run(self._client.alloc_checks, alloc_id)
        except NotFoundError:
            self._settle(alloc_id, False)      # the allocation is gone
            rnd.succeeded = True
        except NodeUnreachableError as exc:
            rnd.failed[alloc_id] = (node, exc.message)
        except BackendUnavailableError as exc:
            # The agent itself: keep what was known, as for any outage.
            self._agent_failures += 1
            self._on_outage("health checks", exc,
                            backoff_delay(self._agent_failures, cap=self._backoff_max))
        except LlmgwError as exc:
            rnd.failed[alloc_id] = (node, exc.message)
        except Exception as exc:
            log.exception("reading the checks of allocation %s failed", alloc_id)
            rnd.failed[alloc_id] = (node, f"reading its checks failed ({type(exc).__name__})")
        else:
            self._settle(alloc_id, checks_pass(checks))
            rnd.succeeded = True
            if self._agent_failures:
                self._agent_failures = 0
                self._on_ok("health checks")
        finally:
            self._inflight.pop(alloc_id, None)
            rnd.pending -= 1
            self._judge(rnd)
            self._recompute()

    def _settle(self, alloc_id: str, healthy: bool) -> None:
        self.alloc_health[alloc_id] = healthy
        self.unknown.pop(alloc_id, None)

    def _judge(self, rnd: _Round) -> None:
        """Turn the round's failed reads into unknown allocations: at once when another
        read of the round succeeded (the agent answers), else when the round is over —
        unless they span two or more nodes, when the trouble is the agent's."""
        if not rnd.failed or (not rnd.succeeded and rnd.pending > 0):
            return
        nodes = {node for node, _ in rnd.failed.values()}
        if not rnd.succeeded and len(nodes) > 1:
            first = next(iter(rnd.failed.values()))[1]
            self._on_outage("health checks", BackendUnavailableError(
                f"no allocation check could be read on any of {len(nodes)} nodes ({first})"),
                self._check_interval)
            rnd.failed.clear()
            return
        for alloc_id, (node, why) in rnd.failed.items():
            if alloc_id not in self.unknown:
                log.warning("allocation %s on node %s gets no traffic until its health can "
                            "be read: %s", alloc_id, node, why)
            self.unknown[alloc_id] = why
        rnd.failed.clear()

    def _recompute(self) -> None:
        endpoints = {}
        # The job renders its service with a "profile=<name>" tag (render.tags).
        self._profiles = {endpoint_url(r): tag[len(PROFILE_TAG):]
                          for regs in self.registrations.values() for r in regs
                          for tag in r.Tags or () if tag.startswith(PROFILE_TAG)}
        for model in self._models:
            urls = sorted({endpoint_url(r) for r in self.registrations.get(model, ())
                           if self.alloc_health.get(r.AllocID) is True
                           and r.AllocID not in self.unknown})
            if urls:
                endpoints[model] = urls
        if endpoints != self._endpoints:
            self._endpoints = endpoints
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
