"""Sign-in, sign-out, and the guard that keeps every other admin route behind them.

Only an admin token opens the page, checked with the same constant-time
``identify`` as the JSON API. An inference API key (``llmgw keys``) is not an
admin token and is refused like any other wrong value; an ``Authorization``
header, whatever it holds, is ignored here — the pages take the session
cookie only, so a Bearer token pasted into a browser extension or sent by a
script opens the JSON API and nothing else.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from litestar import Request, get, post
from litestar.connection import ASGIConnection
from litestar.enums import RequestEncodingType
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.params import Body, QueryParameter
from litestar.response import Redirect, Template

from llmgw.admin.csrf import session_of
from llmgw.admin.render import page
from llmgw.admin.session import (
    COOKIE,
    SIGNIN_COOKIE,
    expired_cookie,
    issue,
    session_cookie,
    signin_cookie,
    verify,
)
from llmgw.control.context import AppContext, Ctx
from llmgw.control.identity import identify

HOME = "/admin/models"
Form = Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]

NO_TOKENS = ("no admin token is configured on this server; set LLMGW_ADMIN_TOKENS "
             "(or admin_tokens in the configuration file) and restart it")
REFUSAL = ("that is not an admin token of this server; inference API keys do not "
               "open the admin page")


class NotSignedIn(NotAuthorizedException):
    """An admin route reached without a valid session cookie."""


def require_session(connection: ASGIConnection[Any, Any, Any, Any],
                    handler: BaseRouteHandler) -> None:
    """Guard: a valid session cookie, except on the sign-in routes themselves."""
    if handler.opt.get("public"):
        return
    ctx: AppContext = connection.app.state.ctx
    session = verify(ctx.config.admin_token_names(), connection.cookies.get(COOKIE))
    if session is None:
        raise NotSignedIn("sign in to the admin page first")
    connection.scope["state"]["admin_session"] = session


def safe_next(value: str | None) -> str:
    """Where to go after signing in: an admin path of this site, never another site."""
    if (value and value.startswith("/admin/") and not value.startswith("//")
            and "\\" not in value and "://" not in value):
        return value
    return HOME


def _form(request: Request[Any, Any, Any], *, next_: str, error: str | None,
          configured: bool, status: int = 200) -> Template:
    nonce = secrets.token_urlsafe(32)
    return page(request, "signin.html", session=None, status=status,
                cookies=[signin_cookie(request, nonce)], signin_csrf=nonce,
                next=next_, error=error, configured=configured)


@get("/signin", opt={"public": True})
async def signin_page(
    request: Request[Any, Any, Any], ctx: Ctx,
    next_: Annotated[str | None, QueryParameter(name="next")] = None,
) -> Template | Redirect:
    tokens = ctx.config.admin_token_names()
    if verify(tokens, request.cookies.get(COOKIE)) is not None:
        return Redirect(safe_next(next_), status_code=303)
    return _form(request, next_=safe_next(next_), error=None if tokens else NO_TOKENS,
                 configured=bool(tokens))


@post("/signin", opt={"public": True, "signin": True})
async def signin(request: Request[Any, Any, Any], ctx: Ctx,
                 data: Form) -> Template | Redirect:
    tokens = ctx.config.admin_token_names()
    target = safe_next(data.get("next"))
    if not tokens:
        return _form(request, next_=target, error=NO_TOKENS, configured=False, status=401)
    token = data.get("token", "").strip()
    name = identify(tokens, token or None)
    if name is None:
        return _form(request, next_=target, error=REFUSAL, configured=True, status=401)
    value, _ = issue(token, name)
    return Redirect(target, status_code=303, cookies=[
        session_cookie(request, value),
        expired_cookie(request, SIGNIN_COOKIE, path="/admin/signin"),
    ])


@post("/signout")
async def signout(request: Request[Any, Any, Any]) -> Redirect:
    assert session_of(request) is not None  # the guard let us in
    return Redirect("/admin/signin", status_code=303,
                    cookies=[expired_cookie(request, COOKIE)])


route_handlers = [signin_page, signin, signout]
