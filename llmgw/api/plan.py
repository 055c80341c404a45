"""``POST /api/v1/plan``: the planner's candidates against the live fleet.

The body is the same ``PlanRequest`` the CLI builds: the model's raw
config.json and parameter count, read on the machine that can reach the
model, so this server needs no access to the Hub or to the weights. Without
``pools`` the pools come from the scheduler's view of the fleet, grouped by
(gpu class, fabric); with them, the fleet is not consulted.

The arithmetic is pure but not free on a large fleet, so it runs in a worker
thread rather than on the event loop that also serves the gateway.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from litestar import post
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK

from llmgw.control.context import Ctx
from llmgw.planner.candidates import pools_from_fleet
from llmgw.planner.plan import PlanRequest, PlanResult, plan_model


@post("/plan", status_code=HTTP_200_OK,
      summary="Every way a model fits the fleet: quantisation, GPUs, context")
async def plan(ctx: Ctx, data: JSONBody[PlanRequest]) -> PlanResult:
    """Plan ``data``'s model on its pools, or on the live fleet's pools when it gives none."""
    notes: list[str] = []
    if data.pools is not None:
        pools = data.pools
    else:
        pools, notes = pools_from_fleet(await ctx.backend.fleet())
    return await anyio.to_thread.run_sync(lambda: plan_model(data, pools, notes=notes))


route_handlers: list[Any] = [plan]
