"""The admin page's router: its guards, its error pages and its response headers.

Two guards run, in order, on every route under ``/admin`` but the static
files: a valid session cookie (``llmgw.admin.signin``), then on every POST the
session's CSRF token (``llmgw.admin.csrf``). Nothing under ``/admin`` is
reachable by an ``Authorization`` header: the JSON API under ``/api/v1`` is
where the admin token works as a Bearer token.

Without a session a page redirects to sign-in (and comes back afterwards);
an action or a status fragment answers 401, because a redirect there would
either lose the form or paste the sign-in page into the middle of another.

Errors render as HTML pages here rather than the JSON the API answers with;
they carry the same message.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from litestar import Request, Response, Router
from litestar.datastructures import CacheControlHeader, ResponseHeader
from litestar.exceptions import HTTPException
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router

from llmgw.admin import actions, console, pages, signin
from llmgw.admin.csrf import CsrfRefused, check_csrf, session_of
from llmgw.admin.render import NAV, STATIC
from llmgw.admin.signin import NotSignedIn, require_session
from llmgw.errors import LlmgwError

log = logging.getLogger("llmgw.admin")

# Only this app's own script and style run; no inline script, no framing, and
# forms may post only here. Should escaping ever fail, injected markup still
# cannot run script.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def _error_page(request: Request[Any, Any, Any], status: int, title: str,
                message: str) -> Template:
    session = session_of(request)
    return Template(
        template_name="error.html",
        context={"who": session.name if session else None,
                 "csrf": session.csrf if session else "",
                 "flash": None, "refresh_seconds": 0, "error": None, "nav_items": NAV,
                 "status": status, "title": title, "message": message},
        status_code=status, headers={**SECURITY_HEADERS, "Cache-Control": "no-store"},
    )


def _not_signed_in(request: Request[Any, Any, Any], exc: NotSignedIn) -> Response[Any]:
    fragment = bool(request.route_handler.opt.get("fragment"))
    if request.method == "GET" and not fragment:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return Redirect(f"/admin/signin?next={quote(target, safe='')}", status_code=303)
    return _error_page(request, 401, "Sign in first",
                       "this admin action needs a signed-in session; sign in and try again")


def _csrf(request: Request[Any, Any, Any], exc: CsrfRefused) -> Response[Any]:
    return _error_page(request, 403, "Form refused", str(exc.detail))


def _llmgw(request: Request[Any, Any, Any], exc: LlmgwError) -> Response[Any]:
    titles = {404: "Not found", 409: "Refused", 503: "Unavailable"}
    return _error_page(request, exc.status, titles.get(exc.status, "Error"), exc.message)


def _http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    message = exc.detail
    if exc.status_code == 413:
        message = "the form is too large; a model definition is a few kilobytes"
    return _error_page(request, exc.status_code, "Request refused", message)


def _internal(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unexpected error serving %s %s", request.method, request.url.path,
                  exc_info=exc)
    return _error_page(request, 500, "Internal error",
                       "internal error; the server's log has the traceback")


def admin_router() -> Router:
    """Every page and action under /admin, behind the session and CSRF guards."""
    return Router(
        "/admin",
        route_handlers=[*signin.route_handlers, *pages.route_handlers,
                        *actions.route_handlers,
                        # The console's pages (llmgw.admin.console), one block.
                        *console.route_handlers],
        guards=[require_session, check_csrf],
        exception_handlers={
            NotSignedIn: _not_signed_in,
            CsrfRefused: _csrf,
            LlmgwError: _llmgw,
            HTTPException: _http,
            Exception: _internal,
        },
        response_headers=[ResponseHeader(name=k, value=v) for k, v in SECURITY_HEADERS.items()],
        # Pages carry CSRF tokens and live status: neither belongs in a cache.
        cache_control=CacheControlHeader(no_store=True),
        include_in_schema=False,
    )


def static_router() -> Router:
    """The page's stylesheet and its one small script; public, like any stylesheet."""
    return create_static_files_router(
        path="/admin/static", directories=[STATIC], name="admin-static",
        include_in_schema=False,
        cache_control=CacheControlHeader(max_age=300),
    )


def routers() -> list[Router]:
    return [admin_router(), static_router()]
