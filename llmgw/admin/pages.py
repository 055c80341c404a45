"""The admin page's read-only pages, and the status fragments its script refreshes.

Every figure comes from the functions the JSON API answers with
(``llmgw.api.models`` builds a ``ModelView`` from the catalog in force, the
store row and the scheduler; ``replica_view`` decides staleness and memory
warnings), so the page and ``llmgw ctl`` cannot disagree about a model.

Each page that shows live status renders its status part from a template
fragment that is also served on its own under ``/admin/fragments/…``; the
page's script fetches it every few seconds and swaps it in. Forms live
outside the fragments, so a refresh never eats what someone is typing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

import yaml
from litestar import Request, get
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Redirect, Template

from llmgw.admin.chart import series_of, usage_chart
from llmgw.admin.csrf import session_of
from llmgw.admin.locate import excerpt, line_of
from llmgw.admin.prg import FormState
from llmgw.admin.render import fragment, page
from llmgw.admin.session import Session
from llmgw.admin.tenantforms import KEY_FIELDS, TEAM_FIELDS
from llmgw.catalog.decode import to_builtins
from llmgw.catalog.model import Model
from llmgw.control.adapters import adapter_view
from llmgw.control.context import AppContext, Ctx
from llmgw.control.tenants import list_keys, list_teams, store_of
from llmgw.control.traffic import (
    NEAR,
    STATUS_WINDOW,
    budget_use,
    status_counts,
    upstream_health_of,
)
from llmgw.control.usage import By, Granularity, usage_report
from llmgw.control.views import (
    ModelView,
    ReplicaView,
    desired_reason,
    find_model,
    model_view,
    replica_view,
    replicas_by_model,
    replicas_of,
    scaler_decisions,
)
from llmgw.errors import LlmgwError
from llmgw.scheduler.base import Fleet
from llmgw.tenancy import Limits

log = logging.getLogger("llmgw.admin")

FLEET_TIMEOUT = 5.0
FRAGMENT = {"fragment": True}

EXAMPLE = """\
name: qwen-coder-7b
description: Qwen2.5 Coder 7B for the editor plugin
source: hf://Qwen/Qwen2.5-Coder-7B-Instruct
engine: vllm
profiles:
  - name: one-l40s
    gpu_class: l40s-48g
    gpus: 1
    context: 32768
    cpu_cores: 8
    memory: 32GiB
scaling:
  min: 1
"""


def signed_in(request: Request[Any, Any, Any]) -> Session:
    session = session_of(request)
    if session is None:  # the router's guard runs first; this would be a wiring fault
        raise RuntimeError("admin route reached without a session")
    return session


# -- what the templates show -------------------------------------------------

# Rows of a long list per page: a fleet of 2,000 models (or 1,000 keys) on one page
# is over a megabyte of HTML and a second of rendering.
PAGE_SIZE = 100


class Paged:
    """One page of a filtered list: its rows, where it is, and the links around it."""

    def __init__(self, rows: list[Any], number: int, path: str, query: dict[str, str],
                 size: int = PAGE_SIZE) -> None:
        self.total = len(rows)
        self.pages = max(1, -(-self.total // size))
        self.number = min(max(1, number), self.pages)
        self.first = (self.number - 1) * size
        self.rows = rows[self.first:self.first + size]
        self.last = self.first + len(self.rows)
        self.path, self.query = path, {k: v for k, v in query.items() if v}

    def link(self, number: int) -> str:
        return f"{self.path}?{urlencode({**self.query, 'page': number})}"

    @property
    def here(self) -> str:
        return self.link(self.number) if self.number > 1 else (
            f"{self.path}?{urlencode(self.query)}" if self.query else self.path)


def matching(names: list[Any], q: str, key: Any) -> list[Any]:
    needle = q.strip().lower()
    return [n for n in names if needle in key(n).lower()] if needle else names


async def models_context(ctx: AppContext, q: str = "", number: int = 1) -> dict[str, Any]:
    shown = Paged(matching(list(ctx.models.catalog), q, lambda m: m.name), number,
                  "/admin/models", {"q": q})
    chosen: list[Model] = shown.rows
    replicas = await replicas_of(ctx) if len(chosen) != 1 else await replicas_of(
        ctx, chosen[0].name)
    upstreams = await upstream_health_of(ctx, chosen)
    mine = replicas_by_model(replicas)
    views = [model_view(ctx, m, mine.get(m.name, []), upstreams=upstreams) for m in chosen]
    loaded = ctx.adapters_loaded() if ctx.adapters_loaded is not None else {}
    adapters = [adapter_view(ctx, a, loaded.get(a.name))
                for a in sorted(ctx.models.catalog.adapters.values(), key=lambda a: a.name)]
    return {
        "models": views,
        "paged": shown,
        "q": q,
        "fragment_url": "/admin/fragments/models" + shown.here.removeprefix("/admin/models"),
        "adapters": adapters,
        "replicas_unknown": replicas is None,
        "skipped": ctx.models.skipped,
        "store_error": ctx.models.store_problem(),
        "backend": ctx.backend.health(),
    }


async def model_context(ctx: AppContext, name: str) -> dict[str, Any]:
    m = find_model(ctx, name)
    replicas = await replicas_of(ctx, name)
    view: ModelView = model_view(ctx, m, replicas, await scaler_decisions(ctx),
                                 await upstream_health_of(ctx, [m]))
    rows: list[ReplicaView] = [replica_view(r, m) for r in replicas or [] if r.model == name]
    prefetch = None
    if not m.external:
        try:
            prefetch = await asyncio.wait_for(ctx.backend.prefetch_status(name),
                                              FLEET_TIMEOUT)
        except Exception as exc:  # the page answers without it when the scheduler does not
            log.info("prefetch status of %s: %s", name, exc)
    return {"m": view, "replicas": rows, "replicas_unknown": replicas is None,
            "backend": ctx.backend.health(), "prefetch": prefetch,
            "why_desired": desired_reason(view.scaling, view.scaler),
            "offers": model_actions(view)}


def model_actions(view: ModelView) -> dict[str, str | None]:
    """Each action of the model page: None when it can be done, else why it cannot.

    The page offers only what the service would accept, and says why the rest
    is not there, rather than offering a button that is then refused.
    """
    declared = view.origin == "declared"
    external = ("external: its replicas are the upstream's, run by whoever runs it"
                if view.external else None)
    return {
        "scale": external or ("declared in the server's configuration: change its scaling "
                              "there (a change here would revert on the next restart)"
                              if declared else None),
        "rollout": external,
        "prefetch": ("external: no node of this fleet holds its weights"
                     if view.external else None),
        "remove": ("declared in the server's configuration: remove it there (it would come "
                   "back on the next restart)" if declared else None),
    }


def definition_yaml(view: ModelView) -> str:
    """The definition in force, as YAML an operator can copy into a file or server.yaml."""
    return yaml.safe_dump(to_builtins(view.definition), sort_keys=False,
                          allow_unicode=True)


async def fleet_context(ctx: AppContext) -> dict[str, Any]:
    try:
        found: Fleet | None = await asyncio.wait_for(ctx.backend.fleet(), FLEET_TIMEOUT)
        error = None
    except LlmgwError as exc:
        found, error = None, exc.message
    except TimeoutError:
        found, error = None, (f"the scheduler did not answer within {FLEET_TIMEOUT:.0f} s; "
                              "check that it is reachable (see /readyz)")
    except Exception as exc:  # a status page must answer even when the scheduler does not
        log.warning("fleet lookup failed: %s", exc)
        found, error = None, ("the scheduler's fleet could not be read "
                              f"({type(exc).__name__}); the server's log has the details, "
                              "and /readyz says whether the scheduler is reachable")
    return {"fleet": found, "fleet_error": error}


def add_context(ctx: AppContext, state: FormState | None = None) -> dict[str, Any]:
    """The add page's context; ``state`` when a refused form is answered directly."""
    return {"example": EXAMPLE, "checked": ctx.source_check is not None,
            "locate": locate_error, "direct": state}


def locate_error(state: FormState) -> dict[str, Any]:
    """Where the add form's error is in what was pasted: its field, line and excerpt."""
    field, message = state.errors[0] if state.errors else ("", "")
    text = state.values.get("yaml", "")
    line = line_of(text, field or None)
    return {"error": message, "field": field or None, "line": line,
            "lines": excerpt(text, line) if line else []}


# -- routes ------------------------------------------------------------------

@get("/")
async def index() -> Redirect:
    return Redirect("/admin/models", status_code=303)


@get("/models")
async def models_page(request: Request[Any, Any, Any], ctx: Ctx, q: FromQuery[str] = "",
                      page_number: Annotated[int, QueryParameter(name="page", ge=1)] = 1,
                      ) -> Template:
    return page(request, "models.html", session=signed_in(request),
                **await models_context(ctx, q, page_number))


@get("/fragments/models", opt=FRAGMENT)
async def models_fragment(ctx: Ctx, q: FromQuery[str] = "",
                          page_number: Annotated[int, QueryParameter(name="page", ge=1)] = 1,
                          ) -> Template:
    return fragment("_models.html", **await models_context(ctx, q, page_number))


@get("/models/{name:str}")
async def show_model(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str]) -> Template:
    context = await model_context(ctx, name)
    return page(request, "model.html", session=signed_in(request),
                definition=definition_yaml(context["m"]), **context)


@get("/fragments/models/{name:str}", opt=FRAGMENT)
async def model_fragment(ctx: Ctx, name: FromPath[str]) -> Template:
    return fragment("_model.html", **await model_context(ctx, name))


@get("/fleet")
async def fleet_page(request: Request[Any, Any, Any], ctx: Ctx) -> Template:
    return page(request, "fleet.html", session=signed_in(request), **await fleet_context(ctx))


@get("/fragments/fleet", opt=FRAGMENT)
async def fleet_fragment(ctx: Ctx) -> Template:
    return fragment("_fleet.html", **await fleet_context(ctx))


@get("/add")
async def add_page(request: Request[Any, Any, Any], ctx: Ctx) -> Template:
    return page(request, "add.html", session=signed_in(request), **add_context(ctx))


@get("/models/{name:str}/remove")
async def remove_page(request: Request[Any, Any, Any], ctx: Ctx, name: FromPath[str]) -> Template:
    context = await model_context(ctx, name)
    return page(request, "remove.html", session=signed_in(request), **context)


def limits_text(limits: Limits) -> str:
    parts = [f"models {', '.join(limits.models)}"] if limits.models is not None else []
    parts.extend(f"{name.replace('_', ' ')} {value:,}" if isinstance(value, int)
                 else f"{name} {value}"
                 for name in ("rpm", "tokens_per_minute", "tokens_per_day", "tokens_per_month",
                              "priority")
                 if (value := getattr(limits, name)) is not None)
    return "; ".join(parts) or "no limits"


def api_instant(moment: datetime) -> str:
    """A UTC moment as a query's value for the API: ``2026-12-01T00:00:00Z``. Short, since
    a page's every marked number carries the URL it is checked against."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


async def usage_context(ctx: AppContext, by: By, granularity: Granularity) -> dict[str, Any]:
    hourly = granularity == "hour"
    step = 3600 if hourly else 86400
    now = time.time()
    end = (int(now // step) + 1) * step
    count = 24 if hourly else 14
    since = datetime.fromtimestamp(end - count * step, UTC)
    out: dict[str, Any] = {"by": by, "granularity": granularity, "usage_error": None}
    try:
        report = await usage_report(ctx, by, since, datetime.fromtimestamp(end, UTC),
                                    granularity)
        starts = [datetime.fromtimestamp(end - (count - i) * step, UTC) for i in range(count)]
        query = urlencode({"by": by, "granularity": granularity,
                           "since": api_instant(report.since),
                           "until": api_instant(report.until)}, safe=":")
        out.update(report=report, series=series_of(report.totals),
                   usage_api=f"/api/v1/usage?{query}",
                   chart=usage_chart(report.buckets, report.totals, starts, hourly=hourly,
                                     now=datetime.fromtimestamp(now, UTC)))
    except LlmgwError as exc:
        out["usage_error"] = exc.message
    out.update(await traffic_context(ctx, now))
    return out


# The busiest refusals and failures shown; the API lists them all.
MAX_STATUS_ROWS = 50

# Statuses shown with what they mean to the operator; the rest by their number alone.
STATUS_MEANING = {
    400: "refused as malformed", 401: "no or unknown key", 403: "model not allowed",
    404: "unknown model", 408: "timed out", 413: "too large",
    429: "budget, rate limit or queue full", 499: "client went away",
    500: "engine error", 502: "upstream failed", 503: "no replica ready",
    504: "upstream timed out",
}


async def traffic_context(ctx: AppContext, now: float) -> dict[str, Any]:
    """Budget use against each limit, and the last hour's answers by status."""
    out: dict[str, Any] = {"budgets": [], "statuses": None, "traffic_error": None,
                           "status_meaning": STATUS_MEANING, "near": NEAR}
    try:
        out["budgets"] = sorted(await budget_use(ctx, now),
                                key=lambda b: (not b.over, -b.share, b.team, b.key or ""))
        # The refusals and failures, and how many answers in all: grouping every
        # success too would be most of the page's time on a busy ledger.
        report = await status_counts(ctx, now - STATUS_WINDOW, least=400)
        answered = await store_of(ctx).requests_since(now - STATUS_WINDOW)
    except LlmgwError as exc:
        out["traffic_error"] = exc.message
        return out
    out["statuses"] = report
    out["statuses_api"] = "/api/v1/statuses?" + urlencode({"since": api_instant(report.since)},
                                                          safe=":")
    errors = sorted(report.counts,
                    key=lambda c: (-c.requests, c.status, c.team, c.key, c.model))
    out["errors"], out["errors_more"] = errors[:MAX_STATUS_ROWS], len(errors) - MAX_STATUS_ROWS
    out["answered"] = answered
    return out


@get("/usage")
async def usage_page(request: Request[Any, Any, Any], ctx: Ctx, by: FromQuery[By] = "team",
                     granularity: FromQuery[Granularity] = "hour") -> Template:
    return page(request, "usage.html", session=signed_in(request),
                **await usage_context(ctx, by, granularity))


async def teams_context(ctx: AppContext, q: str = "", number: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {"teams_error": None, "teams": [], "keys": [], "over": set(),
                           "limits_text": limits_text, "team_fields": TEAM_FIELDS,
                           "key_fields": KEY_FIELDS, "q": q,
                           "paged": Paged([], 1, "/admin/teams", {"q": q})}
    try:
        teams, keys = await list_teams(ctx), await list_keys(ctx)
        paged = Paged(matching(keys, q, lambda k: f"{k.name} {k.team}"),
                      number, "/admin/teams", {"q": q})
        out["teams"], out["paged"], out["keys"] = teams, paged, paged.rows
        # Teams over a budget of their own: the keys' budgets are not read (a thousand
        # keys' rows to build and drop).
        out["over"] = {b.team for b in await budget_use(ctx, teams=teams, keys=[])
                       if b.over}
    except LlmgwError as exc:
        out["teams_error"] = exc.message
    return out


@get("/teams")
async def teams_page(request: Request[Any, Any, Any], ctx: Ctx, q: FromQuery[str] = "",
                     page_number: Annotated[int, QueryParameter(name="page", ge=1)] = 1,
                     ) -> Template:
    return page(request, "teams.html", session=signed_in(request),
                **await teams_context(ctx, q, page_number))


route_handlers = [index, models_page, models_fragment, show_model, model_fragment, fleet_page,
                  fleet_fragment, add_page, remove_page, usage_page, teams_page]
