"""Rendering the admin page: one Jinja environment, autoescaped, and the page helper.

Autoescaping is on for every template, whatever its name, and nothing is ever
marked safe: model names, descriptions, error messages and replica messages
all come from people or from engines' output, so all of it is shown as text.
A Content-Security-Policy (``llmgw.admin.routes``) that allows only this
app's own script is the second line, should a template ever slip.

Templates receive only what they display. The session object (which holds
the key its flash messages are signed with) never reaches one: a page gets
the signed-in name and the CSRF token its forms must carry, and no more.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import Request
from litestar.datastructures import Cookie
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.template.config import TemplateConfig
from markupsafe import Markup, escape

from llmgw.admin import timefmt
from llmgw.admin.prg import carried
from llmgw.admin.session import FLASH_COOKIE, Session, expired_cookie, read_flash
from llmgw.catalog.model import Scaling
from llmgw.catalog.units import format_size
from llmgw.control.views import ScalingInForce

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

# How often the page's script refreshes status fragments, in seconds.
REFRESH_SECONDS = 5

# The navigation, in order: (section, path, text). A page sets ``section`` to mark
# itself current; a new page is reachable once it is listed here.
NAV: list[tuple[str, str, str]] = [
    ("models", "/admin/models", "Models"),
    ("add", "/admin/add", "Add a model"),
    ("fleet", "/admin/fleet", "Fleet"),
    ("usage", "/admin/usage", "Usage"),
    ("teams", "/admin/teams", "Teams & keys"),
    # The console's pages (llmgw.admin.console).
    ("live", "/admin/live", "Live"),
    ("replicas", "/admin/replicas", "Replicas"),
    ("playground", "/admin/playground", "Playground"),
    ("spend", "/admin/spend", "Spend"),
    ("logs", "/admin/logs", "Request logs"),
    ("guided", "/admin/guided", "Add (form)"),
    ("mirror", "/admin/mirror", "Mirror"),
]


def when(value: datetime | float | None, fmt: str = "minute") -> Markup:
    """A moment as ``<time>``: UTC text that reads without script (``2026-12-01 23:00
    UTC``), which the page's script rewrites in the viewer's zone, keeping the UTC text
    on hover. ``fmt`` "hour" is a clock time alone (a chart's axis)."""
    if value is None:
        return Markup("—")
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    utc = value.astimezone(UTC)
    text = utc.strftime("%H:%M UTC" if fmt == "hour" else "%Y-%m-%d %H:%M UTC")
    # Built with escape() and an f-string rather than Markup.format: a page of a thousand
    # rows calls this for each, and string.Formatter's parsing is most of its cost.
    stamp = utc.isoformat(timespec="seconds").replace("+00:00", "Z")
    html = f'<time datetime="{escape(stamp)}" data-format="{escape(fmt)}">{escape(text)}</time>'
    return Markup(html)   # noqa: S704 - every interpolated text is escaped above


def api_number(value: float | None, api: str, path: Sequence[str | int | dict[str, str]],
               text: str | None = None) -> Markup:
    """A number as shown, marked with where the JSON API answers it: ``api`` (a GET path
    under /api/v1) and ``path`` into its answer (a key, a list index, or ``{"name":
    "x"}`` for the list item whose ``name`` is x). The page-walk test reads every marked
    number and checks it against the API, so page and API cannot drift apart.

    The text is ``value`` with thousands separators unless ``text`` is given (a size),
    in which case the raw value rides along in ``data-value``.
    """
    shown = text if text is not None else ("—" if value is None else f"{value:,}")
    raw = "" if value is None else repr(value)
    # The path's JSON in a single-quoted attribute, its double quotes left as they are:
    # a page marks hundreds of numbers, and ``&#34;`` for each quote is a third of each.
    where = json.dumps(list(path), separators=(",", ":"))
    quoted = (where.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
              .replace("'", "&#39;"))
    html = (f'<span class="api-num" data-api="{escape(api)}" data-api-path=\'{quoted}\' '
            f'data-value="{escape(raw)}">{escape(shown)}</span>')
    return Markup(html)   # noqa: S704 - every interpolated text is escaped above


def size(value: int | None) -> str:
    return "—" if value is None else format_size(value)


def scaling_text(s: Scaling | ScalingInForce) -> str:
    """The scaling in force, worded as ``llmgw ctl model list`` words it."""
    if s.min == 0:
        return f"on demand (max {s.max}, idle {s.idle_timeout})"
    return f"{s.min} (max {s.max})"


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["size"] = size
    env.filters["scaling"] = scaling_text
    env.filters["pair"] = lambda value: (value, value)
    env.globals["api_number"] = api_number
    timefmt.install(env)
    return env


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    """The app's template configuration (the admin page is its only user)."""
    return TemplateConfig(instance=JinjaTemplateEngine.from_environment(environment()))


def page(request: Request[Any, Any, Any], name: str, *, session: Session | None,
         status: int = 200, cookies: list[Cookie] | None = None,
         **context: Any) -> Template:
    """A full page: the layout's context plus ``context``; consumes what the redirect
    of a form carried (a flash message, a refused form, a secret to show once).

    A template asks ``form("key-form")`` for a form's state (``llmgw.admin.prg``):
    what was typed and each problem when it was refused, blank otherwise; and
    ``shown("key-form")`` for a secret to show once beside it.
    """
    out = list(cookies or [])
    flash = None
    if session is not None and FLASH_COOKIE in request.cookies:
        flash = read_flash(session, request.cookies.get(FLASH_COOKIE))
        out.append(expired_cookie(request, FLASH_COOKIE))
    back = carried(request, session)
    out.extend(back.cookies)
    return Template(
        template_name=name,
        context={
            "who": session.name if session else None,
            "csrf": session.csrf if session else "",
            "flash": flash,
            "refresh_seconds": REFRESH_SECONDS,
            "nav_items": NAV,
            "error": None,
            "form": back.form,
            "shown": back.secret,
            **context,
        },
        status_code=status,
        cookies=out,
    )


def fragment(name: str, **context: Any) -> Template:
    """A piece of a page, fetched by the page's script to refresh status."""
    return Template(template_name=name, context=context)
