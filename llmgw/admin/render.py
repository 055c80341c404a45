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

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import Request
from litestar.datastructures import Cookie
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.template.config import TemplateConfig

from llmgw.admin import timefmt
from llmgw.admin.session import FLASH_COOKIE, Session, expired_cookie, read_flash
from llmgw.catalog.model import Scaling
from llmgw.catalog.units import format_size
from llmgw.control.views import ScalingInForce

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

# How often the page's script refreshes status fragments, in seconds.
REFRESH_SECONDS = 5


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


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
    timefmt.install(env)
    return env


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    """The app's template configuration (the admin page is its only user)."""
    return TemplateConfig(instance=JinjaTemplateEngine.from_environment(environment()))


def page(request: Request[Any, Any, Any], name: str, *, session: Session | None,
         status: int = 200, cookies: list[Cookie] | None = None,
         **context: Any) -> Template:
    """A full page: the layout's context plus ``context``; consumes a flash message."""
    out = list(cookies or [])
    flash = None
    if session is not None and FLASH_COOKIE in request.cookies:
        flash = read_flash(session, request.cookies.get(FLASH_COOKIE))
        out.append(expired_cookie(request, FLASH_COOKIE))
    return Template(
        template_name=name,
        context={
            "who": session.name if session else None,
            "csrf": session.csrf if session else "",
            "flash": flash,
            "refresh_seconds": REFRESH_SECONDS,
            "error": None,
            **context,
        },
        status_code=status,
        cookies=out,
    )


def fragment(name: str, **context: Any) -> Template:
    """A piece of a page, fetched by the page's script to refresh status."""
    return Template(template_name=name, context=context)
