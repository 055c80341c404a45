"""/api/v1/adapters: list, show, add and remove LoRA adapters."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, get, post
from litestar.params import FromQuery, JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_204_NO_CONTENT

from llmgw.api.auth import actor
from llmgw.api.models import strict_body
from llmgw.api.params import ModelPath
from llmgw.catalog.adapter import Adapter
from llmgw.control.adapters import AdapterView, adapter_view, add_adapter, find_adapter
from llmgw.control.context import AppContext, Ctx


def _loaded_on(ctx: AppContext) -> dict[str, list[str]]:
    """Adapter → the replicas holding it, from this process's gateway (if it has one)."""
    return ctx.adapters_loaded() if ctx.adapters_loaded is not None else {}


@get("/adapters", summary="List the LoRA adapters in force")
async def list_adapters(ctx: Ctx) -> list[AdapterView]:
    loaded = _loaded_on(ctx)
    return [adapter_view(ctx, a, loaded.get(a.name))
            for a in sorted(ctx.models.catalog.adapters.values(), key=lambda a: a.name)]


@get("/adapters/{name:str}", summary="Show one LoRA adapter")
async def show_adapter(ctx: Ctx, name: ModelPath) -> AdapterView:
    return adapter_view(ctx, find_adapter(ctx, name), _loaded_on(ctx).get(name))


@post("/adapters", status_code=HTTP_200_OK,
      summary="Add (or replace) a runtime LoRA adapter; no replica restarts")
async def create_adapter(
    ctx: Ctx, request: Request[Any, Any, Any], data: JSONBody[Adapter],
    skip_source_check: FromQuery[bool] = False,
) -> AdapterView:
    data = await strict_body(request, Adapter)
    added = await add_adapter(ctx, data, actor(request), check_source=not skip_source_check)
    return adapter_view(ctx, ctx.models.catalog.adapters.get(added.name, added))


@delete("/adapters/{name:str}", status_code=HTTP_204_NO_CONTENT,
        summary="Remove a runtime LoRA adapter")
async def remove_adapter(ctx: Ctx, request: Request[Any, Any, Any],
                         name: ModelPath) -> None:
    await ctx.models.remove_adapter(name, actor(request))


route_handlers = [list_adapters, show_adapter, create_adapter, remove_adapter]
