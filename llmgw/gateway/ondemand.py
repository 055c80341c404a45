"""On-demand models: scale from zero when a request arrives, back to zero when idle.

A model with ``scaling.min: 0`` runs no replica until someone asks for it.

**Scale-up.** A request that finds no healthy replica is *held*, not
answered 503 (the failure of several peers): the gateway asks the scheduler
for one replica and waits, up to ``scaling.wait``, for it to become healthy.
A burst of requests must cause one scale-up, also across several gateway
processes, so the one that calls ``set_demand`` is whoever takes the store
lease ``scale-up:<model>``; everyone else just waits for the endpoint. In one
process, all held requests for a model share one waiting task, so a burst of
a thousand requests is one lease attempt and one wait loop.

The lease is held for ``scaling.wait`` while the replica loads. Once the
replica is up it is not released but shortened to a few seconds: a process
whose view of the endpoints lags behind would otherwise take the freed lease
and scale up a second time; a lease left at its full length would stop the
*next* cold start (after a scale-down) from being triggered by anyone else.

**Scale-down.** Every process marks a model's activity in the store when a
request for it starts or ends (at most once per ``activity_interval`` per
model) and, while it has requests in flight, on every tick. A model is scaled
back to zero only when the store's last activity (shared by all processes) is
older than its ``idle_timeout`` *and* this process has no request for it in
flight, so a generation longer than the idle timeout is never cut.

If the store cannot be reached, a scale-up still happens (availability over
de-duplication: two ``set_demand(model, 1)`` still make one replica) and a
scale-down does not (never stop a model on activity nobody can read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model
from llmgw.errors import LlmgwError, StoreUnavailableError
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.scheduler.base import Routing
from llmgw.store.base import Store

log = logging.getLogger("llmgw.gateway.ondemand")

# How long the scale-up lease is kept after the replica came up: long enough
# for every process to see the new endpoint (discovery lags by ~1 s), far
# shorter than any sensible idle timeout.
LEASE_GRACE = 5.0


def is_on_demand(model: Model) -> bool:
    return model.scaling.min == 0 and not model.external


def lease_name(model: str) -> str:
    return f"scale-up:{model}"


class OnDemand:
    def __init__(self, backend: Routing, store: Store, metrics: GatewayMetrics, holder: str,
                 activity_interval: float, clock: Callable[[], float]) -> None:
        self.backend = backend
        self.store = store
        self.metrics = metrics
        self.holder = holder
        self.activity_interval = activity_interval
        self.clock = clock
        self.in_flight: dict[str, int] = {}
        self._marked: dict[str, float] = {}
        self._bringing: dict[str, asyncio.Task[bool]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.ticks = 0

    # ------------------------------------------------------------ requests

    def begin(self, model: Model) -> None:
        name = model.name
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        if is_on_demand(model):
            self.touch(name)

    def end(self, model: Model) -> None:
        name = model.name
        self.in_flight[name] = self.in_flight.get(name, 1) - 1
        if is_on_demand(model):
            self.touch(name)

    def touch(self, name: str) -> None:
        """Mark activity now unless this process did so within ``activity_interval``."""
        now = self.clock()
        if now - self._marked.get(name, -math.inf) < self.activity_interval:
            return
        self._marked[name] = now
        self._spawn(self._mark(name))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _mark(self, name: str) -> None:
        try:
            await self.store.mark_activity(name)
        except StoreUnavailableError as exc:
            self._marked.pop(name, None)
            log.warning("cannot record activity of %r: %s", name, exc.message)
        except Exception:
            self._marked.pop(name, None)
            log.exception("recording activity of %r failed", name)

    async def wait_for_replica(self, model: Model) -> bool:
        """Hold until ``model`` has a healthy replica or ``scaling.wait`` has passed.

        Starts the scale-up if this process is the one that takes the lease.
        True when a replica is up.
        """
        name = model.name
        started = self.clock()
        deadline = started + model.scaling.wait
        try:
            while not self.backend.endpoints(name):
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return False
                task = self._bringing.get(name)
                if task is None or task.done():
                    task = asyncio.create_task(self._bring_up(model), name=f"scale-up {name}")
                    self._bringing[name] = task
                    task.add_done_callback(self._brought)
                # Not wait_for: on 3.11 it can swallow a cancellation that
                # races the task's completion, and this runs in a loop.
                try:
                    async with asyncio.timeout(remaining):
                        await asyncio.shield(task)
                except TimeoutError:
                    return bool(self.backend.endpoints(name))
                if not task.result():
                    return bool(self.backend.endpoints(name))
            return True
        finally:
            self.metrics.cold_wait.labels(name).observe(self.clock() - started)

    def _brought(self, task: asyncio.Task[bool]) -> None:
        for name, t in list(self._bringing.items()):
            if t is task:
                del self._bringing[name]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("scaling up failed: %s", exc)

    async def _bring_up(self, model: Model) -> bool:
        name = model.name
        wait = model.scaling.wait
        lease = lease_name(name)
        try:
            mine = await self.store.try_lease(lease, self.holder, wait)
        except StoreUnavailableError as exc:
            log.warning("store unreachable, scaling %r up without the lease: %s",
                        name, exc.message)
            mine = True
        if mine and not self.backend.endpoints(name):
            log.info("scaling on-demand model %r up from zero", name)
            try:
                await self.backend.set_demand(name, 1)
            except BaseException:
                await self._release(lease)
                raise
            self.metrics.scale_ups.labels(name).inc()
        deadline = self.clock() + wait
        while not self.backend.endpoints(name):
            remaining = deadline - self.clock()
            if remaining <= 0:
                log.warning("on-demand model %r has no healthy replica after %g s "
                            "(scaling.wait)", name, wait)
                return False
            await self.backend.wait_changed(min(remaining, 1.0))
        if mine:
            with contextlib.suppress(StoreUnavailableError):
                await self.store.try_lease(lease, self.holder, LEASE_GRACE)
        return True

    async def _release(self, lease: str) -> None:
        with contextlib.suppress(StoreUnavailableError):
            await self.store.release_lease(lease, self.holder)

    # ------------------------------------------------------------ background

    def tick_interval(self, catalog: Catalog) -> float:
        idle = [m.scaling.idle_timeout for m in catalog if is_on_demand(m)]
        return max(0.05, min([self.activity_interval, *(i / 4 for i in idle)]))

    async def tick(self, catalog: Catalog) -> None:
        """Keep in-flight models marked active; scale idle on-demand models to zero."""
        self.ticks += 1
        # Each count is read live: a request may begin while a mark is awaited.
        for name in list(self.in_flight):
            if self.in_flight.get(name, 0) <= 0:
                self.in_flight.pop(name, None)
                continue
            model = catalog.get(name)
            if model is not None and is_on_demand(model):
                self._marked[name] = self.clock()
                await self._mark(name)
        for model in catalog:
            if not is_on_demand(model) or self.in_flight.get(model.name, 0) > 0:
                continue
            try:
                await self._maybe_scale_down(model)
            except StoreUnavailableError as exc:
                log.warning("not scaling %r down: the store is unreachable: %s",
                            model.name, exc.message)
            except LlmgwError as exc:
                log.error("scaling %r down failed: %s", model.name, exc.message)  # noqa: TRY400

    async def _maybe_scale_down(self, model: Model) -> None:
        name = model.name
        if name in self._bringing:
            return
        running = bool(self.backend.endpoints(name)) or self.backend.status(name).desired > 0
        if not running:
            return
        idle_for = await self.store.last_activity(name)
        if idle_for is None:
            # Running but never used (started by someone else, or the store was
            # reset): start its idle clock now rather than stopping it at once.
            await self.store.mark_activity(name)
            return
        idle_timeout = model.scaling.idle_timeout
        if idle_for < idle_timeout or self.in_flight.get(name, 0) > 0:
            return
        log.info("scaling on-demand model %r to zero: no request for %.0f s (idle_timeout %g s)",
                 name, idle_for, idle_timeout)
        await self.backend.set_demand(name, 0)
        self.metrics.scale_downs.labels(name).inc()

    async def close(self) -> None:
        tasks = [*self._bringing.values(), *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
