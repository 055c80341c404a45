"""Token budgets: 429 insufficient_quota with the reset time, across gateway instances."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from llmgw.gateway.batchworker import RETRY_STATUSES
from llmgw.gateway.budgets import Budgets, period_start, resets_at
from llmgw.gateway.keys import hash_key
from llmgw.gateway.ledger import Ledger
from llmgw.store.base import OwnerId, UsageRecord
from llmgw.store.sqlite import SqliteStore
from llmgw.tenancy import Limits, key_id
from tests.gateway.conftest import GatewayFactory, chat_model
from tests.gateway.engine import FakeEngine
from tests.gateway.test_tenants import make_key, make_team, until

# The fake engine reports 5 prompt and 3 completion tokens per chat completion.
PER_REQUEST = 8


# Each request reserves its body's bytes (about 80) and max_tokens on its budgets.
MAX_TOKENS = 3


async def until_refused(chat: Callable[[], Awaitable[httpx.Response]], what: str,
                        limit: int = 200) -> tuple[int, httpx.Response]:
    """Send requests one at a time until one is refused: how many were answered 200,
    and the refusal."""
    for answered in range(limit):
        r = await chat()
        if r.status_code != 200:
            return answered, r
    raise AssertionError(f"{what}: {limit} requests were all answered")


async def test_a_team_over_its_daily_budget_gets_insufficient_quota(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    """Requests are admitted while the team's budget holds their reservation, then refused
    with 429 insufficient_quota saying what was used and when it resets."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080")
    await make_team(gw.store, "ml", Limits(tokens_per_day=400))
    k1 = await make_key(gw.store, "k1", "ml")

    async def accepted() -> bool:
        return (await gw.chat("m", key=k1, max_tokens=MAX_TOKENS)).status_code == 200

    await until(accepted, "the key to be accepted")
    answered, r = await until_refused(lambda: gw.chat("m", key=k1, max_tokens=MAX_TOKENS),
                                      "a team over its budget")
    assert answered >= 1
    assert (answered + 1) * PER_REQUEST <= 400
    assert r.status_code == 429
    error = r.json()["error"]
    assert error["code"] == "insufficient_quota"
    assert error["type"] == "insufficient_quota"
    assert "team 'ml' has used or reserved" in error["message"]
    assert "of its 400 tokens per day (UTC)" in error["message"]
    midnight = datetime.fromtimestamp(resets_at("tokens_per_day", time.time()), UTC)
    assert midnight.isoformat(timespec="seconds") in error["message"]
    assert int(r.headers["retry-after"]) >= 1


async def test_a_budget_smaller_than_one_reservation_says_so(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    """A request whose reservation (body bytes plus max_tokens) exceeds the whole budget can
    never be admitted: 429 insufficient_quota saying so, with the reset time."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080")
    await make_team(gw.store, "ml", Limits(tokens_per_day=50))
    key = await make_key(gw.store, "k", "ml")

    async def refused() -> bool:
        return (await gw.chat("m", key=key, max_tokens=MAX_TOKENS)).status_code == 429

    await until(refused, "the key's team budget to be in force")
    r = await gw.chat("m", key=key, max_tokens=MAX_TOKENS)
    error = r.json()["error"]
    assert error["code"] == "insufficient_quota"
    assert "team 'ml''s budget of 50 tokens per day (UTC) is smaller than this request's " \
        "reservation" in error["message"]
    midnight = datetime.fromtimestamp(resets_at("tokens_per_day", time.time()), UTC)
    assert f"it resets at {midnight.isoformat(timespec='seconds')}" in error["message"]
    assert int(r.headers["retry-after"]) >= 1
    assert engine.requests == []


async def test_a_batch_line_of_a_team_over_its_budget_is_refused_for_the_worker_to_retry(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    """Batch lines count against their owner's budget line by line, not only when the
    batch was created: past it, a line is answered 429 (final for the worker: quota)."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080")
    await make_team(gw.store, "ml", Limits(tokens_per_day=400))
    k1 = await make_key(gw.store, "k1", "ml")

    async def accepted() -> bool:
        return (await gw.chat("m", key=k1, max_tokens=MAX_TOKENS)).status_code == 200

    await until(accepted, "the key to be accepted")
    body = b'{"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}'
    owner = OwnerId(key_id(hash_key(k1)))
    first = await gw.gateway.execute("/v1/chat/completions", body, "m", owner=owner)
    assert first.status == 200
    for _ in range(200):
        refused = await gw.gateway.execute("/v1/chat/completions", body, "m", owner=owner)
        if refused.status != 200:
            break
    assert refused.status == 429
    assert b"insufficient_quota" in refused.body
    assert 429 in RETRY_STATUSES


async def test_a_key_budget_narrows_its_team(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080")
    await make_team(gw.store, "ml", Limits(tokens_per_month=10_000))
    small = await make_key(gw.store, "small", "ml", Limits(tokens_per_minute=150))
    other = await make_key(gw.store, "other", "ml")

    async def accepted() -> bool:
        return (await gw.chat("m", key=small, max_tokens=MAX_TOKENS)).status_code == 200

    await until(accepted, "the key to be accepted")
    _, r = await until_refused(lambda: gw.chat("m", key=small, max_tokens=MAX_TOKENS),
                               "a key over its own budget")
    assert r.status_code == 429
    assert "key 'small' has used or reserved" in r.json()["error"]["message"]
    assert "of its 150 tokens per minute" in r.json()["error"]["message"]
    assert (await gw.chat("m", key=other, max_tokens=MAX_TOKENS)).status_code == 200


async def test_another_instance_sees_the_tokens_after_a_flush(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    """What one instance spent of a budget, another cannot lease again."""
    engine = await engines()
    models = [chat_model("m", upstream=[engine.url])]
    first = await make_gateway(models, listen="0.0.0.0:8080", ledger_interval="100ms")
    second = await make_gateway(models, listen="0.0.0.0:8080", ledger_interval="100ms")
    await make_team(first.store, "ml", Limits(tokens_per_day=200))
    key = await make_key(first.store, "k", "ml")

    async def accepted() -> bool:
        return (await first.chat("m", key=key, max_tokens=MAX_TOKENS)).status_code == 200

    await until(accepted, "the key to be accepted on the first instance")
    await until_refused(lambda: first.chat("m", key=key, max_tokens=MAX_TOKENS),
                        "the first instance spending the budget")

    async def refused_on_second() -> bool:
        r = await second.chat("m", key=key, max_tokens=MAX_TOKENS)
        return r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"

    await until(refused_on_second, "the second instance to refuse the spent budget")


def test_periods_are_utc_days_and_calendar_months() -> None:
    now = datetime(2026, 12, 31, 23, 59, tzinfo=UTC).timestamp()
    assert period_start("tokens_per_day", now) == datetime(2026, 12, 31, tzinfo=UTC).timestamp()
    assert period_start("tokens_per_month", now) == datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    assert resets_at("tokens_per_day", now) == datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    assert resets_at("tokens_per_month", now) == datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    assert resets_at("tokens_per_minute", now) == now + 60


async def test_own_tokens_count_once_between_a_write_and_the_re_read(tmp_path: Path) -> None:
    """Written but not yet re-read, this instance's tokens still count; after, once."""
    store = SqliteStore(f"sqlite:///{tmp_path / 'b.db'}")
    await store.open()
    try:
        ledger = Ledger(store, interval=1, capacity=100, retention=86400)
        budgets = Budgets(store, ledger)
        ledger.record(UsageRecord(
            id="a", at=time.time(), key="k", team="ml", model="m", replica="r",
            gpu_class="", prompt_tokens=7, cached_tokens=0, completion_tokens=3, status=200,
            latency=0.1, ttft=None))
        for field in ("tokens_per_minute", "tokens_per_day", "tokens_per_month"):
            assert budgets.used(field, "ml", None) == 10   # type: ignore[arg-type]
        await ledger.flush()
        assert budgets.used("tokens_per_day", "ml", "k") == 10
        await budgets.refresh()
        assert budgets.used("tokens_per_day", "ml", "k") == 10
        assert budgets.used("tokens_per_minute", "ml", None) == 10
    finally:
        await store.close()


async def test_a_team_over_its_cost_budget_gets_insufficient_quota(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    """The cost meter's published figures are checked; last period's are ignored."""
    import msgspec

    from llmgw.tenancy import COSTS_REPORT, TeamCosts

    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080",
                            ledger_interval="50ms")
    await make_team(gw.store, "ml", Limits(cost_per_day=2.5))
    key = await make_key(gw.store, "k", "ml")
    now = time.time()
    day = period_start("tokens_per_day", now)
    month = period_start("tokens_per_month", now)
    await gw.store.put_report(COSTS_REPORT, "current", msgspec.json.encode(TeamCosts(
        day_start=day - 86400, month_start=month, day={"ml": 9.0}, month={"ml": 9.0})))

    async def accepted() -> bool:
        return (await gw.chat("m", key=key)).status_code == 200

    await until(accepted, "yesterday's spending not to count today")
    await gw.store.put_report(COSTS_REPORT, "current", msgspec.json.encode(TeamCosts(
        day_start=day, month_start=month, day={"ml": 3.0}, month={"ml": 3.0})))

    async def refused() -> bool:
        r = await gw.chat("m", key=key)
        return r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"

    await until(refused, "the cost budget to be enforced")
    r = await gw.chat("m", key=key)
    assert "team 'ml' has spent 3.00 of its 2.50 per day (UTC)" in r.json()["error"]["message"]


async def test_a_nearly_spent_budget_quickens_the_ledger(tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'b.db'}")
    await store.open()
    try:
        ledger = Ledger(store, interval=1, capacity=100, retention=86400)
        budgets = Budgets(store, ledger)
        ledger.record(UsageRecord(
            id="a", at=time.time(), key="k", team="ml", model="m", replica="r",
            gpu_class="", prompt_tokens=70, cached_tokens=0, completion_tokens=0, status=200,
            latency=0.1, ttft=None))
        budgets.check("ml", "k", Limits(tokens_per_day=100), None)      # 70%: no hurry
        assert not ledger.hurried
        budgets.check("ml", "k", Limits(tokens_per_day=85), None)       # 82%
        assert ledger.hurried
    finally:
        await store.close()


async def test_each_team_budget_reports_the_share_used(tmp_path: Path) -> None:
    """For every budget a team sets, the share of it used: tokens of the period (as the
    check counts them) over the limit, and the cost meter's figure of the current period
    over a cost budget; a team without budgets, and last period's cost figures, give none."""
    from llmgw.tenancy import RuntimeTeam, TeamCosts

    store = SqliteStore(f"sqlite:///{tmp_path / 'b.db'}")
    await store.open()
    try:
        ledger = Ledger(store, interval=1, capacity=100, retention=86400)
        budgets = Budgets(store, ledger)
        ledger.record(UsageRecord(
            id="a", at=time.time(), key="k", team="ml", model="m", replica="r",
            gpu_class="", prompt_tokens=70, cached_tokens=0, completion_tokens=0, status=200,
            latency=0.1, ttft=None))
        now = time.time()
        budgets.costs = TeamCosts(day_start=period_start("tokens_per_day", now),
                                  month_start=period_start("tokens_per_month", now) - 1,
                                  day={"ml": 2.5}, month={"ml": 9.0})
        teams = [RuntimeTeam(name="ml", limits=Limits(
                     tokens_per_day=100, tokens_per_month=1000, cost_per_day=10.0,
                     cost_per_month=10.0)),
                 RuntimeTeam(name="web", limits=Limits(rpm=60))]
        assert sorted(budgets.shares(teams)) == [
            ("ml", "cost_per_day", 0.25), ("ml", "tokens_per_day", 0.7),
            ("ml", "tokens_per_month", 0.07)]
    finally:
        await store.close()


async def test_metrics_show_how_much_of_each_team_budget_is_used(
        make_gateway: GatewayFactory, engines: Callable[..., Awaitable[FakeEngine]]) -> None:
    """/metrics carries llmgw_gateway_budget_used_ratio by team and budget, what the
    budget-near-exhaustion alert (deploy/llmgw-rules.yml) reads."""
    engine = await engines()
    gw = await make_gateway([chat_model("m", upstream=[engine.url])], listen="0.0.0.0:8080")
    await make_team(gw.store, "ml", Limits(tokens_per_day=400))
    key = await make_key(gw.store, "k", "ml")

    async def accepted() -> bool:
        return (await gw.chat("m", key=key, max_tokens=MAX_TOKENS)).status_code == 200

    await until(accepted, "the key to be accepted")          # 8 of 400 tokens

    async def reported() -> bool:
        text = (await gw.client.get("/metrics")).text
        return 'llmgw_gateway_budget_used_ratio{budget="tokens_per_day",team="ml"} 0.02' in text

    await until(reported, "the team's share of its budget on /metrics")
    text = (await gw.client.get("/metrics")).text
    assert 'llmgw_gateway_budget_slice_tokens{budget="tokens_per_day",key="",state="reserved",' \
        'team="ml"} 0.0' in text
    assert 'llmgw_gateway_budget_slice_renewals_total{outcome="granted"}' in text
