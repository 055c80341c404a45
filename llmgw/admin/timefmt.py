"""Instants and figures on the console: instants in the viewer's own zone, UTC on hover.

The server cannot know the viewer's zone, so it writes every instant as a
``<time>`` element whose text and title are UTC and whose ``datetime`` is
ISO 8601; ``static/console.js`` rewrites the text in the browser's zone and
keeps UTC in the title. Without script the page still reads correctly, in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from jinja2 import Environment


def _dt(value: float | datetime) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromtimestamp(value, UTC)


def iso(value: float | datetime) -> str:
    return _dt(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc(value: float | datetime) -> str:
    return _dt(value).strftime("%Y-%m-%d %H:%M UTC")


def money(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f}"


def seconds(value: float | None) -> str:
    """A duration as the live view shows it (``static/console.js`` formats alike)."""
    if value is None:
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def install(env: Environment) -> None:
    env.filters["seconds"] = seconds
    env.filters["percent"] = percent
    env.filters["rate"] = rate
    env.filters["iso"] = iso
    env.filters["utc"] = utc
    env.filters["money"] = money
