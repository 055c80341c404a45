"""/api/v1/usage: the usage ledger's roll-ups, by team, key or model; /api/v1/budgets and
/api/v1/statuses: what the gateways' budgets have used, and how requests were answered."""

from __future__ import annotations

from litestar import get
from litestar.params import FromQuery

from llmgw.api.instant import Instant, instant
from llmgw.control.context import Ctx
from llmgw.control.traffic import BudgetUse, StatusReport, budget_use, status_counts
from llmgw.control.usage import By, Granularity, UsageReport, usage_report


@get("/usage", summary="Requests and tokens by team, key or model, per hour or day")
async def usage(ctx: Ctx, by: FromQuery[By] = "team", since: Instant = None,
                until: Instant = None,
                granularity: FromQuery[Granularity] = "hour") -> UsageReport:
    return await usage_report(ctx, by, instant(since, "since"), instant(until, "until"),
                              granularity)


@get("/budgets", summary="Each budget of the runtime teams and keys: used, limit, reset")
async def budgets(ctx: Ctx) -> list[BudgetUse]:
    """Token and cost budgets as the gateways count them before answering 429."""
    return await budget_use(ctx)


@get("/statuses", summary="Requests by team, key, model and status since a moment")
async def statuses(ctx: Ctx, since: Instant = None) -> StatusReport:
    """From the ledger's raw records; ``since`` defaults to an hour ago."""
    start = instant(since, "since")
    return await status_counts(ctx, None if start is None else start.timestamp())


route_handlers = [usage, budgets, statuses]
