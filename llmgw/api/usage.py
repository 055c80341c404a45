"""/api/v1/usage: the usage ledger's roll-ups, by team, key or model."""

from __future__ import annotations

from litestar import get
from litestar.params import FromQuery

from llmgw.api.instant import Instant, instant
from llmgw.control.context import Ctx
from llmgw.control.usage import By, Granularity, UsageReport, usage_report


@get("/usage", summary="Requests and tokens by team, key or model, per hour or day")
async def usage(ctx: Ctx, by: FromQuery[By] = "team", since: Instant = None,
                until: Instant = None,
                granularity: FromQuery[Granularity] = "hour") -> UsageReport:
    return await usage_report(ctx, by, instant(since, "since"), instant(until, "until"),
                              granularity)


route_handlers = [usage]
