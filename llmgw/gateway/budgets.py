"""Token budgets per team and per key, enforced across gateway instances.

A budget is ``tokens_per_minute``, ``tokens_per_day`` (UTC) or
``tokens_per_month`` (UTC calendar month) on a team (every key of it counts)
or on a key (``llmgw.tenancy.Limits``); a token is a prompt or completion
token as the engine reported it.

Two checks, both without a store round trip on the request path:

* **Admission reserves against a leased slice** (``llmgw.gateway.slices``,
  which argues the design and its bounds): once the body is read, a request
  holds its worst case — its body's bytes plus ``max_tokens`` — on this
  process's slice of every budget of its key and team, and settles with the
  engine's usage when it ends. The store grants slices so that the written
  tokens plus every process's slice never exceed the budget, so however many
  instances share a budget, the tokens served never exceed it when every
  request states ``max_tokens``; a request without it reserves
  ``DEFAULT_ANSWER_TOKENS`` for its answer, and what it generates past that is
  the overshoot, at most its model's context per such request in flight. A
  budget smaller than one request's reservation answers 429 saying so.
* **Before the body is read**, this module's ``check``: the tokens the store's
  ledger holds for the period — read by every instance right after each of its
  ledger flushes, from the hourly roll-ups for a day or a month and from the
  raw records for the last minute — plus this instance's own tokens not yet
  written, or written since that read began (``Ledger.pending_*``,
  ``Ledger.written_*``). At or over the budget, the request is refused before
  it costs a body read. This view lags the other instances by up to two ledger
  cycles (their flush, this instance's re-read; a cycle is
  ``gateway.budget_interval``, quickened to a quarter of it past 80% of a
  budget), which is why it only refuses and never admits past a slice. It is
  also what a budget with ``when_store_down: admit`` is held to while its slice
  has lapsed: each instance then enforces the whole budget on its own view,
  so N instances cut off from the store allow up to N times the budget.

At or over the budget, the answer is 429 with the code ``insufficient_quota``
in OpenAI's error shape, the time the budget resets in the message, and
``Retry-After``. ``bench/budget_overshoot.py`` measures what is served against
the budget with two and four ``llmgw serve`` instances on one Postgres.

A team may also have ``cost_per_day`` and ``cost_per_month``: its share of GPU
and CPU time as ``llmgw.control.costs`` attributes it. The cost meter
publishes every team's cost so far each ``costs.meter_interval`` (a store
report), with the rate at which the replicas held at that moment add to it;
gateways read it with their budget re-read and refuse a team whose cost so far
plus that rate times the time since reaches its budget. So the time held
between two passes of the meter is counted as it passes, not one interval
late; what a pass can still add is a replica started since the last one, or a
shift of the team's share of the tokens within the hour.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime

import msgspec

from llmgw.errors import RateLimitedError
from llmgw.gateway.ledger import Ledger
from llmgw.store.base import REPORT_RETENTION, Store, TokenTotal
from llmgw.tenancy import (
    BUDGET_FIELDS,
    COST_FIELDS,
    COSTS_REPORT,
    BudgetField,
    CostField,
    Limits,
    RuntimeTeam,
    TeamCosts,
    period_start,
    resets_at,
)

log = logging.getLogger("llmgw.gateway.budgets")

# Past this share of a budget, the ledger's cycle quickens (``Ledger.hurry``).
NEAR = 0.8


class QuotaExceededError(RateLimitedError):
    """A team's or key's token budget is used up until it resets."""

    code = "insufficient_quota"
    openai_type = "insufficient_quota"

    def __init__(self, message: str, *, retry_after: float, resets_at: float) -> None:
        super().__init__(message, retry_after=retry_after)
        self.resets_at = resets_at


def _cost_period(field: CostField) -> BudgetField:
    return "tokens_per_day" if field == "cost_per_day" else "tokens_per_month"


_decode_costs = msgspec.json.Decoder(TeamCosts).decode

_PERIOD = {"tokens_per_minute": "minute", "tokens_per_day": "day (UTC)",
           "tokens_per_month": "month (UTC)"}


class Budgets:
    """The tokens each team and key used in each period, as last read, and the checks."""

    def __init__(self, store: Store, ledger: Ledger, clock: Callable[[], float] = time.time,
                 in_use: Callable[[], set[BudgetField]] | None = None,
                 cost_in_use: Callable[[], bool] | None = None) -> None:
        self.store = store
        self.ledger = ledger
        # The periods some key or team in force has a budget for: only those are read.
        self._in_use = in_use or (lambda: set(BUDGET_FIELDS))
        self.clock = clock
        self._teams: dict[BudgetField, dict[str, int]] = {f: {} for f in BUDGET_FIELDS}
        self._keys: dict[BudgetField, dict[tuple[str, str], int]] = {
            f: {} for f in BUDGET_FIELDS}
        # Tokens this instance wrote that the totals being read may not hold yet.
        self._carried: tuple[dict[str, int], dict[tuple[str, str], int]] = ({}, {})
        # The cost meter's latest figures (cost budgets), and whether any team has one.
        self.costs: TeamCosts | None = None
        self._cost_in_use = cost_in_use or (lambda: False)

    async def refresh(self) -> None:
        """Read the totals of each period in use (a query each)."""
        if not self.store.is_open:
            return
        teams_w, keys_w = self.ledger.take_written()
        carried_t, carried_k = self._carried
        for team, n in teams_w.items():
            carried_t[team] = carried_t.get(team, 0) + n
        for k, n in keys_w.items():
            carried_k[k] = carried_k.get(k, 0) + n
        now = self.clock()
        read: list[tuple[BudgetField, dict[str, int], dict[tuple[str, str], int]]] = []
        in_use = self._in_use()
        for field in BUDGET_FIELDS:
            if field not in in_use:
                read.append((field, {}, {}))
                continue
            since = period_start(field, now)
            totals: list[TokenTotal]
            if field == "tokens_per_minute":
                totals = await self.store.recent_tokens(since)
            else:
                totals = await self.store.token_totals(since)
            teams: dict[str, int] = {}
            keys: dict[tuple[str, str], int] = {}
            for t in totals:
                teams[t.team] = teams.get(t.team, 0) + t.tokens
                keys[(t.team, t.key)] = t.tokens
            read.append((field, teams, keys))
        # Installed together, with the carried tokens dropped: they are in what was read.
        for field, teams, keys in read:
            self._teams[field], self._keys[field] = teams, keys
        self._carried = ({}, {})
        if self._cost_in_use():
            reports = await self.store.reports(COSTS_REPORT, REPORT_RETENTION)
            try:
                self.costs = _decode_costs(reports[0].payload) if reports else None
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("the cost meter's report does not decode: %s", exc)

    def used(self, field: BudgetField, team: str, key: str | None) -> int:
        """Tokens of the period: as read from the store, plus this instance's unwritten."""
        ledger = self.ledger
        if key is None:
            return (self._teams[field].get(team, 0) + ledger.pending_teams.get(team, 0)
                    + ledger.written_teams.get(team, 0) + self._carried[0].get(team, 0))
        k = (team, key)
        return (self._keys[field].get(k, 0) + ledger.pending_keys.get(k, 0)
                + ledger.written_keys.get(k, 0) + self._carried[1].get(k, 0))

    def check(self, team: str, key: str, team_limits: Limits | None,
              key_limits: Limits | None) -> None:
        """Raise QuotaExceededError if the key or its team has used a budget up."""
        if team_limits is not None and team_limits.has_cost_budget():
            self._check_cost(team, team_limits)
        now = 0.0
        for field in BUDGET_FIELDS:
            for limits, who, scope in ((key_limits, f"key {key!r}", key),
                                       (team_limits, f"team {team!r}", None)):
                limit = limits.budget(field) if limits is not None else None
                if limit is None:
                    continue
                used = self.used(field, team, scope)
                if used < limit:
                    if used >= NEAR * limit:
                        self.ledger.hurry()
                    continue
                now = now or self.clock()
                at = resets_at(field, now)
                when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
                raise QuotaExceededError(
                    f"{who} has used {used:,} of its {limit:,} tokens per "
                    f"{_PERIOD[field]}; it resets at {when}"
                    + (" (a sliding minute)" if field == "tokens_per_minute" else ""),
                    retry_after=max(1.0, at - now), resets_at=at)

    def shares(self, teams: Iterable[RuntimeTeam]) -> Iterator[tuple[str, str, float]]:
        """(team, budget field, share used) of every budget ``teams`` set, as ``check``
        counts it now: what the budget-near-exhaustion alert reads from /metrics. A cost
        budget has a share only while the cost meter's figures are of its period."""
        now = self.clock()
        for t in teams:
            for field in BUDGET_FIELDS:
                limit = t.limits.budget(field)
                if limit:
                    yield t.name, field, self.used(field, t.name, None) / limit
            for cost_field in COST_FIELDS:
                cost_limit: float | None = getattr(t.limits, cost_field)
                spent = self._spent(cost_field, t.name, now) if cost_limit else None
                if cost_limit and spent is not None:
                    yield t.name, cost_field, spent / cost_limit

    def _spent(self, field: CostField, team: str, now: float) -> float | None:
        """The team's cost so far in the period of ``field``; None while the meter's latest
        figures are of a period that has ended (or there are none)."""
        costs = self.costs
        if costs is None:
            return None
        start = costs.day_start if field == "cost_per_day" else costs.month_start
        if start != period_start(_cost_period(field), now):
            return None
        spent = (costs.day if field == "cost_per_day" else costs.month).get(team, 0.0)
        return spent + costs.rate.get(team, 0.0) * max(0.0, now - costs.at) if costs.at \
            else spent

    def _check_cost(self, team: str, limits: Limits) -> None:
        if self.costs is None:
            return
        now = self.clock()
        for field in COST_FIELDS:
            limit = getattr(limits, field)
            if limit is None:
                continue
            period = _cost_period(field)
            spent = self._spent(field, team, now)
            if spent is None or spent < limit:
                continue
            at = resets_at(period, now)
            when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
            raise QuotaExceededError(
                f"team {team!r} has spent {spent:,.2f} of its {limit:,.2f} per "
                f"{_PERIOD[period]} (GPU and CPU time attributed by tokens); it resets at {when}",
                retry_after=max(1.0, at - now), resets_at=at)
