"""How the console's pages write figures: durations, shares, rates, money, ISO instants.

``static/console.js`` formats the live view's figures the same way when it
rebuilds the table from JSON; keep the two in step. Instants shown to people
go through ``render.when`` (a ``<time>`` the page's script puts in the
viewer's zone).
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


def money(value: float | None) -> str:
    """An amount in the prices' currency: cents, or four places below one (a few
    minutes of a CPU replica cost a fraction of a cent, which is not nothing)."""
    if value is None:
        return "—"
    return f"{value:,.2f}" if abs(value) >= 1 or value == 0 else f"{value:.4f}"


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
    env.filters["money"] = money
