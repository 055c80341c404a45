"""/api/v1/costs: GPU and CPU time priced and attributed to teams by their tokens."""

from __future__ import annotations

from datetime import datetime

from litestar import get
from litestar.params import FromQuery

from llmgw.control.context import Ctx
from llmgw.control.costs import CostReport, cost_report


@get("/costs", summary="Cost per team and per model (and per million tokens) from GPU time")
async def costs(ctx: Ctx, since: FromQuery[datetime | None] = None,
                until: FromQuery[datetime | None] = None) -> CostReport:
    return await cost_report(ctx, since, until)


route_handlers = [costs]
