"""Cost from GPU time: metering replica time, pricing it, attributing it by tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from llmgw.api.app import create_app
from llmgw.catalog.decode import convert
from llmgw.catalog.model import GpuClass, Model
from llmgw.catalog.units import Size
from llmgw.config import AdminToken, CostsConfig, ServerConfig
from llmgw.control.context import AppContext
from llmgw.control.costs import CostMeter, attribute, held_time
from llmgw.modelsvc import ModelService
from llmgw.scheduler.base import Holding
from llmgw.store.base import ReplicaTime, Store, StoredHolding, UsageRecord

from .conftest import RecordingBackend

ADMIN = {"Authorization": "Bearer t0ken-alice"}
HOUR = 1_773_500_400          # 2026-03-14T15:00:00Z
H100 = GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB"),
                price_per_hour=2.0)
L4 = GpuClass(device="NVIDIA L4", memory=Size.parse("23034MiB"))
GPUS = {"h100": H100, "l4": L4}
COSTS = CostsConfig(cpu_core_per_hour=0.05, overhead_account="platform")

BIG = convert({"name": "big", "source": "/m/big.gguf", "engine": "llama.cpp", "profiles": [
    {"name": "tp2", "gpu_class": "h100", "gpus": 2}]}, Model)
SMALL = convert({"name": "small", "source": "/m/small.gguf", "engine": "llama.cpp",
                 "profiles": [{"name": "cpu", "cpu_cores": 4, "memory": "8GiB"}]}, Model)


def held(id_: str, model: str, gpus: float, start: float, end: float | None = None, *,
         gpu_class: str = "h100", cores: float = 0) -> StoredHolding:
    return StoredHolding(id=id_, model=model, gpu_class=gpu_class, gpus=gpus, cores=cores,
                         started=start, ended=end, seen=start)


def test_held_time_counts_cards_and_cores_split_at_the_hour() -> None:
    holdings = [
        held("a", "big", 2, HOUR - 60, cores=16),            # open: counts until now
        held("b", "small", 0, HOUR - 7200, HOUR + 10, gpu_class="", cores=4),
        held("c", "big", 2, HOUR - 9000, HOUR - 3700),       # ended before the window
        held("d", "big", 0.5, HOUR, HOUR + 3600)]            # carried over: half a card
    rows = held_time(holdings, HOUR - 60, HOUR + 3600, now=HOUR + 30)
    assert rows == [
        ReplicaTime(hour=HOUR - 3600, model="big", gpu_class="h100", gpu_seconds=120.0,
                    core_seconds=0.0),
        ReplicaTime(hour=HOUR - 3600, model="small", gpu_class="", gpu_seconds=0.0,
                    core_seconds=240.0),
        ReplicaTime(hour=HOUR, model="big", gpu_class="h100", gpu_seconds=60.0 + 1800.0,
                    core_seconds=0.0),
        ReplicaTime(hour=HOUR, model="small", gpu_class="", gpu_seconds=0.0,
                    core_seconds=40.0)]


def test_cost_is_shared_by_tokens_and_idle_hours_go_to_the_overhead() -> None:
    times = [ReplicaTime(hour=HOUR, model="big", gpu_class="h100", gpu_seconds=7200,
                         core_seconds=0),                 # 2 cards x 1 h = 4.0
             ReplicaTime(hour=HOUR + 3600, model="big", gpu_class="h100", gpu_seconds=3600,
                         core_seconds=0),                 # idle: 2.0
             ReplicaTime(hour=HOUR, model="small", gpu_class="", gpu_seconds=0,
                         core_seconds=4 * 3600),          # 4 cores x 1 h = 0.2
             ReplicaTime(hour=HOUR, model="cheap", gpu_class="l4", gpu_seconds=3600,
                         core_seconds=0)]                 # no price
    tokens = [(HOUR, "ml", "big", 3000), (HOUR, "web", "big", 1000),
              (HOUR, "web", "small", 500), (HOUR, "ml", "cheap", 10)]
    teams, models, unpriced = attribute(times, tokens, GPUS, COSTS)
    cost = {t.team: round(t.cost, 6) for t in teams}
    assert cost == {"ml": 3.0, "platform": 2.0, "web": 1.2}
    by_model = {m.model: m for m in models}
    assert round(by_model["big"].cost, 6) == 6.0
    assert round(by_model["big"].idle_cost, 6) == 2.0
    assert by_model["big"].gpu_hours == 3.0
    assert round(by_model["big"].cost_per_million_tokens or 0, 6) == 1500.0
    assert round(by_model["small"].cost, 6) == 0.2
    assert unpriced == ["l4"]


async def test_one_meter_records_the_schedulers_history_and_closes_what_it_forgot(
        store: Store) -> None:
    now = [float(HOUR)]
    reported = [Holding(id="alloc-1", model="big", gpu_class="h100", gpus=2, cores=16,
                        start=HOUR - 600.0),
                Holding(id="alloc-2", model="big", gpu_class="h100", gpus=2, cores=16,
                        start=HOUR - 300.0)]

    async def holdings() -> list[Holding]:
        return list(reported)

    first = CostMeter(store, holdings, "a", 60, clock=lambda: now[0])
    second = CostMeter(store, holdings, "b", 60, clock=lambda: now[0])
    assert len(await first.tick()) == 2
    assert await second.tick() == []            # no lease
    # Times come from the scheduler, not from when the meter looked: the time before
    # the first tick counts.
    stored = {h.id: h for h in await store.holdings(HOUR - 3600, HOUR + 3600)}
    assert stored["alloc-1"].started == HOUR - 600.0
    assert stored["alloc-1"].ended is None
    # alloc-1 ends (the scheduler says when); alloc-2 is forgotten while open.
    reported[:] = [msgspec.structs.replace(reported[0], end=HOUR + 100.0)]
    now[0] += 200
    await first.tick()
    stored = {h.id: h for h in await store.holdings(HOUR - 3600, HOUR + 3600)}
    assert stored["alloc-1"].ended == HOUR + 100.0
    assert stored["alloc-2"].ended == HOUR      # last seen at the first tick
    times = held_time(list(stored.values()), HOUR - 3600, HOUR + 3600, now[0])
    assert sum(r.gpu_seconds for r in times) == 2 * 700 + 2 * 300
    # Reported held again (the scheduler's word wins): open again.
    reported.append(Holding(id="alloc-2", model="big", gpu_class="h100", gpus=2, cores=16,
                            start=HOUR - 300.0))
    now[0] += 60
    await first.tick()
    [again] = [h for h in await store.holdings(HOUR, HOUR + 3600) if h.id == "alloc-2"]
    assert again.ended is None
    assert [h.id for h in await store.holdings(HOUR + 150, HOUR + 3600)] == ["alloc-2"]


@pytest.fixture
async def client(store: Store, backend: RecordingBackend,
                 tmp_path: Path) -> AsyncIterator[AsyncTestClient]:
    config = ServerConfig(admin_tokens=[AdminToken(name="alice", token="t0ken-alice")],
                          gpu_classes=GPUS, costs=COSTS)
    svc = ModelService(config.models, GPUS, store)
    await svc.load()
    ctx = AppContext(config=config, models=svc, backend=backend, store=store)
    async with AsyncTestClient(create_app(ctx)) as c:
        yield c


async def test_the_costs_route_prices_time_and_attributes_it(
        client: AsyncTestClient, store: Store) -> None:
    """Cost over a span is the priced holdings shared by tokens, for any span: every instant
    there is counts the same hour, and a year before the data costs nothing."""
    await store.put_holdings([held("x", "big", 2, HOUR, HOUR + 3600)], HOUR + 3600)
    await store.record_usage([UsageRecord(
        id=f"r{i}", at=HOUR + i, key="k", team=team, model="big", replica="r",
        gpu_class="h100", prompt_tokens=n, cached_tokens=0, completion_tokens=0, status=200,
        latency=0.1, ttft=None) for i, (team, n) in enumerate([("ml", 300), ("web", 100)])])
    r = await client.get("/api/v1/costs", headers=ADMIN, params={
        "since": "2026-03-14T15:00:00Z", "until": "2026-03-14T16:00:00Z"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 4.0
    assert [(t["team"], t["cost"], t["tokens"]) for t in body["teams"]] == [
        ("ml", 3.0, 300), ("web", 1.0, 100)]
    assert body["models"][0]["cost_per_million_tokens"] == 10000.0
    # Every instant there is costs what the data in it costs: the same hour, priced alike.
    r = await client.get("/api/v1/costs", headers=ADMIN, params={
        "since": "0001-01-01T00:00:00Z", "until": "9999-12-31T23:59:59Z"})
    assert r.status_code == 200, r.text
    assert (r.json()["since"], r.json()["until"]) == ("0001-01-01T00:00:00Z",
                                                      "9999-12-31T23:59:59Z")
    assert r.json()["total"] == 4.0
    r = await client.get("/api/v1/costs", headers=ADMIN, params={"since": "2000-01-01T00:00:00Z",
                                                                 "until": "2001-01-01T00:00:00Z"})
    assert r.status_code == 200, r.text
    assert (r.json()["total"], r.json()["teams"]) == (0, [])


async def test_the_meter_publishes_each_teams_cost_this_day_and_month(store: Store) -> None:
    import msgspec

    from llmgw.tenancy import COSTS_REPORT, TeamCosts

    meter = CostMeter(store, no_holdings, "a", 60, clock=lambda: HOUR + 1800.0,
                      gpu_classes=GPUS, costs=COSTS)
    await store.put_holdings([
        held("today", "big", 2, HOUR),                     # open: 2 cards x 30 min = 2.0
        held("yesterday", "big", 1, HOUR - 86400, HOUR - 84600)],   # this month: 1.0
        HOUR + 1800.0)
    await store.record_usage([
        UsageRecord(id="a", at=HOUR + 5, key="k", team="ml", model="big", replica="r",
                    gpu_class="h100", prompt_tokens=10, cached_tokens=0, completion_tokens=0,
                    status=200, latency=0.1, ttft=None),
        UsageRecord(id="b", at=HOUR - 86400 + 5, key="k", team="web", model="big",
                    replica="r", gpu_class="h100", prompt_tokens=10, cached_tokens=0,
                    completion_tokens=0, status=200, latency=0.1, ttft=None)])
    published = await meter.publish(HOUR + 1800.0)
    assert published.day == {"ml": 2.0}
    assert published.month == {"ml": 2.0, "web": 1.0}
    [report] = await store.reports(COSTS_REPORT, 60)
    assert msgspec.json.decode(report.payload, type=TeamCosts) == published


async def no_holdings() -> list[Holding]:
    return []


def test_cost_budgets_are_checked_and_belong_to_the_team() -> None:
    from llmgw.errors import DefinitionError
    from llmgw.tenancy import Limits, check_limits, check_narrowing

    for bad in (0, -1.0, 1e12):
        with pytest.raises(DefinitionError) as err:
            check_limits(Limits(cost_per_day=bad), "team 't'")
        assert err.value.field == "cost_per_day"
    with pytest.raises(DefinitionError) as err:
        check_narrowing(Limits(), Limits(cost_per_month=5), "key 'k'")
    assert err.value.field == "cost_per_month"


def test_an_adapters_tokens_share_its_bases_gpu_time_for_the_team_using_it() -> None:
    """A team using only a fine-tune pays its token share of the base's replica time."""
    from llmgw.control.costs import on_bases

    times = [ReplicaTime(hour=HOUR, model="big", gpu_class="h100", gpu_seconds=7200,
                         core_seconds=0)]                 # 4.0
    tokens = on_bases([(HOUR, "ml", "big", 1000), (HOUR, "legal", "big-law", 3000)],
                      {"big-law": "big"})
    teams, _, _ = attribute(times, tokens, GPUS, COSTS)
    assert {t.team: round(t.cost, 6) for t in teams} == {"legal": 3.0, "ml": 1.0}


async def test_a_cost_budget_counts_the_time_held_since_the_meters_last_pass(
        store: Store) -> None:
    """Published at 15:30 with ml at 2.00 of a 3.00 day and two cards still held for it,
    the budget is spent at 16:00 though the meter has not run since: a gateway adds the
    cards' cost per second times the time since, rather than waiting a meter interval."""

    from llmgw.gateway.budgets import Budgets, QuotaExceededError
    from llmgw.gateway.ledger import Ledger
    from llmgw.tenancy import Limits

    published_at = HOUR + 1800.0
    meter = CostMeter(store, no_holdings, "a", 60, clock=lambda: published_at,
                      gpu_classes=GPUS, costs=COSTS)
    await store.put_holdings([held("today", "big", 2, HOUR)], published_at)
    await store.record_usage([UsageRecord(
        id="a", at=HOUR + 5, key="k", team="ml", model="big", replica="r", gpu_class="h100",
        prompt_tokens=10, cached_tokens=0, completion_tokens=0, status=200, latency=0.1,
        ttft=None)])
    costs = await meter.publish(published_at)
    assert costs.day == {"ml": 2.0}
    assert costs.rate == {"ml": pytest.approx(2 * 2.0 / 3600)}     # two cards at 2.0 an hour
    clock = [published_at + 60.0]
    budgets = Budgets(store, Ledger(store, interval=1, capacity=10, retention=86400),
                      cost_in_use=lambda: True, clock=lambda: clock[0])
    budgets.costs = costs
    budgets.check("ml", "k", Limits(cost_per_day=3.0), None)          # 2.07: admitted
    clock[0] = published_at + 1800.0                                    # 4.00 by now
    with pytest.raises(QuotaExceededError, match="has spent 4.00 of its 3.00"):
        budgets.check("ml", "k", Limits(cost_per_day=3.0), None)
