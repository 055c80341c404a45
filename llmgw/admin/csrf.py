"""Cross-site request forgery: every POST of the admin page carries a token.

Each session holds a random CSRF token in its signed cookie; every form puts it
in a hidden ``csrf`` field, and this guard refuses (403) any state-changing
request whose field does not match the session's. Another site can make a
browser send the cookie's request only if it can also read the page to learn
the token, which the same-origin policy forbids. ``SameSite=Strict`` on the
cookie already keeps other sites' requests from carrying it; the token is the
second lock, for browsers or proxies that get SameSite wrong.

Sign-in comes before any session, so its form uses a double-submit cookie: the
sign-in page sets a random value in a cookie scoped to ``/admin/signin`` and
in the form, and the POST must present both, equal.

Litestar's own CSRF middleware was not used: it is app-wide, so it would have
to be taught to leave the JSON API (Bearer tokens, no cookies) alone, and its
secret would need the same sharing across instances that the session key gets
here for free.
"""

from __future__ import annotations

import hmac
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from llmgw.admin.session import SIGNIN_COOKIE, Session

FIELD = "csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CsrfRefused(PermissionDeniedException):
    """A state-changing request without this session's CSRF token."""


def session_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Session | None:
    found = connection.scope["state"].get("admin_session")
    return found if isinstance(found, Session) else None


async def check_csrf(connection: ASGIConnection[Any, Any, Any, Any],
                     handler: BaseRouteHandler) -> None:
    """Guard: a POST's ``csrf`` field must equal the session's (or the sign-in cookie's)."""
    if connection.scope.get("method", "GET") in SAFE_METHODS:
        return
    if not isinstance(connection, Request):
        raise CsrfRefused("this admin action takes a form")
    form = await connection.form()
    given = form.get(FIELD)
    if handler.opt.get("signin"):
        expected = connection.cookies.get(SIGNIN_COOKIE)
        retry = "reload the sign-in page and try again"
    else:
        session = session_of(connection)
        expected = session.csrf if session else None
        retry = "reload the page and submit the form again"
    if (not isinstance(given, str) or not given or not expected
            or not hmac.compare_digest(given.encode(), expected.encode())):
        raise CsrfRefused(
            f"the form's CSRF token is missing or does not belong to this session; {retry}")
