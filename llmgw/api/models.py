"""/api/v1/models: list, show, add, remove, scale, resources, rollout (A1)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any, TypeVar

import msgspec
from litestar import Request, delete, get, post, put
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_204_NO_CONTENT

from llmgw.api.auth import actor
from llmgw.api.context import AppContext, Ctx
from llmgw.api.views import ModelView, ReplicaView, ScalingInForce, memory_warning, replica_view
from llmgw.catalog.decode import decode_json
from llmgw.catalog.fingerprint import fingerprint
from llmgw.catalog.model import Model, Profile
from llmgw.catalog.units import Size
from llmgw.errors import BackendUnavailableError, NotFoundError
from llmgw.scheduler.base import Replica

log = logging.getLogger("llmgw.api")
T = TypeVar("T")

# The list view asks the scheduler for replicas once per request; if that is
# slow (Nomad busy) the list still answers, without the per-replica details.
REPLICA_LOOKUP_TIMEOUT = 2.0
# A rollout registers one job (or marks local replicas); a minute without an
# answer means the scheduler is not answering, which the caller should hear.
ROLLOUT_TIMEOUT = 60.0


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


class RolloutAnswer(msgspec.Struct, kw_only=True):
    model: str
    profile: str | None
    fingerprint: str
    message: str


async def replicas_of(ctx: AppContext, model: str | None = None) -> list[Replica] | None:
    try:
        return await asyncio.wait_for(ctx.backend.replicas(model), REPLICA_LOOKUP_TIMEOUT)
    except Exception as exc:  # the list must answer even when the scheduler does not
        log.warning("replica lookup failed: %s", exc)
        return None


def model_view(ctx: AppContext, m: Model, replicas: list[Replica] | None) -> ModelView:
    row = ctx.models.stored(m.name)
    mine = [r for r in replicas or [] if r.model == m.name]
    views = [replica_view(r, m) for r in mine]
    return ModelView(
        name=m.name,
        origin=ctx.models.origin(m.name),
        external=m.external,
        added_by=row.added_by if row else None,
        added_at=row.added_at if row else None,
        updated_by=row.updated_by if row else None,
        updated_at=row.updated_at if row else None,
        scaling=ScalingInForce.of(m.scaling),
        fingerprints={p.name: fingerprint(m, p) for p in m.profiles},
        status=ctx.backend.status(m.name),
        stale_replicas=sum(1 for v in views if v.stale),
        memory_warnings=[f"{r.id}: {w}" for r in mine if (w := memory_warning(r))],
        definition=m,
    )


async def strict_body(request: Request[Any, Any, Any], type_: type[T]) -> T:
    """The body decoded strictly, as server.yaml and `ctl model add -f` files are (C4).

    Litestar has already decoded it (which also documents it in the OpenAPI
    schema), but leniently: "4" would pass for 4. A field that is refused in
    the YAML must be refused here too.
    """
    return decode_json(await request.body(), type_)


def find_model(ctx: AppContext, name: str) -> Model:
    m = ctx.models.catalog.get(name)
    if m is None:
        raise NotFoundError(
            f"there is no model named {name!r}; `llmgw ctl model list` shows the catalog")
    return m


@get("/models", summary="List the models in force")
async def list_models(ctx: Ctx) -> list[ModelView]:
    replicas = await replicas_of(ctx)
    return [model_view(ctx, m, replicas) for m in ctx.models.catalog]


@get("/models/{name:str}", summary="Show one model")
async def show_model(ctx: Ctx, name: FromPath[str]) -> ModelView:
    m = find_model(ctx, name)
    return model_view(ctx, m, await replicas_of(ctx, name))


@post("/models", status_code=HTTP_200_OK, summary="Add (or replace) a runtime model")
async def add_model(
    ctx: Ctx, request: Request[Any, Any, Any], data: JSONBody[Model],
    skip_source_check: FromQuery[bool] = False,
) -> ModelView:
    data = await strict_body(request, Model)
    if not skip_source_check and ctx.source_check is not None:
        await ctx.source_check(data)
    final = await ctx.models.add(data, actor(request))
    in_force = ctx.models.catalog.get(final.name) or final
    return model_view(ctx, in_force, await replicas_of(ctx, final.name))


@delete("/models/{name:str}", status_code=HTTP_204_NO_CONTENT, summary="Remove a runtime model")
async def remove_model(ctx: Ctx, request: Request[Any, Any, Any], name: FromPath[str]) -> None:
    await ctx.models.remove(name, actor(request))


@put("/models/{name:str}/scale", summary="Change a runtime model's scaling")
async def scale_model(ctx: Ctx, request: Request[Any, Any, Any], name: FromPath[str],
                      data: JSONBody[ScaleRequest]) -> ScalingInForce:
    data = await strict_body(request, ScaleRequest)
    return ScalingInForce.of(await ctx.models.scale(name, data.min, data.max, actor(request)))


@put("/models/{name:str}/resources", summary="Set a runtime model's cores and memory")
async def model_resources(ctx: Ctx, request: Request[Any, Any, Any], name: FromPath[str],
                          data: JSONBody[ResourcesRequest]) -> ResourcesAnswer:
    data = await strict_body(request, ResourcesRequest)
    p: Profile = await ctx.models.resources(name, data.cpu_cores, data.memory, data.profile,
                                            actor(request))
    return ResourcesAnswer(model=name, profile=p.name, cpu_cores=p.cpu_cores, memory=p.memory)


async def roll_out(ctx: AppContext, name: str) -> RolloutAnswer:
    """Roll out a model's current profile; the answer names the profile its new replicas run.

    Shared by the API and the admin page, so both say the same thing.
    """
    m = find_model(ctx, name)
    if m.external:
        raise NotFoundError(f"model {name!r} is external (upstream); there is nothing to roll out")
    try:
        async with asyncio.timeout(ROLLOUT_TIMEOUT):
            profile = await ctx.backend.rollout(name)
    except TimeoutError:
        raise BackendUnavailableError(
            f"the scheduler did not take the rollout of {name!r} within "
            f"{ROLLOUT_TIMEOUT:.0f} s; `llmgw ctl replicas {name}` shows whether it went "
            "ahead, and `/readyz` whether the scheduler is reachable") from None
    chosen = m.profile(profile) if profile else None
    if chosen is None:
        return RolloutAnswer(model=name, fingerprint="", profile=None,
                             message=f"no profile of {name} fits the fleet now; its replicas "
                                     "are replaced once one does")
    fp = fingerprint(m, chosen)
    return RolloutAnswer(model=name, fingerprint=fp, profile=chosen.name,
                         message=f"replicas of {name} are being replaced with profile "
                                 f"{chosen.name} ({fp})")


@post("/models/{name:str}/rollout", status_code=HTTP_200_OK,
      summary="Replace a model's replicas with ones running its current profile")
async def rollout_model(ctx: Ctx, name: FromPath[str]) -> RolloutAnswer:
    return await roll_out(ctx, name)


@get("/replicas", summary="Replicas of every model, or of one")
async def list_replicas(
    ctx: Ctx, model: FromQuery[str | None] = None,
) -> list[ReplicaView]:
    if model is not None:
        find_model(ctx, model)
    replicas = await ctx.backend.replicas(model)
    catalog = ctx.models.catalog
    return [replica_view(r, catalog.get(r.model)) for r in replicas]


route_handlers = [list_models, show_model, add_model, remove_model, scale_model,
                  model_resources, rollout_model, list_replicas]
