"""What the admin page changes: add, scale, remove, roll out, prefetch; teams and keys.

Each action calls the model service — the same calls the JSON API makes — so
the rules (configuration wins, the whole catalog is validated first, a
removal may not break a fallback) live in one place, and a refusal reaches
the page as the exception the CLI would have printed, with the same message.

Adding runs the source check first, as ``llmgw ctl model add`` does: a typo
or a mirror that is down is an error on this page naming the source, not a
replica failing on a node minutes later. The page offers no way to skip it;
the CLI's ``--skip-source-check`` is there for the rare deliberate case. A
profile whose memory is below what a replica needs is added all the same,
and the message after adding lists the warnings the CLI prints.

The pasted YAML goes through ``decode_model_file``, the decoder behind
``ctl model add -f`` and server.yaml's ``models:``, so an entry that works in
one works in the others. A refused form is shown again with what was typed
and the error beside the line it is about.

A successful action redirects (POST, then redirect, then GET) with a
one-shot message, so reloading the next page does not repeat the action —
but for a new key, which is shown in the answer to its POST only: the
message travels in a cookie, and a key must not.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath
from litestar.response import Redirect, Template

from llmgw.admin.locate import excerpt, line_of
from llmgw.admin.pages import EXAMPLE, model_context, model_page, signed_in, usage_context
from llmgw.admin.render import page, scaling_text
from llmgw.admin.session import flash_cookie
from llmgw.catalog.decode import decode_model_file
from llmgw.catalog.model import Model
from llmgw.control import tenants
from llmgw.control.actions import PrefetchRequest, roll_out, start_prefetch
from llmgw.control.actions import add_model as add
from llmgw.control.context import Ctx
from llmgw.control.tenants import KeyRequest, TeamRequest
from llmgw.errors import DefinitionError, LlmgwError
from llmgw.tenancy import Limits

Form = Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]
SOURCE = "pasted YAML"


def done(request: Request[Any, Any, Any], to: str, text: str, kind: str = "ok",
         notes: list[str] | None = None) -> Redirect:
    return Redirect(to, status_code=303,
                    cookies=[flash_cookie(request, signed_in(request), kind, text, notes)])


@post("/add")
async def add_model(request: Request[Any, Any, Any], ctx: Ctx,
                    data: Form) -> Template | Redirect:
    session = signed_in(request)
    text = data.get("yaml", "")
    try:
        model: Model = decode_model_file(text, source=SOURCE)
        added = await add(ctx, model, session.name)
    except LlmgwError as exc:
        line = line_of(text, exc.field)
        return page(request, "add.html", session=session, status=exc.status, yaml=text,
                    example=EXAMPLE, error=exc.message, field=exc.field, line=line,
                    lines=excerpt(text, line) if line else [],
                    checked=ctx.source_check is not None)
    final = added.model
    return done(request, f"/admin/models/{final.name}",
                f"added {final.name}; scaling {scaling_text(final.scaling)}",
                kind="warn" if added.warnings else "ok", notes=added.warnings)


def _count(data: dict[str, str], key: str, least: int) -> int | None:
    raw = data.get(key, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise DefinitionError(f"{key}: {raw!r} is not a whole number", field=key) from None
    if n < least:
        raise DefinitionError(f"{key}: {n} is below {least}", field=key)
    return n


@post("/models/{name:str}/scale")
async def scale_model(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                      data: Form) -> Template | Redirect:
    session = signed_in(request)
    try:
        min_ = _count(data, "min", 0)
        if min_ is None:
            raise DefinitionError("min: give the number of replicas to run (0 for on demand)",
                                  field="min")
        scaling = await ctx.models.scale(name, min_, _count(data, "max", 1), session.name)
    except LlmgwError as exc:
        return await model_page(request, ctx, name, status=exc.status, scale_error=exc.message,
                                scale_min=data.get("min"), scale_max=data.get("max"))
    return done(request, f"/admin/models/{name}", f"{name}: scaling {scaling_text(scaling)}")


@post("/models/{name:str}/remove")
async def remove_model(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                       data: Form) -> Template | Redirect:
    session = signed_in(request)
    # The confirmation page puts the name here; a POST without it did not pass there.
    if data.get("confirm") != name:
        return Redirect(f"/admin/models/{name}/remove", status_code=303)
    try:
        await ctx.models.remove(name, session.name)
    except LlmgwError as exc:
        context = await model_context(ctx, name)
        return page(request, "remove.html", session=session, status=exc.status,
                    error=exc.message, **context)
    return done(request, "/admin/models", f"removed {name}")


@post("/models/{name:str}/rollout")
async def rollout_model(request: Request[Any, Any, Any], ctx: Ctx,
                        name: FromPath[str]) -> Redirect:
    try:
        answer = await roll_out(ctx, name)
    except LlmgwError as exc:
        return done(request, f"/admin/models/{name}", exc.message, kind="error")
    return done(request, f"/admin/models/{name}", answer.message)


@post("/models/{name:str}/prefetch")
async def prefetch_model(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                         data: Form) -> Redirect:
    count = str(data.get("count") or "1")
    if not count.isdigit() or int(count) < 1:
        return done(request, f"/admin/models/{name}",
                    f"nodes: {count!r} is not a number of nodes (1 or more)", kind="error")
    try:
        answer = await start_prefetch(ctx, name, PrefetchRequest(count=int(count)))
    except LlmgwError as exc:
        return done(request, f"/admin/models/{name}", exc.message, kind="error")
    return done(request, f"/admin/models/{name}", answer.message)


# -- teams and keys -------------------------------------------------------------

def _limits_from(data: dict[str, str]) -> Limits:
    models = [m.strip() for m in data.get("models", "").split(",") if m.strip()]
    priority = data.get("priority") or None
    if priority not in (None, "interactive", "batch"):
        raise DefinitionError(f"priority: {priority!r} is not interactive or batch",
                              field="priority")
    return Limits(models=models or None, rpm=_count(data, "rpm", 1),
                  tokens_per_minute=_count(data, "tokens_per_minute", 1),
                  tokens_per_day=_count(data, "tokens_per_day", 1),
                  tokens_per_month=_count(data, "tokens_per_month", 1),
                  priority=priority)  # type: ignore[arg-type]


async def _usage(request: Request[Any, Any, Any], ctx: Ctx, status: int,
                 **extra: Any) -> Template:
    context = await usage_context(ctx, "team", "hour")
    return page(request, "usage.html", session=signed_in(request), status=status,
                **{**context, **extra})


@post("/teams")
async def create_team(request: Request[Any, Any, Any], ctx: Ctx,
                      data: Form) -> Template | Redirect:
    name = data.get("name", "").strip()
    try:
        await tenants.create_team(ctx, TeamRequest(name=name, limits=_limits_from(data)),
                                  signed_in(request).name)
    except LlmgwError as exc:
        return await _usage(request, ctx, exc.status, team_error=exc.message)
    return done(request, "/admin/usage", f"created team {name}")


@post("/keys")
async def create_key(request: Request[Any, Any, Any], ctx: Ctx, data: Form) -> Template:
    """Shown on this answer only: the key is not stored, so it is not put in a redirect."""
    name, team = data.get("name", "").strip(), data.get("team", "").strip()
    try:
        created = await tenants.create_key(ctx, KeyRequest(name=name, team=team),
                                           signed_in(request).name)
    except LlmgwError as exc:
        return await _usage(request, ctx, exc.status, key_error=exc.message)
    return await _usage(request, ctx, 200, new_key=created)


@post("/teams/{name:str}/revoke")
async def revoke_team(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                      data: Form) -> Template | Redirect:
    if data.get("confirm") != name:
        return await _usage(request, ctx, 400, team_error=(
            f"type the team's name, {name}, to revoke it and every key of it"))
    try:
        await tenants.revoke_team(ctx, name)
    except LlmgwError as exc:
        return await _usage(request, ctx, exc.status, team_error=exc.message)
    return done(request, "/admin/usage", f"revoked team {name} and its keys")


@post("/keys/{name:str}/revoke")
async def revoke_key(request: Request[Any, Any, Any], ctx: Ctx,
                     name: FromPath[str]) -> Template | Redirect:
    try:
        await tenants.revoke_key(ctx, name)
    except LlmgwError as exc:
        return await _usage(request, ctx, exc.status, key_error=exc.message)
    return done(request, "/admin/usage", f"revoked key {name}")


route_handlers = [add_model, scale_model, remove_model, rollout_model, prefetch_model,
                  create_team, create_key, revoke_team, revoke_key]
