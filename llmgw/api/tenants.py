"""/api/v1/teams and /api/v1/keys: teams and keys created at run time."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, get, post, put
from litestar.params import FromQuery, JSONBody
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from llmgw.api.auth import actor
from llmgw.api.models import strict_body
from llmgw.api.params import KeyPath, LogLimit, TeamPath, TeamQuery
from llmgw.control import tenants as t
from llmgw.control.context import Ctx
from llmgw.tenancy import Limits


@get("/teams", summary="List the runtime teams, their limits and keys")
async def list_teams(ctx: Ctx) -> list[t.TeamView]:
    return await t.list_teams(ctx)


@post("/teams", status_code=HTTP_201_CREATED, summary="Create a team")
async def create_team(ctx: Ctx, request: Request[Any, Any, Any],
                      data: JSONBody[t.TeamRequest]) -> t.TeamView:
    data = await strict_body(request, t.TeamRequest)
    return await t.create_team(ctx, data, actor(request))


@put("/teams/{name:str}/limits", summary="Replace a team's limits")
async def set_team_limits(ctx: Ctx, request: Request[Any, Any, Any], name: TeamPath,
                          data: JSONBody[Limits]) -> t.TeamView:
    data = await strict_body(request, Limits)
    return await t.set_team_limits(ctx, name, data)


@delete("/teams/{name:str}", status_code=HTTP_204_NO_CONTENT,
        summary="Revoke a team and every key of it")
async def revoke_team(ctx: Ctx, name: TeamPath) -> None:
    await t.revoke_team(ctx, name)


@get("/keys", summary="List the runtime keys (never the keys themselves)")
async def list_keys(ctx: Ctx, team: TeamQuery = None) -> list[t.KeyView]:
    return await t.list_keys(ctx, team)


@post("/keys", status_code=HTTP_201_CREATED,
      summary="Create a key in a team; the answer is the only place the key appears")
async def create_key(ctx: Ctx, request: Request[Any, Any, Any],
                     data: JSONBody[t.KeyRequest]) -> t.CreatedKey:
    data = await strict_body(request, t.KeyRequest)
    return await t.create_key(ctx, data, actor(request))


@delete("/keys/{name:str}", status_code=HTTP_204_NO_CONTENT, summary="Revoke a runtime key")
async def revoke_key(ctx: Ctx, name: KeyPath) -> None:
    await t.revoke_key(ctx, name)


@get("/teams/{name:str}/logs",
     summary="A team's request logs, newest first (teams that set log_requests)")
async def team_logs(ctx: Ctx, name: TeamPath, before: FromQuery[float | None] = None,
                    limit: LogLimit = 100) -> list[t.LoggedRequest]:
    return await t.request_logs(ctx, name, before, limit)


route_handlers = [list_teams, create_team, set_team_limits, revoke_team, list_keys,
                  create_key, revoke_key, team_logs]
