"""Fetching an adapter onto a replica's node before the gateway loads it there.

``AdapterStager`` carries out what ``adapterjob`` decides, for any llmgw process:
the gateway calls ``stage`` on the request path (through ``NomadBackend``), so it
runs in whichever process holds the request, leader or not — each holds a token
with ``submit-job`` and ``read-fs`` in llmgw's namespace, and nothing more is
needed. Writing the node's metadata afterwards is the leader's (``caches``), as
for a model's fetch.

``stage(adapter, address)``:

1. the replica's node, from its service registration (``Discovery``);
2. nothing to do when the node is known to hold the adapter — its metadata says
   so, or this process fetched it there (``again`` overrides: the engine said the
   path holds no adapter, so the cache lost it);
3. otherwise the job ``llmgw_adapter_<adapter>_<node>`` is read: a fetch under way
   is waited for; a finished one is trusted unless ``again``; else a new attempt is
   registered with ``EnforceIndex`` (a concurrent register by another process wins,
   and this one waits on that attempt);
4. the attempt is followed until its allocation is terminal. A failure raises
   ``AdapterFetchError`` with the fetch's own reason, and is remembered for
   ``RETRY_AFTER`` seconds, so a hot adapter with a broken source asks Nomad for one
   job per node and interval, not one per request.

Concurrent calls in one process for one (adapter, node) share one attempt. The
attempt is not tied to the caller: a caller whose bound passes stops waiting, the
attempt goes on (to ``FOLLOW_FOR``), and the next request finds the adapter there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable

from llmgw.catalog.adapter import Adapter
from llmgw.config import NomadConfig
from llmgw.errors import NotFoundError, UnavailableError
from llmgw.scheduler.nomad import adapterjob, credentials, wire
from llmgw.scheduler.nomad.client import JobChangedError, NomadClient
from llmgw.scheduler.nomad.offload import Offloader
from llmgw.scheduler.nomad.placement import latest_failure
from llmgw.scheduler.nomad.render import PROGRESS_FILE
from llmgw.weights import cache

log = logging.getLogger("llmgw.nomad")
# Seconds a failed fetch is answered from memory before it is tried again.
RETRY_AFTER = 30.0
# Seconds an attempt is followed at most (an allocation Nomad never places, say).
FOLLOW_FOR = 600.0
POLL = 0.25


class AdapterFetchError(UnavailableError):
    """The adapter's weights could not be brought onto the replica's node."""

    code = "adapter_fetch_failed"


class AdapterStager:
    def __init__(self, client: NomadClient, offload: Offloader, cfg: NomadConfig,
                 mirror: str | None, keeper: credentials.Keeper,
                 node_of: Callable[[str], str | None], *,
                 clock: Callable[[], float] = time.monotonic, poll: float = POLL) -> None:
        self._client, self._offload, self._cfg = client, offload, cfg
        self._mirror, self._keeper, self._node_of = mirror, keeper, node_of
        self._clock, self._poll = clock, poll
        self._meta: dict[str, dict[str, str]] = {}        # node ID → metadata, last read
        self._names: dict[str, str] = {}                  # node ID → name
        self._have: dict[tuple[str, str], str] = {}       # (node, adapter) → tag fetched
        self._failed: dict[tuple[str, str], tuple[float, str]] = {}
        self._attempts: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.fetches = 0          # attempts this process registered (tests, metrics)

    async def close(self) -> None:
        """Stop following the attempts under way (their jobs run on in Nomad)."""
        tasks = list(self._attempts.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- what the nodes hold ------------------------------------------------

    def note_nodes(self, nodes: Iterable[wire.Node],
                   meta: Callable[[wire.Node], dict[str, str]]) -> None:
        """The nodes as a pass read them, with llmgw's own pending writes (``caches``)."""
        self._meta = {n.ID: meta(n) for n in nodes}
        self._names = {n.ID: n.Name or n.ID for n in nodes}

    def warm(self, adapter: Adapter, address: str) -> bool:
        """Whether the node of the replica at ``address`` holds ``adapter`` (no I/O)."""
        node = self._node_of(address)
        found = adapterjob.fetch_of(adapter, self._mirror)
        if node is None or found is None:
            return False
        return self._have.get((node, adapter.name)) == cache.tag(found[1]) or \
            adapterjob.warm(self._meta.get(node), adapter, self._mirror)

    # ---- fetching -----------------------------------------------------------

    async def stage(self, adapter: Adapter, address: str, *, again: bool = False) -> None:
        """Make the node of the replica at ``address`` hold ``adapter``'s weights."""
        if adapterjob.fetch_of(adapter, self._mirror) is None:
            return    # read from a path the engine sees as it is
        node = self._node_of(address)
        if node is None:
            raise AdapterFetchError(
                f"adapter {adapter.name!r}: the replica at {address} is not among the "
                "service registrations Nomad lists; it is stopping or was never llmgw's")
        if not again and self.warm(adapter, address):
            return
        key = (node, adapter.name)
        failed = self._failed.get(key)
        if failed is not None and self._clock() - failed[0] < RETRY_AFTER:
            raise AdapterFetchError(failed[1])
        task = self._attempts.get(key)
        if task is None:
            task = asyncio.create_task(self._attempt(adapter, node, again))
            self._attempts[key] = task
            task.add_done_callback(lambda t: self._settled(key, t))
        await asyncio.shield(task)

    def _settled(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._attempts.pop(key, None)
        if not task.cancelled() and isinstance(task.exception(), AdapterFetchError):
            self._failed[key] = (self._clock(), str(task.exception()))

    async def _attempt(self, adapter: Adapter, node: str, again: bool) -> None:
        jid = adapterjob.job_id(adapter.name, node)
        where = self._names.get(node, node)
        registered = False
        deadline = self._clock() + FOLLOW_FOR
        while self._clock() < deadline:
            version, index, allocs, unplaced = await self._offload.run(self._read, jid)
            seen = adapterjob.outcome(version, allocs, unplaced=unplaced)
            if seen.state == "done" and (registered or not again):
                found = adapterjob.fetch_of(adapter, self._mirror)
                assert found is not None
                self._have[(node, adapter.name)] = cache.tag(found[1])
                self._failed.pop((node, adapter.name), None)
                log.info("adapter %s: its weights are on node %s", adapter.name, where)
                return
            if seen.state == "failed" and registered:
                error = await self._offload.run(self._error, allocs, version)
                reason = adapterjob.outcome(version, allocs, error, unplaced).reason
                log.warning("adapter %s: fetching it onto node %s failed: %s",
                            adapter.name, where, reason)
                raise AdapterFetchError(
                    f"adapter {adapter.name!r}: fetching its weights onto node {where} "
                    f"failed: {reason}")
            if seen.state != "running" and not registered:
                await self._offload.run(self._register, adapter, node, jid, index)
                registered = True
            elif seen.state == "running":
                registered = True   # an attempt under way (ours or another process's)
            await asyncio.sleep(self._poll)
        raise AdapterFetchError(
            f"adapter {adapter.name!r}: its fetch onto node {where} did not finish in "
            f"{FOLLOW_FOR:.0f} s (job {jid}; `nomad job status {jid}` says why)")

    def _read(self, jid: str) -> tuple[int | None, int, list[wire.Allocation],
                                      wire.AllocationMetric | None]:
        """The job's version and index, its allocations, and — while the version has
        none — why its latest evaluation placed nothing, if it says (an evaluation names
        the job version it was made for by its JobModifyIndex: docs/nomad-api.md §5.2)."""
        try:
            job = self._client.job_version(jid)
            allocs = self._client.job_allocations(jid)
            unplaced = None
            if not any(a.JobVersion == job.Version for a in allocs):
                evals = [e for e in self._client.job_evaluations(jid)
                         if e.JobModifyIndex >= job.JobModifyIndex]
                unplaced = latest_failure(evals, adapterjob.ADAPTER_GROUP)
        except NotFoundError:
            return None, 0, [], None
        return job.Version, job.JobModifyIndex, allocs, unplaced

    def _error(self, allocs: list[wire.Allocation], version: int | None) -> str | None:
        mine = [a for a in allocs if a.JobVersion == version]
        if not mine:
            return None
        latest = max(mine, key=lambda a: a.CreateIndex)
        data = self._client.alloc_file(latest.ID, PROGRESS_FILE, timeout=5.0)
        p = cache.read_progress(data) if data else None
        return p.error if p is not None else None

    def _register(self, adapter: Adapter, node: str, jid: str, index: int) -> None:
        # Its fetch reads the same credentials a model of that source would.
        self._keeper.ensure(adapter, jid)
        keys = credentials.needs(adapter, self._cfg, self._mirror).fetch
        job = adapterjob.fetch_job(adapter, self._cfg, self._mirror, node,
                                   run=uuid.uuid4().hex[:12], keys=keys)
        try:
            # Index 0: only if there is no such job; else only if nobody changed it since.
            self._client.register(job, if_index=index)
        except JobChangedError:
            return    # another process registered an attempt first: follow that one
        self.fetches += 1
        log.info("adapter %s: fetching its weights onto node %s (job %s)", adapter.name,
                 self._names.get(node, node), jid)
