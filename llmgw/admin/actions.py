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
one works in the others.

Every answer is a redirect to a GET page (``llmgw.admin.prg``): a success
with a one-shot message, a refusal with what was typed and every problem
found beside its field, a new key with the key itself, shown once beside the
form that asked for it. So every page after a form can be reloaded, and every
action's URL opened with a GET lands on the page holding its form.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, post
from litestar.enums import RequestEncodingType
from litestar.handlers import HTTPRouteHandler
from litestar.params import Body, FromPath
from litestar.response import Redirect, Template

from llmgw.admin.pages import add_context, signed_in
from llmgw.admin.prg import FormState, Shown, back_to, landing, refused_cookie, secret_cookie
from llmgw.admin.render import page, scaling_text
from llmgw.admin.session import flash_cookie
from llmgw.admin.tenantforms import KEY_FIELDS, TEAM_FIELDS, limits_from
from llmgw.catalog.decode import decode_model_file
from llmgw.catalog.model import Model
from llmgw.control import tenants
from llmgw.control.actions import PrefetchRequest, roll_out, start_prefetch
from llmgw.control.actions import add_model as add
from llmgw.control.context import Ctx
from llmgw.control.tenants import KeyRequest, TeamRequest
from llmgw.errors import DefinitionError, LlmgwError
from llmgw.tenancy import KeyLimits

Form = Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]
SOURCE = "pasted YAML"
TEAMS = "/admin/teams"


def done(request: Request[Any, Any, Any], to: str, text: str, kind: str = "ok",
         notes: list[str] | None = None) -> Redirect:
    return Redirect(to, status_code=303,
                    cookies=[flash_cookie(request, signed_in(request), kind, text, notes)])


def refused(request: Request[Any, Any, Any], to: str, form: str, data: dict[str, str],
            errors: list[tuple[str, str]]) -> Redirect:
    """Back to the form's page with what was sent and every problem found."""
    cookie = refused_cookie(request, signed_in(request),
                            FormState(form=form, values=data, errors=errors))
    if cookie is None:  # too big for a cookie: the problems, without what was typed
        cookie = refused_cookie(request, signed_in(request),
                                FormState(form=form, values={}, errors=errors))
    if cookie is None:
        return done(request, to, errors[0][1] if errors else "refused", kind="error")
    return back_to(to, cookie)


def problem(exc: LlmgwError, default_field: str = "") -> tuple[str, str]:
    return (exc.field or default_field, exc.message)


@post("/add")
async def add_model(request: Request[Any, Any, Any], ctx: Ctx,
                    data: Form) -> Template | Redirect:
    session = signed_in(request)
    text = data.get("yaml", "")
    try:
        model: Model = decode_model_file(text, source=SOURCE)
        added = await add(ctx, model, session.name)
    except LlmgwError as exc:
        state = FormState("add-form", data, [problem(exc)])
        cookie = refused_cookie(request, session, state)
        if cookie is None:
            # A definition of several kilobytes does not fit in a cookie: answered here,
            # the one form whose refusal cannot be reloaded (what was pasted is kept).
            return page(request, "add.html", session=session, status=exc.status,
                        **add_context(ctx, state))
        return back_to("/admin/add", cookie)
    final = added.model
    return done(request, f"/admin/models/{final.name}",
                f"added {final.name}; scaling {scaling_text(final.scaling)}",
                kind="warn" if added.warnings else "ok", notes=added.warnings)


def count(data: dict[str, str], key: str, least: int) -> int | None:
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
                      data: Form) -> Redirect:
    session = signed_in(request)
    to = f"/admin/models/{name}#scale"
    errors: list[tuple[str, str]] = []
    min_ = max_ = None
    for key, least in (("min", 0), ("max", 1)):
        try:
            value = count(data, key, least)
        except DefinitionError as exc:
            errors.append(problem(exc, key))
            continue
        if key == "min":
            min_ = value
        else:
            max_ = value
    if min_ is None and not any(f == "min" for f, _ in errors):
        errors.append(("min", "min: give the number of replicas to run (0 for on demand)"))
    if errors or min_ is None:
        return refused(request, to, "scale-form", data, errors)
    try:
        scaling = await ctx.models.scale(name, min_, max_, session.name)
    except LlmgwError as exc:
        return refused(request, to, "scale-form", data, [problem(exc, "min")])
    return done(request, to, f"{name}: scaling {scaling_text(scaling)}")


@post("/models/{name:str}/remove")
async def remove_model(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                       data: Form) -> Redirect:
    session = signed_in(request)
    to = f"/admin/models/{name}/remove"
    # The confirmation page puts the name here; a POST without it did not pass there.
    if data.get("confirm") != name:
        return Redirect(to, status_code=303)
    try:
        await ctx.models.remove(name, session.name)
    except LlmgwError as exc:
        return refused(request, to, "remove-form", data, [problem(exc)])
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
    to = f"/admin/models/{name}#prefetch"
    raw = str(data.get("count") or "1")
    if not raw.isdigit() or int(raw) < 1:
        return refused(request, to, "prefetch-form", data, [
            ("count", f"nodes: {raw!r} is not a number of nodes (1 or more)")])
    try:
        answer = await start_prefetch(ctx, name, PrefetchRequest(count=int(raw)))
    except LlmgwError as exc:
        return done(request, f"/admin/models/{name}", exc.message, kind="error")
    return done(request, f"/admin/models/{name}", answer.message)


# -- teams and keys -------------------------------------------------------------

@post("/teams")
async def create_team(request: Request[Any, Any, Any], ctx: Ctx, data: Form) -> Redirect:
    name = data.get("name", "").strip()
    to = f"{TEAMS}#team-form"
    limits, errors = limits_from(ctx, data, TEAM_FIELDS)
    if not name:
        errors.insert(0, ("name", "name: give the team a name"))
    if errors or limits is None:
        return refused(request, to, "team-form", data, errors)
    try:
        await tenants.create_team(ctx, TeamRequest(name=name, limits=limits),
                                  signed_in(request).name)
    except LlmgwError as exc:
        return refused(request, to, "team-form", data, [problem(exc, "name")])
    return done(request, f"{TEAMS}#team-{name}", f"created team {name}")


@post("/keys")
async def create_key(request: Request[Any, Any, Any], ctx: Ctx, data: Form) -> Redirect:
    name, team = data.get("name", "").strip(), data.get("team", "").strip()
    to = f"{TEAMS}#key-form"
    limits, errors = limits_from(ctx, data, KEY_FIELDS)
    if not name:
        errors.insert(0, ("name", "name: give the key a name"))
    if not team:
        errors.insert(0, ("team", "team: choose the team the key belongs to"))
    if errors or limits is None:
        return refused(request, to, "key-form", data, errors)
    session = signed_in(request)
    try:
        created = await tenants.create_key(ctx, KeyRequest(name=name, team=team,
                                                           limits=KeyLimits.of(limits)),
                                           session.name)
    except LlmgwError as exc:
        return refused(request, to, "key-form", data, [problem(exc, "name")])
    shown = Shown(form="key-form", label=f"key {created.name} of team {created.team}",
                  secret=created.key)
    return Redirect(f"{TEAMS}#new-key", status_code=303, cookies=[
        secret_cookie(request, session, shown),
        flash_cookie(request, session, "ok", f"created key {created.name}")])


@post("/teams/{name:str}/revoke")
async def revoke_team(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                      data: Form) -> Redirect:
    form = f"revoke-team-{name}"
    to = f"{TEAMS}#team-{name}"
    if data.get("confirm", "").strip() != name:
        return refused(request, to, form, data, [(
            "confirm", f"type the team's name, {name}, to revoke it and every key of it")])
    try:
        await tenants.revoke_team(ctx, name)
    except LlmgwError as exc:
        return refused(request, to, form, data, [problem(exc, "confirm")])
    return done(request, TEAMS, f"revoked team {name} and its keys")


@post("/keys/{name:str}/revoke")
async def revoke_key(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                     data: Form) -> Redirect:
    form = f"revoke-key-{name}"
    to = f"{TEAMS}#key-{name}"
    if data.get("confirm", "").strip() != name:
        return refused(request, to, form, data, [(
            "confirm", f"type the key's name, {name}, to revoke it: requests with it are "
                       "refused at once")])
    try:
        await tenants.revoke_key(ctx, name)
    except LlmgwError as exc:
        return refused(request, to, form, data, [problem(exc, "confirm")])
    return done(request, TEAMS, f"revoked key {name}")


# A GET on each action's URL lands on the page holding its form.
LANDINGS: list[HTTPRouteHandler] = [
    landing("/models/{name:str}/scale", "/admin/models/{name}#scale"),
    landing("/models/{name:str}/rollout", "/admin/models/{name}#rollout"),
    landing("/models/{name:str}/prefetch", "/admin/models/{name}#prefetch"),
    landing("/teams", TEAMS + "#team-form"),
    landing("/keys", TEAMS + "#key-form"),
    landing("/teams/{name:str}/revoke", TEAMS + "#team-{name}"),
    landing("/keys/{name:str}/revoke", TEAMS + "#key-{name}"),
    landing("/signout", "/admin/models"),
]

route_handlers = [add_model, scale_model, remove_model, rollout_model, prefetch_model,
                  create_team, create_key, revoke_team, revoke_key,
                  *LANDINGS]
