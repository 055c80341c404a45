"""/api/v1/models: list, show, add, remove, scale, resources, rollout, prefetch;
/api/v1/replicas."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec
from litestar import Request, delete, get, post, put
from litestar.params import FromQuery, JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_204_NO_CONTENT

from llmgw.api.auth import actor
from llmgw.api.params import ModelPath, ModelQuery
from llmgw.catalog.decode import decode_json
from llmgw.catalog.model import Model, Profile
from llmgw.catalog.units import Size
from llmgw.control.actions import (
    PrefetchRequest,
    RolloutAnswer,
    prefetch_progress,
    roll_out,
    start_prefetch,
)
from llmgw.control.actions import add_model as add
from llmgw.control.context import Ctx
from llmgw.control.traffic import upstream_health_of
from llmgw.control.views import (
    AddedView,
    ModelView,
    ReplicaView,
    ScalingInForce,
    find_model,
    model_view,
    replica_view,
    replicas_by_model,
    replicas_of,
    scaler_decisions,
)
from llmgw.scheduler.base import Prefetch

T = TypeVar("T")


class ScaleRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    min: Annotated[int, msgspec.Meta(ge=0)]
    max: Annotated[int, msgspec.Meta(ge=1)] | None = None


class ResourcesRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    cpu_cores: Annotated[int, msgspec.Meta(ge=1)]
    memory: Size
    profile: str | None = None


class ResourcesAnswer(msgspec.Struct, kw_only=True):
    model: str
    profile: str
    cpu_cores: int | None
    memory: Size | None


async def strict_body(request: Request[Any, Any, Any], type_: type[T]) -> T:
    """The body decoded strictly, as server.yaml and `ctl model add -f` files are.

    Litestar has already decoded it (which also documents it in the OpenAPI
    schema), but leniently: "4" would pass for 4. A field that is refused in
    the YAML must be refused here too. One leniency JSON itself asks for: a
    whole number written ``2.0`` is the integer 2 (JSON Schema's ``integer``
    admits it, so a client generated from the OpenAPI document may send it).
    """
    return decode_json(await request.body(), type_, integral_floats=True)


@get("/models", summary="List the models in force")
async def list_models(ctx: Ctx) -> list[ModelView]:
    replicas = await replicas_of(ctx)
    decisions = await scaler_decisions(ctx)
    upstreams = await upstream_health_of(ctx, list(ctx.models.catalog))
    mine = replicas_by_model(replicas)
    return [model_view(ctx, m, mine.get(m.name, []), decisions, upstreams)
            for m in ctx.models.catalog]


@get("/models/{name:str}", summary="Show one model")
async def show_model(ctx: Ctx, name: ModelPath) -> ModelView:
    m = find_model(ctx, name)
    return model_view(ctx, m, await replicas_of(ctx, name), await scaler_decisions(ctx),
                      await upstream_health_of(ctx, [m]))


@post("/models", status_code=HTTP_200_OK, summary="Add (or replace) a runtime model")
async def add_model(
    ctx: Ctx, request: Request[Any, Any, Any], data: JSONBody[Model],
    skip_source_check: FromQuery[bool] = False,
) -> AddedView:
    data = await strict_body(request, Model)
    added = await add(ctx, data, actor(request), check_source=not skip_source_check)
    view = model_view(ctx, added.model, await replicas_of(ctx, added.model.name))
    return AddedView.of(view, added.warnings)


@delete("/models/{name:str}", status_code=HTTP_204_NO_CONTENT, summary="Remove a runtime model")
async def remove_model(ctx: Ctx, request: Request[Any, Any, Any], name: ModelPath) -> None:
    await ctx.models.remove(name, actor(request))


@put("/models/{name:str}/scale", summary="Change a runtime model's scaling")
async def scale_model(ctx: Ctx, request: Request[Any, Any, Any], name: ModelPath,
                      data: JSONBody[ScaleRequest]) -> ScalingInForce:
    data = await strict_body(request, ScaleRequest)
    return ScalingInForce.of(await ctx.models.scale(name, data.min, data.max, actor(request)))


@put("/models/{name:str}/resources", summary="Set a runtime model's cores and memory")
async def model_resources(ctx: Ctx, request: Request[Any, Any, Any], name: ModelPath,
                          data: JSONBody[ResourcesRequest]) -> ResourcesAnswer:
    data = await strict_body(request, ResourcesRequest)
    p: Profile = await ctx.models.resources(name, data.cpu_cores, data.memory, data.profile,
                                            actor(request))
    return ResourcesAnswer(model=name, profile=p.name, cpu_cores=p.cpu_cores, memory=p.memory)


@post("/models/{name:str}/rollout", status_code=HTTP_200_OK,
      summary="Replace a model's replicas with ones running its current profile")
async def rollout_model(ctx: Ctx, name: ModelPath) -> RolloutAnswer:
    return await roll_out(ctx, name)


@post("/models/{name:str}/prefetch", status_code=HTTP_200_OK,
      summary="Fetch a model's weights onto nodes ahead of its replicas")
async def prefetch_model(ctx: Ctx, request: Request[Any, Any, Any], name: ModelPath,
                         data: JSONBody[PrefetchRequest]) -> Prefetch:
    data = await strict_body(request, PrefetchRequest)
    return await start_prefetch(ctx, name, data)


@get("/models/{name:str}/prefetch", summary="A model's prefetch, node by node")
async def prefetch_status(ctx: Ctx, name: ModelPath) -> Prefetch:
    return await prefetch_progress(ctx, name)


@get("/replicas", summary="Replicas of every model, or of one")
async def list_replicas(
    ctx: Ctx, model: ModelQuery = None,
) -> list[ReplicaView]:
    if model is not None:
        find_model(ctx, model)
    replicas = await ctx.backend.replicas(model)
    catalog = ctx.models.catalog
    return [replica_view(r, catalog.get(r.model)) for r in replicas]


route_handlers = [list_models, show_model, add_model, remove_model, scale_model,
                  model_resources, rollout_model, prefetch_model, prefetch_status,
                  list_replicas]
