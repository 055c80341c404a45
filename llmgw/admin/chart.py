"""The usage chart: tokens per bucket, stacked by group, as SVG rendered on the server.

No script draws it: the page's Content-Security-Policy allows no inline
script or style, so the chart is plain SVG with presentation attributes
(``fill``, not ``style``). Each bar segment carries a ``<title>`` (the group,
the bucket and its tokens), which browsers show on hover and screen readers
read. The busiest ``MAX_SERIES - 1`` groups get their own colour; the rest
are summed as "other". Every text is escaped here; the template marks the
result safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from markupsafe import Markup, escape

from llmgw.control.usage import UsageBucket, UsageTotal

MAX_SERIES = 6
# Colour-blind-safe categorical colours (Okabe and Ito's palette), then grey for "other".
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#999999")
OTHER = "other"


def series_of(totals: Sequence[UsageTotal]) -> list[tuple[str, str]]:
    """(group, colour) of each series, busiest first; "other" last if groups were folded."""
    named = [t.group for t in totals[:MAX_SERIES - 1]] if len(totals) > MAX_SERIES else \
        [t.group for t in totals]
    out = [(g, PALETTE[i]) for i, g in enumerate(named)]
    if len(totals) > len(named):
        out.append((OTHER, PALETTE[-1]))
    return out


def _label(start: datetime, hourly: bool) -> str:
    return start.strftime("%H:00") if hourly else start.strftime("%b %d")


def usage_chart(buckets: Sequence[UsageBucket], totals: Sequence[UsageTotal],
                starts: Sequence[datetime], *, hourly: bool, width: int = 760,
                height: int = 260) -> Markup:
    """A stacked bar per entry of ``starts`` (every bucket of the span, empty ones too)."""
    series = series_of(totals)
    colour = dict(series)
    stacks: dict[datetime, dict[str, int]] = {s: {} for s in starts}
    for b in buckets:
        group = b.group if b.group in colour else OTHER
        stack = stacks.setdefault(b.start, {})
        stack[group] = stack.get(group, 0) + b.total_tokens
    peak = max((sum(s.values()) for s in stacks.values()), default=0) or 1
    left, bottom, top = 64, 28, 12
    plot_w, plot_h = width - left - 8, height - bottom - top
    slot = plot_w / max(1, len(starts))
    bar = max(1.0, slot * 0.8)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="usage-chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-label="tokens per {"hour" if hourly else "day"}, stacked by group">',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 8}" y2="{top + plot_h}" '
        'stroke="#888" stroke-width="1"/>',
        f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" font-size="11" '
        f'fill="#444">{peak:,}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end" font-size="11" '
        'fill="#444">0</text>',
    ]
    every = max(1, len(starts) // 12)
    for i, start in enumerate(starts):
        x = left + i * slot + (slot - bar) / 2
        y = float(top + plot_h)
        stack = stacks.get(start, {})
        for group, fill in series:
            tokens = stack.get(group, 0)
            if not tokens:
                continue
            h = tokens / peak * plot_h
            y -= h
            when = start.isoformat(timespec="minutes" if hourly else "hours")
            parts.append(
                f'<rect class="segment" data-group="{escape(group)}" x="{x:.1f}" y="{y:.1f}" '
                f'width="{bar:.1f}" height="{max(h, 0.5):.1f}" fill="{fill}">'
                f'<title>{escape(group)}: {tokens:,} tokens, {escape(when)}</title></rect>')
        if i % every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{height - 10}" text-anchor="middle" '
                         f'font-size="11" fill="#444">{escape(_label(start, hourly))}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))   # noqa: S704 - every interpolated text is escaped above
