"""The spend page: cost per team, key and model, budget gauges; a key's own page, where
its limits are edited, its expiry set and its secret rotated.

Costs come from ``llmgw.control.costs.cost_report`` (what ``/api/v1/costs``
answers) over the UTC day or month so far; tokens from the ledger's roll-ups,
read as the gateway's budget check reads them (``Store.token_totals`` from the
period's start, ``recent_tokens`` for the last minute), so a gauge and a 429
agree. Cost budgets are measured against the cost meter's published figures
(the ``team-costs`` report), which is what the gateway refuses on.

The key list shows the keys that spent most first and stops at ``KEYS_SHOWN``
(a filter by team or name reaches the rest): a fleet with a thousand keys
gets a page, not a dump.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
from litestar import Request, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from llmgw.admin.actions import Form, done, problem, refused
from llmgw.admin.pages import limits_text, signed_in
from llmgw.admin.prg import Shown, landing, secret_cookie
from llmgw.admin.render import page
from llmgw.admin.session import flash_cookie
from llmgw.admin.tenantforms import KEY_FIELDS, limits_from
from llmgw.control import tenants
from llmgw.control.context import AppContext, Ctx
from llmgw.control.costs import cost_report
from llmgw.errors import DefinitionError, LlmgwError, NotFoundError
from llmgw.store.base import REPORT_RETENTION
from llmgw.tenancy import COSTS_REPORT, BudgetField, TeamCosts, period_start

from .gauges import Gauge, gauges, key_costs, per_million

Period = Literal["day", "month"]
KEYS_SHOWN = 100
# What the rotate form offers as the old secret's grace period, in seconds.
GRACES = [("0", "none: the old secret stops now"), ("3600", "1 hour"), ("86400", "1 day"),
          ("604800", "7 days")]


class TeamSpend(msgspec.Struct, kw_only=True):
    name: str
    cost: float
    tokens: int
    per_million: float | None
    gauges: list[Gauge]
    refused: dict[int, int]      # status (429, 403) → requests refused in the span


class KeySpend(msgspec.Struct, kw_only=True):
    name: str
    team: str
    tokens: int
    cost: float
    per_million: float | None
    gauges: list[Gauge]
    limits: str
    expires_at: float | None
    previous_until: float | None


# The answers the page counts as the gateway refusing a team (allow-lists, budgets and
# rate limits); the span's records are read for these alone.
REFUSALS = (403, 429)


async def _cost_figures(ctx: AppContext) -> TeamCosts | None:
    reports = await ctx.store.reports(COSTS_REPORT, REPORT_RETENTION)
    try:
        return msgspec.json.decode(reports[0].payload, type=TeamCosts) if reports else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def spend_context(ctx: AppContext, period: Period, team: str, key: str,
                        now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    field: BudgetField = "tokens_per_day" if period == "day" else "tokens_per_month"
    since = period_start(field, now)
    out: dict[str, Any] = {"period": period, "team_filter": team, "key_filter": key,
                           "spend_error": None, "graces": GRACES}
    store = ctx.store
    try:
        # Independent reads, together: the cost report's pricing runs in a thread while
        # the store answers the others.
        (report, (teams, keys), day, month, minute, figures), statuses = await asyncio.gather(
            asyncio.gather(
                cost_report(ctx, datetime.fromtimestamp(since, UTC), None),
                tenants.teams_and_keys(ctx),
                store.token_totals(period_start("tokens_per_day", now)),
                store.token_totals(period_start("tokens_per_month", now)),
                store.recent_tokens(now - 60), _cost_figures(ctx)),
            store.status_counts(since, min(REFUSALS)))
    except LlmgwError as exc:
        out["spend_error"] = exc.message
        return out
    span = day if period == "day" else month
    # What the gateway refused each team in the span: a budget answers 429 before the
    # ledger's figure reaches its limit when the rest cannot cover a request's reserve.
    refusals: dict[str, dict[int, int]] = {}
    for c in statuses:
        if c.status in REFUSALS:
            per = refusals.setdefault(c.team, {})
            per[c.status] = per.get(c.status, 0) + c.requests
    team_cost = {t.team: t.cost for t in report.teams}

    def sums(rows: list[Any], by_key: bool) -> dict[str, int]:
        acc: dict[str, int] = {}
        for r in rows:
            name = r.key if by_key else r.team
            acc[name] = acc.get(name, 0) + r.tokens
        return acc

    used = {p: (sums(rows, False), sums(rows, True))
            for p, rows in (("minute", minute), ("day", day), ("month", month))}
    cost_used = {"day": figures.day if figures else {}, "month": figures.month if figures else {}}
    team_rows = [TeamSpend(
        name=t.name, cost=team_cost.get(t.name, 0.0), tokens=used[period][0].get(t.name, 0),
        per_million=per_million(team_cost.get(t.name, 0.0), used[period][0].get(t.name, 0)),
        gauges=gauges(t.limits, {p: used[p][0].get(t.name, 0) for p in used},
                      {p: c.get(t.name, 0.0) for p, c in cost_used.items()}, now),
        refused=refusals.get(t.name, {}))
        for t in teams]
    shares = key_costs(team_cost, [(r.team, r.key, r.tokens) for r in span])
    key_tokens = used[period][1]
    chosen = [k for k in keys if (not team or k.team == team) and (not key or key in k.name)]
    chosen.sort(key=lambda k: (-shares.get(k.name, 0.0), -key_tokens.get(k.name, 0), k.name))
    key_rows = [KeySpend(
        name=k.name, team=k.team, tokens=key_tokens.get(k.name, 0),
        cost=shares.get(k.name, 0.0),
        per_million=per_million(shares.get(k.name, 0.0), key_tokens.get(k.name, 0)),
        gauges=gauges(k.limits, {p: used[p][1].get(k.name, 0) for p in used}, {}, now),
        limits=limits_text(k.limits), expires_at=k.expires_at,
        previous_until=k.previous_until) for k in chosen[:KEYS_SHOWN]]
    out.update(report=report, teams=sorted(team_rows, key=lambda t: (-t.cost, t.name)),
               team_names=[t.name for t in teams], keys=key_rows,
               keys_hidden=max(0, len(chosen) - KEYS_SHOWN), keys_total=len(keys),
               since=datetime.fromtimestamp(since, UTC), cost_figures=figures is not None,
               idle=sum(m.idle_cost for m in report.models))
    return out


@get("/spend")
async def spend_page(request: Request[Any, Any, Any], ctx: Ctx,
                     period: FromQuery[Period] = "day", team: FromQuery[str] = "",
                     key: FromQuery[str] = "") -> Template:
    return page(request, "console/spend.html", session=signed_in(request), section="spend",
                **await spend_context(ctx, period, team, key))


# -- one key: limits, expiry, rotation ----------------------------------------------
# Each form answers with a redirect (llmgw.admin.prg): to the key's page with the
# flash, with what was typed and each problem when refused, or with the new secret
# sealed in a cookie that the page shows once.

async def key_context(ctx: AppContext, name: str) -> dict[str, Any]:
    keys = await tenants.list_keys(ctx)
    found = next((k for k in keys if k.name == name), None)
    if found is None:
        raise NotFoundError(f"no runtime key named {name!r} (keys in the keys file are "
                            "changed with `llmgw keys` on the control-plane host)")
    teams = {t.name: t for t in await tenants.list_teams(ctx)}
    team = teams.get(found.team)
    return {"k": found, "team_limits": limits_text(team.limits) if team else "",
            "limits_text": limits_text, "graces": GRACES, "key_fields": KEY_FIELDS,
            "models": [m.name for m in ctx.models.catalog][:300]}


@get("/keys/{name:str}")
async def show_key(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str]) -> Template:
    return page(request, "console/key.html", session=signed_in(request),
                **await key_context(ctx, name))


@post("/keys/{name:str}/limits")
async def set_limits(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                     data: Form) -> Redirect:
    to = f"/admin/keys/{name}#limits-form"
    limits, errors = limits_from(ctx, data, KEY_FIELDS)
    if errors or limits is None:
        return refused(request, to, "limits-form", data, errors)
    try:
        await tenants.set_key_limits(ctx, name, limits)
    except LlmgwError as exc:
        return refused(request, to, "limits-form", data, [problem(exc, "models")])
    return done(request, to, f"key {name}: limits now {limits_text(limits)}")


def parse_expiry(raw: str, offset_minutes: str) -> float | None:
    """The form's ``datetime-local`` value, in the viewer's zone (its offset from UTC in
    minutes, as the browser's getTimezoneOffset gives it), as Unix seconds; "" clears."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        local = datetime.fromisoformat(raw)
        offset = int(offset_minutes or "0")
    except ValueError:
        raise DefinitionError(f"expires: {raw!r} is not a date and time", field="expires_at"
                              ) from None
    return local.replace(tzinfo=UTC).timestamp() + offset * 60


@post("/keys/{name:str}/expiry")
async def set_expiry(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                     data: Form) -> Redirect:
    to = f"/admin/keys/{name}#expiry-form"
    try:
        at = parse_expiry(data.get("expires_at", ""), data.get("tz_offset", "0"))
        await tenants.set_key_expiry(ctx, name, at)
    except LlmgwError as exc:
        return refused(request, to, "expiry-form", data, [problem(exc, "expires_at")])
    text = "never expires" if at is None else \
        f"expires {datetime.fromtimestamp(at, UTC):%Y-%m-%d %H:%M} UTC"
    return done(request, to, f"key {name} {text}")


@post("/keys/{name:str}/rotate")
async def rotate(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str],
                 data: Form) -> Redirect:
    to = f"/admin/keys/{name}#rotate-form"
    raw = data.get("grace", "")
    try:
        if not raw.isdigit():
            raise DefinitionError(f"grace: {raw!r} is not a number of seconds", field="grace")
        created = await tenants.rotate_key(ctx, name, float(raw))
    except LlmgwError as exc:
        return refused(request, to, "rotate-form", data, [problem(exc, "grace")])
    session = signed_in(request)
    shown = Shown(form="rotate-form", label=f"the new secret of key {name}",
                  secret=created.key)
    return Redirect(f"/admin/keys/{name}#new-key", status_code=303, cookies=[
        secret_cookie(request, session, shown),
        flash_cookie(request, session, "ok", f"rotated key {name}")])


route_handlers = [spend_page, show_key, set_limits, set_expiry, rotate,
                  landing("/keys/{name:str}/limits", "/admin/keys/{name}#limits-form"),
                  landing("/keys/{name:str}/expiry", "/admin/keys/{name}#expiry-form"),
                  landing("/keys/{name:str}/rotate", "/admin/keys/{name}#rotate-form")]
