"""The usage chart: tokens per bucket, stacked by group, as SVG rendered on the server.

No script draws it: the page's Content-Security-Policy allows no inline
script or style, so the chart is plain SVG with presentation attributes
(``fill``, not ``style``), sized by its viewBox to whatever box holds it.
Each bar segment carries a ``<title>`` (the group, the bucket and its
tokens), which browsers show on hover and screen readers read. The busiest
``MAX_SERIES - 1`` groups get their own colour; the rest are summed as
"other". Every text is escaped here; the template marks the
result safe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

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


def nice_ticks(peak: int, count: int = 4) -> list[int]:
    """Round y-axis ticks from 0 covering ``peak``: steps of 1, 2 or 5 times a power
    of ten, about ``count`` of them (0, 50,000, 100,000, ...)."""
    if peak <= 0:
        return [0, 1]
    raw = peak / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    top = math.ceil(peak / step) * step
    return list(range(0, int(top) + 1, int(step)))


def _short(n: int) -> str:
    """A tick label: 250, 1.5k, 20k, 3M."""
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            text = f"{n / size:.1f}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
    return str(n)


def _utc(start: datetime, hourly: bool) -> str:
    return start.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC" if hourly else "%Y-%m-%d UTC")


def usage_chart(buckets: Sequence[UsageBucket], totals: Sequence[UsageTotal],
                starts: Sequence[datetime], *, hourly: bool, now: datetime | None = None,
                width: int = 960, height: int = 280) -> Markup:
    """A stacked bar per entry of ``starts`` (every bucket of the span, empty ones too).

    The SVG has a viewBox and no fixed size, so it fills its box at any width (the
    stylesheet gives it ``width: 100%``). The y axis has round ticks with grid lines;
    the bucket holding ``now`` is marked and labelled "now". Axis times are UTC in the
    markup (``data-time`` holds the instant), rewritten in the viewer's zone by the
    page's script; each bar's title names the group, the tokens and the bucket in UTC.
    """
    series = series_of(totals)
    colour = dict(series)
    stacks: dict[datetime, dict[str, int]] = {s: {} for s in starts}
    for b in buckets:
        group = b.group if b.group in colour else OTHER
        stack = stacks.setdefault(b.start, {})
        stack[group] = stack.get(group, 0) + b.total_tokens
    peak = max((sum(s.values()) for s in stacks.values()), default=0)
    ticks = nice_ticks(peak)
    top_value = ticks[-1]
    left, bottom, top = 52, 30, 14
    plot_w, plot_h = width - left - 10, height - bottom - top
    slot = plot_w / max(1, len(starts))
    bar = max(1.0, slot * 0.78)
    step = (starts[1] - starts[0]) if len(starts) > 1 else None
    current = None
    if now is not None and step is not None:
        current = next((s for s in starts if s <= now < s + step), None)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="usage-chart" role="img" '
        f'viewBox="0 0 {width} {height}" preserveAspectRatio="xMidYMid meet" '
        f'aria-label="tokens per {"hour" if hourly else "day"}, stacked by group; '
        f'highest bar {peak:,} tokens">',
    ]
    for t in ticks:
        y = top + plot_h - t / top_value * plot_h
        parts.append(f'<line class="grid-line" x1="{left}" y1="{y:.1f}" x2="{width - 10}" '
                     f'y2="{y:.1f}" stroke="{"#888" if t == 0 else "#e1e4ea"}" '
                     'stroke-width="1"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'font-size="12" fill="#3b4252">{escape(_short(t))}</text>')
    every = max(1, math.ceil(len(starts) / 8))
    for i, start in enumerate(starts):
        x = left + i * slot + (slot - bar) / 2
        y = float(top + plot_h)
        if start == current:
            parts.append(f'<rect class="now-band" x="{left + i * slot:.1f}" y="{top}" '
                         f'width="{slot:.1f}" height="{plot_h}" fill="#eef3ff"/>')
        stack = stacks.get(start, {})
        for group, fill in series:
            tokens = stack.get(group, 0)
            if not tokens:
                continue
            h = tokens / top_value * plot_h
            y -= h
            parts.append(
                f'<rect class="segment" data-group="{escape(group)}" x="{x:.1f}" y="{y:.1f}" '
                f'width="{bar:.1f}" height="{max(h, 0.5):.1f}" fill="{fill}">'
                f'<title>{escape(group)}: {tokens:,} tokens, '
                f'{escape(_utc(start, hourly))}</title></rect>')
        label_x = x + bar / 2
        instant = start.astimezone(UTC).isoformat().replace("+00:00", "Z")
        if start == current:
            parts.append(f'<text class="now-label" x="{label_x:.1f}" y="{height - 8}" '
                         'text-anchor="middle" font-size="12" font-weight="700" '
                         'fill="#1f448f">now</text>')
        elif i % every == 0 and (current is None or abs(starts.index(current) - i) > 1):
            text = start.strftime("%H:%M") if hourly else start.strftime("%m-%d")
            parts.append(f'<text class="time" data-time="{instant}" '
                         f'data-format="{"hour" if hourly else "day"}" x="{label_x:.1f}" '
                         f'y="{height - 8}" text-anchor="middle" font-size="12" '
                         f'fill="#3b4252">{escape(text)}'
                         f'<title>{escape(_utc(start, hourly))}</title></text>')
    parts.append("</svg>")
    return Markup("".join(parts))   # noqa: S704 - every interpolated text is escaped above
