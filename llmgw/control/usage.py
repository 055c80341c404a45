"""Usage reports from the ledger's hourly roll-ups: by team, key or model, per hour or day."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal

import msgspec

from llmgw.control.context import AppContext
from llmgw.errors import DefinitionError, StoreUnavailableError

By = Literal["team", "key", "model"]
Granularity = Literal["hour", "day"]
# The longest span one report may cover (a year and a day's slack).
MAX_SPAN = 367 * 86400


class UsageBucket(msgspec.Struct, kw_only=True):
    start: datetime            # the hour's or UTC day's start
    group: str                 # the team, key or model
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageTotal(msgspec.Struct, kw_only=True):
    group: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageReport(msgspec.Struct, kw_only=True):
    by: By
    granularity: Granularity
    since: datetime
    until: datetime
    buckets: list[UsageBucket]
    totals: list[UsageTotal]   # per group over the whole span, most tokens first


def _span(since: datetime | None, until: datetime | None,
          granularity: Granularity) -> tuple[int, int]:
    step = 3600 if granularity == "hour" else 86400
    end = until.timestamp() if until is not None else time.time()
    start = since.timestamp() if since is not None else end - (86400 if step == 3600 else
                                                               30 * 86400)
    # Whole buckets: since down to its bucket's start, until up to the next one.
    lo = int(start // step) * step
    hi = -int(-end // step) * step
    if hi <= lo:
        raise DefinitionError(f"until ({until}) must be after since ({since})", field="until")
    if hi - lo > MAX_SPAN:
        raise DefinitionError(f"the span from since to until is over {MAX_SPAN // 86400} days; "
                              "ask for less", field="since")
    return lo, hi


async def usage_report(ctx: AppContext, by: By, since: datetime | None,
                       until: datetime | None, granularity: Granularity) -> UsageReport:
    if not ctx.store.is_open:
        raise StoreUnavailableError("the store is not open, so usage cannot be read; "
                                    "`/readyz` says why")
    lo, hi = _span(since, until, granularity)
    rows = await ctx.store.usage(by, lo, hi, day=granularity == "day")
    buckets = [UsageBucket(start=datetime.fromtimestamp(r.bucket, UTC), group=r.group,
                           requests=r.requests, prompt_tokens=r.prompt_tokens,
                           cached_tokens=r.cached_tokens, completion_tokens=r.completion_tokens,
                           total_tokens=r.prompt_tokens + r.completion_tokens) for r in rows]
    sums: dict[str, list[int]] = {}
    for b in buckets:
        s = sums.setdefault(b.group, [0, 0, 0, 0])
        s[0] += b.requests
        s[1] += b.prompt_tokens
        s[2] += b.cached_tokens
        s[3] += b.completion_tokens
    totals = sorted((UsageTotal(group=g, requests=s[0], prompt_tokens=s[1], cached_tokens=s[2],
                                completion_tokens=s[3], total_tokens=s[1] + s[3])
                     for g, s in sums.items()), key=lambda t: (-t.total_tokens, t.group))
    return UsageReport(by=by, granularity=granularity, since=datetime.fromtimestamp(lo, UTC),
                       until=datetime.fromtimestamp(hi, UTC), buckets=buckets, totals=totals)
