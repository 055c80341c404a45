"""The scaler: one process across all gateways decides each model's replica count from its load.

Every gateway process runs a ``Scaler``; each tick it publishes its own load
(requests in flight and queued per model) as a store report, then tries the
store lease ``scaler``. The holder — one process across every instance and
worker — sums the fresh load reports, reads the engines' figures, decides
(``scaling.decide``), asks the scheduler for the count through
``Routing.set_demand``, and publishes its decisions with their reasons. The
others read those decisions, so ``/metrics`` of any process, and the API of
any instance (``llmgw ctl replicas``), show the same count and why.

The lease is short (a few ticks): a holder that dies is replaced within
seconds, and its successor starts with no history, so it scales up at once
if it must but down only after watching a whole ``scale_down_delay``.

Only models the scheduler runs and whose range leaves a choice (``max``
above ``min``, or above 1 for an on-demand model) are managed. An on-demand
model at zero replicas is left to the on-demand path: the scaler neither
starts it nor stops it.

A store outage stops decisions (nobody can know they are the only decider)
and leaves every count where it is; it is logged once until the store answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import msgspec

from llmgw.catalog.build import Catalog
from llmgw.catalog.model import Model
from llmgw.errors import LlmgwError, StoreUnavailableError
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.routing import Balancer
from llmgw.gateway.scaling import Decision, ScaleInputs, decide, demand_of, recommend
from llmgw.scheduler.base import SCALER_REPORT, Routing
from llmgw.scheduler.base import ScalerDecision as Decided
from llmgw.scheduler.base import ScalerDecisions as Decisions
from llmgw.store.base import Store

log = logging.getLogger("llmgw.gateway.scaler")

LEASE = "scaler"


class ModelLoad(msgspec.Struct, frozen=True):
    in_flight: int = 0
    queued: int = 0


class LoadReport(msgspec.Struct, frozen=True):
    models: dict[str, ModelLoad]


_encode = msgspec.json.Encoder().encode
_load = msgspec.json.Decoder(LoadReport)
_decisions = msgspec.json.Decoder(Decisions)


def scaling_range(model: Model) -> tuple[int, int] | None:
    """``(low, high)`` the scaler may choose from, or None when it has no choice to make."""
    if model.external:
        return None
    s = model.scaling
    low = max(s.min, 1)
    high = s.max if s.max is not None else low
    return (low, high) if high > low else None


class Scaler:
    def __init__(self, backend: Routing, store: Store, balancer: Balancer,
                 metrics: GatewayMetrics, holder: str, clock: Callable[[], float],
                 interval: float, local_load: Callable[[], Mapping[str, ModelLoad]]) -> None:
        self.backend = backend
        self.store = store
        self.balancer = balancer
        self.metrics = metrics
        self.holder = holder
        self.clock = clock
        self.interval = interval
        self.local_load = local_load
        self.decisions: dict[str, Decided] = {}
        self.leading = False
        self._watched_since: float | None = None
        self._history: dict[str, list[tuple[float, int]]] = {}
        self._changed_at: dict[str, float] = {}
        self._store_down = False

    @property
    def report_window(self) -> float:
        """How old a gateway's load report may be and still count."""
        return 3 * self.interval + 2.0

    async def tick(self, catalog: Catalog) -> None:
        try:
            await self._tick(catalog)
            if self._store_down:
                log.info("the store answers again; the scaler decides again")
            self._store_down = False
        except StoreUnavailableError as exc:
            if not self._store_down:
                log.warning("the scaler cannot reach the store; replica counts stay as they "
                            "are until it can: %s", exc.message)
            self._store_down = True
            self._resign()
        except Exception:
            # Once per outage, not once per tick (a store that was never opened).
            if not self._store_down:
                log.exception("the scaler failed; replica counts stay as they are")
            self._store_down = True
            self._resign()

    def _resign(self) -> None:
        self.leading = False
        self._watched_since = None
        self._history.clear()

    async def _tick(self, catalog: Catalog) -> None:
        mine = LoadReport(models=dict(self.local_load()))
        await self.store.put_report("load", self.holder, _encode(mine))
        managed = [m for m in catalog if scaling_range(m) is not None]
        if not managed:
            self.decisions = {}
            return
        ttl = max(3 * self.interval, 5.0)
        if not await self.store.try_lease(LEASE, self.holder, ttl):
            if self.leading:
                log.info("another process decides replica counts now")
            self._resign()
            await self._follow()
            return
        if not self.leading:
            log.info("this process decides replica counts now (holds the %r lease)", LEASE)
            await self._follow()
            now = self.clock()
            for name, d in self.decisions.items():
                if d.since is not None:
                    self._changed_at[name] = now - d.since
        self.leading = True
        now = self.clock()
        if self._watched_since is None:
            self._watched_since = now
        totals: dict[str, ModelLoad] = {}
        for report in await self.store.reports("load", self.report_window):
            try:
                loads = _load.decode(report.payload).models
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            for name, load in loads.items():
                t = totals.get(name, ModelLoad())
                totals[name] = ModelLoad(t.in_flight + load.in_flight, t.queued + load.queued)
        decided: dict[str, Decided] = {}
        for m in managed:
            decision = await self._decide(m, totals.get(m.name, ModelLoad()), now)
            if decision is not None:
                changed = self._changed_at.get(m.name)
                decided[m.name] = Decided(
                    desired=decision.desired, kind=decision.kind, reason=decision.reason,
                    since=None if changed is None else now - changed)
        self.decisions = decided
        await self.store.put_report(*SCALER_REPORT, _encode(Decisions(models=decided)))

    async def _follow(self) -> None:
        found = await self.store.reports(SCALER_REPORT[0], self.report_window + self.interval)
        self.decisions = {}
        for report in found:
            try:
                models = _decisions.decode(report.payload).models
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            self.decisions = {name: msgspec.structs.replace(
                d, since=None if d.since is None else d.since + report.age)
                for name, d in models.items()}

    async def _decide(self, m: Model, load: ModelLoad, now: float) -> Decision | None:
        rng = scaling_range(m)
        assert rng is not None
        status = self.backend.status(m.name)
        urls = self.backend.endpoints(m.name)
        if m.scaling.min == 0 and status.desired == 0:
            self._history.pop(m.name, None)
            return None
        samples = [self.balancer.sample(u, now) for u in urls]
        inputs = ScaleInputs(
            current=status.desired, ready=len(urls),
            waiting_for_capacity=status.waiting_for_capacity is not None,
            low=rng[0], high=rng[1], target=m.scaling.target,
            window=float(m.scaling.scale_down_delay),
            demand=demand_of(samples, load.in_flight, load.queued))
        history = self._history.setdefault(m.name, [])
        history.append((now, recommend(inputs)))
        while history and history[0][0] < now - inputs.window - self.interval:
            history.pop(0)
        assert self._watched_since is not None
        d = decide(inputs, history, now, self._watched_since)
        if d.desired != status.desired:
            direction = "up" if d.desired > status.desired else "down"
            log.info("scaling %r %s to %d: %s", m.name, direction, d.desired, d.reason)
            try:
                await self.backend.set_demand(m.name, d.desired)
            except LlmgwError as exc:
                log.error("scaling %r to %d failed: %s", m.name, d.desired,  # noqa: TRY400
                          exc.message)
                return Decision(desired=status.desired, kind=d.kind,
                                reason=f"asking the scheduler for {d.desired} failed: "
                                       f"{exc.message}")
            self.metrics.scale_changes.labels(m.name, direction).inc()
            self._changed_at[m.name] = now
        return d

    def figures(self) -> list[tuple[str, tuple[str, ...], float]]:
        return [("llmgw_gateway_desired_replicas", (name, d.kind), float(d.desired))
                for name, d in self.decisions.items()]


