"""Cost from GPU time: the scheduler's holdings, priced, attributed to teams by tokens.

**Metering.** One process across all instances (the store lease
``cost-meter``) asks the scheduler every ``costs.meter_interval`` (1m) for
its holdings — each replica's cards and cores, from the time they were
reserved until the time they were freed (``Holding``: Nomad's allocation
history, the local scheduler's reservations) — and records them in the
store as reported. A holding's time counts whether or not the replica
answered yet: starting, loading, restarting and draining replicas hold
their cards all the same.

The record is the scheduler's history, not samples, so a change of meter
holder or a restart loses nothing the scheduler still remembers: the next
holder records the start and end times the scheduler kept. What it does
not remember is bounded: a holding that was held at its last report and
is missing from the next (Nomad garbage-collected a terminal allocation
the meter never saw terminal, or llmgw's local scheduler restarted) ends
when it was last seen, at most one interval early for a running meter.

**Pricing.** Costs are computed when they are read: each holding's time in
[since, until) is split at hour boundaries into card-seconds per model,
GPU class and hour, and, for a replica without cards, core-seconds. A
model-hour costs its card-seconds times its GPU class's ``price_per_hour``
/ 3600, plus its core-seconds times ``costs.cpu_core_per_hour`` / 3600. A
GPU class without a price is listed in ``unpriced`` and costs nothing,
rather than a guess. A holding still open counts up to the time of the read.

**Attribution.** Each model-hour's cost is shared among the teams whose
requests that model answered in that hour, in proportion to their tokens
(prompt + completion, from the ledger's roll-ups). A model-hour in which no
request was answered is idle: its whole cost goes to the overhead account
(``costs.overhead_account``), never spread silently over the teams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

import anyio.to_thread
import msgspec

from llmgw.catalog.model import GpuClass
from llmgw.config import CostsConfig
from llmgw.control.context import AppContext
from llmgw.control.usage import instant_at, report_span
from llmgw.errors import LlmgwError, StoreUnavailableError
from llmgw.scheduler.base import Holding
from llmgw.store.base import ReplicaTime, Store, StoredHolding, hour_of
from llmgw.tenancy import COSTS_REPORT, TeamCosts

log = logging.getLogger("llmgw.control.costs")

LEASE = "cost-meter"


class CostMeter:
    """Records the scheduler's holdings in the store; one holder across instances."""

    def __init__(self, store: Store, holdings: Callable[[], Awaitable[list[Holding]]],
                 holder: str, interval: float, clock: Callable[[], float] = time.time,
                 gpu_classes: dict[str, GpuClass] | None = None,
                 costs: CostsConfig | None = None,
                 bases: Callable[[], Mapping[str, str]] = dict) -> None:
        self.store = store
        # Adapter → its base: an adapter's tokens share the base's GPU time.
        self.bases = bases
        self.gpu_classes = gpu_classes or {}
        self.costs = costs or CostsConfig()
        self._holdings = holdings
        self.holder = holder
        self.interval = interval
        self.clock = clock

    async def tick(self) -> list[Holding]:
        """Record once; the holdings recorded (none without the lease)."""
        if not self.store.is_open:
            return []
        if not await self.store.try_lease(LEASE, self.holder, 3 * self.interval):
            return []
        held = await self._holdings()
        now = self.clock()
        await self.store.put_holdings([stored(h) for h in held], now)
        await self.publish(now)
        return held

    async def publish(self, now: float) -> TeamCosts:
        """Each team's cost so far this UTC day and month, for the gateways' cost budgets."""
        t = datetime.fromtimestamp(now, UTC)
        day = t.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
        month = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()
        end = hour_of(now) + 3600
        held = await self.store.holdings(month, end)
        times = held_time(held, month, end, now)
        tokens = on_bases([(x.hour, x.team, x.model, x.tokens)
                           for x in await self.store.team_model_tokens(month, end)],
                          self.bases())
        costs = TeamCosts(day_start=day, month_start=month, at=now,
                          rate=accrual_rates(held, tokens, now, self.gpu_classes, self.costs))
        for into, lo in ((costs.month, month), (costs.day, day)):
            teams, _, _ = attribute([r for r in times if r.hour >= lo],
                                    [x for x in tokens if x[0] >= lo], self.gpu_classes,
                                    self.costs)
            into.update({c.team: c.cost for c in teams})
        await self.store.put_report(COSTS_REPORT, "current", msgspec.json.encode(costs))
        return costs

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except LlmgwError as exc:
                log.warning("recording the scheduler's holdings failed: %s", exc.message)
            except Exception:
                log.exception("recording the scheduler's holdings failed")
            await asyncio.sleep(self.interval)


def on_bases(tokens: list[tuple[int, str, str, int]], bases: Mapping[str, str]
             ) -> list[tuple[int, str, str, int]]:
    """Tokens per (hour, team, model), an adapter's counted on its base.

    The ledger names the adapter a request asked for (usage reports show it);
    the GPU time it used is its base's replicas', shared by tokens among every
    team that used the base or any of its adapters in that hour.
    """
    if not bases:
        return tokens
    return [(hour, team, bases.get(model, model), n) for hour, team, model, n in tokens]


def stored(h: Holding) -> StoredHolding:
    return StoredHolding(id=h.id, model=h.model, gpu_class=h.gpu_class, gpus=float(h.gpus),
                         cores=float(h.cores), started=h.start, ended=h.end, seen=0.0)


def held_time(holdings: list[StoredHolding], start: float, end: float,
              now: float) -> list[ReplicaTime]:
    """Card- and core-seconds of each model in [start, end), split at hour boundaries.

    A holding still open counts until ``now``. Cores count only for a holding
    without cards: a GPU replica's cores come with its cards' price.
    """
    sums: dict[tuple[int, str, str], list[float]] = {}
    for h in holdings:
        t = max(start, h.started)
        stop = min(end, now if h.ended is None else h.ended)
        cores = 0.0 if h.gpus else h.cores
        while t < stop:
            hour = hour_of(t)
            upto = min(stop, hour + 3600)
            s = sums.setdefault((hour, h.model, h.gpu_class if h.gpus else ""), [0.0, 0.0])
            s[0] += h.gpus * (upto - t)
            s[1] += cores * (upto - t)
            t = upto
    return [ReplicaTime(hour=h, model=m, gpu_class=g, gpu_seconds=v[0], core_seconds=v[1])
            for (h, m, g), v in sorted(sums.items())]


def accrual_rates(holdings: list[StoredHolding], tokens: list[tuple[int, str, str, int]],
                  now: float, gpu_classes: dict[str, GpuClass], costs: CostsConfig
                  ) -> dict[str, float]:
    """What each team's cost grows by per second from ``now``: every holding still open,
    priced as ``attribute`` prices it, shared by the teams' tokens on its model this hour
    (the hour before while this one has none yet). Idle models accrue to nobody's
    budget, as ``attribute`` gives their cost to the overhead account."""
    per_model: dict[str, float] = {}
    for h in holdings:
        if h.ended is not None or h.started > now:
            continue
        rate = 0.0
        if h.gpus:
            gc = gpu_classes.get(h.gpu_class)
            if gc is not None and gc.price_per_hour is not None:
                rate = h.gpus * gc.price_per_hour / 3600
        elif costs.cpu_core_per_hour is not None:
            rate = h.cores * costs.cpu_core_per_hour / 3600
        if rate:
            per_model[h.model] = per_model.get(h.model, 0.0) + rate
    hour = hour_of(now)
    rates: dict[str, float] = {}
    for model, rate in per_model.items():
        for lo in (hour, hour - 3600):
            shares = [(team, n) for h_, team, m, n in tokens if h_ == lo and m == model and n > 0]
            if shares:
                total = sum(n for _, n in shares)
                for team, n in shares:
                    rates[team] = rates.get(team, 0.0) + rate * n / total
                break
    return rates


class TeamCost(msgspec.Struct, kw_only=True):
    team: str
    cost: float
    tokens: int


class ModelCost(msgspec.Struct, kw_only=True):
    model: str
    cost: float
    gpu_hours: float
    core_hours: float
    tokens: int
    idle_cost: float                        # of cost, what went to the overhead account
    cost_per_million_tokens: float | None   # None: no tokens


class CostReport(msgspec.Struct, kw_only=True):
    since: datetime
    until: datetime
    total: float
    overhead_account: str
    teams: list[TeamCost]                   # most expensive first; the overhead account too
    models: list[ModelCost]
    unpriced: list[str]                     # GPU classes with time but no price_per_hour


def attribute(times: list[ReplicaTime], tokens: list[tuple[int, str, str, int]],
              gpu_classes: dict[str, GpuClass], costs: CostsConfig
              ) -> tuple[list[TeamCost], list[ModelCost], list[str]]:
    """Price each model-hour and share it among teams by tokens; idle to the overhead."""
    unpriced: set[str] = set()
    hour_cost: dict[tuple[int, str], float] = {}
    models: dict[str, ModelCost] = {}
    for t in times:
        cost = 0.0
        if t.gpu_seconds:
            gc = gpu_classes.get(t.gpu_class)
            price = gc.price_per_hour if gc is not None else None
            if price is None:
                unpriced.add(t.gpu_class)
            else:
                cost += t.gpu_seconds / 3600 * price
        if t.core_seconds and costs.cpu_core_per_hour is not None:
            cost += t.core_seconds / 3600 * costs.cpu_core_per_hour
        hour_cost[(t.hour, t.model)] = hour_cost.get((t.hour, t.model), 0.0) + cost
        m = models.setdefault(t.model, ModelCost(model=t.model, cost=0.0, gpu_hours=0.0,
                                                 core_hours=0.0, tokens=0, idle_cost=0.0,
                                                 cost_per_million_tokens=None))
        m.cost += cost
        m.gpu_hours += t.gpu_seconds / 3600
        m.core_hours += t.core_seconds / 3600
    by_hour: dict[tuple[int, str], list[tuple[str, int]]] = {}
    for hour, team, model, n in tokens:
        if n > 0:
            by_hour.setdefault((hour, model), []).append((team, n))
        if model in models:
            models[model].tokens += n
    teams: dict[str, TeamCost] = {}

    def charge(team: str, cost: float, n: int) -> None:
        tc = teams.setdefault(team, TeamCost(team=team, cost=0.0, tokens=0))
        tc.cost += cost
        tc.tokens += n

    for (hour, model), cost in hour_cost.items():
        shares = by_hour.get((hour, model))
        if not shares:
            charge(costs.overhead_account, cost, 0)
            models[model].idle_cost += cost
            continue
        total = sum(n for _, n in shares)
        for team, n in shares:
            charge(team, cost * n / total, n)
    for m in models.values():
        if m.tokens:
            m.cost_per_million_tokens = m.cost / m.tokens * 1e6
    return (sorted(teams.values(), key=lambda c: (-c.cost, c.team)),
            sorted(models.values(), key=lambda c: (-c.cost, c.model)), sorted(unpriced))


async def cost_report(ctx: AppContext, since: datetime | None,
                      until: datetime | None) -> CostReport:
    if not ctx.store.is_open:
        raise StoreUnavailableError("the store is not open, so costs cannot be read; "
                                    "`/readyz` says why")
    # Any span, as a usage report answers it (``llmgw.control.usage``): the reads are
    # ranges of the data there is, and the hours split below are the holdings' own.
    lo, hi = report_span(since, until, 3600, 30 * 86400)
    holdings = await ctx.store.holdings(lo, hi) if hi > lo else []
    rows = await ctx.store.team_model_tokens(lo, hi) if hi > lo else []
    bases = {a.name: a.base for a in ctx.models.catalog.adapters.values()}
    now = time.time()

    def priced() -> tuple[list[TeamCost], list[ModelCost], list[str]]:
        times = held_time(holdings, lo, hi, now)
        tokens = on_bases([(t.hour, t.team, t.model, t.tokens) for t in rows], bases)
        return attribute(times, tokens, dict(ctx.config.gpu_classes), ctx.config.costs)

    # Years of a large fleet's holdings are many card-hours to split: off the event loop
    # that also serves the gateway.
    teams, models, unpriced = await anyio.to_thread.run_sync(priced)
    return CostReport(since=instant_at(lo), until=instant_at(hi),
                      total=sum(m.cost for m in models),
                      overhead_account=ctx.config.costs.overhead_account, teams=teams,
                      models=models, unpriced=unpriced)
