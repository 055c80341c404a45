"""Usage reports from the ledger's hourly roll-ups: by team, key or model, per hour or day.

**Any span is answered.** A report covers [since, until) in whole buckets, however
long: one since 2000 is the ledger's whole history, or nothing, rather than a
refusal. Its cost follows the data, not the span — every read is one range of
an index (``usage_rollup`` by grain, dimension and bucket; ``holdings`` by
start), and every loop over the answer runs over the rows found — so the
decades before the first record cost nothing, and a bound on the span would
only refuse reports the store answers as cheaply as any other. A span that
ends where it starts, or before, holds no bucket and is answered empty.
``report_span`` and ``instant_at`` are shared with the cost report.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal

import msgspec

from llmgw.control.context import AppContext
from llmgw.errors import StoreUnavailableError

By = Literal["team", "key", "model"]
Granularity = Literal["hour", "day"]
# The instants a report can name (datetime's range, in Unix seconds): a bucket boundary
# rounded past them is shown at the nearest one.
FIRST_INSTANT = -62135596800   # 0001-01-01T00:00:00Z
LAST_INSTANT = 253402300799    # 9999-12-31T23:59:59Z


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


def instant_at(t: float) -> datetime:
    """``t`` (Unix seconds) as a UTC datetime, held within the instants one can name."""
    return datetime.fromtimestamp(min(max(t, FIRST_INSTANT), LAST_INSTANT), UTC)


def report_span(since: datetime | None, until: datetime | None, step: int,
                default: int) -> tuple[int, int]:
    """[since, until) widened to whole ``step`` buckets, as Unix seconds; ``until`` defaults
    to now and ``since`` to ``default`` seconds before it. Never inverted: a span that ends
    before it starts is empty (hi == lo)."""
    end = until.timestamp() if until is not None else time.time()
    start = since.timestamp() if since is not None else end - default
    # Whole buckets: since down to its bucket's start, until up to the next one.
    lo = int(start // step) * step
    hi = -int(-end // step) * step
    return lo, max(lo, hi)


async def usage_report(ctx: AppContext, by: By, since: datetime | None,
                       until: datetime | None, granularity: Granularity) -> UsageReport:
    if not ctx.store.is_open:
        raise StoreUnavailableError("the store is not open, so usage cannot be read; "
                                    "`/readyz` says why")
    step = 3600 if granularity == "hour" else 86400
    lo, hi = report_span(since, until, step, 86400 if step == 3600 else 30 * 86400)
    rows = await ctx.store.usage(by, lo, hi, day=granularity == "day") if hi > lo else []
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
    return UsageReport(by=by, granularity=granularity, since=instant_at(lo),
                       until=instant_at(hi), buckets=buckets, totals=totals)
