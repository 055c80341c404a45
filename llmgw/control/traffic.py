"""What the gateways' own records say about the traffic: budget use, statuses, upstreams.

Three views, each read from the store the gateways write to, so the API, ``ctl``
and the console show the numbers the gateways enforce:

* **budget use** (``budget_use``): for every token and cost budget of a runtime
  team or key, what the period has used so far, the share, and when it
  resets. Counted as ``llmgw.gateway.budgets`` counts it before answering 429:
  the hourly roll-ups for a day or a month, the raw records for the sliding
  minute, the cost meter's report (plus its rate since) for a cost budget. A
  gateway also adds its own tokens not yet written, so a figure here may trail
  the gateway's by one ledger write (``gateway.budget_interval``, 200 ms).
* **statuses** (``status_counts``): requests per team, key, model and status
  over the last ``STATUS_WINDOW`` seconds, from the raw records: where 429s
  (budgets, rate limits, queues), 403s (allow-lists) and 502s (dead upstreams)
  come from.
* **upstream health** (``upstream_health``): an external model whose recent
  requests all failed is failing, whatever its definition says. The gateways'
  active probes are the first judge (a dead upstream stops getting requests
  within one probe interval, ``llmgw.gateway.probes``); the records are what
  the control plane can see of them, and what a model without a health path
  has.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import msgspec

from llmgw.catalog.model import Model
from llmgw.control.context import AppContext
from llmgw.control.tenants import KeyView, TeamView, list_keys, list_teams, store_of
from llmgw.scheduler.base import PROBES_REPORT, ProbeReport
from llmgw.store.base import REPORT_RETENTION, StatusCount, TokenTotal
from llmgw.tenancy import (
    BUDGET_FIELDS,
    COST_FIELDS,
    COSTS_REPORT,
    BudgetField,
    Limits,
    TeamCosts,
    period_start,
    resets_at,
)

log = logging.getLogger("llmgw.api")

# The span of the statuses view and of an upstream's recent requests.
STATUS_WINDOW = 3600.0
UPSTREAM_WINDOW = 300.0
# This many failures in a row, and no success since, make an upstream failing.
FAILING_AFTER = 3
# A share of a budget at which it is shown as nearly used (the gateways hurry their
# ledger from 80%, ``llmgw.gateway.budgets.NEAR``).
NEAR = 0.8


class BudgetUse(msgspec.Struct, kw_only=True):
    """One budget of a team (``key`` None) or of a key, and what its period has used."""

    team: str
    key: str | None
    budget: str                # tokens_per_minute, tokens_per_day, ..., cost_per_month
    limit: float
    used: float
    share: float               # used / limit
    over: bool                 # the gateways answer 429 until it resets
    resets_at: datetime


class StatusView(msgspec.Struct, kw_only=True):
    team: str
    key: str
    model: str
    status: int
    requests: int
    last_at: datetime


class StatusReport(msgspec.Struct, kw_only=True):
    since: datetime
    counts: list[StatusView]


class UpstreamHealth(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateways' probes and the recent requests of an external model say about
    its upstream. ``failing``: no request it gets can succeed now."""

    failing: bool
    reason: str | None          # why failing, or what is wrong short of it
    down: list[str] = []        # upstreams failing their probe (credentials masked)
    failures: int = 0           # requests answered 5xx in UPSTREAM_WINDOW
    requests: int = 0


def _cost_period(field: str) -> BudgetField:
    return "tokens_per_day" if field == "cost_per_day" else "tokens_per_month"


def _spent(costs: TeamCosts | None, field: str, team: str, now: float) -> float | None:
    """The team's cost so far in the period, as ``Budgets._spent`` counts it."""
    if costs is None:
        return None
    start = costs.day_start if field == "cost_per_day" else costs.month_start
    if start != period_start(_cost_period(field), now):
        return None
    spent = (costs.day if field == "cost_per_day" else costs.month).get(team, 0.0)
    return spent + costs.rate.get(team, 0.0) * max(0.0, now - costs.at) if costs.at else spent


def _use(team: str, key: str | None, budget: str, limit: float, used: float,
         now: float) -> BudgetUse:
    period = _cost_period(budget) if budget in COST_FIELDS else budget
    return BudgetUse(team=team, key=key, budget=budget, limit=limit, used=used,
                     share=used / limit, over=used >= limit,
                     resets_at=datetime.fromtimestamp(
                         resets_at(period, now), UTC))  # type: ignore[arg-type]


async def budget_use(ctx: AppContext, now: float | None = None, *,
                     teams: list[TeamView] | None = None,
                     keys: list[KeyView] | None = None) -> list[BudgetUse]:
    """Every budget of every runtime team and key, with its use so far (``teams`` and
    ``keys`` when the caller has just listed them)."""
    now = time.time() if now is None else now
    teams = await list_teams(ctx) if teams is None else teams
    keys = await list_keys(ctx) if keys is None else keys
    limits: list[tuple[str, str | None, Limits]] = [(t.name, None, t.limits) for t in teams]
    limits += [(k.team, k.name, k.limits) for k in keys]
    totals: dict[BudgetField, list[TokenTotal]] = {}
    for field in BUDGET_FIELDS:
        if any(lim.budget(field) is not None for _, _, lim in limits):
            since = period_start(field, now)
            totals[field] = (await ctx.store.recent_tokens(since)
                             if field == "tokens_per_minute"
                             else await ctx.store.token_totals(since))
    costs = None
    if any(lim.has_cost_budget() for _, _, lim in limits):
        reports = await ctx.store.reports(COSTS_REPORT, REPORT_RETENTION)
        try:
            costs = msgspec.json.decode(reports[0].payload, type=TeamCosts) if reports else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            costs = None
    # Added up once per period, by team and by (team, key): a fleet has a thousand keys.
    by_team: dict[BudgetField, dict[str, int]] = {}
    by_key: dict[BudgetField, dict[tuple[str, str], int]] = {}
    for field, found in totals.items():
        teams_used, keys_used = by_team.setdefault(field, {}), by_key.setdefault(field, {})
        for t in found:
            teams_used[t.team] = teams_used.get(t.team, 0) + t.tokens
            keys_used[(t.team, t.key)] = keys_used.get((t.team, t.key), 0) + t.tokens
    out: list[BudgetUse] = []
    for team, key, lim in limits:
        for field in BUDGET_FIELDS:
            limit = lim.budget(field)
            if limit is None:
                continue
            used = (by_team.get(field, {}).get(team, 0) if key is None
                    else by_key.get(field, {}).get((team, key), 0))
            out.append(_use(team, key, field, limit, used, now))
        for cost_field in COST_FIELDS:
            cost_limit: float | None = getattr(lim, cost_field)
            if cost_limit is None or key is not None:
                continue
            spent = _spent(costs, cost_field, team, now)
            out.append(_use(team, None, cost_field, cost_limit, spent or 0.0, now))
    return out


async def status_counts(ctx: AppContext, since: float | None = None,
                        least: int = 0) -> StatusReport:
    """Requests by team, key, model and status since ``since``: statuses ``least`` and up."""
    start = time.time() - STATUS_WINDOW if since is None else since
    rows = await store_of(ctx).status_counts(start, least)
    return StatusReport(since=datetime.fromtimestamp(start, UTC), counts=[
        StatusView(team=r.team, key=r.key, model=r.model, status=r.status,
                   requests=r.requests, last_at=datetime.fromtimestamp(r.last_at, UTC))
        for r in rows])


def upstream_health(model: Model, counts: list[StatusCount], probes: list[ProbeReport],
                    now: float) -> UpstreamHealth:
    """Pure. Failing when a gateway finds every upstream failing its probe, or when the
    model's latest ``FAILING_AFTER`` or more requests in the window were 5xx with no
    success after them; a warning when some upstreams fail their probes or some
    requests failed."""
    mine = [c for c in counts if c.model == model.name]
    failed = [c for c in mine if c.status >= 500]
    failures = sum(c.requests for c in failed)
    last_ok = max((c.last_at for c in mine if c.status < 500), default=None)
    last_bad = max(failed, key=lambda c: c.last_at, default=None)
    down = sorted({u for p in probes for u in p.down.get(model.name, [])})
    probed = max((p.probed.get(model.name, 0) for p in probes), default=0)
    all_down = [p for p in probes if p.probed.get(model.name)
                and len(p.down.get(model.name, [])) >= p.probed[model.name]]
    in_a_row = (failures >= FAILING_AFTER and last_bad is not None
                and (last_ok is None or last_ok < min(c.last_at for c in failed)))
    reason = None
    if all_down:
        reason = (f"every upstream fails its health probe ({', '.join(down)}); requests "
                  "for it fail until one passes")
    elif in_a_row and last_bad is not None:
        reason = (f"its last {failures} requests failed (latest {last_bad.status}, "
                  f"{max(0.0, now - last_bad.last_at):.0f} s ago) and none has succeeded "
                  "since")
    elif down:
        reason = f"{len(down)} of {probed} upstreams fail their health probe: {', '.join(down)}"
    elif failures and last_bad is not None:
        reason = (f"{failures} of {sum(c.requests for c in mine)} requests failed in the "
                  f"last {UPSTREAM_WINDOW / 60:.0f} minutes (latest {last_bad.status})")
    return UpstreamHealth(failing=bool(all_down) or in_a_row, reason=reason, down=down,
                          failures=failures, requests=sum(c.requests for c in mine))


# How old a gateway's probe report may be: a few of its scaler ticks.
PROBES_FRESH = 30.0


async def upstream_health_of(ctx: AppContext, models: list[Model],
                             now: float | None = None) -> dict[str, UpstreamHealth]:
    """``upstream_health`` of each external model; none when the store cannot be read."""
    external = [m for m in models if m.external]
    if not external or not ctx.store.is_open:
        return {}
    now = time.time() if now is None else now
    try:
        counts = await ctx.store.status_counts(now - UPSTREAM_WINDOW)
        found = await ctx.store.reports(PROBES_REPORT, PROBES_FRESH)
    except Exception as exc:  # a view must answer whatever the store does
        log.warning("cannot read the upstreams' recent requests or probes: %s", exc)
        return {}
    probes = []
    for r in found:
        try:
            probes.append(msgspec.json.decode(r.payload, type=ProbeReport))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return {m.name: upstream_health(m, counts, probes, now) for m in external}
