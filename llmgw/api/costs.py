"""/api/v1/costs: GPU and CPU time priced and attributed to teams by their tokens."""

from __future__ import annotations

from litestar import get

from llmgw.api.instant import Instant, instant
from llmgw.control.context import Ctx
from llmgw.control.costs import CostReport, cost_report


@get("/costs", summary="Cost per team and per model (and per million tokens) from GPU time")
async def costs(ctx: Ctx, since: Instant = None,
                until: Instant = None) -> CostReport:
    return await cost_report(ctx, instant(since, "since"), instant(until, "until"))


route_handlers = [costs]
