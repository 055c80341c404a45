"""Budget gauges and cost shares: what the spend page computes, with no I/O.

A gauge is one limit of a team or key against what its period has used, with
the instant the period resets: the same periods the gateway enforces
(``llmgw.tenancy.period_start`` and ``resets_at``), so a gauge at
100% is a team the gateway is answering 429.

A key's cost is its team's cost shared by the key's tokens in the span — the
rule ``llmgw.control.costs`` uses to share a model-hour among teams, one level
down. It is an attribution, as the team's figure is, not a meter of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from llmgw.tenancy import BUDGET_FIELDS, COST_FIELDS, Limits, resets_at

PERIOD_OF = {"tokens_per_minute": "minute", "tokens_per_day": "day",
             "tokens_per_month": "month", "cost_per_day": "day", "cost_per_month": "month"}
LABEL = {"tokens_per_minute": "tokens / minute", "tokens_per_day": "tokens / day (UTC)",
         "tokens_per_month": "tokens / month (UTC)", "cost_per_day": "cost / day (UTC)",
         "cost_per_month": "cost / month (UTC)"}
# A gauge this full is shown as a warning; a full one as over budget.
NEAR = 0.8


class Gauge(msgspec.Struct, frozen=True, kw_only=True):
    field: str
    label: str
    used: float
    limit: float
    resets_at: float           # Unix seconds

    @property
    def share(self) -> float:
        return self.used / self.limit if self.limit else 0.0

    @property
    def percent(self) -> int:
        """The share as a whole percent, capped at 100 for the bar's width."""
        return min(100, round(self.share * 100))

    @property
    def state(self) -> str:
        return "over" if self.share >= 1 else "near" if self.share >= NEAR else "ok"

    @property
    def cost(self) -> bool:
        return self.field.startswith("cost_")


def gauges(limits: Limits, tokens: Mapping[str, int], costs: Mapping[str, float],
           now: float) -> list[Gauge]:
    """One gauge per budget set in ``limits``; ``tokens`` and ``costs`` map a period
    ("minute", "day", "month") to what it has used."""
    out: list[Gauge] = []
    for field in BUDGET_FIELDS:
        limit = limits.budget(field)
        if limit is not None:
            out.append(Gauge(field=field, label=LABEL[field], limit=float(limit),
                             used=float(tokens.get(PERIOD_OF[field], 0)),
                             resets_at=resets_at(field, now)))
    for cost_field in COST_FIELDS:
        cap: float | None = getattr(limits, cost_field)
        if cap is not None:
            period = "tokens_per_day" if cost_field == "cost_per_day" else "tokens_per_month"
            out.append(Gauge(field=cost_field, label=LABEL[cost_field], limit=float(cap),
                             used=costs.get(PERIOD_OF[cost_field], 0.0),
                             resets_at=resets_at(period, now)))  # type: ignore[arg-type]
    return out


def key_costs(team_cost: Mapping[str, float], key_tokens: Iterable[tuple[str, str, int]]
              ) -> dict[str, float]:
    """Each key's share of its team's cost, by its tokens: ``key_tokens`` holds
    (team, key, tokens). A team with no tokens shares nothing."""
    rows = list(key_tokens)
    per_team: dict[str, int] = {}
    for team, _, n in rows:
        per_team[team] = per_team.get(team, 0) + n
    return {key: team_cost.get(team, 0.0) * n / per_team[team]
            for team, key, n in rows if per_team[team] > 0}


def per_million(cost: float, tokens: int) -> float | None:
    return cost / tokens * 1e6 if tokens else None
